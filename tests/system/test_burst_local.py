"""System tier: a small `make burst` (devstack/load.py, burst_profile): workflows started at once against the hotels
service limited as its agent declares (5 calls at once, 10 a second, 429 beyond), and the checks of such a run.

Time is real here; the run bounds itself.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from devstack.load import LoadResult, StepState, WorkflowState, burst_profile, check, render, run_load

pytestmark = pytest.mark.system


def test_a_burst_of_starts_never_calls_the_hotels_over_its_quota_and_its_deferrals_use_no_attempt(
    tmp_path: Path,
) -> None:
    # Given the local stack, and 40 trip bookings started at once with records deferred after 0.5 s of waiting for
    # the hotels agent's limits (agents.yaml: 5 in flight, 10 a second), the hotels service enforcing the same quota
    profile = burst_profile(
        40,
        call_wait_seconds=0.5,
        time_limit_seconds=240,
        poll_seconds=0.5,
        schedule_interval_seconds=1.0,
        log_dir=tmp_path / "logs",
    )
    output = io.StringIO()
    console = Console(file=output, width=160)

    # When they run to the end
    result = run_load(profile, console=console)
    render(result, console, title="Burst run")

    # Then every workflow completed, and the hotels service, by its own count, never served more than 5 calls at once
    # nor answered a call over its quota
    assert result.problems == [], output.getvalue()
    assert result.final_states == {"COMPLETED": 40}
    assert result.quotas == {"hotels": {"quota_in_flight": 5, "quota_rate": 10.0, "quota_burst": 10}}
    hotels = result.service_stats["hotels"]
    assert hotels["by_outcome"]["throttled"] == 0
    assert 1 <= hotels["in_flight_peak"] <= 5
    assert hotels["by_outcome"]["applied"] == 40
    # the ledger's own times say the same of the rate: no window of w seconds held more than 10 + 10 w bookings
    # (each booking is written 0.4 s after its call arrived, so the gaps between them are the gaps between calls)
    booked = sorted(record.created_at for record in result.ledger_records["hotels"] if record.effect)
    assert len(booked) == 40
    for first in range(len(booked)):
        for last in range(first, len(booked)):
            assert last - first + 1 <= 10 + 10 * (booked[last] - booked[first]) + 1, (first, last, booked)

    # And the limits deferred records, each sent again without using an attempt: every step took one attempt
    steps = result.steps()
    assert len(steps) == 120
    assert sum(step.limit_deferrals for step in steps) > 0
    assert {step.attempt for step in steps} == {1}
    assert {step.limit_deferrals for step in steps if step.name != "book_hotel"} == {0}
    figures = dict(result.figures())
    assert figures["hotels: calls over its quota (answered 429)"] == "0"
    assert figures["call-limit deferrals (sent again, no attempt used)"] == str(
        sum(step.limit_deferrals for step in steps)
    )
    # And the verdict says what was checked (a trial found only make load's line)
    said = output.getvalue()
    assert "OK: hotels (5 at once, 10/s (burst 10)) was called at most" in said
    assert "OK: every one of 120 steps took one attempt;" in said


def _burst_result(*, throttled: int, peak: int, attempts: tuple[int, ...]) -> LoadResult:
    result = LoadResult(burst_profile(len(attempts)))
    result.quotas = {"hotels": {"quota_in_flight": 5, "quota_rate": 10.0, "quota_burst": 10}}
    result.service_stats = {"hotels": {"by_outcome": {"throttled": throttled}, "in_flight_peak": peak}}
    for n, attempt in enumerate(attempts):
        step = StepState("book_hotel", "SUCCEEDED", attempt, 0, 0, 0, limit_deferrals=2)
        result.workflows[f"wf-{n}"] = WorkflowState(f"wf-{n}", "COMPLETED", steps={"book_hotel": step})
        result.workflow_ids.append(f"wf-{n}")
    return result


def test_the_burst_checks_fail_on_a_call_over_the_quota_and_on_a_second_attempt() -> None:
    # Given the outcome of a clean burst, one whose service throttled a call and served 6 at once, and one in which a
    # step took a second attempt
    clean = _burst_result(throttled=0, peak=5, attempts=(1, 1))
    over = _burst_result(throttled=1, peak=6, attempts=(1, 1))
    retried = _burst_result(throttled=0, peak=5, attempts=(1, 2))

    # When they are checked
    for result in (clean, over, retried):
        check(result)

    # Then only the clean one passes, and each problem names what went wrong
    assert clean.problems == []
    assert over.problems == [
        "hotels answered 1 call(s) over its quota (5 at once, 10/s (burst 10)) 429",
        "hotels served 6 calls at once, over 5",
    ]
    assert retried.problems == ["1 step(s) took more than one attempt in a burst without faults"]
