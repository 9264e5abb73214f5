"""The invariants a finished simulation must satisfy, checked against DynamoDB, the queues and the remote ledgers.

1. Every workflow is terminal (within the bounded number of supervisor ticks the loop allows).
2. Each remote effect is applied at most once per token, and undone at most once.
3. COMPLETED: every step completed, its effect applied exactly once, and nothing compensated.
4. COMPENSATED / CANCELLED: every step whose action happened was compensated exactly once, in reverse dependency
   order (no step before the later steps that depend on it); nothing we recorded as "did not happen" happened.
5. COMPENSATION_FAILED: only after a step's compensation retries were exhausted (or its compensation refused).
6. The sparse deadline index: a workflow item carries ``dl_shard`` and ``complete_by`` iff it is not terminal (and
   not waiting for a person with no timeout), and ``complete_by`` is then no later than the earliest complete-by of
   its steps in flight (DESIGN Rule 3: a lower bound, so the supervisor never finds a step overdue late); a step
   has a complete-by iff it is in flight; a terminal workflow has no step in flight.
7. Every message is consumed or in a dead-letter queue, and each dead-letter entry belongs to a terminal workflow,
   so it was not needed (nothing was silently dropped).
8. The safety net (the supervisor advancing a workflow that is not terminal with nothing in flight) never had to
   rescue a workflow unless one of its messages went to a dead-letter queue: otherwise progress was lost between
   writers (for example two concurrent replies of parallel steps).
9. No update is lost: DynamoDB accepted at most one write of each version of a workflow. Two writers that read the
   same version cannot both commit (the write is conditional on the version), so the second decides again from the
   first one's result instead of overwriting it.
10. Every unwind is explained by the faults injected into that workflow: the step that made it unwind was refused
    by its service (a business rejection was injected for it), a map step had more children end without completing
    (by themselves, not unwound by it) than it tolerates, a child was unwound by its parent, or every attempt it
    used was touched by a fault that can make an attempt fail (a crash in its invocation, a lost or delayed message
    of it, a remote failure of its calls, an invocation killed after its effect...). An unwind with an attempt that
    failed by itself is the product's doing: the trip was undone although nothing forced it.
11. A reply applies only to the attempt it answers, with one exception: in a write of the scheduler, a step in
    flight changes only when the batch holds a reply to its current attempt of its current phase, or a success of
    an earlier attempt of its action under the current token (after the step's last operator retry) that completes
    it. No failure reply of an earlier attempt moves a step (it is acknowledged and changes nothing), and an
    earlier success is accepted only with the current token. Checked on every write as it happens
    (``Simulation.stale_applied``).
12. While a workflow stays paused nothing new starts: no step leaves PENDING and no compensation begins (checked
    on every write, ``Simulation.paused_moved``).
13. Operators: what a person did is accounted for. A step an operator skipped is COMPLETED without needing its
    effect; a compensation an operator resolved by hand needs no undo; an unwind an operator asked for
    ("compensation requested by an operator") has its audited event; a workflow under the hold policy unwinds
    after a step failure only once its hold timeout has passed (or an operator asked), never at once.
14. Conditions: a step whose ``when`` is false (evaluated here, with jmespath, on the workflow's input) never
    has an effect and is SKIPPED; one whose condition is true is never SKIPPED by it (the history's ``skipped``).
    A COMPLETED workflow has every step COMPLETED, or SKIPPED by a false condition.
15. Waits: a wait step resumes no earlier than its time (dispatch + ``seconds``, or its ``until``), at most a few
    supervisor ticks after it (`WAIT_LATE_SECONDS`), and no step that depends on it starts before it resumed. A
    COMPLETED workflow's waits all resumed; a wait ends otherwise only because its workflow unwound (``UNWOUND``).
16. Callbacks: a task token is applied at most once (one 200 for a success or a failure, and one callback event in
    its history; the same answer sent again is 200 and applies nothing), only to the attempt it
    was issued for (its history has the reply of that attempt), and what was applied is what the step kept: a
    callback step COMPLETED holds the output of its token's applied success, and none completed without one.
    An answer an operator gave (``POST /ops/callbacks/{token}``) is audited once in the history (an
    ``operator_action`` approve or reject naming the step, however often it was sent), and an owner's answer not.
17. Map steps: every child is terminal when its parent is, and none is orphaned (each stored child belongs to a
    stored parent's map step, which started it). A COMPLETED map step counts its children as they ended (succeeded
    = the children COMPLETED, at most ``tolerated_failure`` not), and its ``results`` are their outputs; under an
    unwound parent (COMPENSATED, CANCELLED) no child is left COMPLETED: each unwound with it (children are
    workflows, so invariants 2 to 16 hold for each of them too). A child has no TTL while its parent may still
    compensate it (the parent is not terminal: checked on every write, ``Simulation.child_expiring``, and at the
    end), and its parent's ``expires_at`` once the parent is terminal.
18. Claim-checked payloads: no payload object is missing while its workflow may still read it. Every read of one
    that found no object is a violation as it happens (``Simulation.payload_missing``); at the end every reference
    a workflow's item holds (its input, its steps' outputs) names an object of the payload bucket whose bytes match
    its SHA-256, and no step failed with ``CLAIM_CHECK_MISSING``. And none outlives its workflow's retention: every
    object of an ended workflow is tagged ``claim-check=terminal`` (the bucket's lifecycle rule expires those after
    ``TerminalRetentionDays``), and every object sits under the prefix of a workflow that exists, or expires (tagged
    ``pending``: written before a workflow item that never came to name it; or ``terminal``); and none a workflow's
    item names is still ``pending`` (the bucket's rule would expire it under the workflow).
19. Poison messages: a message no handler can read (``Faults.poison_message``) ends in its queue's dead-letter queue,
    never consumed and never lost, and without waiting out visibility timeouts on the way: after each receive whose
    handler returned (with the record as a batch-item failure), the next receive (or the move to the dead-letter
    queue) comes within `POISON_REDELIVERY_SECONDS` of that return. A receive whose invocation died or whose poller
    was lost is not held to it: SQS hides the message for the visibility timeout then, whatever the handler does.
    Its dead letter explains itself: it belongs to no workflow.
20. Triggers (``simulation/triggers.py``; the seed drives the schedule or, one seed in five, the event trigger):
    exactly one workflow per occurrence (a tick's time, an event's id). No two workflows carry the same trigger and
    occurrence; every workflow a trigger started belongs to a tick or event that was sent; every one sent has its
    workflow, or waits in the trigger's dead-letter queue (its deliveries failed five receives: an operator
    redrives it, and it starts the same workflow), or was skipped because an operator had paused the trigger, or
    missed because it was handled later than the trigger's catch-up window (never within it); a tick
    handled while the trigger was paused starts nothing (checked at every handler call); an operator's run-now is an
    occurrence of its own, one workflow however often it is sent with its Idempotency-Key, and an event trigger's is
    refused (409). Every message that is not a tick (or not an event) is in that dead-letter queue,
    refused with its code and reason (or as it was, after five failed receives), and started nothing; nothing a
    trigger could start was refused. Overlap (the seed's, ``run.SIM_OVERLAPS``): under skip and buffer_one no two
    of the trigger's runs ever ran at once (checked as each run is first seen: of two runs, the one created first
    has ended); a tick kept waiting (buffer_one) started its workflow, unless it still waits behind a run that has
    not ended; and at the end no slot is held by a run that has ended, nor a tick kept waiting behind none.
21. Call limits (issue 38; the hotels agent, at ``run.SIM_CALL_LIMITS``): as each call to a limited service starts,
    the units its instances believe they hold (each by its own skewed clock, within its lease less the guard) are
    never more than ``max_in_flight`` together (``Simulation.limit_violations``); the calls the service received, in
    every window that starts at a call (1, 10 and 60 s), are never more than ``burst + rate * window``; and no unit
    leaks: at the end no instance counts a call in flight or a record waiting, and once the longest lease and its
    guard have passed, a new instance is given every unit (the leases of crashed instances lapsed).
22. Tenants (issue 39; ``Faults.tenancy``): after every start of a definition with ``tenancy``, and at every
    supervisor tick, the workflows of each tenant that have not ended (``ENDED_RUN``) are never more than its
    ``max_running`` (``Simulation.tenant_violations``); a start refused with 429 wrote no workflow (the workflow
    count: the stored workflows are the starts less the refused ones); and no slot leaks:
    at the end every such workflow holds a slot of its tenant, and, once a holder's grace and the pruning period
    have passed, a start of a tenant below its limit takes a slot (slots whose give-back was lost are found).
    Half the runs queue the starts over the limit (``over_limit: queue``, ``Simulation.tenant_queue``): a QUEUED
    workflow counts as not running; a tenant's queue starts its workflows in ticket order (no ticket started while
    a lower one still waits) and each once (one ``dequeued`` event), checked as it goes; at the end no workflow is
    still QUEUED and no queue entry is left.
23. Batches (issue 40; ``Faults.operator_batch``): no workflow is acted on twice by one batch (at most one
    operator action naming the batch in its history), whatever crashed, was delivered twice or overlapped (the
    supervisor, single actions, other batches); every workflow a batch acted on is one its pages claimed (the lineage
    is true), and every ``done`` outcome has its action in the workflow's history (outcomes are read, not assumed);
    every batch ended (COMPLETED or CANCELLED) once its queue drained, all its pages settled, and its counts are the
    sums of its pages' outcomes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
import jmespath

from sasflow.adapters.batch_dynamodb import DynamoDBBatchStore
from sasflow.adapters.dynamodb_store import DEADLINE_INDEX, WORKFLOW_PREFIX
from sasflow.adapters.limits_dynamodb import DynamoDBLimitsStore
from sasflow.adapters.tenancy_dynamodb import DynamoDBTenantSlotStore
from sasflow.adapters.trigger_dynamodb import DynamoDBTriggerStore
from sasflow.api_models import events_of
from sasflow.batches import Counts
from sasflow.call_limits import allocate
from sasflow.callbacks import task_token
from sasflow.claim_check import REFERENCE_KEY, is_reference
from sasflow.definition import CallbackStep, MapStep, TaskStep, WaitStep
from sasflow.errors import TenantLimitError
from sasflow.fanout import child_id
from sasflow.messages import remote_token
from sasflow.records import Snapshot, StepRecord
from sasflow.states import ENDED_RUN, WorkflowStatus
from sasflow.tenancy import HOLDER_GRACE_SECONDS, PRUNE_SECONDS, TenantGate
from sasflow.transitions.base import HOLD_TIMEOUT_SUFFIX
from sasflow.triggers import Message, TriggerRefusedError, trigger_input

if TYPE_CHECKING:
    from simulation.run import Simulation

TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}
#: Invariant 19: the longest a poison message may wait after the handler of a receive returned (seconds). Other
#: invocations move the simulated clock meanwhile (an agent's backoff, a client's retried start), so not 0; a third
#: of the template's visibility timeout (180 s), so a message left hidden for it is caught.
POISON_REDELIVERY_SECONDS = 60
#: The scheduler's reason for unwinding: "step X failed: CODE" or "step X timed out after N attempt(s)".
_UNWIND_REASON = re.compile(r"^step (?P<step>[A-Za-z][A-Za-z0-9_]*) (?:failed: (?P<code>\S+)|timed out after)")
#: The simulated services' business refusal (``SimRemote``); anything else that fails a step is transient.
_BUSINESS_REJECTION = "REJECTED"


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its kind, the workflow (if any) and what was seen."""

    kind: str
    workflow_id: str
    detail: str


def check_invariants(sim: Simulation) -> list[Violation]:
    """Check every invariant; return the violations (empty when the run is correct)."""
    violations: list[Violation] = []
    as_stored = {s.workflow.workflow_id: s for s in sim.stored_workflows()}
    violations.extend(sim.payload_missing)
    violations.extend(_payload_violations(sim, as_stored))
    snapshots = _resolved_inputs(sim, as_stored)  # the other invariants read the workflow input itself
    pages = (
        sim.dynamodb_checker()
        .get_paginator("scan")
        .paginate(TableName=sim.physical["StateTable"], IndexName=DEADLINE_INDEX)
    )
    index_keys = {
        item["pk"]["S"][len(WORKFLOW_PREFIX) :]: int(item["complete_by"]["N"])
        for page in pages
        for item in page["Items"]
    }

    effects = {token: effect for remote in sim.remotes.values() for token, effect in remote.effects.items()}
    for remote in sim.remotes.values():
        for token, count in remote.applications.items():
            if count > 1:
                violations.append(Violation("duplicate effect", remote.effects[token].workflow_id, token))
        for effect in remote.effects.values():
            if len(effect.undone_by) > 1:
                violations.append(Violation("effect undone twice", effect.workflow_id, effect.token))

    started = sum(1 for s in snapshots.values() if s.workflow.parent is None and s.workflow.trigger is None)
    accepted = sim.workflows - len(sim.tenant_refused)
    if started != accepted:
        violations.append(
            Violation(
                "workflow count", "-", f"{started} stored, {accepted} started ({len(sim.tenant_refused)} refused)"
            )
        )
    violations.extend(_tenant_violations(sim, snapshots))
    violations.extend(_map_violations(snapshots))
    violations.extend(_poison_violations(sim))
    violations.extend(trigger_violations(sim, snapshots))
    violations.extend(_batch_violations(sim, snapshots))

    for workflow_id, snapshot in snapshots.items():
        status = snapshot.workflow.status.value
        definition = snapshot.workflow.definition
        records = {name: _fields(record) for name, record in snapshot.steps.items()}
        for name, record in snapshot.steps.items():
            if record.in_flight != (record.complete_by is not None):
                violations.append(Violation("complete-by out of step", workflow_id, f"{name} {record.status.value}"))
        key = index_keys.get(workflow_id)
        if (key is None) != (snapshot.deadline is None) or (key is not None and key > (snapshot.deadline or 0)):
            violations.append(Violation("deadline index out of step", workflow_id, f"{key} {snapshot.deadline}"))
        if status not in TERMINAL:
            violations.append(Violation("not terminal", workflow_id, status))
            continue
        for name, record in snapshot.steps.items():
            if record.in_flight:
                violations.append(Violation("step in flight in a terminal workflow", workflow_id, name))

        happened = {step.name: _effect_of(effects, workflow_id, step, snapshot) for step in definition.steps}
        conditions = _conditions(snapshot)
        violations.extend(_condition_violations(snapshot, conditions, happened))
        violations.extend(_wait_violations(snapshot, sim.config_grace()))
        violations.extend(_callback_violations(snapshot, sim.callbacks_applied, sim.callbacks_maybe))
        violations.extend(_operator_answer_violations(snapshot, sim.operator_answers))
        audited = [e.detail or {} for e in events_of(snapshot) if e.kind == "operator_action"]
        skipped = {d.get("step") for d in audited if d.get("action") == "skip"}
        resolved = {
            name
            for name, record in snapshot.steps.items()
            if isinstance(record.comp_output, dict) and "resolved_by" in record.comp_output
        }
        if status == "COMPLETED":
            for step in definition.steps:
                finished = records.get(step.name)
                if conditions.get(step.name) is False:
                    continue  # invariant 14 checks it is SKIPPED
                if finished is None or finished["status"] != "COMPLETED":
                    violations.append(Violation("COMPLETED with an unfinished step", workflow_id, step.name))
                if not hasattr(step, "action"):
                    continue  # a wait: no effect (invariant 15)
                applied = happened[step.name]
                if applied is None:
                    if step.name not in skipped:
                        violations.append(Violation("COMPLETED step without its effect", workflow_id, step.name))
                elif applied.undone_by:
                    violations.append(Violation("COMPLETED workflow was compensated", workflow_id, step.name))
            continue

        for step in definition.steps:
            stored = records.get(step.name, {})
            done = happened[step.name]
            if done is not None and stored.get("status") == "FAILED" and not stored.get("may_have_happened"):
                violations.append(Violation("effect happened but was recorded as not", workflow_id, step.name))

        violations.extend(_unexplained_unwind(sim, snapshot, audited))

        if status in ("COMPENSATED", "CANCELLED"):
            for step in definition.steps:
                done = happened[step.name]
                if done is None or step.compensation is None:
                    continue
                if len(done.undone_by) > 1 or (not done.undone_by and step.name not in resolved):
                    violations.append(Violation("happened but not compensated exactly once", workflow_id, step.name))
        if status == "COMPENSATION_FAILED":
            exhausted = []
            for step in definition.steps:
                stored = records.get(step.name, {})
                if stored.get("status") != "COMPENSATION_FAILED":
                    continue
                if step.compensation is None:
                    # A map step fails its unwind for a child whose compensation failed: that child is a workflow
                    # of its own, COMPENSATION_FAILED, and checked here as such.
                    if isinstance(step, MapStep):
                        exhausted.append(step.name)
                    continue
                error = stored.get("comp_error") or {}
                policy = step.compensation.retry
                # When it gave up: the step's last compensation event (its failed reply or its timeout).
                gave_up_at = max(
                    (e.time for e in events_of(snapshot) if e.step == step.name and e.phase == "compensation"),
                    default=0,
                )
                budget_spent = gave_up_at >= int(stored.get("comp_since") or 0) + policy.budget_minutes * 60
                if (
                    stored.get("comp_attempts_used", 0) >= policy.max_attempts
                    or budget_spent
                    or error.get("code") in ("REJECTED", "ALREADY_COMPENSATED")
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
        violations.append(Violation("rescued by the safety net without a dead letter", workflow_id, ""))
    violations.extend(sim.stale_applied)
    violations.extend(sim.limit_violations)
    violations.extend(_call_limits(sim))
    violations.extend(sim.paused_moved)
    violations.extend(sim.child_expiring)
    violations.extend(sim.operator_failed)
    for (workflow_id, version), writes in sorted(sim.committed.items()):
        if writes > 1:
            violations.append(Violation("lost update", workflow_id, f"{writes} writes stored version {version}"))

    for spec in sim.queues.specs.values():
        pending = sim.queues.messages[spec.url]
        if spec.dead_letter_url is not None and pending:
            violations.append(Violation("messages left unconsumed", "-", f"{len(pending)} in {spec.url}"))
        if spec.dead_letter_url is None and spec.url != sim.trigger_config.dead_letter_url:  # invariant 20's
            for message in pending:
                if message.message_id in sim.poisoned:
                    continue  # invariant 19
                owner = _workflow_of(message.body)
                stored_workflow = snapshots.get(owner) if owner else None
                if stored_workflow is None or stored_workflow.workflow.status.value not in TERMINAL:
                    violations.append(Violation("unexplained dead letter", owner or "-", message.body[:120]))
    return violations


def trigger_violations(sim: Simulation, snapshots: dict[str, Snapshot]) -> list[Violation]:
    """Invariant 20: one workflow per occurrence; every message that is not one refused into the dead-letter queue."""
    config, log = sim.trigger_config, sim.trigger_log
    violations: list[Violation] = list(log.seen)
    by_occurrence: dict[str, list[str]] = {}
    for workflow_id, snapshot in snapshots.items():
        ref = snapshot.workflow.trigger
        if ref is not None:
            by_occurrence.setdefault(ref.occurrence, []).append(workflow_id)
            if ref.name != config.name:
                violations.append(Violation("workflow of another trigger", workflow_id, ref.name))
    for occurrence, workflow_ids in sorted(by_occurrence.items()):
        if len(workflow_ids) > 1:
            violations.append(Violation("two workflows for one occurrence", workflow_ids[0], occurrence))
        if occurrence not in log.occurrences:
            violations.append(Violation("workflow of no occurrence", workflow_ids[0], occurrence))
    waiting: set[str] = set()  # ticks dead-lettered as they were, after five failed receives
    refused_bad: set[str] = set()
    for message in sim.queues.messages[config.dead_letter_url]:
        document = json.loads(message.body)
        refused = document.get("refused") if isinstance(document, dict) else None
        body = document["body"] if isinstance(refused, dict) else message.body
        if '"s3:TestEvent"' in body:
            violations.append(Violation("S3's test event dead-lettered", "-", message.body[:120]))
            continue
        try:
            # as the trigger reads it (its sealed envelopes opened): an sqs trigger's occurrence is the message's id,
            # kept by a refusal (SQS keeps it when it moves one)
            [which] = sim.modules[sim.trigger_id].service().read(message.body, Message(message.message_id))
            trigger_input(config, which)  # a message whose input cannot render is a bad one, whatever its kind
            occurrence = which.identity
        except TriggerRefusedError:
            if isinstance(refused, dict) and not (refused.get("code") and refused.get("reason")):
                violations.append(Violation("refused without its reason", "-", message.body[:120]))
            refused_bad.add(body)
            continue
        if isinstance(refused, dict):
            violations.append(Violation("a startable occurrence refused", "-", f"{occurrence}: {refused}"))
        waiting.add(occurrence)
    for occurrence in sorted(log.occurrences - set(by_occurrence) - waiting - log.skipped - log.missed):
        violations.append(Violation("occurrence started no workflow", "-", occurrence))
    for body in sorted(log.bad - refused_bad):
        violations.append(Violation("bad message not in the dead-letter queue", "-", body))
    if config.slot:
        violations += _slot_violations(sim, snapshots, set(by_occurrence))
    return violations


def _tenant_violations(sim: Simulation, snapshots: dict[str, Snapshot]) -> list[Violation]:
    """Invariant 22, tenants: never more running than max_running (as the run went), and no slot leaked at the end."""
    violations = list(dict.fromkeys(sim.tenant_violations))
    slots = DynamoDBTenantSlotStore(sim.physical["StateTable"], sim.dynamodb_checker())
    tenants: dict[tuple[str, str], list[Snapshot]] = {}
    for snapshot in snapshots.values():
        if snapshot.workflow.tenant is not None:
            tenants.setdefault((snapshot.workflow.definition.name, snapshot.workflow.tenant), []).append(snapshot)
    gate = TenantGate(slots, lambda wid: snapshots[wid].workflow.status if wid in snapshots else None)
    later = int(sim.clock.now()) + HOLDER_GRACE_SECONDS + PRUNE_SECONDS + 1
    for snapshot in snapshots.values():
        if snapshot.workflow.status is WorkflowStatus.QUEUED:
            violations.append(
                Violation(
                    "a queued workflow never started", snapshot.workflow.workflow_id, f"{snapshot.workflow.tenant}"
                )
            )
    for item in sim.state_items():
        if item["pk"]["S"].startswith("TENANCY#") and item["sk"]["S"].startswith("Q#"):
            detail = f"{item['pk']['S']} {item['sk']['S']} ({item['wid']['S']})"
            violations.append(Violation("a tenant's queue entry left behind", "-", detail))
    for (name, tenant), members in sorted(tenants.items()):
        holders = slots.slots(name, tenant).holders
        running = [s for s in members if s.workflow.status not in ENDED_RUN | {WorkflowStatus.QUEUED}]
        for snapshot in running:
            if snapshot.workflow.workflow_id not in holders:
                violations.append(
                    Violation("a running workflow holds no slot of its tenant", snapshot.workflow.workflow_id, tenant)
                )
        if len(running) >= sim.tenant_limit:
            continue
        probe = f"probe-{len(running)}"
        try:
            gate.take(members[0].workflow.definition, tenant, probe, later)
        except TenantLimitError:
            stale = sorted(set(holders) - {s.workflow.workflow_id for s in running})
            violations.append(
                Violation("tenant slot leaked", "-", f"{name} {tenant}: {len(running)} running, held by {stale}")
            )
        else:
            slots.release(name, tenant, probe)
    return violations


def _slot_violations(sim: Simulation, snapshots: dict[str, Snapshot], started: set[str]) -> list[Violation]:
    """Invariant 20, overlap: the slot at the end, and every tick kept waiting started (or still waits)."""
    config, log = sim.trigger_config, sim.trigger_log
    state = DynamoDBTriggerStore(sim.physical["StateTable"], sim.dynamodb_checker()).state(config.name, consistent=True)
    holder = snapshots.get(state.running) if state.running is not None else None
    held = holder is not None and holder.workflow.status not in ENDED_RUN
    violations: list[Violation] = []
    if holder is not None and not held:
        violations.append(Violation("a slot held by a run that has ended", holder.workflow.workflow_id, config.name))
    if state.waiting is not None and not held:
        violations.append(Violation("a tick kept waiting behind no run", "-", str(state.waiting_occurrence)))
    for occurrence in sorted(log.buffered - started):
        if not (held and occurrence == state.waiting_occurrence):
            violations.append(Violation("a tick kept waiting never started", "-", occurrence))
    return violations


def _poison_violations(sim: Simulation) -> list[Violation]:
    """Invariant 19: each poison message is dead-lettered, with no visibility timeout waited out on the way."""
    violations: list[Violation] = []
    for message_id, url in sorted(sim.poisoned.items()):
        spec = sim.queues.specs[url]
        assert spec.visibility_timeout > POISON_REDELIVERY_SECONDS, f"{url}: invariant 19 cannot see its timeout"
        where = spec.dead_letter_url or url
        message = next((m for m in sim.queues.messages[where] if m.message_id == message_id), None)
        if spec.dead_letter_url is None or message is None or message.dead_lettered_at is None:
            violations.append(Violation("poison message not dead-lettered", "-", f"{message_id} of {url}"))
            continue
        following = [*message.received_at[1:], message.dead_lettered_at]
        for receive, after in enumerate(following, start=1):
            handled = message.handled_at.get(receive)
            if handled is not None and after - handled > POISON_REDELIVERY_SECONDS:
                violations.append(
                    Violation(
                        "poison message hidden after a failed receive",
                        "-",
                        f"{message_id} of {url}: receive {receive}, next {after - handled:.0f} s after its handler",
                    )
                )
    return violations


def _map_violations(snapshots: dict[str, Snapshot]) -> list[Violation]:
    """Invariant 17: map steps' children follow their parents (see the module's docstring)."""
    violations: list[Violation] = []
    by_parent: dict[tuple[str, str], dict[int, Snapshot]] = {}
    for snapshot in snapshots.values():
        parent = snapshot.workflow.parent
        if parent is None:
            continue
        by_parent.setdefault((parent.workflow_id, parent.step), {})[parent.index] = snapshot
        owner = snapshots.get(parent.workflow_id)
        record = owner.steps.get(parent.step) if owner is not None else None
        if record is None or record.map is None or parent.index >= record.map.launched:
            violations.append(
                Violation("orphaned child", snapshot.workflow.workflow_id, f"parent {parent.workflow_id}")
            )
    for workflow_id, snapshot in snapshots.items():
        status = snapshot.workflow.status.value
        for step in snapshot.workflow.definition.steps:
            if not isinstance(step, MapStep):
                continue
            record = snapshot.steps.get(step.name)
            kids = by_parent.get((workflow_id, step.name), {})
            if status in TERMINAL:
                for index, child in sorted(kids.items()):
                    if child.workflow.status.value not in TERMINAL:
                        detail = f"{step.name}[{index}] is {child.workflow.status.value}"
                        violations.append(Violation("child not terminal under a terminal parent", workflow_id, detail))
                    elif child.workflow.expires_at != snapshot.workflow.expires_at:
                        detail = f"{step.name}[{index}] expires at {child.workflow.expires_at}"
                        violations.append(Violation("child's retention is not its parent's", workflow_id, detail))
            else:
                for index, child in sorted(kids.items()):
                    if child.workflow.expires_at is not None:
                        detail = f"{step.name}[{index}] expires at {child.workflow.expires_at}"
                        violations.append(Violation("child may expire before its parent ends", workflow_id, detail))
            if record is None:
                continue
            skipped = any(
                e.kind == "operator_action" and (e.detail or {}).get("action") == "skip" and e.step == step.name
                for e in events_of(snapshot)
            )
            if record.status.value == "COMPLETED" and record.map is not None and not skipped:
                completed = sorted(i for i, c in kids.items() if c.workflow.status.value == "COMPLETED")
                output = record.output or {}
                if len(kids) != record.map.total or output.get("succeeded") != len(completed):
                    detail = (
                        f"{step.name}: {len(kids)} children of {record.map.total}, {len(completed)} completed, {output}"
                    )
                    violations.append(Violation("map completed out of step with its children", workflow_id, detail))
                if output.get("failed", 0) > step.tolerated(record.map.total):
                    violations.append(Violation("map completed over its tolerance", workflow_id, step.name))
                results = output.get("results") or []
                wrong = [i for i in completed if i >= len(results) or results[i] is None]
                if wrong:
                    violations.append(Violation("map result missing", workflow_id, f"{step.name} {wrong}"))
            if status in ("COMPENSATED", "CANCELLED"):
                left = sorted(i for i, c in kids.items() if c.workflow.status.value == "COMPLETED")
                if left:
                    detail = f"{step.name} children {left} still COMPLETED"
                    violations.append(Violation("child not unwound with its parent", workflow_id, detail))
    return violations


def _resolved_inputs(sim: Simulation, snapshots: dict[str, Snapshot]) -> dict[str, Snapshot]:
    """``snapshots`` with each claim-checked workflow input replaced by its payload (when its object is there)."""
    s3 = boto3.client("s3")
    resolved = {}
    for workflow_id, snapshot in snapshots.items():
        value = snapshot.workflow.input
        if is_reference(value):
            try:
                body = s3.get_object(Bucket=sim.physical["PayloadBucket"], Key=value[REFERENCE_KEY]["key"])["Body"]
                snapshot = snapshot.with_workflow(snapshot.workflow.evolve(input=json.loads(body.read())))
            except s3.exceptions.NoSuchKey:
                pass  # reported by _payload_violations
        resolved[workflow_id] = snapshot
    return resolved


def _payload_violations(sim: Simulation, snapshots: dict[str, Snapshot]) -> list[Violation]:
    """Invariant 18 at the end of the run: the payload bucket against the workflows' items."""
    s3 = boto3.client("s3")
    bucket = sim.physical["PayloadBucket"]
    objects: dict[str, str] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            tags = s3.get_object_tagging(Bucket=bucket, Key=item["Key"])["TagSet"]
            objects[item["Key"]] = next((t["Value"] for t in tags if t["Key"] == "claim-check"), "")
    sim.report.payload_objects, sim.report.payload_reads = len(objects), sim.payload_reads
    violations: list[Violation] = []
    for key, tag in sorted(objects.items()):
        workflow_id = key.split("/", 1)[0]
        snapshot = snapshots.get(workflow_id)
        if snapshot is None:
            if tag == "live":  # pending ones (a start or a reply that never reached its workflow) expire after a day
                violations.append(Violation("claim-checked object of no workflow", workflow_id, f"{key} {tag}"))
        elif snapshot.workflow.status.value in TERMINAL and tag != "terminal":
            violations.append(Violation("object of an ended workflow never expires", workflow_id, f"{key} {tag}"))
    for workflow_id, snapshot in snapshots.items():
        held = [("input", snapshot.workflow.input)]
        held += [(f"{name}.output", r.output) for name, r in snapshot.steps.items()]
        held += [(f"{name}.comp_output", r.comp_output) for name, r in snapshot.steps.items()]
        for where, value in held:
            if not is_reference(value):
                continue
            claim = value[REFERENCE_KEY]
            if claim["key"] not in objects:
                violations.append(Violation("claim-checked payload missing", workflow_id, f"{where} {claim['key']}"))
                continue
            if objects[claim["key"]] == "pending":  # the bucket's rule would delete it under the workflow naming it
                violations.append(Violation("claim-checked payload left pending", workflow_id, where))
            body = s3.get_object(Bucket=bucket, Key=claim["key"])["Body"].read()
            if hashlib.sha256(body).hexdigest() != claim["sha256"]:
                violations.append(Violation("claim-checked payload altered", workflow_id, where))
        for name, record in snapshot.steps.items():
            for error in (record.error, record.comp_error):
                if (error or {}).get("code") == "CLAIM_CHECK_MISSING":
                    violations.append(Violation("step failed for a missing payload", workflow_id, name))
    return violations


def _unexplained_unwind(sim: Simulation, snapshot: Snapshot, audited: list[dict[str, Any]]) -> list[Violation]:
    """Invariants 10 and 13 for one unwound workflow (see the module's docstring)."""
    workflow_id = snapshot.workflow.workflow_id
    if snapshot.workflow.status.value == "CANCELLED":
        return []  # a client or an operator asked for it
    reason = snapshot.workflow.reason or ""
    parent = snapshot.workflow.parent
    if parent is not None and reason == "its parent unwound":
        parent_snapshot = sim.state_store().load(parent.workflow_id)
        unwound = parent_snapshot is not None and parent_snapshot.workflow.status.value != "COMPLETED"
        return [] if unwound else [Violation("child unwound under a parent that did not", workflow_id, reason)]
    if reason == "compensation requested by an operator":
        asked = any(d.get("action") == "compensate" for d in audited)
        return [] if asked else [Violation("operator unwind without its audit", workflow_id, reason)]
    definition = snapshot.workflow.definition
    match = _UNWIND_REASON.match(reason)
    # Read from the definition itself, not through the engine's failure_policy: that is what a mutation breaks.
    held = match is not None and (definition.step(match.group("step")).on_failure or definition.on_failure) == "hold"
    if held and not reason.endswith(HOLD_TIMEOUT_SUFFIX):
        return [Violation("unwound instead of held", workflow_id, reason)]
    if match is None:
        return [Violation("unwind without a reason", workflow_id, repr(snapshot.workflow.reason))]
    step = match.group("step")
    record = snapshot.steps.get(step)
    if record is None:
        return [Violation("unwind names a step never dispatched", workflow_id, step)]
    touched = sim.log.touched
    if match.group("code") == "MAP_FAILURE_TOLERANCE_EXCEEDED":
        # A map step fails for its children: explained when more of them did not complete than it tolerates
        # (each child's own unwind is checked as the unwind of a workflow of its own).
        map_step = definition.step(step)
        started = record.map.launched if record.map is not None else 0
        index = definition.order.index(step)
        children = sim.state_store().load_many([child_id(workflow_id, index, i) for i in range(started)])
        failed = sum(  # the children that ended without completing by themselves, not unwound by this parent
            1
            for c in children.values()
            if c.workflow.status.value != "COMPLETED" and not any(e.kind == "parent_unwound" for e in events_of(c))
        )
        tolerated = map_step.tolerated(record.map.total) if isinstance(map_step, MapStep) and record.map else 0
        if failed > tolerated:
            return []
        return [
            Violation("unexplained unwind", workflow_id, f"{step}: {failed} children failed, {tolerated} tolerated")
        ]
    if match.group("code") == "CALLBACK_FAILED":
        refused = any(
            "approver rejected" in touched.get((workflow_id, step, "action", attempt), set())
            for attempt in range(1, record.attempt + 1)
        )
        return [] if refused else [Violation("unexplained unwind", workflow_id, f"{step} failed by no approver")]
    if match.group("code") == _BUSINESS_REJECTION:
        refused = any(
            "remote business rejection" in touched.get((workflow_id, step, "action", attempt), set())
            for attempt in range(1, record.attempt + 1)
        )
        return [] if refused else [Violation("unexplained unwind", workflow_id, f"{step} refused, none injected")]
    clean = [a for a in range(1, record.attempt + 1) if not touched.get((workflow_id, step, "action", a))]
    clean = [a for a in clean if not _in_outage(sim, snapshot, step, a)]
    if clean:
        detail = f"{snapshot.workflow.reason}; attempt(s) {clean} of {record.attempt} met no fault"
        return [Violation("unexplained unwind", workflow_id, detail)]
    return []


#: How long after an outage its agent's circuit may still be open (the template's BreakerOpenSeconds, 30, twice).
OUTAGE_BREAKER_SECONDS = 60


def _in_outage(sim: Simulation, snapshot: Snapshot, step: str, attempt: int) -> bool:
    """Whether forward ``attempt`` of ``step`` ended deferred by its agent's open circuit (a callback step's: the agent
    its notification goes through) while its service was down (or just after, while the circuit stayed open): such
    an attempt made no call, its deferrals ran out of their budget, and it met the outage injected into its service
    (a 15-minute outage outlasts a forward action's deferral budget). An attempt that failed in any other way during
    an outage is not explained by it."""
    kind = snapshot.workflow.definition.step(step)
    notify = getattr(kind, "notify", None)  # a callback step's attempt is its notification's call
    remote = sim.remotes.get(str(getattr(kind, "agent", None) or getattr(notify, "agent", "")))
    if remote is None:
        return False
    replies = [
        e
        for e in events_of(snapshot)
        if e.kind == "reply_applied" and e.step == step and e.phase == "action" and e.attempt == attempt
    ]
    if not replies or replies[-1].outcome != "deferred":
        return False
    last = replies[-1].time
    return any(start - 1 <= last <= end + OUTAGE_BREAKER_SECONDS for start, end in remote.outages)


def _effect_of(effects: dict[str, Any], workflow_id: str, step: Any, snapshot: Snapshot) -> Any:
    """The effect of a step's action under any of its tokens (an operator's retry of a refused step takes a new
    one, ``StepRecord.token_action``), or None when it never happened (or the step is a wait)."""
    if not isinstance(step, TaskStep):
        return None
    record = snapshot.steps.get(step.name)
    generations = range((record.generation if record else 0) + 1)
    for generation in generations:
        action = step.action if generation == 0 else f"{step.action}#{generation}"
        effect = effects.get(remote_token(workflow_id, step.name, action))
        if effect is not None:
            return effect
    return None


#: How late a wait may resume (seconds after its time): the grace, then up to five supervisor ticks (a timer lost
#: to a crash is resumed by the supervisor; the supervisor's own invocation may crash and run again next tick).
WAIT_LATE_TICKS = 5


def _conditions(snapshot: Snapshot) -> dict[str, bool]:
    """Each conditional step's condition, evaluated on the workflow's input as JMESPath counts truth."""
    results = {}
    for step in snapshot.workflow.definition.steps:
        if step.when is not None:
            value = jmespath.search(step.when, {"input": snapshot.workflow.input, "steps": {}})
            results[step.name] = not (
                value is None or value is False or (isinstance(value, (str, list, dict)) and not value)
            )
    return results


def _condition_violations(snapshot: Snapshot, conditions: dict[str, bool], happened: dict[str, Any]) -> list[Violation]:
    """Invariant 14 for one workflow."""
    workflow_id = snapshot.workflow.workflow_id
    skipped = {e.step for e in events_of(snapshot) if e.kind == "skipped"}
    violations = []
    for name, holds in conditions.items():
        record = snapshot.steps.get(name)
        if not holds and happened.get(name) is not None:
            violations.append(Violation("condition false but the step ran", workflow_id, name))
        if (
            not holds
            and snapshot.workflow.status.value == "COMPLETED"
            and (record is None or record.status.value != "SKIPPED")
        ):
            violations.append(Violation("condition false but the step was not skipped", workflow_id, name))
        if holds and name in skipped:
            violations.append(Violation("condition true but the step was skipped", workflow_id, name))
    return violations


def _wait_violations(snapshot: Snapshot, grace: int) -> list[Violation]:
    """Invariant 15 for one workflow."""
    workflow = snapshot.workflow
    definition = workflow.definition
    events = events_of(snapshot)
    violations = []
    for step in definition.steps:
        if not isinstance(step, WaitStep):
            continue
        dispatched = [e for e in events if e.kind == "dispatched" and e.step == step.name]
        resumed = [e for e in events if e.kind == "resumed" and e.step == step.name]
        record = snapshot.steps.get(step.name)
        if not dispatched:
            continue
        start = dispatched[0]
        due = (
            start.time + step.seconds if step.seconds is not None else max(start.time, int(workflow.input["resume_at"]))
        )
        if start.complete_by != due:
            violations.append(
                Violation("wait due at the wrong time", workflow.workflow_id, f"{start.complete_by} != {due}")
            )
        if not resumed:
            if workflow.status.value == "COMPLETED" or (
                record is not None
                and (record.error or {}).get("code") != "UNWOUND"
                and record.status.value != "PROCESSING"
            ):
                violations.append(Violation("wait never resumed", workflow.workflow_id, step.name))
            continue
        at = resumed[0].time
        if at < due:
            violations.append(Violation("wait resumed early", workflow.workflow_id, f"{step.name} at {at}, due {due}"))
        if at > due + grace + WAIT_LATE_TICKS * 60:
            violations.append(Violation("wait resumed late", workflow.workflow_id, f"{step.name} at {at}, due {due}"))
        for later in definition.descendants[step.name]:
            first = next((e for e in events if e.kind == "dispatched" and e.step == later), None)
            if first is not None and (first.seq < resumed[0].seq):
                violations.append(Violation("step started before its wait resumed", workflow.workflow_id, later))
    return violations


def _batch_violations(sim: Simulation, snapshots: dict[str, Snapshot]) -> list[Violation]:
    """Invariant 23: batches act on no workflow twice, their lineage and outcomes are true, and they end."""
    violations: list[Violation] = []
    acted: dict[str, set[str]] = {}
    for workflow_id, snapshot in snapshots.items():
        names = Counter(
            (e.detail or {}).get("batch")
            for e in events_of(snapshot)
            if e.kind == "operator_action" and (e.detail or {}).get("batch")
        )
        for batch_id, n in names.items():
            acted.setdefault(str(batch_id), set()).add(workflow_id)
            if n > 1:
                violations.append(Violation("workflow acted on twice by a batch", workflow_id, f"{batch_id}: {n}"))
    store = DynamoDBBatchStore(sim.physical["StateTable"], sim.dynamodb_checker())
    for batch_id in sorted(set(sim.batch_ids.values())):
        batch = store.get(batch_id, consistent=True)
        if batch is None:
            violations.append(Violation("batch lost", "-", batch_id))
            continue
        pages = list(store.pages(batch_id))
        claimed = {w for page in pages for w in page.workflow_ids}
        for workflow_id in sorted(acted.get(batch_id, set()) - claimed):
            violations.append(Violation("batch acted on a workflow it did not claim", workflow_id, batch_id))
        for page in pages:
            for workflow_id, outcome in page.outcomes.items():
                if outcome == "done" and workflow_id not in acted.get(batch_id, set()):
                    violations.append(Violation("batch outcome done without its action", workflow_id, batch_id))
        if batch.status == "RUNNING":
            violations.append(Violation("batch not ended", "-", f"{batch_id}: {batch.pages} pages, {batch.counts}"))
            continue
        settled = [p for p in pages if p.number <= batch.settled]
        total = Counts()
        for page in settled:
            total = total + page.counts()
        if batch.settled != batch.pages or total != batch.counts:
            violations.append(
                Violation("batch counts out of step", "-", f"{batch_id}: {batch.counts} vs pages {total}")
            )
    return violations


def _operator_answer_violations(snapshot: Snapshot, answers: dict[str, list[dict[str, Any]]]) -> list[Violation]:
    """Invariant 16, the operator's answers: one audit per answer applied, none for the owner's."""
    workflow_id = snapshot.workflow.workflow_id
    given = sorted(
        (token.split("~")[1], "approve" if body["status"] == "succeeded" else "reject")
        for token, bodies in answers.items()
        if token.startswith(f"{workflow_id}~")
        for body in bodies
    )
    audited = sorted(
        (str((e.detail or {}).get("step")), str((e.detail or {}).get("action")))
        for e in events_of(snapshot)
        if e.kind == "operator_action" and (e.detail or {}).get("action") in ("approve", "reject")
    )
    if given != audited:
        return [Violation("operator answer not audited once", workflow_id, f"answered {given}, audited {audited}")]
    return []


def _callback_violations(
    snapshot: Snapshot, applied: dict[str, list[dict[str, Any]]], maybe: dict[str, list[dict[str, Any]]]
) -> list[Violation]:
    """Invariant 16 for one workflow."""
    workflow_id = snapshot.workflow.workflow_id
    events = events_of(snapshot)
    violations = []
    mine = {token: bodies for token, bodies in applied.items() if token.startswith(f"{workflow_id}~")}
    for token, bodies in mine.items():
        _, name, attempt, _ = token.split("~")
        applications = [
            e for e in events if e.kind == "callback_applied" and e.step == name and e.attempt == int(attempt)
        ]
        if len(bodies) > 1 or len(applications) > 1:
            violations.append(Violation("callback applied twice", workflow_id, f"{name} attempt {attempt}"))
        replies = [e for e in events if e.kind == "callback_applied" and e.step == name and e.attempt == int(attempt)]
        if not replies:
            violations.append(
                Violation("callback applied to another attempt", workflow_id, f"{name} attempt {attempt}")
            )
    for step in snapshot.workflow.definition.steps:
        if not isinstance(step, CallbackStep):
            continue
        record = snapshot.steps.get(step.name)
        if record is None or record.status.value not in ("COMPLETED", "COMPENSATED", "COMPENSATION_FAILED"):
            continue
        if record.status.value != "COMPLETED" and record.output is None:
            continue
        skipped_by_hand = any(e.kind == "operator_action" and (e.detail or {}).get("step") == step.name for e in events)
        token = task_token(workflow_id, step.name, record.attempt, record.callback_nonce or "")
        # an answer whose response was lost (the function crashed after its write) may have applied: the approver's
        # retry of it then met 409
        successes = [b for b in mine.get(token, []) + maybe.get(token, []) if b["status"] == "succeeded"]
        if skipped_by_hand:
            continue  # an operator's skip gave it its output (invariant 13)
        if not successes:
            violations.append(Violation("callback step completed without an answer", workflow_id, step.name))
        elif record.output not in [b.get("output") for b in successes]:
            violations.append(Violation("callback output lost", workflow_id, step.name))
    return violations


def _fields(record: StepRecord) -> dict[str, Any]:
    return {
        "status": record.status.value,
        "may_have_happened": record.may_have_happened,
        "comp_attempt": record.comp_attempt,
        "comp_attempts_used": record.comp_attempts_used,
        "comp_since": record.comp_since,
        "error": record.error,
        "comp_error": record.comp_error,
    }


def _workflow_of(body: str) -> str | None:
    try:
        return str(json.loads(body)["workflow_id"])
    except (ValueError, KeyError, TypeError):
        return None


#: Invariant 21: the windows the calls of a limited service are counted over (seconds).
LIMIT_WINDOWS = (1.0, 10.0, 60.0)


def _call_limits(sim: Simulation) -> list[Violation]:
    """Invariant 21 at the end of a run: every window's calls within the rate, and no unit leaked."""
    violations: list[Violation] = []
    store = DynamoDBLimitsStore(sim.physical["IdempotencyTable"], sim.dynamodb_checker())
    for agent, limiters in sorted(sim.limiters.items()):
        limits = limiters[0].limits
        starts = sorted(sim.remotes[agent].starts)
        if limits.rate is not None:
            for window in LIMIT_WINDOWS:
                allowed = limits.burst_calls + limits.rate * window
                end = 0
                for begin, start in enumerate(starts):
                    end = max(end, begin)
                    while end < len(starts) and starts[end] < start + window:
                        end += 1
                    if end - begin > allowed + 1e-9:
                        detail = f"{end - begin} calls in the {window:g} s from {start:.3f}; at most {allowed:g}"
                        violations.append(Violation("calls over the rate limit", "-", f"{agent}: {detail}"))
                        break
        for limiter in limiters:
            if limiter.calls_in_flight or limiter.records_waiting:
                detail = f"{agent} instance {limiter.holder}: {limiter.calls_in_flight} calls in flight and "
                detail += f"{limiter.records_waiting} records waiting after the run"
                violations.append(Violation("call limit unit leaked", "-", detail))
        lapsed = sim.clock.now() + max(limiter.lease_seconds for limiter in limiters) + 2 * limiters[0].guard_seconds
        lapsed += 2 * sim.faults.clock_skew_seconds
        record = store.read(agent)
        _, grant = allocate(
            record,
            "after the run",
            limits.units,
            0,
            lapsed,
            limits,
            lease_seconds=limiters[0].lease_seconds,
            guard_seconds=limiters[0].guard_seconds,
        )
        if grant.units != limits.units:
            held = {holder: (lease.units, lease.until) for holder, lease in record.leases.items()}
            detail = (
                f"{agent}: a new instance got {grant.units} of {limits.units} units after every lease ended: {held}"
            )
            violations.append(Violation("call limit unit leaked", "-", detail))
    return violations
