"""The console's operator actions: which ones a workflow's page offers, and what each will do (its preview).

The actions are the API's (``POST /ops/workflows/{id}/{action}``, ``transitions/operator.py``); the console only
offers the ones that apply to the workflow as it was read, and says in words what the API will do before the operator
confirms. The API still decides: a workflow that moved on between the page and the confirmation is refused there,
and the console shows that refusal as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ACTIONS", "NOT_GIVEN", "Action", "Offer", "fingerprint", "offered", "preview"]

#: A form whose JSON field was left empty: nothing is sent for it (the retry keeps its input; a skip sends no output).
NOT_GIVEN: Any = object()

#: A workflow in these statuses has ended: nothing is left to act on.
TERMINAL = ("COMPLETED", "COMPENSATED", "CANCELLED")


@dataclass(frozen=True)
class Action:
    """One operator action as the console offers it.

    ``value`` names the JSON the form edits (a retry's ``input``, a skip's or an approval's ``output``; None: none),
    ``step`` which step it needs (``failed``: a FAILED step of a HELD workflow, required; ``callback``: a callback
    step waiting for its answer, required; ``compensation``: a step whose compensation failed; ``""``: the workflow
    as a whole); ``code`` whether it takes an error code (a rejection).
    """

    name: str
    title: str
    value: str | None = None
    step: str = ""
    code: bool = False


ACTIONS: Mapping[str, Action] = {
    action.name: action
    for action in (
        Action("approve", "Approve a callback step", value="output", step="callback"),
        Action("reject", "Reject a callback step", step="callback", code=True),
        Action("retry", "Retry a failed step", value="input", step="failed"),
        Action("skip", "Skip a failed step with an output", value="output", step="failed"),
        Action("compensate", "Compensate now"),
        Action("retry-compensation", "Retry a failed compensation", step="compensation"),
        Action("resolve", "Resolve a failed compensation by hand", step="compensation"),
        Action("pause", "Pause"),
        Action("resume", "Resume"),
        Action("cancel", "Cancel"),
    )
}


@dataclass(frozen=True)
class Offer:
    """A button of the workflow's page: an action, on a step or on the workflow."""

    action: str
    step: str | None
    label: str


def _failed(view: Mapping[str, Any]) -> list[str]:
    return [s["name"] for s in view["steps"] if s["status"] == "FAILED"]


def _compensation_failed(view: Mapping[str, Any]) -> list[str]:
    return [s["name"] for s in view["steps"] if s.get("compensation_status") == "COMPENSATION_FAILED"]


def offered(view: Mapping[str, Any]) -> list[Offer]:
    """The actions that apply to the workflow as ``view`` shows it, in the order on-call reaches for them."""
    status = view["status"]
    offers: list[Offer] = []
    if status in TERMINAL:
        return offers
    if status in ("RUNNING", "HELD"):
        for step in view["steps"]:
            if step.get("type") == "callback" and step["status"] == "PROCESSING" and step.get("task_token"):
                name = step["name"]
                offers += [Offer("approve", name, f"Approve {name}"), Offer("reject", name, f"Reject {name}")]
    if status == "HELD":
        for step in _failed(view):
            offers += [Offer("retry", step, f"Retry {step}"), Offer("skip", step, f"Skip {step}")]
    if status == "COMPENSATION_FAILED":
        for step in _compensation_failed(view):
            offers += [
                Offer("retry-compensation", step, f"Retry the compensation of {step}"),
                Offer("resolve", step, f"Resolve the compensation of {step}"),
            ]
    if status in ("RUNNING", "HELD"):
        offers += [Offer("compensate", None, "Compensate now"), Offer("cancel", None, "Cancel")]
    if status == "QUEUED":  # waiting for its tenant's slot: it has done nothing, so it can only be cancelled
        offers.append(Offer("cancel", None, "Cancel"))
    offers.append(Offer("resume", None, "Resume") if view.get("paused") else Offer("pause", None, "Pause"))
    return offers


def fingerprint(action: str, view: Mapping[str, Any], step: str | None) -> str:
    """What the preview of ``action`` was decided on, as a string: the same string at the confirmation means the
    workflow is still as previewed. A retry or a skip: the step's status and attempt; an answer to a callback: the
    task token of the attempt previewed (a new attempt has another); a failed compensation: its status and attempt;
    anything else: the workflow's status and whether it is paused."""
    found: Mapping[str, Any] = next((s for s in view["steps"] if s["name"] == step), {}) if step else {}
    whole = f"{view['status']}:{bool(view.get('paused'))}"
    if action in ("retry", "skip"):
        return f"{whole}:{found.get('status')}:{found.get('attempt')}"
    if action in ("approve", "reject"):
        return str(found.get("task_token") or "not waiting")
    if action in ("retry-compensation", "resolve"):
        return f"{whole}:{found.get('compensation_status')}:{found.get('compensation_attempt')}"
    return whole


def _names(steps: Sequence[str]) -> str:
    return ", ".join(steps) if steps else "none"


def preview(
    action: str, view: Mapping[str, Any], step: str | None, value: Any, edited: bool, *, code: str = "REJECTED"
) -> list[str]:
    """What ``action`` will do to the workflow of ``view``, in sentences (the preview before the confirmation).

    ``value`` is the JSON the form carries (a retry's input, a skip's output; ``NOT_GIVEN`` when its field was left
    empty), ``edited`` whether a retry's input differs from the one the step's attempts got.
    """
    given = value is not NOT_GIVEN
    steps = view["steps"]
    in_flight = [s["name"] for s in steps if s["status"] == "PROCESSING"]
    # what may have happened and has something to undo (a wait and a callback have none), last started first
    undoable = [s for s in steps if s.get("type") not in ("wait", "callback")]
    undone = [
        *reversed([s["name"] for s in undoable if s["status"] == "PROCESSING"]),
        *reversed([s["name"] for s in undoable if s["status"] == "COMPLETED"]),
    ]
    waiting = [s["name"] for s in steps if step in (s.get("depends_on") or [])]  # the steps that wait for it
    status = view["status"]
    said: list[str]
    if action == "retry":
        which = "the edited input below" if edited else "the same input as before"
        said = [
            f"Step {step} runs again with a new budget of attempts, with {which}.",
            "The workflow leaves HELD and goes on RUNNING; the steps that wait for it run when it completes.",
        ]
    elif action == "skip":
        output = "the output below" if given else "no output (refused if a later step reads it)"
        said = [
            f"Step {step} is marked COMPLETED with {output}, without calling its service again.",
            f"The steps that wait for it run next: {_names(waiting)}."
            if waiting
            else "No step waits for it: the workflow completes once its other steps have.",
            "If the workflow unwinds later, the step's compensation (if it has one) runs with this output.",
        ]
    elif action == "approve":
        output = "the output below" if given else "no output (null)"
        said = [
            f"The callback step {step} is answered as approved: it completes with {output}.",
            f"The steps that wait for it run next: {_names(waiting)}.",
            "Its task token is then used: a different answer to it is refused (409).",
        ]
    elif action == "reject":
        said = [
            f"The callback step {step} is answered as rejected: it fails at once with CALLBACK_FAILED (cause {code}, "
            "your reason as its message). A rejection is final: its retry policy does not wait for another answer.",
            "The workflow then unwinds (its completed steps compensated), or is held under the hold policy.",
        ]
    elif action == "compensate":
        said = [
            f"The workflow unwinds now ({status} → COMPENSATING): no new step starts.",
            f"What may have happened by then is compensated, the last started first and independent steps at once; "
            f"now that is {_names(undone)} (task and map steps; a wait or a callback has nothing to undo).",
            "It ends COMPENSATED, or COMPENSATION_FAILED if a compensation fails.",
        ]
    elif action == "cancel" and status == "QUEUED":
        said = [
            "The workflow is cancelled at once (QUEUED → CANCELLED): it never started, so nothing is compensated.",
            "It leaves its tenant's queue; the workflows queued behind it move up.",
        ]
    elif action == "cancel":
        said = [
            f"The workflow is cancelled ({status} → CANCELLING): no new step starts.",
            f"What may have happened by then is compensated, the last started first and independent steps at once; "
            f"now that is {_names(undone)} (task and map steps; a wait or a callback has nothing to undo).",
            "It ends CANCELLED, or COMPENSATION_FAILED if a compensation fails.",
        ]
    elif action == "retry-compensation":
        said = [
            f"The compensation of step {step} runs again with a new budget of attempts and time.",
            "The workflow goes on COMPENSATING; it ends COMPENSATED when every compensation is done, or "
            "COMPENSATION_FAILED again if this one fails again.",
        ]
    elif action == "resolve":
        others = [s for s in _compensation_failed(view) if s != step]
        said = [
            f"The compensation of step {step} is marked done by hand: nothing is called. Its compensation output "
            "says who resolved it and why.",
            "The workflow ends COMPENSATED."
            if not others
            else f"Other compensations still failed ({_names(others)}): the workflow stays COMPENSATION_FAILED.",
        ]
    elif action == "pause":
        said = [
            "No new step is dispatched until the workflow is resumed.",
            f"Replies and timeouts of the steps in flight are still handled: {_names(in_flight)}.",
        ]
    else:  # resume
        said = ["Dispatches start again: what waited is dispatched now (a failed step of a paused workflow retried)."]
    if view.get("paused") and action not in ("pause", "resume"):
        said.append("The workflow is paused: what this starts is dispatched only once it is resumed.")
    return said
