"""A workflow's steps as a graph: one box per step, columns by dependency depth, an arrow per dependency.

Drawn on the server as SVG (no script, no layout library): a step sits one column right of its deepest dependency,
steps of a column keep the definition's order. Each box says the step's status in words as well as in colour (its
CSS class), a map step adds its children's counts, and links to the step's section of the page. Every text is
escaped by the template that embeds it (`Box` holds plain strings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BOX_HEIGHT", "BOX_WIDTH", "Box", "Edge", "Graph", "layout"]

BOX_WIDTH = 200
BOX_HEIGHT = 58
COLUMN_GAP = 56
ROW_GAP = 18
MARGIN = 8


@dataclass(frozen=True)
class Box:
    """One step: where it is drawn, its name, status (word and CSS class) and a line of detail."""

    name: str
    status: str
    detail: str
    x: int
    y: int

    @property
    def css(self) -> str:
        return "st-" + self.status.lower().replace("_", "-")


@dataclass(frozen=True)
class Edge:
    """A dependency: from the step waited for (its right side) to the step that waits (its left side)."""

    start: tuple[int, int]
    end: tuple[int, int]


@dataclass(frozen=True)
class Graph:
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def _detail(step: Mapping[str, Any]) -> str:
    children = step.get("children")
    if children:
        text = f"map: {children['ended']}/{children['total']} ended"
        return text + (f", {children['failed']} failed" if children.get("failed") else "")
    if step.get("agent"):
        return f"{step['agent']}.{step.get('action')}"
    return str(step.get("type") or "")


def layout(steps: Sequence[Mapping[str, Any]]) -> Graph:
    """Place ``steps`` (a WorkflowView's, or a definition's with ``status`` filled in) in columns by depth.

    Each step is a mapping with ``name``, ``status``, ``depends_on`` (names), and optionally ``type``, ``agent``,
    ``action`` and ``children`` (a map step's counts). A name in ``depends_on`` that is not a step is ignored.
    """
    names = [str(step["name"]) for step in steps]
    known = set(names)
    depth: dict[str, int] = {}
    for step in steps:  # a WorkflowView lists steps in a topological order: every dependency comes first
        parents = [p for p in step.get("depends_on") or [] if p in known and p in depth]
        depth[str(step["name"])] = 1 + max((depth[p] for p in parents), default=-1)
    rows: dict[int, int] = {}
    where: dict[str, tuple[int, int]] = {}
    boxes = []
    for step in steps:
        name = str(step["name"])
        column = depth[name]
        row = rows.get(column, 0)
        rows[column] = row + 1
        x = MARGIN + column * (BOX_WIDTH + COLUMN_GAP)
        y = MARGIN + row * (BOX_HEIGHT + ROW_GAP)
        where[name] = (x, y)
        boxes.append(Box(name, str(step.get("status") or "PENDING"), _detail(step), x, y))
    edges = []
    for step in steps:
        x, y = where[str(step["name"])]
        for parent in step.get("depends_on") or []:
            if parent in where:
                px, py = where[parent]
                edges.append(Edge((px + BOX_WIDTH, py + BOX_HEIGHT // 2), (x, y + BOX_HEIGHT // 2)))
    columns = 1 + max(depth.values(), default=0)
    width = 2 * MARGIN + columns * BOX_WIDTH + (columns - 1) * COLUMN_GAP
    height = 2 * MARGIN + max(rows.values(), default=1) * (BOX_HEIGHT + ROW_GAP) - ROW_GAP
    return Graph(tuple(boxes), tuple(edges), width, height)
