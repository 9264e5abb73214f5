"""The overdue boundary when a workflow has several steps in flight (DESIGN Rule 3: now > complete_by + grace).

The deadline index holds one entry per workflow, keyed by its earliest complete-by; the supervisor's query finds
the workflow once that step is overdue, and the scheduler then decides step by step. A sibling whose complete-by is
exactly ``now - grace`` is not overdue yet and must not be resent with the one that is.
"""

from __future__ import annotations

from typing import Any

from tests.support.pipeline import TRIP_INPUT, Pipeline


def two_parallel_steps() -> dict[str, Any]:
    return {
        "name": "parallel",
        "version": 1,
        "steps": [
            {"name": "flight", "agent": "flights", "action": "reserve", "timeout_seconds": 30, "depends_on": []},
            {"name": "hotel", "agent": "hotels", "action": "book", "timeout_seconds": 31, "depends_on": []},
        ],
    }


def test_a_sibling_at_exactly_the_boundary_is_not_resent_with_the_overdue_step() -> None:
    # Given two parallel steps dispatched together, whose complete-by differ by one second, and both replies lost
    p = Pipeline(grace=30)
    wid = p.start(two_parallel_steps(), TRIP_INPUT)
    p.run_agent("flights", lose_replies=True)
    p.run_agent("hotels", lose_replies=True)
    steps = p.snapshot(wid).steps
    flight_by, hotel_by = steps["flight"].complete_by, steps["hotel"].complete_by
    assert flight_by is not None and hotel_by == flight_by + 1
    # When the supervisor runs when the flight is one second overdue and the hotel exactly at its boundary
    p.clock.set(hotel_by + 30)
    report = p.sweep()
    # Then only the flight is resent (attempt 2); the hotel keeps its first attempt until one second later
    assert (report.overdue, report.messages) == (1, 1)
    assert [r.attempt for r in p.requests("flights")] == [2]
    assert p.requests("hotels") == []
    after = p.snapshot(wid).steps
    assert (after["flight"].attempt, after["hotel"].attempt) == (2, 1)
    p.clock.set(hotel_by + 31)
    assert p.sweep().messages == 1
    assert [r.attempt for r in p.requests("hotels")] == [2]
