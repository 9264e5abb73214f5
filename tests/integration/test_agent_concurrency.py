"""An agent works on its batch's records at once (AGENT_CONCURRENCY, agents.yaml ``concurrency``), through the real
handler on moto: its calls are in flight together, each record keeps its own idempotency, reply and cost, and every
AWS call of its worker threads is still checked against the function's role."""

from __future__ import annotations

import threading
from typing import Any

import boto3

from devstack.iam.guard import clear_refusals
from devstack.inprocess import environment, function_environment
from sasflow.cost import Tally
from sasflow.messages import StepRequest
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event, sqs_event

TRIP = load_event("trip_booking_request.json")


class AllInFlight:
    """A remote whose calls return only once ``count`` of them are in flight together (else, after 10 s, a
    BrokenBarrierError fails the record)."""

    def __init__(self, real: Any, count: int) -> None:
        self.real = real
        self.together = threading.Barrier(count, timeout=10)
        self.threads: set[str] = set()

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        self.threads.add(threading.current_thread().name)
        self.together.wait()
        return dict(self.real.call(request, timeout_seconds))


def test_a_batch_of_ten_requests_calls_its_service_ten_at_once_and_replies_for_each_with_its_own_cost(
    deployed: Deployed,
) -> None:
    # Given ten started trips whose flight requests arrive in one batch
    started = [deployed.api("POST", "/workflows", TRIP)[1]["workflow_id"] for _ in range(10)]
    agent = deployed.driver("FlightsAgentFunction")
    assert function_environment(agent.function.spec)["AGENT_CONCURRENCY"] == "10"  # agents.yaml's http default
    messages: list[dict[str, Any]] = []
    while len(messages) < 10:
        messages += agent.receive()
    with environment(function_environment(agent.function.spec)):
        services = agent.function.module.agent()
    remote = AllInFlight(services.runtime.remote, 10)
    services.runtime.remote = remote
    clear_refusals()
    # When the agent is invoked with the batch
    result = agent.function.invoke(sqs_event(messages, agent.event.queue_arn))
    # Then all ten calls were in flight together, each on its own thread, and no record failed
    assert result == {"batchItemFailures": []}
    assert len(remote.threads) == 10 and all(name.startswith("sasflow-record") for name in remote.threads)
    assert sorted(deployed.remote["flights"].service.effects().values()) == [1] * 10
    # And every call of the worker threads was allowed by the function's role (the guard checks them too)
    assert clear_refusals() == []
    # And one reply per workflow, each carrying its own record's cost: its idempotency writes and its time
    sqs = boto3.client("sqs")
    scheduler = deployed.driver("SchedulerFunction")
    replies: dict[str, Tally] = {}
    while len(replies) < 10:
        batch = sqs.receive_message(
            QueueUrl=scheduler.event.queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", [])
        assert batch, f"only {len(replies)} replies"
        for message in batch:
            workflow_id = message["Body"].split('"workflow_id":"', 1)[1].split('"', 1)[0]
            replies[workflow_id] = Tally.from_attribute(message["MessageAttributes"]["sasflow-cost"]["StringValue"])
    assert sorted(replies) == sorted(started)
    for tally in replies.values():
        assert tally.wru >= 2  # its idempotency record: claimed, then completed
        assert tally.mb_ms > 0 and tally.invocations == 0.1  # its time, and a tenth of the invocation


def test_a_finished_trip_answers_its_cost_in_dollars_lines_and_units_for_scripts(deployed: Deployed) -> None:
    # Given a trip run to its end through the handlers
    status, started = deployed.api("POST", "/workflows", TRIP)
    assert status == 201
    deployed.pump()
    # When its owner reads it
    status, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert status == 200 and view["status"] == "COMPLETED"
    cost = view["cost"]
    # Then its cost is the sum of its lines, at the deployment's prices, with what they count as numbers
    assert cost["prices"].startswith("us-east-1, read ")
    assert cost["dollars"] == sum(line["dollars"] for line in cost["lines"]) > 0
    units = cost["units"]
    # each step its idempotency claim and result and a write of the item, the start's writes and index entries
    assert units["dynamodb_write_units"] >= 12
    # one invocation each: the API's, three agents' and three scheduler's (a batch of one, each); the agents' reach
    # the item on their replies (a harness that dropped the replies' message attributes lost them: found here)
    assert (units["api_requests"], units["lambda_invocations"]) == (1, 7)
    assert units["lambda_gb_seconds"] > 0 and units["log_bytes"] > 0
    by_line = {line["name"]: line for line in cost["lines"]}
    assert by_line["DynamoDB writes"]["quantity"] == f"{units['dynamodb_write_units']:,.0f} WRU"
