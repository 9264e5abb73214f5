"""The invariants a finished simulation must satisfy, checked against DynamoDB, the queues and the remote ledgers.

1. Every workflow is terminal (within the bounded number of supervisor ticks the loop allows).
2. Each remote effect is applied at most once per token, and undone at most once.
3. COMPLETED: every step completed, its effect applied exactly once, and nothing compensated.
4. COMPENSATED / CANCELLED: every step whose action happened was compensated exactly once, in reverse dependency
   order (no step before the later steps that depend on it); nothing we recorded as "did not happen" happened.
5. COMPENSATION_FAILED: only after a step's compensation retries were exhausted (or its compensation refused).
6. The sparse deadline index: a step is in flight iff it has complete_by and dl_shard; a workflow has a stall
   deadline iff it is not terminal; a terminal workflow has no step in flight.
7. Every message is consumed or in a dead-letter queue, and each dead-letter entry belongs to a terminal workflow,
   so it was not needed (nothing was silently dropped).
8. The stall safety net never had to rescue a workflow unless one of its messages went to a dead-letter queue:
   otherwise progress was lost between writers (for example two concurrent replies of parallel steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sasflow.adapters.dynamodb_store import unpack_definition
from sasflow.messages import remote_token

if TYPE_CHECKING:
    from simulation.run import Simulation

TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}
IN_FLIGHT = {"PROCESSING", "COMPENSATING"}


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its kind, the workflow (if any) and what was seen."""

    kind: str
    workflow_id: str
    detail: str


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in item.items():
        kind, raw = next(iter(value.items()))
        out[key] = int(raw) if kind == "N" else raw
    return out


def check_invariants(sim: Simulation) -> list[Violation]:
    """Check every invariant; return the violations (empty when the run is correct)."""
    from simulation.run import _scan

    violations: list[Violation] = []
    items = [_plain(i) for i in _scan(sim.dynamodb_checker(), sim.physical["StateTable"])]
    workflows = {i["workflow_id"]: i for i in items if i.get("entity") == "workflow"}
    steps: dict[str, dict[str, dict[str, Any]]] = {}
    for item in items:
        if item.get("entity") == "step":
            steps.setdefault(item["workflow_id"], {})[item["step"]] = item

    effects = {token: effect for remote in sim.remotes.values() for token, effect in remote.effects.items()}
    for remote in sim.remotes.values():
        for token, count in remote.applications.items():
            if count > 1:
                violations.append(Violation("duplicate effect", remote.effects[token].workflow_id, token))
        for effect in remote.effects.values():
            if len(effect.undone_by) > 1:
                violations.append(Violation("effect undone twice", effect.workflow_id, effect.token))

    if len(workflows) != sim.workflows:
        violations.append(Violation("workflow count", "-", f"{len(workflows)} stored, {sim.workflows} started"))

    for workflow_id, workflow in workflows.items():
        status = workflow["status"]
        definition = unpack_definition(workflow["definition_z"])
        records = steps.get(workflow_id, {})
        if status not in TERMINAL:
            violations.append(Violation("not terminal", workflow_id, status))
            continue
        if "complete_by" in workflow or "dl_shard" in workflow:
            violations.append(Violation("terminal workflow still in the deadline index", workflow_id, status))
        for name, record in records.items():
            in_index = "complete_by" in record and "dl_shard" in record
            if (record["status"] in IN_FLIGHT) != in_index:
                violations.append(Violation("deadline index out of step", workflow_id, f"{name} {record['status']}"))
            if record["status"] in IN_FLIGHT:
                violations.append(Violation("step in flight in a terminal workflow", workflow_id, name))

        happened = {
            step.name: effects.get(remote_token(workflow_id, step.name, step.action)) for step in definition.steps
        }
        if status == "COMPLETED":
            for step in definition.steps:
                finished = records.get(step.name)
                if finished is None or finished["status"] != "COMPLETED":
                    violations.append(Violation("COMPLETED with an unfinished step", workflow_id, step.name))
                applied = happened[step.name]
                if applied is None:
                    violations.append(Violation("COMPLETED step without its effect", workflow_id, step.name))
                elif applied.undone_by:
                    violations.append(Violation("COMPLETED workflow was compensated", workflow_id, step.name))
            continue

        for step in definition.steps:
            stored = records.get(step.name, {})
            done = happened[step.name]
            if done is not None and stored.get("status") == "FAILED" and not stored.get("may_have_happened"):
                violations.append(Violation("effect happened but was recorded as not", workflow_id, step.name))

        if status in ("COMPENSATED", "CANCELLED"):
            for step in definition.steps:
                done = happened[step.name]
                if done is not None and step.compensation is not None and len(done.undone_by) != 1:
                    violations.append(Violation("happened but not compensated exactly once", workflow_id, step.name))
        if status == "COMPENSATION_FAILED":
            exhausted = []
            for step in definition.steps:
                stored = records.get(step.name, {})
                if stored.get("status") != "COMPENSATION_FAILED":
                    continue
                assert step.compensation is not None
                error = json.loads(stored.get("error") or "{}")
                if stored.get("comp_attempt", 0) >= step.compensation.retry.max_attempts or error.get("code") in (
                    "REJECTED",
                    "ALREADY_COMPENSATED",
                ):
                    exhausted.append(step.name)
            if not exhausted:
                violations.append(Violation("COMPENSATION_FAILED before retries were exhausted", workflow_id, ""))

        # Reverse dependency order: a step is undone only after every later step that depends on it.
        descendants = definition.descendants
        for step in definition.steps:
            undone = happened[step.name]
            if undone is None or not undone.undone_by:
                continue
            for later in descendants[step.name]:
                later_effect = happened[later]
                if later_effect is None or definition.step(later).compensation is None:
                    continue
                if not later_effect.undone_by or later_effect.undone_by[0] > undone.undone_by[0]:
                    violations.append(
                        Violation("compensated before a later step", workflow_id, f"{step.name} before {later}")
                    )

    dead_lettered = {
        _workflow_of(m.body)
        for spec in sim.queues.specs.values()
        if spec.dead_letter_url is None
        for m in sim.queues.messages[spec.url]
    }
    for workflow_id in sorted(sim.rescued - dead_lettered):
        violations.append(Violation("rescued by the stall safety net without a dead letter", workflow_id, ""))

    for spec in sim.queues.specs.values():
        pending = sim.queues.messages[spec.url]
        if spec.dead_letter_url is not None and pending:
            violations.append(Violation("messages left unconsumed", "-", f"{len(pending)} in {spec.url}"))
        if spec.dead_letter_url is None:
            for message in pending:
                workflow_id = _workflow_of(message.body)
                if workflow_id is None or workflows.get(workflow_id, {}).get("status") not in TERMINAL:
                    violations.append(Violation("unexplained dead letter", workflow_id or "-", message.body[:120]))
    return violations


def _workflow_of(body: str) -> str | None:
    try:
        return str(json.loads(body)["workflow_id"])
    except (ValueError, KeyError, TypeError):
        return None
