"""The bench's accounting rules, its Step Functions anchor, and a tiny end-to-end run of the cost scenarios."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from bench.accounting import Meter, Usage, attribute_size, bill, item_size
from bench.asl import StepObservation, count_transitions, saga_asl
from bench.cost import figures, rows, whole_bill
from bench.report import Row
from bench.scenarios import Scenario, calls_waited, chain_definition, check_mappings, run_scenario, scenarios
from devstack.template import SqsEventSpec
from sasflow import prices

AGENT_NAMES = ("Flights", "Hotels", "Payments")


# ---------------------------------------------------------------------------------------------------- item size
def test_attribute_sizes_follow_the_dynamodb_rules() -> None:
    assert attribute_size({"S": "héllo"}) == 6  # UTF-8 bytes
    assert attribute_size({"N": "12345"}) == 4  # ceil(5 / 2) + 1
    assert attribute_size({"N": "-0.0012300"}) == 4  # significant digits "123": ceil(3 / 2) + 1, + 1 for the sign
    assert attribute_size({"BOOL": True}) == 1
    assert attribute_size({"NULL": True}) == 1
    assert attribute_size({"B": b"\x00\x01\x02"}) == 3
    assert attribute_size({"L": [{"S": "ab"}, {"N": "1"}]}) == 3 + (1 + 2) + (1 + 2)
    assert attribute_size({"M": {"k": {"S": "v"}}}) == 3 + 1 + 1 + 1
    assert item_size({"pk": {"S": "abc"}, "n": {"N": "7"}}) == (2 + 3) + (1 + 2)


# ---------------------------------------------------------------------------------------------------- capacity
@pytest.fixture
def table() -> Iterator[tuple[Meter, Any]]:
    with mock_aws():
        meter = Meter()
        with meter.installed():
            client = boto3.client("dynamodb", region_name="us-east-1")
            with meter.paused():
                client.create_table(
                    TableName="t",
                    KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                    AttributeDefinitions=[
                        {"AttributeName": "pk", "AttributeType": "S"},
                        {"AttributeName": "g", "AttributeType": "S"},
                    ],
                    GlobalSecondaryIndexes=[
                        {
                            "IndexName": "gsi",
                            "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                            "Projection": {"ProjectionType": "KEYS_ONLY"},
                        }
                    ],
                    BillingMode="PAY_PER_REQUEST",
                )
            yield meter, client


def test_writes_cost_one_wru_per_kb_of_the_larger_image_and_index_writes_count(table: tuple[Meter, Any]) -> None:
    meter, client = table
    big = "x" * 1500  # pk (2 + 1) + body (4 + 1500) = 1,507 bytes: 2 WRU
    client.put_item(TableName="t", Item={"pk": {"S": "a"}, "body": {"S": big}})
    assert meter.usage.wru["PutItem"] == 2
    assert meter.usage.wru["PutItem:index"] == 0  # no "g": not in the sparse index
    client.update_item(
        TableName="t",
        Key={"pk": {"S": "a"}},
        UpdateExpression="SET g = :g",
        ExpressionAttributeValues={":g": {"S": "1"}},
    )
    assert meter.usage.wru["UpdateItem"] == 2  # the item is still 1.5 KB
    assert meter.usage.wru["UpdateItem:index"] == 1  # it entered the index
    client.update_item(TableName="t", Key={"pk": {"S": "a"}}, UpdateExpression="REMOVE body, g")
    assert meter.usage.wru["UpdateItem"] == 4  # billed on the larger (before) image
    assert meter.usage.wru["UpdateItem:index"] == 2  # it left the index
    assert meter.usage.calls[("dynamodb", "UpdateItem")] == 2


def test_a_failed_conditional_write_still_costs_and_transactions_cost_double(table: tuple[Meter, Any]) -> None:
    meter, client = table
    client.put_item(TableName="t", Item={"pk": {"S": "a"}})
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        client.put_item(TableName="t", Item={"pk": {"S": "a"}}, ConditionExpression="attribute_not_exists(pk)")
    assert meter.usage.wru["PutItem"] == 2
    client.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "b"}, "g": {"S": "1"}}}},
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "c"}}}},
        ]
    )
    assert meter.usage.wru["TransactWriteItems"] == 4  # 2 items x 1 WRU x 2
    assert meter.usage.wru["TransactWriteItems:index"] == 2  # b entered the index, doubled too


def test_reads_cost_per_4_kb_and_half_when_eventually_consistent(table: tuple[Meter, Any]) -> None:
    meter, client = table
    with meter.paused():
        for key in "abc":
            client.put_item(TableName="t", Item={"pk": {"S": key}, "g": {"S": "1"}, "body": {"S": "y" * 3000}})
    assert meter.usage.calls == {}  # paused calls are not counted
    client.get_item(TableName="t", Key={"pk": {"S": "a"}}, ConsistentRead=True)
    client.get_item(TableName="t", Key={"pk": {"S": "zz"}})  # nothing found: still the minimum
    assert meter.usage.rru["GetItem"] == 1.5
    client.query(
        TableName="t", IndexName="gsi", KeyConditionExpression="g = :g", ExpressionAttributeValues={":g": {"S": "1"}}
    )
    assert meter.usage.rru["Query"] == 0.5  # 3 keys-only items, well under 4 KB, eventually consistent
    assert meter.usage.items_read["Query:gsi"] == 3


def test_sqs_requests_are_billed_per_64_kb_chunk() -> None:
    with mock_aws():
        meter = Meter()
        with meter.installed():
            sqs = boto3.client("sqs", region_name="us-east-1")
            with meter.paused():
                url = sqs.create_queue(QueueName="q")["QueueUrl"]
            sqs.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "MessageBody": "z" * 40_000} for i in range(3)],  # 120,000 bytes
            )
            received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)],
            )
    assert meter.usage.calls[("sqs", "SendMessageBatch")] == 1
    billed_receive = -(-len(received) * 40_000 // prices.SQS_CHUNK_BYTES)
    assert meter.usage.sqs_billed == 2 + billed_receive + 1
    assert meter.usage.sqs_messages == {"sent": 3, "received": len(received), "deleted": len(received)}


def test_bill_prices_every_line_with_the_price_list() -> None:
    meter = Meter()
    usage = meter.usage
    usage.lambda_invocations["SchedulerFunction"] = 1_000_000
    usage.lambda_ms["SchedulerFunction"] = 100 * 1_000_000  # 100 ms each
    usage.wru["PutItem"] = 1_000_000
    usage.rru["Query"] = 1_000_000
    usage.sqs_billed = 1_000_000
    usage.api_requests = 1_000_000
    cost = bill(usage, {"SchedulerFunction": 256})
    assert cost.lambda_requests == pytest.approx(0.20)
    assert cost.lambda_compute == pytest.approx(100_000 * 0.25 * 0.0000166667)  # GB-s at 256 MB
    assert cost.dynamodb_writes == pytest.approx(0.625)
    assert cost.dynamodb_reads == pytest.approx(0.125)
    assert cost.sqs == pytest.approx(0.40)
    assert cost.api == pytest.approx(1.00)


# ---------------------------------------------------------------------------------------------------- the anchor
def _ok(calls: int = 1) -> StepObservation:
    return StepObservation(ran=True, calls=calls, outcome="ok")


def test_step_functions_transitions_of_the_saga() -> None:
    definition = chain_definition(3)
    asl = saga_asl(definition)
    names = [s["name"] for s in definition["steps"]]
    assert asl["StartAt"] == f"Do_{names[0]}"
    assert asl["States"][f"Do_{names[2]}"]["End"] is True
    happy = {name: _ok() for name in names}
    assert count_transitions(asl, happy) == 3  # one Task per step, End on the last
    retried = {**happy, names[1]: _ok(calls=3)}
    assert count_transitions(asl, retried) == 5  # two retries are two more transitions
    rejected = {
        names[0]: StepObservation(True, 1, "ok", compensation_calls=1),
        names[1]: StepObservation(True, 1, "rejected"),
        names[2]: StepObservation(False, 0, "ok"),
    }
    assert count_transitions(asl, rejected) == 4  # Do_1, Do_2, Undo_1, SagaFailed
    unknown = {
        names[0]: StepObservation(True, 1, "ok", compensation_calls=1),
        names[1]: StepObservation(True, 1, "ok", compensation_calls=3),
        names[2]: StepObservation(True, 9, "failed", compensation_calls=5, compensation_ok=False),
    }
    # Do x3 (+8 retries on the last), Undo_3 (+4 retries) then CompensationFailed
    assert count_transitions(asl, unknown) == 3 + 8 + 1 + 4 + 1


# ---------------------------------------------------------------------------------------------------- end to end
def test_the_cost_scenarios_run_end_to_end_and_their_figures_add_up() -> None:
    s1 = next(s for s in scenarios(scale=0.02) if s.name == "S1")
    assert s1.workflows == 4
    result = run_scenario(s1)
    assert dict(result.statuses) == {"COMPLETED": 4}
    assert result.steps_run == 12
    data = figures(result)
    assert data["step_functions_transitions"] == 12
    assert data["anchor_per_step"] == pytest.approx(prices.STEP_FUNCTIONS_PER_TRANSITION)
    calls = data["usage"]["calls"]
    by_function = data["usage"]["calls_by_function"]
    # Per workflow: one write to start it (and the definition once); per reply one write; per step two
    # idempotency writes by the agent; no transaction anywhere.
    assert "dynamodb.TransactWriteItems" not in calls
    assert by_function["ApiFunction dynamodb.PutItem"] == 4 + 1
    assert by_function["SchedulerFunction dynamodb.PutItem"] == 12
    assert by_function["FlightsAgentFunction dynamodb.PutItem"] == 4
    assert by_function["FlightsAgentFunction dynamodb.UpdateItem"] == 4
    # Write units: 1 per write (every item is under 1 KB), plus the index: in at the start and out at the end; the
    # two replies between keep the key (a lower bound of the next complete-by, not yet overdue: index_key_for)
    wru = data["usage"]["dynamodb_wru"]
    assert wru["PutItem:index"] == 4 * (1 + 1)
    assert wru["PutItem"] == (4 + 1) + 12 + 3 * 4
    # the agents' idempotency completions, and the hotels agent's call limits: one lease for the run's four calls
    # (one batch of four: the 2 s window, from the first trip's request, gathers the four trips started 0.5 s apart)
    assert wru["UpdateItem"] == 3 * 4 + 1
    assert data["call_limits"]["requests_per_step"] == pytest.approx(2 / 12)  # its first read, and the write
    assert [row.metric.split(" ")[0] for row in rows(result, data)] == ["S1"] * 12
    # a start through the API: its HTTP API request, the API function's invocation and its requests
    assert data["start"]["through"] == "api" and data["start"]["invocations_per_start"] == 1.0
    # The anchors' raw counts: 4 executions of 3 steps, each step one durable operation and one Express Task
    assert (data["durable"]["operations"], data["durable"]["invocations"]) == (12, 4)
    assert (data["express"]["requests"], data["express"]["log_events"]) == (4, 4 * 17)
    # (the figures derived from such counts are checked against a hand count in the next test)


@pytest.mark.parametrize(
    ("name", "start_charge"),
    [
        ("S6", prices.EVENTBRIDGE_PER_EVENT),  # the event's PutEvents, paid by both sides
        ("S6-sqs", prices.EVENTBRIDGE_PIPES_PER_REQUEST / 10),  # Step Functions needs a pipe to read a queue
        ("S6-s3", 0.0),  # S3's events on the default bus are free, and so is the rule
    ],
)
def test_the_workflows_started_by_a_trigger_are_costed_with_their_start_on_both_sides(
    name: str, start_charge: float
) -> None:
    scenario = next(s for s in scenarios(scale=0.02) if s.name == name)
    result = run_scenario(scenario)
    workflows = result.workflows
    assert dict(result.statuses) == {"COMPLETED": workflows} and workflows >= 2
    data = figures(result)
    kind = scenario.trigger
    by_function = data["usage"]["calls_by_function"]
    function = result.trigger_function
    # every occurrence reached the trigger's queue as its source sends it (counted), and no start went through the API
    assert by_function[f"{kind} delivery sqs.SendMessage"] == workflows
    assert data["usage"]["api_requests"] == 0
    assert data["usage"]["eventbridge_events"] == (workflows if kind == "event" else 0)
    # the trigger's function is orchestration (its invocations billed as ours); a batch's first requests go together
    invocations = data["usage"]["lambda_invocations"][function]
    assert invocations < workflows and data["usage"]["lambda_billed_ms"][function] > 0
    assert by_function[f"{function} sqs.SendMessageBatch"] <= invocations
    assert data["start"]["through"] == kind and data["start"]["function"] == function
    # the anchor: the walk's transitions and what starting an execution that way costs
    assert data["anchor_per_workflow"] == pytest.approx(3 * prices.STEP_FUNCTIONS_PER_TRANSITION + start_charge)
    assert any(row.metric.startswith(f"{name} a start's own cost") for row in rows(result, data))


# One 3-step trip (flights -> hotels -> payments) on the happy path, alone in its run, counted by hand. Each hop
# takes one simulated second (the mappings deliver once a second), so every batch holds one message.
#
# | who            | request                                              |  n | WRU             | RRU |
# |----------------|------------------------------------------------------|---:|-----------------|----:|
# | API            | GetItem of the definition (eventually consistent)    |  1 |                 | 0.5 |
# | API            | PutItem of the definition (the first start stores it)|  1 | 1               |     |
# | API            | PutItem of the workflow item, first step PROCESSING  |  1 | 1 + 1 index put |     |
# | API            | SendMessageBatch: the flights request                |  1 |                 |     |
# | each agent (3) | GetItem of its circuit breaker (eventually)          |  3 |                 | 1.5 |
# | each agent (3) | PutItem idempotency claim (powertools)               |  3 | 3               |     |
# | each agent (3) | UpdateItem idempotency result (powertools)           |  3 | 3               |     |
# | each agent (3) | SendMessageBatch: its reply                          |  3 |                 |     |
# | scheduler      | GetItem of the definition (strong, once)             |  1 |                 | 1   |
# | scheduler      | GetItem of the workflow per reply (eventually)       |  3 |                 | 1.5 |
# | scheduler      | PutItem of the workflow per reply                    |  3 | 3 + index 0+0+1 |     |
# | scheduler      | SendMessageBatch: the next request (none at the end) |  2 |                 |     |
# | mappings       | ReceiveMessage + DeleteMessageBatch per delivery     |  6 + 6 |           |     |
#
# The index key stays on replies 1 and 2 (the first step's complete-by, a lower bound of the next ones, not yet
# overdue: records.index_key_for) and leaves on reply 3 (1).
# DynamoDB: 19 requests (GetItem 8, PutItem 8, UpdateItem 3); 13 WRU (PutItem 8, index 2, UpdateItem 3) = the
# docs/bench.md's 12 per workflow + 1 for the definition; 4.5 RRU.
# CloudWatch Logs: what the API and the scheduler wrote (their JSON lines and metrics), counted by the byte.
# The hotels agent's call limits (agents.yaml): one read of their item and one lease write (1 RRU, 1 WRU).
# SQS: 18 requests (6 sends, 6 receives, 6 deletes), each under 64 KB: 18 billed.
# Idle mappings: 5 queues (the response queue and the 4 agents' of agents.yaml), 4 of them idle in each of the 6
# simulated seconds (each of the 6 hops waits its queue's 1 s window): 24 queue-seconds, 5 long polls per 20 s: 6
# modelled empty polls. Requests per step: (19 + 18 + 6) / 3; the minimum with batches of one:
# 4 + 2/1 + 2/1 + 2/1 = 10. Lambda requests (engine only): API 1 + scheduler 3. Step Functions: 3 transitions.
def test_one_trip_costs_what_a_hand_count_says() -> None:
    # Given one 3-step workflow on the happy path, deployed with both batching windows at 1 s (each queue drained
    # 1 s after its message became visible, as Lambda gathers)
    windows = (("AgentBatchingWindowSeconds", "1"), ("SchedulerBatchingWindowSeconds", "1"))
    scenario = Scenario("S1", "one trip", 3, 1, parameters=windows)
    # When it runs through the bench
    result = run_scenario(scenario)
    data = figures(result)
    # Then every count is the hand count above
    assert dict(result.statuses) == {"COMPLETED": 1}
    usage = data["usage"]
    assert usage["calls"] == {
        "dynamodb.GetItem": 8 + 1,  # + the hotels agent's call limits: its first read of their item
        "dynamodb.PutItem": 8,
        "dynamodb.UpdateItem": 3 + 1,  # + its lease, one write
        "sqs.DeleteMessageBatch": 6,
        "sqs.ReceiveMessage": 6,
        "sqs.SendMessageBatch": 1 + 3 + 2,
        "secretsmanager.GetSecretValue": 1,  # the API's cold sandbox reads the workflow-id key once
    }
    assert usage["dynamodb_wru"] == {"PutItem": 8, "PutItem:index": 2, "UpdateItem": 3 + 1, "UpdateItem:index": 0}
    assert sum(usage["dynamodb_wru"].values()) == 12 + 1 + 1
    assert usage["dynamodb_rru"] == {"GetItem": 0.5 + 1.5 + 1 + 1.5 + 1}
    assert usage["call_limits"] == {"requests": 2, "wru": 1, "rru": 1.0}
    assert usage["sqs_billed_requests"] == 18
    assert usage["sqs_messages"] == {"sent": 6, "received": 6, "deleted": 6}
    assert usage["lambda_invocations"] == {
        "ApiFunction": 1,
        "FlightsAgentFunction": 1,
        "HotelsAgentFunction": 1,
        "PaymentsAgentFunction": 1,
        "SchedulerFunction": 3,
    }
    assert (result.simulated_seconds, result.idle_queue_seconds, data["empty_polls_modelled"]) == (6.0, 24.0, 6.0)
    assert data["actual_requests_per_step"] == pytest.approx((19 + 2 + 18 + 6) / 3)
    assert data["minimal_requests_per_step"] == pytest.approx(10.0)
    assert data["step_functions_transitions"] == 3
    # And the dollars are those counts at the list prices (only Lambda's GB-seconds are timed, not counted)
    dollars = data["ours_dollars"]
    assert dollars["dynamodb_writes"] == pytest.approx(14 * prices.DYNAMODB_PER_WRU)
    assert dollars["dynamodb_reads"] == pytest.approx(5.5 * prices.DYNAMODB_PER_RRU)
    assert dollars["sqs"] == pytest.approx(18 * prices.SQS_PER_REQUEST)
    assert dollars["sqs_empty_polls"] == pytest.approx(6 * prices.SQS_PER_REQUEST)
    assert dollars["api"] == pytest.approx(1 * prices.HTTP_API_PER_REQUEST)
    assert dollars["lambda_requests"] == pytest.approx(4 * prices.LAMBDA_PER_REQUEST)
    # The engine's log (its transition lines and its metrics), priced by the byte
    logged = usage["log_bytes"]["ApiFunction"] + usage["log_bytes"]["SchedulerFunction"]
    assert data["log_bytes_per_workflow"] == logged
    assert dollars["cloudwatch_logs"] == pytest.approx(logged * 0.50 / 1_000_000_000)
    counted = (14 * 0.625 + 5.5 * 0.125 + (18 + 6) * 0.40 + 1 * 1.00 + 4 * 0.20) / 1_000_000
    assert dollars["total"] == pytest.approx(counted + dollars["lambda_compute"] + dollars["cloudwatch_logs"])
    assert data["anchor_per_step"] == pytest.approx(0.025 / 1000)  # one transition per step
    assert data["ours_per_step"] == pytest.approx(dollars["total"] / 3)
    # The whole bill at 100 ms a call: ours adds the 3 agents' invocations, their measured time and 0.1 s of waiting
    # for each of their 3 calls at 256 MB; Step Functions Standard's HTTP Tasks are its 3 transitions; the durable
    # function waits for the same 3 calls at the same memory
    whole = data["whole_bill"]
    assert whole["agents"]["remote_calls"] == 3 and whole["durable"]["remote_calls"] == 3
    assert whole["agents"]["calls_waited"] == 3  # one request a batch: each invocation waits for its one call
    waiting = 3 * 0.1 * 256 / 1024 * prices.LAMBDA_PER_GB_SECOND
    measured = whole["agents"]["billed_ms"] / 1000 * 256 / 1024 * prices.LAMBDA_PER_GB_SECOND
    assert whole["agents"]["billed_ms"] == sum(usage["lambda_billed_ms"][f"{a}AgentFunction"] for a in AGENT_NAMES)
    # and each agent invocation's metrics line (its RemoteCalls count), at the Logs price
    agent_logs = sum(usage["log_bytes"][f"{a}AgentFunction"] for a in AGENT_NAMES)
    assert agent_logs == whole["agents"]["log_bytes"] and 3 * 150 < agent_logs < 3 * 400
    logs = agent_logs * prices.CLOUDWATCH_LOGS_PER_BYTE
    assert whole["ours"] == pytest.approx(dollars["total"] + 3 * prices.LAMBDA_PER_REQUEST + measured + waiting + logs)
    assert whole["standard_http_tasks"] == pytest.approx(3 * 0.025 / 1000)
    assert whole["durable"]["dollars"] == pytest.approx(data["durable"]["dollars"] + waiting)
    assert data["whole_per_step"] == pytest.approx(whole["ours"] / 3)


def test_the_whole_bill_adds_the_agents_lambda_and_their_waits_and_the_durable_functions_wait_for_each_call() -> None:
    # Given a run whose flights agent was invoked twice (10 ms measured, 400 bytes of metrics), called its service
    # six times, waited for four calls' time (its batches' calls at once), and lost one more invocation before it
    # called out; the durable function made five calls
    usage = Usage()
    usage.lambda_invocations["FlightsAgentFunction"] = 2
    usage.lambda_ms["FlightsAgentFunction"] = 10
    usage.log_bytes["FlightsAgentFunction"] = 400
    usage.lambda_invocations["SchedulerFunction"] = 7  # orchestration: already in ``orchestration``
    usage.lambda_ms["SchedulerFunction"] = 70
    memory = {f"{name}AgentFunction": 256 for name in AGENT_NAMES} | {"SchedulerFunction": 512}
    run = SimpleNamespace(
        usage=usage,
        memory_mb=memory,
        remote_calls={"FlightsAgentFunction": 6, "HotelsAgentFunction": 0},
        remote_waits={"FlightsAgentFunction": 4, "HotelsAgentFunction": 0},
        lost_invocations={"FlightsAgentFunction": 1},
    )
    # When its whole bill is made at 100 ms a call
    whole = whole_bill(run, 1e-5, 2e-5, {"dollars": 3e-5, "remote_calls": 5})  # type: ignore[arg-type]
    # Then ours adds 3 requests, 10 ms + 5 waits of 100 ms at 256 MB, and 400 bytes of logs to the orchestration
    gb_second = prices.LAMBDA_PER_GB_SECOND
    agents = 3 * prices.LAMBDA_PER_REQUEST + (0.010 + 5 * 0.1) * 0.25 * gb_second + 400 * 0.5e-9
    assert whole["ours"] == pytest.approx(1e-5 + agents)
    assert whole["agents"]["invocations"] == 3 and whole["agents"]["lost_invocations"] == 1
    assert (whole["agents"]["remote_calls"], whole["agents"]["calls_waited"]) == (6, 4)
    # And Step Functions Standard's HTTP Tasks cost their transitions only; the durable function waits for its 5
    # calls at the agents' 256 MB
    assert whole["standard_http_tasks"] == 2e-5
    assert whole["durable"]["dollars"] == pytest.approx(3e-5 + 5 * 0.1 * 0.25 * gb_second)
    assert whole["durable"]["memory_mb"] == 256


def _cost_row(name: str, ours: float, anchor: float) -> Row:
    """The first (cost) row of scenario ``name`` for a run whose cost per step is ``ours`` against ``anchor``."""
    data = {
        "ours_per_step": ours,
        "anchor_per_step": anchor,
        "ours_per_workflow": 3 * ours,
        "anchor_per_workflow": 3 * anchor,
        "fixed_share": 0.0,
        "supervisor_runs": 0,
        "start": {"through": "api", "function": "ApiFunction", "dollars_per_start": 3e-6, "invocations_per_start": 1.0},
        "actual_requests_per_step": 7.0,
        "minimal_requests_per_step": 7.0,
        "call_limits": {"requests_per_step": 0.0, "dollars_per_step": 0.0},
        "log_bytes_per_workflow": 0.0,
        "logs_share": 0.0,
        "durable": {"operations": 3},
        "durable_per_step": 8.1 / 1_000_000,
        "whole_bill": {"remote_latency_seconds": 0.1, "durable": {"memory_mb": 256}},
        "whole_per_step": 2 * ours,
        "whole_standard_per_step": anchor,
        "whole_durable_per_step": 9.0 / 1_000_000,
        "express": {"can_run": False, "cannot_run": "a callback step"},
    }
    run = SimpleNamespace(scenario=Scenario(name, "t", 3, 1), definition=chain_definition(3))
    return rows(run, data)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "ours", "target", "met"),
    [
        ("S1", 4.00, "<= 0.17", True),  # 4 / 25 = 0.16
        ("S1", 4.25, "<= 0.17", True),  # exactly 0.17: the target is "at most"
        ("S1", 4.50, "<= 0.17", False),  # 0.18
        ("S2", 5.25, "<= 0.2", False),
        ("S3", 4.75, "", None),  # S3 has no cost target
    ],
)
def test_the_cost_target_is_met_at_or_below_its_share_of_step_functions(
    name: str, ours: float, target: str, met: bool | None
) -> None:
    # Given a run costing ``ours`` $ per 1M steps against Step Functions' 25 / When its cost row is made
    row = _cost_row(name, ours / 1_000_000, 25.0 / 1_000_000)
    # Then the ratio is ours / 25 and the target is met exactly when that is at most 0.17 (S1) or 0.2 (S2)
    assert row.ratio == pytest.approx(ours / 25.0)
    assert (row.target, row.met) == (target, met)


def test_a_run_long_enough_for_the_supervisor_counts_its_runs_and_skips_its_lease_item() -> None:
    # Regression: the supervisor's lease item (no workflow_id) made the result fail once a run lasted a minute.
    slow = Scenario("S1", "two workflows 61 s apart", 3, 2, arrivals_per_second=1 / 61)
    result = run_scenario(slow)
    assert dict(result.statuses) == {"COMPLETED": 2}
    assert result.usage.lambda_invocations["SupervisorFunction"] == 1
    assert result.steps_run == 6


def test_a_faulty_scenario_replays_exactly_for_its_seed() -> None:
    s2 = next(s for s in scenarios(scale=0.03) if s.name == "S2")
    first, second = run_scenario(s2), run_scenario(s2)
    assert first.statuses == second.statuses
    assert first.usage.calls == second.usage.calls
    assert first.usage.wru == second.usage.wru
    assert figures(first)["step_functions_transitions"] == figures(second)["step_functions_transitions"]


def test_a_mapping_whose_batching_window_aws_would_not_take_is_refused() -> None:
    # The emulation bills any window AWS takes (0 to 300 whole seconds) and batches of at most 10
    ok = SqsEventSpec("Queue", "url", "arn", batch_size=10, batching_window_seconds=1.0)
    for window in (0.0, 1.0, 2.0, 300.0):
        check_mappings([("Fn", dataclasses.replace(ok, batching_window_seconds=window))])
    with pytest.raises(ValueError, match=r"batching window 0\.5 s, batch size 10"):
        check_mappings([("Fn", dataclasses.replace(ok, batching_window_seconds=0.5))])
    with pytest.raises(ValueError, match="batching window 301 s"):
        check_mappings([("Fn", dataclasses.replace(ok, batching_window_seconds=301.0))])
    with pytest.raises(ValueError, match="batch size 11"):
        check_mappings([("Fn", dataclasses.replace(ok, batch_size=11))])


def test_s4_runs_a_map_step_and_prices_it_against_a_distributed_map_by_hand() -> None:
    s4 = next(s for s in scenarios(scale=0.012) if s.name == "S4")
    assert (s4.workflows, s4.map_items) == (1, 12)
    result = run_scenario(s4)
    assert dict(result.statuses) == {"COMPLETED": 1}
    assert dict(result.children) == {"COMPLETED": 12}
    assert result.steps_run == 13  # the map step and one step per child
    data = figures(result)
    assert (data["items"], data["child_transitions"], data["supervisor_resends"]) == (12, 12, 0)
    # Distributed Map, Standard children: the parent's Map state, one transition per child started, and each
    # child's one Task: (1 + 12 + 12) transitions at $0.025 per 1,000.
    standard = data["distributed_map"]["standard_children"]
    assert standard["transitions"] == 25
    assert standard["dollars"] == pytest.approx(25 * 0.025 / 1000)
    assert data["anchor_per_item"] == pytest.approx(25 * 0.025 / 1000 / 12)
    # per child: its start (one write), its completion (one write), the agent's two idempotency writes
    by_function = data["usage"]["calls_by_function"]
    assert by_function["PaymentsAgentFunction dynamodb.PutItem"] == 12
    assert data["ours_per_item"] == pytest.approx(data["ours_dollars"]["total"] / 12)
    first = rows(result, data)[0]
    assert first.metric.startswith("S4 orchestration $ per 1M map items (anchor: Step Functions Distributed Map")
    assert first.met is True and first.ratio == pytest.approx(data["ours_per_item"] / data["anchor_per_item"])


def test_a_zero_second_window_is_billed_with_smaller_batches_and_more_requests_per_step() -> None:
    # Given the same S1 run deployed with the template's windows and with both windows at 0 s
    s1 = next(s for s in scenarios(scale=0.05) if s.name == "S1")
    eager = next(
        s
        for s in scenarios(
            scale=0.05, parameters={"SchedulerBatchingWindowSeconds": "0", "AgentBatchingWindowSeconds": "0"}
        )
        if s.name == "S1"
    )
    default, zero = run_scenario(s1), run_scenario(eager)
    # Then both complete every workflow, and at 0 s every batch is smaller, so SQS and Lambda bill more requests
    assert default.statuses == zero.statuses == {"COMPLETED": s1.workflows}
    assert sum(zero.receive_batches) == sum(default.receive_batches)
    assert len(zero.receive_batches) > len(default.receive_batches)
    assert zero.usage.sqs_billed > default.usage.sqs_billed
    assert figures(zero)["ours_per_step"] > figures(default)["ours_per_step"]


@pytest.mark.parametrize(
    ("chains", "workers", "waited"),
    [
        ([1, 1, 1, 1], 10, 1),  # four records at once, one call each: one call's wait
        ([1, 3, 1], 10, 3),  # the record that retried twice is the longest chain
        ([1, 1, 1, 1], 1, 4),  # one at a time: every call is waited for
        ([2, 1, 1, 1], 2, 3),  # two workers: 2 on the first, then 1+1 on the second, the last on the first
        ([], 10, 0),
    ],
)
def test_an_invocation_waits_for_its_longest_worker_when_its_records_call_at_once(
    chains: list[int], workers: int, waited: int
) -> None:
    assert calls_waited(chains, workers) == waited
