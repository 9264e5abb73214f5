"""Map steps: a child workflow per item under a concurrency, their reports, tolerance, collection and unwind."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from sasflow.api_models import events_of
from sasflow.definition import parse_definition
from sasflow.errors import InvalidDefinitionError
from sasflow.fanout import ChildCommand, MapProgress, ParentRef, child_id
from sasflow.messages import decode_reply
from sasflow.scheduler import workflow_id_for
from sasflow.states import TERMINAL_WORKFLOW, StepStatus, WorkflowStatus
from tests.support.pipeline import ID_SECRET, OWNER, REPLIES, Pipeline

CHILD = {
    "name": "charge-one",
    "steps": [
        {
            "name": "charge",
            "agent": "payments",
            "action": "charge",
            "input": {"order.$": "input.item", "index.$": "input.index"},
            "compensation": {"action": "refund", "input": {"charge.$": "step.output"}},
        }
    ],
}


def fan_out(**map_options: Any) -> dict[str, Any]:
    """Reserve a flight, then charge every order of the input (a map step), then book the hotel."""
    return {
        "name": "fan-out",
        "steps": [
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "compensation": {"action": "cancel_reservation"},
            },
            {"name": "charge_all", "type": "map", "items": "input.orders", "definition": CHILD, **map_options},
            {"name": "book_hotel", "agent": "hotels", "action": "book"},
        ],
    }


def children(p: Pipeline, wid: str, n: int) -> list[Any]:
    return [p.store.load(child_id(wid, 1, i)) for i in range(n)]


def test_progress_applies_each_report_once_and_keeps_a_prefix() -> None:
    progress, started = MapProgress(total=5).launch(limit=10, concurrency=3)
    assert list(started) == [0, 1, 2] and progress.in_flight == 3
    progress = progress.record(1, failed=False)
    assert progress is not None and (progress.low, progress.done) == (0, (1,))
    assert progress.record(1, failed=True) is None  # a redelivered report changes nothing
    assert progress.record(4, failed=False) is None  # never started
    progress = progress.record(0, failed=True)
    assert progress is not None and (progress.low, progress.done, progress.failed) == (2, (), 1)
    progress, started = progress.launch(limit=10, concurrency=3)
    assert list(started) == [3, 4] and progress.pending() == [2, 3, 4]
    assert MapProgress.from_doc(progress.doc()) == progress


def test_a_map_runs_a_child_per_item_under_its_concurrency_and_collects_their_outputs() -> None:
    p = Pipeline()
    orders = [{"sku": f"s{i}"} for i in range(7)]
    wid = p.start(fan_out(max_concurrency=3), {"orders": orders})
    p.run_agent("flights")
    p.run_scheduler()  # the flight's reply puts the map in flight: its tick goes to the response queue
    p.run_scheduler()  # the tick starts the first three children
    assert [c is not None for c in children(p, wid, 7)] == [True] * 3 + [False] * 4
    assert len(p.requests("payments")) == 3
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    output = snapshot.steps["charge_all"].output
    assert (output["total"], output["succeeded"], output["failed"]) == (7, 7, 0)
    # results in item order: each child's confirmation, whose token names that child
    assert [r["confirmation"] for r in output["results"]] == [
        p.snapshot(child_id(wid, 1, i)).steps["charge"].output["confirmation"] for i in range(7)
    ]
    assert len({r["confirmation"] for r in output["results"]}) == 7
    # each child is a workflow of its own, owned by the parent's owner, all COMPLETED
    kids = children(p, wid, 7)
    assert {c.workflow.status for c in kids} == {WorkflowStatus.COMPLETED}
    assert {c.workflow.owner for c in kids} == {OWNER}
    assert [c.workflow.input for c in kids] == [{"item": o, "index": i} for i, o in enumerate(orders)]
    assert p.services["payments"].actions() == ["charge"] * 7
    assert p.metrics["MapChildrenStarted"] == 7 and p.metrics["MapStepsCompleted"] == 1
    # the parent's item holds counters, not the children
    assert snapshot.steps["charge_all"].map == MapProgress(total=7, launched=7, low=7)


def test_a_failed_child_within_the_tolerance_leaves_a_null_result() -> None:
    p = Pipeline()
    p.services["payments"].script["charge"] = ["ok", "reject"]
    wid = p.start(fan_out(max_concurrency=1, tolerated_failure=1), {"orders": [1, 2, 3]})
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    output = snapshot.steps["charge_all"].output
    assert (output["succeeded"], output["failed"]) == (2, 1)
    assert output["results"][1] is None and output["results"][0]["action"] == "charge"
    assert children(p, wid, 3)[1].workflow.status is WorkflowStatus.COMPENSATED


def test_one_failure_over_the_tolerance_unwinds_the_parent_and_compensates_every_completed_child() -> None:
    p = Pipeline()
    p.services["payments"].script["charge"] = ["ok", "ok", "reject", "reject"]
    wid = p.start(fan_out(max_concurrency=2, tolerated_failure="25%"), {"orders": [1, 2, 3, 4, 5, 6]})
    p.settle(wid)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    record = snapshot.steps["charge_all"]
    assert record.status is StepStatus.COMPENSATED
    assert record.error is not None and record.error["code"] == "MAP_FAILURE_TOLERANCE_EXCEEDED"
    # every child started is terminal and none is left COMPLETED: the two charges were refunded
    kids = [c for c in children(p, wid, 6) if c is not None]
    assert all(c.workflow.status in TERMINAL_WORKFLOW for c in kids)
    assert WorkflowStatus.COMPLETED not in {c.workflow.status for c in kids}
    charged = [c for c in kids if c.steps["charge"].status is StepStatus.COMPENSATED]
    assert len(charged) == 3  # children 0 and 1, and 4, started when child 2's failure freed its slot
    assert p.services["payments"].actions().count("refund") == 3
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPENSATED
    assert "hotels" not in {agent for agent, _ in p.call_log}
    # a compensated child says why in its history
    completed_then_undone = [c for c in kids if any(e.kind == "parent_unwound" for e in events_of(c))]
    assert {c.workflow.status for c in completed_then_undone} == {WorkflowStatus.COMPENSATED}


def test_a_cancel_of_the_parent_cancels_the_running_children() -> None:
    p = Pipeline()
    wid = p.start(fan_out(max_concurrency=2), {"orders": [1, 2, 3, 4]})
    p.run_agent("flights")
    p.run_scheduler()
    p.run_scheduler()  # two children started, their charges queued, not yet delivered
    p.scheduler.cancel(wid, owner=OWNER)
    p.settle(wid)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.CANCELLED
    kids = children(p, wid, 4)
    assert [c.workflow.status if c else None for c in kids] == [WorkflowStatus.CANCELLED] * 2 + [None, None]


def test_a_lost_report_is_found_by_the_supervisor_check() -> None:
    p = Pipeline()
    wid = p.start(fan_out(max_concurrency=5, timeout_seconds=60), {"orders": [1, 2]})
    p.run_agent("flights")
    p.run_scheduler()
    p.run_scheduler()
    p.run_agent("payments")
    # the children's replies are applied, and their reports to the parent lost (a crash after the write)
    lost = [out for message in p.bus.receive(REPLIES) for out in p.scheduler.on_reply(decode_reply(message.body))]
    assert sorted(decode_reply(m.body).child for m in lost) == [0, 1]  # never sent
    assert p.snapshot(wid).steps["charge_all"].status is StepStatus.PROCESSING
    p.settle(wid)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert snapshot.steps["charge_all"].resends == 1  # one check, then both reports again
    assert p.services["payments"].actions() == ["charge", "charge"]  # no child ran twice


def test_an_empty_list_completes_at_once_and_a_non_list_fails_the_step() -> None:
    p = Pipeline()
    wid = p.start(fan_out(), {"orders": []})
    p.pump()
    assert p.snapshot(wid).steps["charge_all"].output == {"total": 0, "succeeded": 0, "failed": 0, "results": []}
    wid = p.start(fan_out(), {"orders": "nope"})
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.steps["charge_all"].error["code"] == "MAP_ITEMS_NOT_EVALUATED"
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tolerated_failure": -1}, "a count >= 0"),
        ({"tolerated_failure": "ten"}, "not a count or a percentage"),
        ({"max_concurrency": 1001}, "less than or equal to 1000"),
        (
            {
                "definition": {
                    "name": "x",
                    "steps": [{"name": "m", "type": "map", "items": "input", "definition": CHILD}],
                }
            },
            "one level",
        ),
        (
            # found by a trial: accepted, and every child ran at once whatever its max_running
            {"definition": {**CHILD, "tenancy": {"max_running": 1, "tenant_key": "item.c", "over_limit": "queue"}}},
            "a map step's definition cannot have tenancy: its children run under the map step's concurrency",
        ),
    ],
)
def test_map_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidDefinitionError, match=message):
        parse_definition(fan_out(**options))


def test_the_childrens_agents_are_checked_at_start() -> None:
    definition = parse_definition(fan_out())
    assert ("charge_all.charge", "payments", "refund") in definition.agent_calls()


def test_an_empty_map_has_nothing_to_undo_when_a_later_step_fails() -> None:
    # Regression (the simulation, seed 21): the unwind moved an empty map COMPLETED -> COMPENSATED in one write,
    # which the store refuses, so the workflow stayed COMPENSATING.
    p = Pipeline()
    p.services["hotels"].script["book"] = ["reject"]
    wid = p.start(fan_out(), {"orders": []})
    p.settle(wid)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.steps["charge_all"].status is StepStatus.COMPLETED  # nothing started, nothing undone
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPENSATED


def test_a_claim_checked_list_of_items_is_read_from_its_object_and_large_items_are_claim_checked_too() -> None:
    # Regression: the items were evaluated on the item's raw input, a reference once the start input is over the
    # threshold, so a map over a large list failed MAP_ITEMS_NOT_EVALUATED.
    p = Pipeline(claim_check_threshold=1_024)
    orders = [{"sku": f"s{i}", "note": "n" * (1_200 if i == 2 else 10)} for i in range(40)]
    wid = p.start(fan_out(max_concurrency=10), {"orders": orders})
    p.pump()
    snapshot = p.snapshot(wid)
    assert "$claim_check" in snapshot.workflow.input  # the start input left the item
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED, snapshot.workflow.reason
    record = snapshot.steps["charge_all"]
    assert "$claim_check" in record.output  # 40 results are over the threshold: claim-checked as well
    big = p.snapshot(child_id(wid, 1, 2))
    assert "$claim_check" in big.workflow.input and big.workflow.claim_checked  # an item over the threshold
    assert p.snapshot(child_id(wid, 1, 3)).workflow.input == {"item": orders[3], "index": 3}
    assert set(p.payloads.tags.values()) == {"terminal"}  # every object expires with its workflow


def expire(p: Pipeline) -> list[str]:
    """What DynamoDB's TTL and the bucket's lifecycle rule do at the injected clock's time: delete every workflow
    whose ``expires_at`` has passed, and its objects tagged terminal; return the ids deleted."""
    now = int(p.clock.now())
    gone = [w for w, s in p.store.workflows.items() if (s.workflow.expires_at or now + 1) <= now]
    for workflow_id in gone:
        del p.store.workflows[workflow_id]
        for key in p.payloads.keys(f"{workflow_id}/"):
            if p.payloads.tags[key] == "terminal":
                p.payloads.delete(key)
    return gone


def test_a_parent_held_past_the_retention_still_compensates_its_children_which_then_expire_with_it() -> None:
    # Regression: a child got its TTL (and its objects the terminal tag) when it ended, so under a parent held
    # longer than TerminalRetentionDays the operator's compensate found the completed children gone and ended
    # COMPENSATION_FAILED (CHILD_COMPENSATION_FAILED) with every charge still in place.
    # Given a parent whose three children completed (one input claim-checked) and which is then HELD at its last step
    p = Pipeline(claim_check_threshold=1_024)
    p.services["hotels"].script["book"] = ["reject"]
    orders = [{"sku": "s0", "note": "n" * 1_200}, {"sku": "s1"}, {"sku": "s2"}]
    wid = p.start({**fan_out(), "on_failure": "hold"}, {"orders": orders})
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    kids = children(p, wid, 3)
    assert {c.workflow.status for c in kids} == {WorkflowStatus.COMPLETED}
    child_keys = p.payloads.keys(f"{child_id(wid, 1, 0)}/")
    # When the parent stays held past the retention (30 days), then an operator compensates it
    p.clock.advance(31 * 86_400)
    expired = expire(p)
    p.scheduler.operate(wid, "compensate", principal="ops", reason="give up", action_id="a-1")
    p.settle(wid)
    # Then every child is compensated (each charge refunded) and the parent ends COMPENSATED
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED, snapshot.steps["charge_all"].comp_error
    assert snapshot.steps["charge_all"].status is StepStatus.COMPENSATED
    assert {c.workflow.status for c in children(p, wid, 3)} == {WorkflowStatus.COMPENSATED}
    assert p.services["payments"].actions().count("refund") == 3
    # (nothing had expired while the parent was held: the children had no TTL and their objects stayed live)
    assert expired == []
    assert child_keys and {c.workflow.expires_at for c in kids} == {None}
    assert {p.payloads.tags[k] for k in child_keys} == {"terminal"}  # re-stamped when the parent ended
    # And the children's retention is the parent's, their objects expire with it, and all go together
    expires_at = snapshot.workflow.expires_at
    assert expires_at == int(p.clock.now()) + 30 * 86_400
    assert {c.workflow.expires_at for c in children(p, wid, 3)} == {expires_at}
    assert {p.payloads.tags[k] for k in p.payloads.keys(f"{child_id(wid, 1, 0)}/")} == {"terminal"}
    p.clock.advance(30 * 86_400)
    assert sorted(expire(p)) == sorted([wid, *(child_id(wid, 1, i) for i in range(3))])
    assert p.payloads.objects == {}


def test_a_child_that_ends_after_its_parent_takes_the_parents_retention() -> None:
    # Given a parent that has ended while one of its children had not (its report lost, the parent skipped on)
    p = Pipeline()
    wid = p.start(fan_out(max_concurrency=2), {"orders": [1, 2]})
    p.pump()
    parent = p.snapshot(wid)
    assert parent.workflow.status is WorkflowStatus.COMPLETED
    child = p.snapshot(child_id(wid, 1, 0))
    # (a child that ended under a parent still running keeps no TTL; rewind it to that moment)
    p.store.workflows[child.workflow.workflow_id] = child.with_workflow(child.workflow.evolve(expires_at=None))
    # When, three days later, a message of the ended child comes again (a redelivery: nothing to write)
    p.clock.advance(3 * 86_400)
    p.scheduler.on_overdue(child.workflow.workflow_id)
    # Then it takes its parent's retention, not three days more than its parent's (its own end + 30 days)
    assert parent.workflow.expires_at is not None
    assert p.snapshot(child_id(wid, 1, 0)).workflow.expires_at == parent.workflow.expires_at


def test_a_parent_reopened_by_an_operator_takes_its_childrens_expiry_away_until_it_ends_again() -> None:
    # Given a parent whose children completed, then unwound when the hotel refused, and which ended
    # COMPENSATION_FAILED because the flight's cancellation kept failing: its children took its retention
    p = Pipeline()
    p.services["hotels"].script["book"] = ["reject"]
    p.services["flights"].script["cancel_reservation"] = ["503"] * 100
    definition = fan_out()
    policy = {"max_attempts": 3, "backoff_base_seconds": 2.0, "backoff_cap_seconds": 10.0}
    definition["steps"][0]["compensation"]["retry"] = policy  # three attempts, seconds apart
    wid = p.start(definition, {"orders": [1, 2, 3]})
    p.settle(wid)
    ended = p.snapshot(wid)
    assert ended.workflow.status is WorkflowStatus.COMPENSATION_FAILED
    assert ended.workflow.expires_at is not None
    assert {c.workflow.expires_at for c in children(p, wid, 3)} == {ended.workflow.expires_at}
    # When, a day later, an operator retries the failed compensation (the parent is no longer ended)
    p.clock.advance(86_400)
    snapshot, messages = p.scheduler.operate(
        wid, "retry-compensation", principal="ops", reason="flights fixed", action_id="rc-1"
    )
    # Then the children lose their expiry with it: they must outlive a parent that may be held again
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATING and snapshot.workflow.expires_at is None
    assert {c.workflow.expires_at for c in children(p, wid, 3)} == {None}
    # And when the parent ends again (flights is back), they take its new retention
    p.services["flights"].script["cancel_reservation"] = []
    p.bus.send(messages)
    p.settle(wid)
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPENSATED
    assert final.workflow.expires_at is not None and final.workflow.expires_at > ended.workflow.expires_at
    assert {c.workflow.expires_at for c in children(p, wid, 3)} == {final.workflow.expires_at}


def squat(p: Pipeline, workflow_id: str, status: WorkflowStatus) -> Any:
    """Store a workflow of its own (no parent) under ``workflow_id``, as if its id collided with a child's."""
    stranger = p.snapshot(p.start(send=False))
    squatter = replace(stranger, workflow=stranger.workflow.evolve(workflow_id=workflow_id, status=status))
    p.store.workflows[workflow_id] = squatter
    return squatter


def test_a_child_id_held_by_another_workflow_fails_the_map_step_and_leaves_that_workflow_alone() -> None:
    # Regression: a start found the stranger under the child's id and waited for its report, which never came.
    # Given a workflow RUNNING under the id child 1 of the map step will have
    p = Pipeline()
    key = f"k-{uuid.uuid4()}"
    wid = workflow_id_for(OWNER, key, lambda: ID_SECRET)
    stranger = squat(p, child_id(wid, 1, 1), WorkflowStatus.RUNNING)
    # When the parent runs its map over three orders
    assert p.start(fan_out(max_concurrency=3), {"orders": [1, 2, 3]}, key=key) == wid
    p.settle(wid)
    # Then the map step fails with the reason, the children that ran are refunded, and the parent ends
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    record = snapshot.steps["charge_all"]
    assert record.error is not None and record.error["code"] == "MAP_CHILD_ID_TAKEN"
    assert child_id(wid, 1, 1) in record.error["message"]
    assert record.status is StepStatus.COMPENSATED
    kids = children(p, wid, 3)
    assert {kids[0].workflow.status, kids[2].workflow.status} <= {WorkflowStatus.CANCELLED, WorkflowStatus.COMPENSATED}
    actions = p.services["payments"].actions()
    assert actions.count("refund") == actions.count("charge")  # whatever a child charged was refunded
    # And the stranger is as it was
    assert p.snapshot(child_id(wid, 1, 1)) == stranger
    assert p.metrics["MapChildIdsTaken"] >= 2  # refused at its start, and left alone by the unwind


def test_a_cancel_of_a_parent_whose_child_id_is_held_by_another_workflow_ends_cancelled() -> None:
    # Regression: the stranger, COMPLETED, was taken for the child: the parent's cancel compensated it, and its
    # report never reached the parent, which stayed CANCELLING for ever.
    # Given a COMPLETED workflow under the id of child 0, and the parent's map step starting its children
    p = Pipeline()
    key = f"k-{uuid.uuid4()}"
    wid = workflow_id_for(OWNER, key, lambda: ID_SECRET)
    stranger = squat(p, child_id(wid, 1, 0), WorkflowStatus.COMPLETED)
    p.start(fan_out(max_concurrency=2), {"orders": [1, 2]}, key=key)
    p.run_agent("flights")
    p.run_scheduler()
    p.run_scheduler()  # the tick starts children 0 (refused: taken) and 1
    # When the client cancels the parent
    p.scheduler.cancel(wid, owner=OWNER)
    p.settle(wid)
    # Then the parent ends CANCELLED, child 1 cancelled with it, and the stranger is left as it was
    assert p.snapshot(wid).workflow.status is WorkflowStatus.CANCELLED
    assert p.snapshot(child_id(wid, 1, 1)).workflow.status is WorkflowStatus.CANCELLED
    assert p.snapshot(child_id(wid, 1, 0)) == stranger
    assert p.metrics["ChildRetentionFailures"] == 0  # the parent's end gave its own children their retention only


def test_a_childs_claim_checked_input_is_pending_until_the_child_exists_and_a_repeated_start_keeps_it_live() -> None:
    # Regression: a child's input object was written live before its create; a create that failed left it live for
    # ever under no workflow, and a repeated start (a stale read) tagged the running child's own input pending.
    # Given a parent whose map step's first start of its child fails at the create
    p = Pipeline(claim_check_threshold=1_024)
    create = p.store.create

    def throttled(snapshot: Any) -> Any:
        if snapshot.workflow.parent is None:
            return create(snapshot)
        p.store.create = create  # type: ignore[method-assign]
        raise RuntimeError("ProvisionedThroughputExceededException")

    p.store.create = throttled  # type: ignore[method-assign]
    wid = p.start(fan_out(timeout_seconds=60), {"orders": [{"sku": "s0", "note": "n" * 1_200}]})
    p.run_agent("flights")
    while p.run_scheduler():  # the flight's reply, then the launch of the map step's child
        pass
    kid = child_id(wid, 1, 0)
    # Then the child's input object is pending (the bucket's PendingPayloads rule expires it after a day)
    [key] = p.payloads.keys(f"{kid}/")
    assert p.store.load(kid) is None and p.payloads.tags[key] == "pending"
    # When the supervisor's check of the map step starts the child
    p.clock.advance(600)
    p.sweep()
    # Then it exists and its input is live (as is its step's rendered input, written after the create)
    assert p.snapshot(kid).workflow.input["$claim_check"]["key"] == key
    assert set(p.payloads.tags[k] for k in p.payloads.keys(f"{kid}/")) == {"live"}
    # When a later check reads it stale (not found yet) and starts it again: the same PUT, then a failed create
    p.store.stale_reads[kid] = None
    parent = p.snapshot(wid)
    ref = ParentRef(workflow_id=wid, step="charge_all", attempt=parent.steps["charge_all"].attempt, index=0)
    item = {"item": {"sku": "s0", "note": "n" * 1_200}, "index": 0}
    assert p.scheduler._start_child(parent, ChildCommand("check", ref, kid, input=item)) == []
    # Then the running child's input stays live (the repeat's pending tag taken back), and all ends terminal
    assert p.payloads.tags[key] == "live"
    del p.store.stale_reads[kid]
    p.settle(wid)
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert p.payloads.tags[key] == "terminal"


def test_a_failure_to_set_the_childrens_retention_fails_the_ending_call_and_its_redelivery_sets_it() -> None:
    # Regression (the simulation, seed 51 with maps and holds): a crash while stamping the children was logged and
    # swallowed, the ending message was deleted, and the children of the ended parent kept no TTL for ever.
    # Given a parent whose children completed and whose last step's reply is about to end it
    p = Pipeline()
    wid = p.start(fan_out(max_concurrency=2), {"orders": [1, 2]})
    while sum(len(p.run_agent(agent)) for agent in ("flights", "payments")) + p.run_scheduler():
        pass
    [last] = p.run_agent("hotels", lose_replies=True)
    load_many = p.store.load_many

    def throttled(ids: Any) -> Any:
        p.store.load_many = load_many  # type: ignore[method-assign]
        raise RuntimeError("ProvisionedThroughputExceededException")

    p.store.load_many = throttled  # type: ignore[method-assign]
    # When the reply ends the parent but its children's retention cannot be set
    with pytest.raises(RuntimeError):
        p.scheduler.on_reply(last)
    # Then the parent has ended, its children have no TTL yet (kept, never expired early), and the call failed
    parent = p.snapshot(wid)
    assert parent.workflow.status is WorkflowStatus.COMPLETED and parent.workflow.expires_at is not None
    assert {c.workflow.expires_at for c in children(p, wid, 2)} == {None}
    # And when SQS delivers the reply again, nothing is written and the children take the parent's retention
    assert p.scheduler.on_reply(last) == []
    assert p.snapshot(wid).version == parent.version
    assert {c.workflow.expires_at for c in children(p, wid, 2)} == {parent.workflow.expires_at}
