"""System tier: a small `make load` (devstack/load.py), and how it explains dead letters and checks sagas.

The smoke run is the load run at a size for the test suite: 20 trip bookings, 20 % transient errors on every
service, a 5-second outage of hotels. Time is real here; the run bounds itself.
"""

from __future__ import annotations

import io
import json
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
    assert len(result.workflow_ids) == 20
    assert result.terminal == 20
    assert result.ledger.duplicate_effects == 0 and result.ledger.duplicate_undos == 0
    assert result.ledger.disagreements == []
    assert [letter for letter in result.dead_letters if not letter.explained] == []
    assert result.saga_mismatches == []
    assert result.outage_at_seconds is not None
    assert result.ledger.calls["transient"] > 0
    assert result.exit_code == 0
    # and the figures and the markdown table carry the measures the README reports
    measures = dict(result.figures())
    for name in ("supervisor resends", "circuit-breaker deferrals", "workflows / second", "steps dispatched"):
        assert name in measures
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
