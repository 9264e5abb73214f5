"""The console's step graph: columns by dependency depth, an edge per dependency, the status word on each box."""

from __future__ import annotations

from typing import Any

from sasflow_cli.console import graph


def test_a_diamond_is_three_columns_with_the_two_branches_stacked_and_four_edges() -> None:
    steps: list[dict[str, Any]] = [
        {"name": "a", "status": "COMPLETED", "depends_on": [], "type": "task", "agent": "flights", "action": "reserve"},
        {"name": "b", "status": "PROCESSING", "depends_on": ["a"], "type": "wait"},
        {
            "name": "c",
            "status": "FAILED",
            "depends_on": ["a"],
            "type": "map",
            "children": {"total": 10, "ended": 4, "failed": 1},
        },
        {"name": "d", "status": "PENDING", "depends_on": ["b", "c", "not-a-step"], "type": "task"},
    ]
    drawn = graph.layout(steps)
    where = {box.name: (box.x, box.y) for box in drawn.boxes}
    column = graph.BOX_WIDTH + graph.COLUMN_GAP
    row = graph.BOX_HEIGHT + graph.ROW_GAP
    m = graph.MARGIN
    assert where == {"a": (m, m), "b": (m + column, m), "c": (m + column, m + row), "d": (m + 2 * column, m)}
    assert [(b.name, b.css, b.detail) for b in drawn.boxes] == [
        ("a", "st-completed", "flights.reserve"),
        ("b", "st-processing", "wait"),
        ("c", "st-failed", "map: 4/10 ended, 1 failed"),
        ("d", "st-pending", "task"),
    ]
    mid = graph.BOX_HEIGHT // 2
    assert len(drawn.edges) == 4  # the unknown name draws nothing
    assert drawn.edges[0].start == (m + graph.BOX_WIDTH, m + mid) and drawn.edges[0].end == (m + column, m + mid)
    assert (drawn.width, drawn.height) == (
        2 * m + 3 * graph.BOX_WIDTH + 2 * graph.COLUMN_GAP,
        2 * m + 2 * row - graph.ROW_GAP,
    )


def test_no_steps_is_an_empty_picture() -> None:
    drawn = graph.layout([])
    assert (drawn.boxes, drawn.edges) == ((), ())
