"""sasflow_cli.timeline: the bars of every attempt, read from a workflow's history, and the two pictures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sasflow_cli.timeline import COLOURS, Bar, Marker, timeline, write_html, write_png

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
