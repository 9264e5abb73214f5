"""devstack.events: the local EventBridge of `python -m devstack emit`: the envelope a rule delivers, and which
rules of the template take an event (their bus, their state, their pattern as EventBridge matches it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import boto3
from moto import mock_aws

from devstack.events import LocalRule, envelope, matching_rules, put_event

ORDERS = LocalRule(
    "OrderPlacedRule",
    "sasflow-orders",
    {"source": ["shop.orders"], "detail": {"total": [{"numeric": [">", 0]}], "country": [{"prefix": "F"}]}},
    True,
    ("queue/orders",),
)


def test_the_envelope_is_what_a_rule_delivers_and_its_id_is_kept_when_given() -> None:
    event = envelope(
        "shop.orders",
        "OrderPlaced",
        {"total": 3},
        region="eu-west-1",
        event_id="e-1",
        time=datetime(2027, 1, 2, tzinfo=UTC),
    )
    assert event == {
        "version": "0",
        "id": "e-1",
        "detail-type": "OrderPlaced",
        "source": "shop.orders",
        "account": "123456789012",
        "time": "2027-01-02T00:00:00Z",
        "region": "eu-west-1",
        "resources": [],
        "detail": {"total": 3},
    }
    assert envelope("s", "t", {}, region="us-east-1")["id"] != envelope("s", "t", {}, region="us-east-1")["id"]


def test_a_rule_takes_an_event_on_its_bus_that_its_pattern_matches_while_it_is_enabled() -> None:
    def event(**detail: object) -> dict[str, object]:
        return envelope("shop.orders", "OrderPlaced", dict(detail), region="us-east-1")

    assert matching_rules([ORDERS], "sasflow-orders", event(total=10, country="FR")) == [ORDERS]
    assert matching_rules([ORDERS], "sasflow-orders", event(total=0, country="FR")) == []  # numeric
    assert matching_rules([ORDERS], "sasflow-orders", event(total=10, country="DE")) == []  # prefix
    assert matching_rules([ORDERS], "default", event(total=10, country="FR")) == []  # another bus
    disabled = LocalRule(*[*vars(ORDERS).values()][:3], False, ORDERS.queue_urls)  # type: ignore[misc]
    assert matching_rules([disabled], "sasflow-orders", event(total=10, country="FR")) == []
    assert LocalRule.from_document(json.loads(json.dumps(ORDERS.document()))) == ORDERS


@mock_aws
def test_put_event_sends_the_event_as_it_is_to_each_matching_rules_queues() -> None:
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    rule = LocalRule("R", "default", {"source": ["shop.orders"]}, True, (url,))
    event = envelope("shop.orders", "OrderPlaced", {"total": 3}, region="us-east-1", event_id="e-9")
    assert put_event(sqs, [rule], "default", event) == [rule]
    assert put_event(sqs, [rule], "default", {**event, "source": "other"}) == []
    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert json.loads(message["Body"]) == event
