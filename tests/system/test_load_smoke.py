"""System tier: a small `make load` (devstack/load.py), and how it explains dead letters and checks sagas.

The smoke run is the load run at a size for the test suite: 20 trip bookings, 20 % transient errors on every
service, a 5-second outage of hotels. Time is real here; the run bounds itself.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from devstack.load import (
    LedgerFacts,
    LoadProfile,
    StepState,
    WorkflowState,
    explain_dead_letter,
    render,
    run_load,
    saga_mismatches,
)


def test_small_load_run_ends_every_workflow_doubles_nothing_and_explains_every_dead_letter(tmp_path: Path) -> None:
    # Given the local stack, 20 % transient errors on every service, and a 5-second hotels outage mid-run
    profile = LoadProfile(
        workflows=20,
        outage_seconds=5,
        max_in_flight=20,
        time_limit_seconds=120,
        poll_seconds=0.5,
        schedule_interval_seconds=1.0,
        breaker_open_seconds=2,
        breaker_probe_seconds=2,
        log_dir=tmp_path / "logs",
    )
    output = io.StringIO()
    console = Console(file=output, width=160)

    # When 20 trip bookings run to the end
    result = run_load(profile, console=console)
    render(result, console)

    # Then every check passes: all terminal, no doubled effect, every dead letter explained, sagas match the ledgers
    assert result.problems == [], output.getvalue()
    assert not result.timed_out
    assert result.exit_code == 0
    assert len(set(result.workflow_ids)) == 20
    assert result.ledger.duplicate_effects == 0 and result.ledger.duplicate_undos == 0
    assert result.ledger.disagreements == []
    assert [letter for letter in result.dead_letters if not letter.explained] == []
    assert result.saga_mismatches == []
    assert result.outage_at_seconds is not None

    # And the figures say what the run did, recomputed here from the raw data it read: the final state of each
    # workflow (result.workflows) and each service's ledger records and call counts
    figures = dict(result.figures())
    finals = [result.workflows[workflow_id] for workflow_id in result.workflow_ids]
    by_status = Counter(workflow.status for workflow in finals)
    assert sum(by_status.values()) == 20, by_status
    assert figures["workflows started"] == "20 / 20"
    assert figures["workflows terminal"] == "20 / 20 (100.0 %)"
    assert {name: value for name, value in figures.items() if name.startswith("final state ")} == {
        f"final state {status}": str(n) for status, n in by_status.items()
    }
    steps = [step for workflow in finals for step in workflow.steps.values()]
    # a step was dispatched unless it was sealed SKIPPED; compensated if it went through the compensation states
    dispatched = [step for step in steps if step.status != "SKIPPED"]
    assert figures["steps dispatched"] == str(len(dispatched))
    assert figures["steps skipped (never started: the workflow unwound first)"] == str(len(steps) - len(dispatched))
    compensated = [s for s in steps if s.status in ("COMPENSATING", "COMPENSATED", "COMPENSATION_FAILED")]
    assert figures["compensations (steps compensated)"] == str(len(compensated))
    # a COMPLETED trip dispatched and completed its 3 steps; attempts and resends are the steps' own counters
    assert all(
        sorted((name, step.status) for name, step in workflow.steps.items())
        == [("book_hotel", "COMPLETED"), ("charge_card", "COMPLETED"), ("reserve_flight", "COMPLETED")]
        for workflow in finals
        if workflow.status == "COMPLETED"
    )
    assert figures["step attempts (forward dispatches)"] == str(sum(step.attempt for step in steps))
    assert figures["supervisor resends"] == str(sum(step.resends for step in steps))
    # the services' own call counts: every call, the 503s of the 20 % transient faults (some, on every service),
    # and the outage's 503s, which only hotels answered
    stats = result.service_stats
    assert figures["remote calls"] == str(sum(stats[name]["calls"] for name in ("flights", "hotels", "payments")))
    transient = {name: stats[name]["by_outcome"]["transient"] for name in stats}
    assert all(n > 0 for n in transient.values()), transient
    assert figures["remote calls answered 503 (transient fault)"] == str(sum(transient.values()))
    assert stats["flights"]["by_outcome"]["outage"] == stats["payments"]["by_outcome"]["outage"] == 0
    assert figures["remote calls answered 503 (outage)"] == str(stats["hotels"]["by_outcome"]["outage"])
    # the ledgers: one record per effect applied and per effect undone
    records = [record for name in ("flights", "hotels", "payments") for record in result.ledger_records[name]]
    effects = [record for record in records if record.kind == "response" and record.effect]
    undos = [record for record in records if record.kind == "undo"]
    assert figures["side effects applied"] == str(len(effects))
    assert figures["side effects undone (compensations applied remotely)"] == str(len(undos))
    assert figures["duplicate side effects (token applied twice)"] == "0"
    assert figures["dead-letter messages"] == str(len(result.dead_letters))
    assert figures["workflows / second"] == f"{20 / result.elapsed_seconds:.2f}"
    # and each saga left the ledgers as its final state says: a COMPLETED trip holds its three effects and no undo;
    # a COMPENSATED one undid every effect it had, in the reverse of the order they were applied
    for workflow in finals:
        applied = sorted((r for r in effects if r.workflow_id == workflow.workflow_id), key=lambda r: r.sequence)
        undone = sorted((r for r in undos if r.workflow_id == workflow.workflow_id), key=lambda r: r.sequence)
        if workflow.status == "COMPLETED":
            assert ([r.step for r in applied], undone) == (["reserve_flight", "book_hotel", "charge_card"], [])
        elif workflow.status == "COMPENSATED":
            assert [r.step for r in undone] == [r.step for r in reversed(applied)], workflow.workflow_id
    assert "| workflows terminal | 20 / 20 (100.0 %) |" in result.markdown()


# ------------------------------------------------------------------------------------------------ dead letters


def _workflow(status: str, **steps: tuple[str, int, int]) -> WorkflowState:
    """A final state: step name -> (status, attempt, comp_attempt)."""
    return WorkflowState(
        workflow_id="wf-1",
        status=status,
        steps={
            name: StepState(name=name, status=s, attempt=a, comp_attempt=c, resends=0, deferrals=0)
            for name, (s, a, c) in steps.items()
        },
    )


def _message(kind: str = "step.request", *, phase: str = "action", attempt: int = 1, step: str = "book_hotel") -> Any:
    body = {"kind": kind, "workflow_id": "wf-1", "step": step, "phase": phase, "attempt": attempt}
    return {"MessageId": "m-1", "Body": json.dumps(body), "Attributes": {"ApproximateReceiveCount": "5"}}


@pytest.mark.parametrize(
    ("workflow", "message", "reason"),
    [
        (
            _workflow("COMPLETED", book_hotel=("COMPLETED", 2, 0)),
            _message(attempt=1),
            "stale request: attempt 1 superseded by attempt 2 (workflow COMPLETED)",
        ),
        (
            _workflow("COMPLETED", book_hotel=("COMPLETED", 1, 0)),
            _message("step.reply", attempt=1),
            "stale reply: attempt 1 already settled COMPLETED (workflow COMPLETED)",
        ),
        (
            _workflow("COMPENSATED", book_hotel=("COMPENSATED", 1, 1)),
            _message(attempt=1),
            "stale request: the step went on to compensation (workflow COMPENSATED)",
        ),
        (
            _workflow("COMPENSATED", book_hotel=("COMPENSATED", 1, 3)),
            _message(phase="compensation", attempt=2),
            "stale request: attempt 2 superseded by attempt 3 (workflow COMPENSATED)",
        ),
    ],
)
def test_a_dead_letter_for_an_attempt_its_terminal_workflow_left_behind_is_explained(
    workflow: WorkflowState, message: Any, reason: str
) -> None:
    # Given a terminal workflow / When a dead letter names an attempt that is no longer in flight
    letter = explain_dead_letter("HotelsDeadLetterQueue", message, {"wf-1": workflow})
    # Then it is explained, with why
    assert (letter.explained, letter.reason, letter.receive_count) == (True, reason, 5)


@pytest.mark.parametrize(
    ("workflows", "message", "reason"),
    [
        ({}, _message(), "request for an unknown workflow"),
        (
            {"wf-1": _workflow("RUNNING", book_hotel=("PROCESSING", 1, 0))},
            _message(),
            "request for a workflow still RUNNING",
        ),
        (
            {"wf-1": _workflow("COMPLETED", reserve_flight=("COMPLETED", 1, 0))},
            _message(),
            "request for a step the workflow never dispatched",
        ),
        (
            {"wf-1": _workflow("COMPLETED", book_hotel=("COMPLETED", 1, 0))},
            _message(phase="compensation"),
            "compensation request for a step never compensated",
        ),
        (
            {"wf-1": _workflow("COMPLETED", book_hotel=("COMPLETED", 1, 0))},
            _message(attempt=2),
            "request for attempt 2, but the step is COMPLETED at attempt 1 (workflow COMPLETED)",
        ),
        ({"wf-1": _workflow("COMPLETED")}, {"MessageId": "m-2", "Body": "not json"}, "not a step request or reply"),
    ],
)
def test_a_dead_letter_the_final_state_cannot_account_for_is_unexplained(
    workflows: dict[str, WorkflowState], message: Any, reason: str
) -> None:
    # Given a final state that does not settle the message's attempt / When the dead letter is explained
    letter = explain_dead_letter("HotelsDeadLetterQueue", message, workflows)
    # Then it is not, and the run would fail
    assert (letter.explained, letter.reason) == (False, reason)


# ------------------------------------------------------------------------------------------------ sagas


def test_a_saga_whose_final_state_disagrees_with_the_ledgers_is_reported() -> None:
    # Given three finished sagas and the effects the services hold
    completed = _workflow("COMPLETED", reserve_flight=("COMPLETED", 1, 0), book_hotel=("COMPLETED", 1, 0))
    completed.workflow_id = "done"
    compensated = _workflow("COMPENSATED", reserve_flight=("COMPENSATED", 1, 1), book_hotel=("FAILED", 3, 0))
    compensated.workflow_id = "undone"
    failed = _workflow("COMPENSATION_FAILED", reserve_flight=("COMPENSATION_FAILED", 1, 5))
    failed.workflow_id = "stuck"
    facts = LedgerFacts(
        live={
            ("done", "reserve_flight"): True,
            ("done", "book_hotel"): False,  # undone although the saga completed
            ("undone", "reserve_flight"): True,  # still live although the saga was compensated
            ("stuck", "reserve_flight"): True,  # allowed: it waits for a person
            ("ghost", "charge_card"): True,  # a workflow the state table does not know
        }
    )
    # When the sagas are compared with the ledgers
    problems = saga_mismatches({w.workflow_id: w for w in (completed, compensated, failed)}, facts)
    # Then each disagreement is named, and COMPENSATION_FAILED is not one
    assert problems == [
        "done COMPLETED but no live effect for ['book_hotel']",
        "undone COMPENSATED but effects still live for ['reserve_flight']",
        "effect for unknown workflow ghost step charge_card",
    ]
