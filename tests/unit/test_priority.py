"""Priorities and fair service (issue 39): a workflow's priority and tenant travel with its step requests; an agent
calls its service for a batch's records by priority, then round-robin between tenants; a deferred record of a higher
priority comes back sooner; SQS sees the tenant as the message's group (fair queues)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sasflow.agent_lambda import service_order
from sasflow.batch import fair_order
from sasflow.call_limits import PRIORITY_WAIT, CallLimiter, CallLimits
from sasflow.clock import ManualClock
from sasflow.definition import parse_definition
from sasflow.errors import CallsLimitedError
from sasflow.messages import canonical_hash, decode_request
from sasflow.tenancy import fair_group
from tests.support.fakes import InMemoryLimitsStore
from tests.support.pipeline import OWNER, TRIP_INPUT, Pipeline, trip_definition

T0 = 1_800_000_000.0


def record(priority: int | None, tenant: str, n: int) -> dict[str, Any]:
    body: dict[str, Any] = {"tenant": tenant, "n": n}
    if priority is not None:
        body["priority"] = priority
    return {"messageId": f"m{n}", "body": json.dumps(body)}


def order(records: list[dict[str, Any]]) -> list[int]:
    return [json.loads(r["body"])["n"] for r in service_order(records)]


def test_a_batch_is_served_by_priority_then_round_robin_between_tenants_then_as_it_came() -> None:
    # Given a batch: acme's burst of four, globex's two, and one urgent (priority 1) and one bulk (5) record
    batch = [
        record(None, "key#acme", 1),
        record(None, "key#acme", 2),
        record(None, "key#acme", 3),
        record(None, "key#acme", 4),
        record(None, "key#globex", 5),
        record(5, "key#globex", 6),
        record(None, "key#globex", 7),
        record(1, "key#acme", 8),
    ]
    # Then the urgent one first, then acme and globex in turn, acme's rest, and the bulk one last
    assert order(batch) == [8, 1, 5, 2, 7, 3, 4, 6]


def test_a_record_that_is_not_a_request_keeps_its_place_at_the_default_priority() -> None:
    batch = [{"messageId": "x", "body": "not json"}, record(1, "t", 1), {"messageId": "y", "body": "[1]"}]
    assert [r["messageId"] for r in service_order(batch)] == ["m1", "x", "y"]
    assert fair_order([], lambda r: (3, "")) == []


def test_a_deferred_record_of_a_higher_priority_comes_back_sooner() -> None:
    # Given an agent limited to 1 call at once, whose one unit another instance holds
    limits = CallLimits(max_in_flight=1)
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    holder = CallLimiter("hotels", limits, store, clock, holder="a", rng=random.Random(1))
    holder.acquire(1.0, T0 + 60)

    # When records of priorities 1, 3 and 5 find no unit, on limiters drawing the same spread
    def deferred_after(priority: int) -> float:
        limiter = CallLimiter("hotels", limits, store, clock, holder=f"p{priority}", rng=random.Random(9))
        with pytest.raises(CallsLimitedError) as deferred:
            limiter.acquire(1.0, T0 + 60, priority=priority)
        return deferred.value.retry_at - T0

    waits = {priority: deferred_after(priority) for priority in (1, 3, 5)}

    # Then the urgent one is told to come back soonest and the bulk one latest, by PRIORITY_WAIT's factors
    assert waits[1] < waits[3] < waits[5]
    assert PRIORITY_WAIT == {1: 0.5, 2: 0.75, 3: 1.0, 4: 1.5, 5: 2.0}


def test_a_workflows_priority_and_tenant_travel_with_its_step_requests_as_the_sqs_group() -> None:
    p = Pipeline()
    definition = {**trip_definition(), "tenancy": {"max_running": 5, "tenant_key": "customer"}}
    workflow_input = {**TRIP_INPUT, "customer": "acme"}
    body = {"definition": definition, "input": workflow_input}
    result = p.scheduler.start_workflow(
        parse_definition(definition), workflow_input, request_hash=canonical_hash(body), owner=OWNER, priority=1
    )
    [message] = result.messages
    request = decode_request(message.body)
    tenant = "key#acme"
    assert (result.workflow.priority, request.priority, request.tenant, message.group) == (1, 1, tenant, tenant)

    # A workflow of the default priority stores none and sends none; its group is the principal that started it
    plain = p.scheduler.start_workflow(
        parse_definition(trip_definition()), TRIP_INPUT, request_hash="h2", owner=OWNER, priority=3
    )
    [message] = plain.messages
    assert (plain.workflow.priority, json.loads(message.body).get("priority")) == (None, None)
    assert message.group == f"principal#{OWNER}"


def test_a_group_sqs_would_refuse_is_replaced_by_its_digest() -> None:
    assert fair_group("key#acme", None) == "key#acme"
    assert fair_group(None, "arn:aws:iam::123456789012:user/client-a") == (
        "principal#arn:aws:iam::123456789012:user/client-a"
    )
    for bad in ("key#" + "x" * 200, "key#café", "key#two words"):
        group = fair_group(bad, None)
        assert group.startswith("sha256#") and len(group) == 47
        assert group == fair_group(bad, None)  # the same tenant, the same group
