"""The anchor: the same saga written for AWS Step Functions Standard, and the state transitions it would bill.

`saga_asl` writes the Amazon States Language a Step Functions user would write for a chain definition, the cheapest
honest way: one ``Task`` state per step (the agent's Lambda, ``End: true`` on the last one, so no extra ``Succeed``
state), a ``Retry`` with the same call budget our definition gives the step (``max_attempts`` dispatches of
``max_attempts`` calls each), and
a ``Catch`` that enters the compensation chain: one ``Task`` per step to undo, in reverse order, each with the
compensation's retry budget, ending in a ``Fail`` state (source: the Step Functions developer guide, "Saga pattern"
and "Handling errors in Step Functions workflows").

`count_transitions` walks that ASL with what actually happened to each step in our run (how many calls the
remote service received per step and phase, whether the step completed, was rejected, or may have happened) and
counts the transitions Step Functions bills: every state entered, and every retry (AWS Step Functions pricing:
"Step Functions counts a state transition each time a step of your workflow is executed, including retries").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sasflow.definition import CompensationRetryPolicy, RetryPolicy

# The same defaults as a definition without ``retry``: the baseline gets the budget our workflows get.
DEFAULT_MAX_ATTEMPTS = RetryPolicy().max_attempts
DEFAULT_COMPENSATION_ATTEMPTS = CompensationRetryPolicy().max_attempts

TRANSIENT = "Remote.Transient"
REJECTED = "Remote.Rejected"
TIMEOUT = "States.Timeout"


@dataclass(frozen=True)
class StepObservation:
    """What happened to one step of one workflow.

    Attributes
    ----------
    ran:
        Whether the step was started at all.
    calls:
        Task attempts for the forward action: calls the remote service received, plus invocations lost before
        calling (Step Functions would see those as a failed attempt and retry).
    outcome:
        ``"ok"``, ``"rejected"`` (nothing happened) or ``"failed"`` (gave up; the action may have happened).
    compensation_calls:
        Calls made to undo the step (0 when it was not compensated).
    compensation_ok:
        Whether the compensation succeeded.
    """

    ran: bool
    calls: int
    outcome: str
    compensation_calls: int = 0
    compensation_ok: bool = True


def _task_name(step: str) -> str:
    return f"Do_{step}"


def _undo_name(step: str) -> str:
    return f"Undo_{step}"


def saga_asl(definition: dict[str, Any]) -> dict[str, Any]:
    """The ASL of a chain ``definition`` (its ``steps`` in order), as a Step Functions user would write it.

    A ``callback`` step is a ``Task`` with the ``.waitForTaskToken`` integration that hands the token to its notify
    agent (``arn:aws:states:::lambda:invoke.waitForTaskToken``, Step Functions developer guide, "Wait for a
    Callback with Task Token"); it has nothing to undo, so its ``Catch`` enters the compensation of the steps before.
    """
    steps = definition["steps"]
    states: dict[str, Any] = {}
    names = [s["name"] for s in steps]
    undoable: list[str] = []  # the steps before this one that have an Undo state, in order
    for index, step in enumerate(steps):
        retry = step.get("retry") or {}
        undo_previous = _undo_name(undoable[-1]) if undoable else "SagaFailed"
        if step.get("type") == "callback":
            notify = step.get("notify") or {}
            attempts = int(retry.get("max_attempts", 1))
            task: dict[str, Any] = {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                "Parameters": {
                    "FunctionName": f"{notify.get('agent', 'notify')}-agent",
                    "Payload": {"TaskToken.$": "$$.Task.Token", "Input.$": "$"},
                },
                "ResultPath": f"$.steps.{step['name']}",
                "TimeoutSeconds": int(step.get("timeout_seconds", 3600)),
                "Retry": [{"ErrorEquals": [TIMEOUT], "MaxAttempts": attempts - 1, "BackoffRate": 2.0}],
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": undo_previous}],
            }
            if index + 1 < len(steps):
                task["Next"] = _task_name(names[index + 1])
            else:
                task["End"] = True
            states[_task_name(step["name"])] = task
            continue
        # Our budget: max_attempts dispatches, each allowed max_attempts calls (the agent's in-attempt retries).
        per_attempt = int(retry.get("max_attempts", DEFAULT_MAX_ATTEMPTS))
        attempts = per_attempt * per_attempt
        task = {
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": f"{step['agent']}-agent", "Payload.$": "$"},
            "ResultPath": f"$.steps.{step['name']}",
            "TimeoutSeconds": int(step.get("timeout_seconds", 30)),
            "Retry": [
                {
                    "ErrorEquals": [TRANSIENT, TIMEOUT],
                    "MaxAttempts": attempts - 1,
                    "IntervalSeconds": int(retry.get("backoff_base_seconds", 1)),
                    "BackoffRate": 2.0,
                }
            ],
            "Catch": [
                # Rejected: nothing happened, undo the steps before this one.
                {"ErrorEquals": [REJECTED], "ResultPath": "$.error", "Next": undo_previous},
                # Gave up on an attempt whose effect is unknown: undo this step too.
                {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": _undo_name(step["name"])},
            ],
        }
        if index + 1 < len(steps):
            task["Next"] = _task_name(names[index + 1])
        else:
            task["End"] = True
        states[_task_name(step["name"])] = task
        compensation = step.get("compensation") or {}
        comp_retry = compensation.get("retry") or {}
        comp_attempts = int(comp_retry.get("max_attempts", DEFAULT_COMPENSATION_ATTEMPTS))
        states[_undo_name(step["name"])] = {
            "Type": "Task",
            "Resource": "arn:aws:states:::lambda:invoke",
            "Parameters": {"FunctionName": f"{step['agent']}-agent", "Payload.$": "$"},
            "ResultPath": None,
            "Retry": [{"ErrorEquals": ["States.ALL"], "MaxAttempts": comp_attempts - 1, "BackoffRate": 2.0}],
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "CompensationFailed"}],
            "Next": undo_previous,
        }
        undoable.append(step["name"])
    states["SagaFailed"] = {"Type": "Fail", "Error": "SagaCompensated"}
    states["CompensationFailed"] = {"Type": "Fail", "Error": "CompensationFailed"}
    return {
        "Comment": f"{definition['name']} v{definition.get('version', 1)}: saga with compensation",
        "StartAt": _task_name(names[0]),
        "States": states,
    }


@dataclass(frozen=True)
class StateVisit:
    """One state the walk entered: its name, type (``Task``, ``Fail``) and how many attempts it made (1 + retries).

    ``retry_intervals`` are the seconds the ``Retry`` waited before each retry (``IntervalSeconds`` times
    ``BackoffRate`` to the power of the retry's index), which an Express workflow's duration includes.
    """

    name: str
    type: str
    attempts: int = 1
    outcome: str = "ok"
    retry_intervals: tuple[float, ...] = ()


def walk(asl: dict[str, Any], observed: dict[str, StepObservation]) -> list[StateVisit]:
    """The states Step Functions would enter to run ``asl`` with the outcomes ``observed`` (by step name), in order.

    Raises
    ------
    ValueError
        When the observations do not fit the ASL (a step the walk reaches that never ran, or a loop).
    """
    states = asl["States"]
    state_name = asl["StartAt"]
    visits: list[StateVisit] = []
    for _ in range(10 * len(states)):
        state = states[state_name]
        if state["Type"] in ("Succeed", "Fail"):
            visits.append(StateVisit(state_name, state["Type"]))
            return visits
        step = state_name.split("_", 1)[1]
        fact = observed.get(step)
        retry = state["Retry"][0]
        budget = 1 + retry["MaxAttempts"]
        interval = float(retry.get("IntervalSeconds", 1))
        rate = float(retry.get("BackoffRate", 2.0))
        if state_name.startswith("Do_"):
            if fact is None or not fact.ran:
                raise ValueError(f"the walk reached {step}, which never ran")
            attempts = min(max(1, fact.calls), budget)
            waits = tuple(interval * rate**index for index in range(attempts - 1))
            visits.append(StateVisit(state_name, "Task", attempts, fact.outcome, waits))
            if fact.outcome == "ok":
                if state.get("End"):
                    return visits
                state_name = state["Next"]
                continue
            error = REJECTED if fact.outcome == "rejected" else "States.ALL"
            state_name = next(
                (c["Next"] for c in state["Catch"] if error in c["ErrorEquals"]), state["Catch"][-1]["Next"]
            )
            continue
        calls = fact.compensation_calls if fact is not None else 0
        attempts = min(max(1, calls), budget)
        failed = fact is not None and not fact.compensation_ok
        waits = tuple(interval * rate**index for index in range(attempts - 1))
        visits.append(StateVisit(state_name, "Task", attempts, "failed" if failed else "ok", waits))
        state_name = state["Catch"][0]["Next"] if failed else state["Next"]
    raise ValueError("the walk did not end")


def count_transitions(asl: dict[str, Any], observed: dict[str, StepObservation]) -> int:
    """State transitions Step Functions would bill to run ``asl`` with the outcomes ``observed`` (by step name):
    every state entered and every retry (see `walk`).

    Raises
    ------
    ValueError
        When the observations do not fit the ASL (a step the walk reaches that never ran, or a loop).
    """
    return sum(visit.attempts for visit in walk(asl, observed))
