"""A map step through the real handlers on moto: children stored as workflows, reports, collection, the view."""

from __future__ import annotations

import json
from typing import Any

import boto3

from devstack.iam.guard import clear_refusals
from sasflow.adapters.dynamodb_store import DynamoDBStateStore
from sasflow.fanout import MapProgress, child_id
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

CHILD = {
    "name": "charge-one",
    "steps": [
        {
            "name": "charge",
            "agent": "payments",
            "action": "charge",
            "input": {"amount.$": "input.item", "currency": "EUR"},
            "compensation": {"action": "refund", "input": {"amount.$": "input.item"}},
        }
    ],
}


def body(orders: list[Any], **options: Any) -> dict[str, Any]:
    return {
        "definition": {
            "name": "charge-orders",
            "steps": [{"name": "charge_all", "type": "map", "items": "input.orders", "definition": CHILD, **options}],
        },
        "input": {"orders": orders},
    }


def store(deployed: Deployed) -> DynamoDBStateStore:
    return DynamoDBStateStore(deployed.physical["StateTable"], boto3.client("dynamodb"))


def test_a_map_of_twelve_completes_through_the_handlers_with_every_child_a_workflow(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", body([10 * i for i in range(12)], max_concurrency=5))
    assert status == 201
    wid = started["workflow_id"]
    deployed.pump()
    status, view = deployed.api("GET", f"/workflows/{wid}")
    assert status == 200 and view["status"] == "COMPLETED"
    step = view["steps"][0]
    assert step["type"] == "map"
    assert step["children"] == {
        "total": 12, "started": 12, "ended": 12, "failed": 0, "unwound": None, "id_prefix": f"{wid}:0:",
    }  # fmt: skip
    output = step["output"]
    assert (output["total"], output["succeeded"], output["failed"]) == (12, 12, 0)
    assert [r["service"] for r in output["results"]] == ["payments"] * 12
    # the children: workflows of their own, read back with BatchGetItem, owned by the caller
    children = store(deployed).load_many([child_id(wid, 0, i) for i in range(13)])
    assert sorted(children) == sorted(child_id(wid, 0, i) for i in range(12))
    assert {c.workflow.status.value for c in children.values()} == {"COMPLETED"}
    assert [children[child_id(wid, 0, i)].workflow.input for i in range(12)] == [
        {"item": 10 * i, "index": i} for i in range(12)
    ]
    parent = children[child_id(wid, 0, 3)].workflow.parent
    assert parent is not None and (parent.workflow_id, parent.step, parent.index) == (wid, "charge_all", 3)
    status, child_view = deployed.api("GET", f"/workflows/{child_id(wid, 0, 3)}")
    assert status == 200 and child_view["input"] == {"item": 30, "index": 3}
    assert sorted(deployed.remote["payments"].service.effects().values()) == [1] * 12
    # the parent's item holds counters: the map progress round-trips through DynamoDB
    snapshot = store(deployed).load(wid)
    assert snapshot is not None and snapshot.steps["charge_all"].map == MapProgress(total=12, launched=12, low=12)


def test_a_cancelled_map_cancels_its_children_through_the_handlers(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", body([1, 2, 3, 4], max_concurrency=2))
    wid = started["workflow_id"]
    deployed.driver("SchedulerFunction").deliver()  # the map's tick starts two children
    status, _ = deployed.api("POST", f"/workflows/{wid}/cancel", {"reason": "changed my mind"})
    assert status == 202
    deployed.pump()
    status, view = deployed.api("GET", f"/workflows/{wid}")
    assert view["status"] == "CANCELLED"
    assert view["steps"][0]["children"]["unwound"] == 2
    children = store(deployed).load_many([child_id(wid, 0, i) for i in range(4)])
    assert sorted(children) == [child_id(wid, 0, 0), child_id(wid, 0, 1)]
    assert {c.workflow.status.value for c in children.values()} <= {"CANCELLED", "COMPENSATED"}
    effects = deployed.remote["payments"].service.effects()
    undone = deployed.remote["payments"].service.compensations()
    assert set(undone) == set(effects)  # every charge that happened was refunded


def test_without_batchgetitem_the_schedulers_role_refuses_to_collect_a_map_and_the_map_never_ends(
    deployed: Deployed,
) -> None:
    # Given the scheduler's role as deployed, but without dynamodb:BatchGetItem (as it was before this was found)
    deployed.roles["SchedulerFunction"] = deployed.roles["SchedulerFunction"].without("dynamodb:BatchGetItem")
    # When a map of three runs through the handlers
    status, started = deployed.api("POST", "/workflows", body([1, 2, 3], max_concurrency=3))
    assert status == 201
    deployed.pump()
    # Then the three children end, but the parent cannot read them back to collect them: it stays RUNNING
    status, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert (status, view["status"]) == (200, "RUNNING")
    step = view["steps"][0]
    assert (step["status"], step["output"], step["children"]["ended"]) == ("PROCESSING", None, 3)
    refused = clear_refusals()
    assert {(r.function, r.action, r.resource) for r in refused} == {
        (
            "SchedulerFunction",
            "dynamodb:BatchGetItem",
            f"arn:aws:dynamodb:us-east-1:123456789012:table/{table(deployed)}",
        )
    }
    assert json.loads(refused[0].missing) == {
        "Effect": "Allow",
        "Action": "dynamodb:BatchGetItem",
        "Resource": f"arn:aws:dynamodb:us-east-1:123456789012:table/{table(deployed)}",
    }


def table(deployed: Deployed) -> str:
    return deployed.physical["StateTable"]


def uncollected_map(deployed: Deployed) -> str:
    """A map of three whose children all ended but whose scheduler could not collect them (its role without
    BatchGetItem, as in the test above), then the supervisor's run past the map step's complete-by; its id."""
    scheduler_role = deployed.roles["SchedulerFunction"]
    deployed.roles["SchedulerFunction"] = scheduler_role.without("dynamodb:BatchGetItem")
    status, started = deployed.api("POST", "/workflows", body([1, 2, 3], max_concurrency=3, timeout_seconds=60))
    assert status == 201
    wid = started["workflow_id"]
    deployed.pump()
    assert deployed.api("GET", f"/workflows/{wid}")[1]["status"] == "RUNNING"
    clear_refusals()
    deployed.fn("SchedulerFunction").principal = scheduler_role  # the scheduler's role as deployed again
    deployed.clock.advance(60 + 31)  # past complete-by + DeadlineGraceSeconds
    deployed.fn("SupervisorFunction").invoke(load_event("supervisor_scheduled.json"))
    deployed.pump()
    return wid


def test_the_supervisor_collects_a_map_its_scheduler_could_not_under_its_own_role(deployed: Deployed) -> None:
    # Given a map of three whose children ended but whose collection failed, When the supervisor runs past the map
    # step's complete-by
    wid = uncollected_map(deployed)
    # Then it collects the children itself (BatchGetItem, which its role allows) and the parent completes
    _, view = deployed.api("GET", f"/workflows/{wid}")
    assert view["status"] == "COMPLETED"
    output = view["steps"][0]["output"]
    assert (output["total"], output["succeeded"], output["failed"]) == (3, 3, 0)
    assert clear_refusals() == []
    # and the children take the ended parent's retention
    parent = store(deployed).load(wid)
    children = store(deployed).load_many([child_id(wid, 0, i) for i in range(3)])
    assert parent is not None and parent.workflow.expires_at is not None
    assert {c.workflow.expires_at for c in children.values()} == {parent.workflow.expires_at}


def test_without_batchgetitem_the_supervisors_role_refuses_to_collect_a_map(deployed: Deployed) -> None:
    # Given the supervisor's role without dynamodb:BatchGetItem
    deployed.roles["SupervisorFunction"] = deployed.roles["SupervisorFunction"].without("dynamodb:BatchGetItem")
    # When it finds the uncollected map overdue
    wid = uncollected_map(deployed)
    # Then its read of the children is refused as on AWS, and the parent stays RUNNING
    assert deployed.api("GET", f"/workflows/{wid}")[1]["status"] == "RUNNING"
    refused = clear_refusals()
    assert {(r.function, r.action) for r in refused} == {("SupervisorFunction", "dynamodb:BatchGetItem")}
