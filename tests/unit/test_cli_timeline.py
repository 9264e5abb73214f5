"""sasflow_cli.timeline: the bars of every attempt, read from a workflow's history, and the two pictures."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sasflow_cli.timeline import COLOURS, Bar, Marker, Timeline, draw, layout, timeline, write_html, write_png

T0 = 1_800_000_000


def event(seq: int, dt: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "time": T0 + dt, "kind": kind, **fields}


def view(status: str = "COMPENSATED", updated: int = 60) -> dict[str, Any]:
    steps = [{"name": name} for name in ("reserve_flight", "book_hotel", "charge_card")]
    return {"workflow_id": "wf-1", "status": status, "created_at": T0, "updated_at": T0 + updated, "steps": steps}


#: A trip whose flight is resent once, whose hotel is deferred once by an open circuit, whose payment is declined,
#: whose hotel compensation times out once and whose flight compensation fails until an operator retries it.
HISTORY = [
    event(1, 0, "started"),
    event(2, 0, "dispatched", step="reserve_flight", phase="action", attempt=1, complete_by=T0 + 5),
    event(3, 11, "resent", step="reserve_flight", phase="action", attempt=1),
    event(4, 11, "dispatched", step="reserve_flight", phase="action", attempt=2, complete_by=T0 + 16),
    event(5, 12, "reply_applied", step="reserve_flight", phase="action", attempt=2, outcome="succeeded", calls=1),
    event(6, 12, "dispatched", step="book_hotel", phase="action", attempt=1, complete_by=T0 + 17),
    event(7, 13, "reply_applied", step="book_hotel", phase="action", attempt=1, outcome="deferred", calls=0),
    event(8, 13, "dispatched", step="book_hotel", phase="action", attempt=1, complete_by=T0 + 21),
    event(9, 17, "reply_applied", step="book_hotel", phase="action", attempt=1, outcome="succeeded", calls=1),
    event(10, 17, "dispatched", step="charge_card", phase="action", attempt=1, complete_by=T0 + 22),
    event(
        11,
        18,
        "reply_applied",
        step="charge_card",
        phase="action",
        attempt=1,
        outcome="rejected",
        calls=1,
        error_code="CARD_DECLINED",
    ),
    event(12, 18, "unwinding", error_code="CARD_DECLINED"),
    event(13, 18, "compensation_dispatched", step="book_hotel", phase="compensation", attempt=1, complete_by=T0 + 23),
    event(14, 30, "compensation_resent", step="book_hotel", phase="compensation", attempt=1),
    event(15, 30, "compensation_dispatched", step="book_hotel", phase="compensation", attempt=2, complete_by=T0 + 35),
    event(
        16, 31, "compensation_reply_applied", step="book_hotel", phase="compensation", attempt=2, outcome="succeeded"
    ),
    event(
        17, 31, "compensation_dispatched", step="reserve_flight", phase="compensation", attempt=1, complete_by=T0 + 36
    ),
    event(
        18,
        32,
        "compensation_reply_applied",
        step="reserve_flight",
        phase="compensation",
        attempt=1,
        outcome="failed",
        calls=3,
        error_code="TRANSIENT_EXHAUSTED",
    ),
    event(19, 32, "finished", status="COMPENSATION_FAILED"),
    event(
        20,
        50,
        "operator_action",
        step="reserve_flight",
        detail={"action": "retry-compensation", "principal": "arn:oncall", "reason": "flights back", "id": "k1"},
    ),
    event(
        21, 50, "compensation_dispatched", step="reserve_flight", phase="compensation", attempt=2, complete_by=T0 + 55
    ),
]


def test_one_bar_per_attempt_of_each_phase_with_its_outcome_complete_by_and_error() -> None:
    # Given the history of a trip with a resend, a deferral, a rejection, a compensation timeout and a failure
    # When its timeline is computed while the retried flight compensation is still in flight
    line = timeline(HISTORY, view(status="COMPENSATING", updated=52))
    # Then every attempt is one bar, in dispatch order, from its dispatch to what settled it
    assert [(b.lane, b.attempt, b.start - T0, None if b.end is None else b.end - T0, b.outcome) for b in line.bars] == [
        ("reserve_flight", 1, 0, 11, "timed_out"),
        ("reserve_flight", 2, 11, 12, "succeeded"),
        ("book_hotel", 1, 12, 13, "deferred"),
        ("book_hotel", 1, 13, 17, "succeeded"),
        ("charge_card", 1, 17, 18, "rejected"),
        ("book_hotel (compensation)", 1, 18, 30, "timed_out"),
        ("book_hotel (compensation)", 2, 30, 31, "succeeded"),
        ("reserve_flight (compensation)", 1, 31, 32, "failed"),
        ("reserve_flight (compensation)", 2, 50, None, "in_flight"),
    ]
    # And each bar carries its attempt's complete-by, error code and remote calls
    assert [b.complete_by - T0 for b in line.bars if b.complete_by is not None] == [5, 16, 17, 21, 22, 23, 35, 36, 55]
    assert line.bars[4].error_code == "CARD_DECLINED"
    assert (line.bars[7].error_code, line.bars[7].calls) == ("TRANSIENT_EXHAUSTED", 3)
    # And the lanes follow the definition, each compensation under its step
    assert line.lanes == (
        "reserve_flight",
        "reserve_flight (compensation)",
        "book_hotel",
        "book_hotel (compensation)",
        "charge_card",
    )
    # And the operator action is a marker naming who, what and why; the milestones are markers too
    assert [m for m in line.markers if m.kind == "operator_action"] == [
        Marker(
            T0 + 50,
            "operator_action",
            "retry-compensation by arn:oncall: flights back",
            "reserve_flight",
            {"action": "retry-compensation", "principal": "arn:oncall", "reason": "flights back", "id": "k1"},
        )
    ]
    assert [(m.time - T0, m.label) for m in line.markers if m.kind != "operator_action"] == [
        (0, "started"),
        (18, "unwinding (CARD_DECLINED)"),
        (32, "finished COMPENSATION_FAILED"),
    ]
    assert (line.start, line.now) == (T0, T0 + 52)


def test_a_request_that_could_not_be_prepared_is_a_failed_bar_of_no_length() -> None:
    events = [
        event(1, 0, "started"),
        event(2, 3, "not_prepared", step="reserve_flight", phase="action", error_code="INPUT_EXPRESSION"),
    ]
    line = timeline(events, view(status="COMPENSATED", updated=3))
    assert line.bars == (Bar("reserve_flight", "action", 0, T0 + 3, T0 + 3, "failed", None, "INPUT_EXPRESSION", 0),)
    assert line.lanes == ("reserve_flight", "book_hotel", "charge_card")


def test_both_pictures_are_written_and_the_html_is_self_contained(tmp_path: Path) -> None:
    # Given the timeline of the history above, with an operator's reason that looks like markup
    history = [dict(e) for e in HISTORY]
    history[19] = dict(history[19], detail={**history[19]["detail"], "reason": "<script>alert(1)</script>"})
    line = timeline(history, view(status="COMPENSATING", updated=52))
    # When both pictures are written
    png = write_png(line, tmp_path / "out" / "trip.png")
    page = write_html(line, tmp_path / "trip.html")
    # Then the PNG is a PNG
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # And the HTML holds every bar, in each outcome's colour, with no reference to anything outside it
    text = page.read_text(encoding="utf-8")
    assert text.count('<rect class="bar"') == len(line.bars) == 9
    for outcome in ("succeeded", "rejected", "failed", "deferred", "timed_out", "in_flight"):
        assert f'fill="{COLOURS[outcome]}"' in text
    assert re.search(r"https?:", text) is None
    assert "<script" not in text and "<link" not in text and "src=" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


@pytest.fixture
def drawn() -> Iterator[Callable[[Timeline], Any]]:
    """`draw`, closing every figure it made afterwards."""
    figures: list[Any] = []

    def make(line: Timeline) -> Any:
        figures.append(draw(line))
        return figures[-1]

    yield make
    from matplotlib import pyplot

    for figure in figures:
        pyplot.close(figure)


PRINCIPAL = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/"
BUSY_STEPS = ("reserve_flight", "book_hotel", "rent_car", "reserve_table", "buy_insurance", "charge_card")


def busy_history() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Six steps, every other one deferred twice by an open circuit (1 s apart), three operator actions within 3 s,
    a hold, then an approval step waiting a day for its callback: 26 s of work and a complete-by at +24 h."""
    events: list[dict[str, Any]] = []

    def add(dt: int, kind: str, **fields: Any) -> None:
        events.append(event(len(events) + 1, dt, kind, **fields))

    add(0, "started")
    t = 0
    for index, name in enumerate(BUSY_STEPS):
        for attempt in (1, 2, 3):
            add(t, "dispatched", step=name, phase="action", attempt=attempt, complete_by=T0 + t + 5)
            if attempt < 3 and index % 2 == 0:
                add(t + 1, "reply_applied", step=name, phase="action", attempt=attempt, outcome="deferred", calls=0)
                t += 1
                continue
            add(t + 2, "reply_applied", step=name, phase="action", attempt=attempt, outcome="succeeded", calls=1)
            t += 2
            break
    tickets = {"step": "send_tickets", "phase": "action"}
    add(t, "dispatched", **tickets, attempt=1, complete_by=T0 + t + 10)
    for dt, action, who, reason in (
        (1, "pause", "alice", "customer called about the dates"),
        (2, "resume", "alice", "dates confirmed"),
    ):
        detail = {"action": action, "principal": PRINCIPAL + who, "reason": reason}
        add(t + dt, "operator_action", step="send_tickets", detail=detail)
    add(t + 3, "reply_applied", **tickets, attempt=1, outcome="failed", calls=3, error_code="TRANSIENT_EXHAUSTED")
    add(t + 3, "held", error_code="TRANSIENT_EXHAUSTED")
    detail = {"action": "retry", "principal": PRINCIPAL + "bob", "reason": "mail server back"}
    add(t + 4, "operator_action", step="send_tickets", detail=detail)
    add(t + 4, "dispatched", **tickets, attempt=2, complete_by=T0 + t + 14)
    add(t + 5, "reply_applied", **tickets, attempt=2, outcome="succeeded", calls=1)
    add(t + 5, "dispatched", step="approval", phase="action", attempt=1, complete_by=T0 + t + 5 + 86_400)
    steps = [{"name": name} for name in (*BUSY_STEPS, "send_tickets", "approval")]
    return events, {
        "workflow_id": "wf-busy",
        "status": "RUNNING",
        "created_at": T0,
        "updated_at": T0 + t + 8,
        "steps": steps,
    }


def test_the_x_axis_ends_at_the_work_and_a_far_complete_by_is_written_at_its_edge(
    drawn: Callable[[Timeline], Any],
) -> None:
    # Given a busy workflow of 26 s whose approval step waits for a callback with a complete-by a day ahead
    events, busy = busy_history()
    line = timeline(events, busy)
    assert line.now - line.start == 26
    # When the PNG is laid out and drawn
    placed = layout(line)
    figure = drawn(line)
    # Then the x-axis ends at the last complete-by within half the workflow's time past its last event (32 s:
    # send_tickets' retry), not at the day-long one
    assert placed.end == 32
    assert figure.axes[0].get_xlim() == pytest.approx((-0.64, 33.6))
    # And the far complete-by is written at the axis' right edge of its lane, with its value
    assert [(b.step, b.complete_by - T0) for b in placed.beyond] == [("approval", 86_423)]
    texts = [t for t in figure.axes[0].texts if "complete-by" in t.get_text()]
    assert [(t.get_text(), t.get_position()[0]) for t in texts] == [("complete-by +24.0 h →", 33.6)]
    # And a complete-by just ahead of a young workflow still stretches the axis to it
    young = timeline(events[:3], dict(busy, updated_at=T0 + 1))
    assert layout(young).end == 5 and layout(young).beyond == ()


def test_marker_labels_of_a_busy_workflow_take_levels_and_never_overlap(drawn: Callable[[Timeline], Any]) -> None:
    # Given the busy workflow: started, three operator actions within 3 s and a hold among them
    events, busy = busy_history()
    line = timeline(events, busy)
    # When it is laid out
    placed = layout(line)
    # Then every marker has its label, operator actions naming the person's role session and the reason
    assert [(label.text, label.level) for label in placed.labels] == [
        ("started", 0),
        ("pause by sasflow-operator/alice: customer called about the dates", 0),
        ("resume by sasflow-operator/alice: dates confirmed", 0),
        ("held (TRANSIENT_EXHAUSTED)", 1),
        ("retry by sasflow-operator/bob: mail server back", 2),
    ]
    # And no two labels of a level share any of the axis
    for a, b in itertools.combinations(placed.labels, 2):
        assert a.level != b.level or a.right <= b.left or b.right <= a.left, (a, b)
    # And, drawn, their text extents (as matplotlib measures them) overlap neither each other nor the attempt numbers
    figure = drawn(line)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    texts = [t for t in figure.axes[0].texts if t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), (a, b)
    # And the attempt numbers are on the bars wide enough for them: all here (1 s is 28 px)
    assert len(placed.attempt_labels) == len(line.bars)


def test_the_html_page_stacks_operator_labels_that_would_overlap(tmp_path: Path) -> None:
    # Given the busy workflow's three operator actions within 3 s
    events, busy = busy_history()
    # When its page is written
    text = write_html(timeline(events, busy), tmp_path / "busy.html").read_text(encoding="utf-8")
    # Then each label has a row of its own above the lanes, in time order from the lowest
    rows = re.findall(r'<text class="optext" x="[0-9.]+" y="([0-9]+)">([a-z]+) by', text)
    assert rows == [("50", "pause"), ("36", "resume"), ("22", "retry")]


def test_attempt_numbers_are_left_off_bars_too_narrow_for_them() -> None:
    # Given a flight deferred every second for 10 s, then a wait of 10 minutes
    events = [event(1, 0, "started")]
    for second in range(10):
        events.append(event(len(events) + 1, second, "dispatched", step="reserve_flight", attempt=1))
    events.append(event(len(events) + 1, 600, "reply_applied", step="reserve_flight", outcome="succeeded"))
    line = timeline(events, view(status="COMPLETED", updated=600))
    # When it is laid out: 1 s is under 2 px
    placed = layout(line)
    # Then only the last attempt, 590 s long, carries its number
    assert sorted(placed.attempt_labels) == [9]
