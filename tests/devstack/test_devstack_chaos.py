"""devstack.chaos: the agent replies that a worker loses, by rate, on its first reply, or scripted per step."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from devstack import chaos


def reply(step: str, *, attempt: int = 1, phase: str = "action", workflow_id: str = "wf-1") -> str:
    body = {"kind": "step.reply", "workflow_id": workflow_id, "step": step, "phase": phase, "attempt": attempt}
    return json.dumps({**body, "outcome": "succeeded"})


def batch(*bodies: str) -> dict[str, Any]:
    return {"QueueUrl": "q", "Entries": [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)]}


MARKED = {chaos.MARKED_STEPS_KEY: "_lose_reply"}


def test_a_marked_step_loses_every_reply_of_its_first_attempt_and_nothing_else() -> None:
    # Given the rule for steps marked "_lose_reply"
    crashes = chaos.crash_rule(MARKED, "fn")
    assert crashes is not None
    # When replies are sent / Then only attempt 1 of a marked step's forward action crashes, each time it is sent
    assert [
        crashes(batch(reply("reserve_flight_lose_reply"))),
        crashes(batch(reply("reserve_flight_lose_reply"))),  # a redelivered attempt 1 loses its reply again
        crashes({"QueueUrl": "q", "MessageBody": reply("charge_card_lose_reply")}),  # SendMessage too
        crashes(batch(reply("reserve_flight_lose_reply", attempt=2))),  # the supervisor's resend gets through
        crashes(batch(reply("reserve_flight_lose_reply", phase="compensation"))),
        crashes(batch(reply("reserve_flight"))),  # an unmarked step
        crashes(batch(reply("book_hotel"), reply("charge_card_lose_reply"))),  # one marked reply sinks the batch
        crashes(batch("not json", json.dumps([1]))),
    ] == [True, True, True, False, False, False, True, False]


def test_the_first_reply_and_the_rate_keep_their_meaning() -> None:
    # Given a worker that loses its first reply, and one that loses a seeded 50 % of them
    first = chaos.crash_rule({"crash_first_reply": True}, "fn")
    rated = chaos.crash_rule({"lose_reply_rate": 0.5, "seed": 3}, "fn")
    assert first is not None and rated is not None
    # When five replies are sent through each
    first_losses = [first(batch(reply("s"))) for _ in range(5)]
    rated_losses = [rated(batch(reply("s"))) for _ in range(5)]
    # Then the first worker lost only its first; the other lost the draws of random.Random("3:fn") under 0.5
    assert first_losses == [True, False, False, False, False]
    draws = random.Random("3:fn")
    assert rated_losses == [draws.random() < 0.5 for _ in range(5)]
    assert chaos.crash_rule({}, "fn") is None


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An agent worker's environment, and a default boto3 session that is thrown away afterwards."""
    monkeypatch.setenv("AGENT_NAME", "flights")
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", f"chaos-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("DEVSTACK_CHAOS", json.dumps(MARKED))
    saved = boto3.DEFAULT_SESSION
    yield
    boto3.DEFAULT_SESSION = saved  # the session install() replaced, with its crash hooks, is dropped


def test_install_makes_the_workers_sends_of_a_marked_first_reply_crash(
    agent_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mock_aws():
        # Given a response queue named by RESPONSE_QUEUE_URL and another queue, and the hook installed
        sqs = boto3.client("sqs", region_name="us-east-1")
        responses = sqs.create_queue(QueueName=f"responses-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        other = sqs.create_queue(QueueName=f"other-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        monkeypatch.setenv("RESPONSE_QUEUE_URL", responses)
        chaos.install()
        worker = boto3.client("sqs", region_name="us-east-1")  # a client made after install, as the agent's is
        # When the worker sends a marked first reply, an unmarked one, and a marked one to another queue
        with pytest.raises(chaos.SimulatedCrash, match="before sending its reply"):
            worker.send_message(QueueUrl=responses, MessageBody=reply("book_hotel_lose_reply"))
        worker.send_message(QueueUrl=responses, MessageBody=reply("book_hotel"))
        worker.send_message(QueueUrl=other, MessageBody=reply("book_hotel_lose_reply"))
        # Then only the two that were not crashed arrived
        got = sqs.receive_message(QueueUrl=responses, MaxNumberOfMessages=10)["Messages"]
        assert [json.loads(m["Body"])["step"] for m in got] == ["book_hotel"]
        elsewhere = sqs.receive_message(QueueUrl=other, MaxNumberOfMessages=10)["Messages"]
        assert [json.loads(m["Body"])["step"] for m in elsewhere] == ["book_hotel_lose_reply"]


def test_install_does_nothing_outside_an_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker that is not an agent (no AGENT_NAME) with chaos configured
    monkeypatch.delenv("AGENT_NAME", raising=False)
    monkeypatch.setenv("DEVSTACK_CHAOS", json.dumps(MARKED))
    saved = boto3.DEFAULT_SESSION
    # When the hook is installed / Then it leaves the default session alone
    chaos.install()
    assert boto3.DEFAULT_SESSION is saved
