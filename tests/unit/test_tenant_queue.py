"""A tenant's queue (``tenancy.over_limit: queue``): starts over the limit wait QUEUED and start in ticket order."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow.definition import parse_definition
from sasflow.history import decode
from sasflow.messages import canonical_hash
from sasflow.scheduler import StartResult
from sasflow.states import WorkflowStatus
from sasflow.tenancy import HOLDER_GRACE_SECONDS, QUEUE_CHECK_SECONDS
from tests.support.pipeline import OWNER, TRIP_INPUT, Pipeline, trip_definition

TENANT = f"principal#{OWNER}"
NAME = "trip-booking"


def queued(max_running: int = 1, **tenancy: Any) -> dict[str, Any]:
    """The sample trip, at most ``max_running`` per tenant, the rest queued."""
    return {**trip_definition(), "tenancy": {"max_running": max_running, "over_limit": "queue", **tenancy}}


def start(
    p: Pipeline, definition: dict[str, Any], *, key: str | None = None, owner: str = OWNER, send: bool = True
) -> StartResult:
    """Start a workflow; ``send=False``: its first messages are lost (it stays RUNNING, as if stuck)."""
    body = {"definition": definition, "input": TRIP_INPUT}
    result = p.scheduler.start_workflow(
        parse_definition(definition), TRIP_INPUT, request_hash=canonical_hash(body), owner=owner, idempotency_key=key
    )
    if send:
        p.bus.send(result.messages)
    return result


def status(p: Pipeline, workflow_id: str) -> WorkflowStatus:
    return p.snapshot(workflow_id).workflow.status


def kinds(p: Pipeline, workflow_id: str) -> list[str]:
    snapshot = p.snapshot(workflow_id)
    workflow = snapshot.workflow
    return [e.kind for e in decode(snapshot.history, workflow.created_at, [s.name for s in workflow.definition.steps])]


def entries(p: Pipeline) -> dict[int, str]:
    return {ticket: workflow_id for ticket, (workflow_id, _) in p.tenancy.queues.get((NAME, TENANT), {}).items()}


def test_starts_over_the_limit_wait_queued_and_start_in_ticket_order_as_slots_are_given_back() -> None:
    # Given a trip limited to 1 running per tenant, queueing the rest
    p = Pipeline()
    started: list[int] = []
    running: list[int] = []
    dequeue = p.tenancy.dequeue

    def logged(definition: str, tenant: str, ticket: int) -> None:
        started.append(ticket)
        running.append(sum(1 for s in p.store.workflows.values() if s.workflow.status is WorkflowStatus.RUNNING))
        dequeue(definition, tenant, ticket)

    p.tenancy.dequeue = logged  # type: ignore[method-assign]

    # When four start at once
    results = [start(p, queued(1)) for _ in range(4)]
    first, *waiting = [r.workflow.workflow_id for r in results]

    # Then the first runs and the others are QUEUED, 201 with their places, nothing of them dispatched
    assert [r.created for r in results] == [True] * 4
    assert [status(p, w) for w in waiting] == [WorkflowStatus.QUEUED] * 3
    assert [r.queue_position for r in results] == [None, 1, 2, 3]
    assert [p.snapshot(w).workflow.queue_ticket for w in waiting] == [1, 2, 3]
    assert [len(r.messages) for r in results] == [1, 0, 0, 0]
    assert entries(p) == dict(zip([1, 2, 3], waiting, strict=True))
    assert p.snapshot(waiting[0]).deadline is None  # in no deadline while queued
    assert set(p.tenancy.slots(NAME, TENANT).holders) == {first}

    # When each runs to its end (every end gives its slot back, which starts the next)
    p.pump()

    # Then all completed, one at a time, in ticket order, each started once; the queue is empty
    assert [status(p, w) for w in [first, *waiting]] == [WorkflowStatus.COMPLETED] * 4
    assert started == [1, 2, 3]
    assert running == [1, 1, 1]  # as each started, it was the only one running
    assert [kinds(p, w).count("dequeued") for w in waiting] == [1, 1, 1]
    assert kinds(p, waiting[0])[:3] == ["started", "queued", "dequeued"]
    assert entries(p) == {}
    assert p.tenancy.slots(NAME, TENANT).holders == {}
    assert p.call_log.count(("flights", "reserve")) == 4


def test_a_start_queues_behind_others_even_with_a_slot_free_and_the_supervisor_starts_what_a_lost_give_back_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given one running and one queued, and the running one's end whose start of the queue's head was lost
    p = Pipeline()
    first = start(p, queued(1)).workflow.workflow_id
    second = start(p, queued(1)).workflow.workflow_id

    def crash(definition: str, tenant: str) -> list[Any]:
        raise RuntimeError("the function crashed after giving the slot back")

    monkeypatch.setattr(p.scheduler, "promote", crash)
    p.pump()
    monkeypatch.undo()
    assert status(p, first) == WorkflowStatus.COMPLETED
    assert status(p, second) == WorkflowStatus.QUEUED
    assert p.tenancy.slots(NAME, TENANT).holders == {}
    assert p.metrics.get("QueuePromotionsFailed") == 1

    # When a third starts while the slot is free: it queues behind the second
    third = start(p, queued(1))
    assert third.queue_position == 2
    assert status(p, third.workflow.workflow_id) == WorkflowStatus.QUEUED

    # When the supervisor's look at the queue comes (not before its time)
    assert p.sweep().queues == 0
    p.clock.advance(QUEUE_CHECK_SECONDS + 1)
    report = p.sweep()

    # Then it started the second (the head), and the third follows when the second ends
    assert report.queues == 1
    assert status(p, second) == WorkflowStatus.RUNNING
    assert status(p, third.workflow.workflow_id) == WorkflowStatus.QUEUED
    p.pump()
    assert [status(p, w) for w in (second, third.workflow.workflow_id)] == [WorkflowStatus.COMPLETED] * 2

    # And once its queue is seen empty, the tenant leaves the deadline index
    p.clock.advance(QUEUE_CHECK_SECONDS + 1)
    assert p.sweep().queues == 1
    assert p.tenancy.due == {}
    p.clock.advance(QUEUE_CHECK_SECONDS + 1)
    assert p.sweep().queues == 0


def test_a_queued_workflow_cancelled_ends_at_once_leaves_the_queue_and_the_others_start() -> None:
    p = Pipeline()
    first = start(p, queued(1)).workflow.workflow_id
    second = start(p, queued(1)).workflow.workflow_id
    third = start(p, queued(1)).workflow.workflow_id

    stored, messages = p.scheduler.cancel(second, owner=OWNER, reason="changed plans")

    assert stored.workflow.status == WorkflowStatus.CANCELLED
    assert messages == []
    assert entries(p) == {2: third}
    assert kinds(p, second) == ["started", "queued", "operator_action", "finished"]
    p.pump()
    assert [status(p, w) for w in (first, second, third)] == [
        WorkflowStatus.COMPLETED,
        WorkflowStatus.CANCELLED,
        WorkflowStatus.COMPLETED,
    ]
    assert p.call_log.count(("flights", "reserve")) == 2


def test_a_repeated_queued_start_gets_its_workflow_and_takes_no_second_ticket() -> None:
    p = Pipeline()
    start(p, queued(1))
    second = start(p, queued(1), key="order-2")
    again = start(p, queued(1), key="order-2")
    assert (again.created, again.workflow.workflow_id, again.workflow.status) == (
        False,
        second.workflow.workflow_id,
        WorkflowStatus.QUEUED,
    )
    assert entries(p) == {1: second.workflow.workflow_id}


def test_an_entry_whose_workflow_never_came_waits_out_the_grace_then_is_dropped() -> None:
    # Given one running, and an entry at the head whose start crashed before writing its workflow, then one queued
    p = Pipeline()
    first = start(p, queued(1)).workflow.workflow_id
    now = int(p.clock.now())
    p.tenancy.enqueue(NAME, TENANT, "never-written", now, now + QUEUE_CHECK_SECONDS)
    behind = start(p, queued(1)).workflow.workflow_id

    # When the running one ends within the grace: the head may still be written, so nothing starts
    p.pump()
    assert status(p, first) == WorkflowStatus.COMPLETED
    assert status(p, behind) == WorkflowStatus.QUEUED
    assert entries(p) == {1: "never-written", 2: behind}

    # When the supervisor looks after the grace: the entry goes and the next starts
    p.clock.advance(max(HOLDER_GRACE_SECONDS, QUEUE_CHECK_SECONDS) + 1)
    p.sweep()
    assert entries(p) == {}
    assert status(p, behind) == WorkflowStatus.RUNNING
    p.pump()
    assert status(p, behind) == WorkflowStatus.COMPLETED


def test_a_promoter_that_crashed_after_taking_the_slot_is_finished_by_the_next_and_starts_the_head_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given one running and one queued, and the running one's end whose promoter crashed after taking the slot
    p = Pipeline()
    first = start(p, queued(1)).workflow.workflow_id
    second = start(p, queued(1)).workflow.workflow_id
    save = p.store.save

    def crash(snapshot: Any, expect: Any) -> Any:
        if expect.workflow.status is WorkflowStatus.QUEUED:
            raise RuntimeError("crashed before the write that starts it")
        return save(snapshot, expect)

    monkeypatch.setattr(p.store, "save", crash)
    p.pump()
    monkeypatch.undo()
    assert status(p, first) == WorkflowStatus.COMPLETED
    assert status(p, second) == WorkflowStatus.QUEUED
    assert set(p.tenancy.slots(NAME, TENANT).holders) == {second}  # held for it, not started yet

    # When the supervisor looks at the queue
    p.clock.advance(QUEUE_CHECK_SECONDS + 1)
    p.sweep()
    p.pump()

    # Then it is started once, holding one slot, and ends
    assert status(p, second) == WorkflowStatus.COMPLETED
    assert kinds(p, second).count("dequeued") == 1
    assert p.tenancy.slots(NAME, TENANT).holders == {}
    assert entries(p) == {}


def test_a_refusing_definition_still_refuses_and_queue_mode_is_parsed() -> None:
    definition = parse_definition(queued(2, tenant_key="customer.id"))
    assert definition.tenancy is not None
    assert definition.tenancy.over_limit == "queue"


def test_a_version_that_refuses_shares_the_slots_and_its_end_starts_the_queues_head_at_once() -> None:
    # Given v2 of the trip refusing over 5 running, v1 queueing over 2 (found by a trial: an end of the version that
    # refuses did not start the queue's head, which waited for the supervisor's look): v2's one running, v1's one
    # stuck running, and v1's next QUEUED (2 held)
    p = Pipeline()
    refusing = {**trip_definition(), "version": 2, "tenancy": {"max_running": 5}}
    other = start(p, refusing).workflow.workflow_id
    stuck = start(p, queued(2), send=False).workflow.workflow_id
    waiting = start(p, queued(2)).workflow.workflow_id
    assert status(p, waiting) == WorkflowStatus.QUEUED

    # When v2's runs to its end, with no supervisor's look
    p.pump()

    # Then its give-back found the queue waiting and started the head (its slot within v1's 2), which completed
    assert [status(p, w) for w in (other, stuck, waiting)] == [
        WorkflowStatus.COMPLETED,
        WorkflowStatus.RUNNING,
        WorkflowStatus.COMPLETED,
    ]


def test_a_queued_start_counts_its_place_from_the_head_after_its_entry_is_written() -> None:
    # Given one running, and a concurrent start whose entry lands between this start's look at the head and its
    # ticket (a trial saw two concurrent starts both told place 1)
    p = Pipeline()
    start(p, queued(1))
    enqueue = p.tenancy.enqueue

    def concurrent(definition: str, tenant: str, workflow_id: str, now: int, due: int) -> int:
        enqueue(definition, tenant, "the-other-start", now, due)
        return enqueue(definition, tenant, workflow_id, now, due)

    p.tenancy.enqueue = concurrent  # type: ignore[method-assign]
    result = start(p, queued(1))

    # Then its place counts the other: 2
    assert (result.workflow.queue_ticket, result.queue_position) == (2, 2)
    assert p.scheduler.queue_position(result.snapshot) == 2
