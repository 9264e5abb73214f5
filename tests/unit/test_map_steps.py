"""Map steps: a child workflow per item under a concurrency, their reports, tolerance, collection and unwind."""

from __future__ import annotations

from typing import Any

import pytest

from sasflow.api_models import events_of
from sasflow.definition import parse_definition
from sasflow.errors import InvalidDefinitionError
from sasflow.fanout import MapProgress, child_id
from sasflow.messages import decode_reply
from sasflow.states import TERMINAL_WORKFLOW, StepStatus, WorkflowStatus
from tests.support.pipeline import OWNER, REPLIES, Pipeline

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
