"""The simulation's fast world (simulation/direct.py) against boto3 on moto: the same answers to the same calls, the
same hooks, and the same report for the same seed (the differential test of issue 18)."""

from __future__ import annotations

import dataclasses
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from devstack.inprocess import offline_aws
from simulation.direct import DirectDynamoDB, table_items
from simulation.run import RunReport, run_one
from simulation.world import Faults
from tests.support.sim_faults import LARGE_PAYLOADS, OPERATOR_HEAVY

pytestmark = pytest.mark.integration


def _create_table() -> None:
    """Table ``t``: hash pk, range sk, and a GSI ``gsi`` on gk/gn with an INCLUDE projection, like the state table."""
    boto3.client("dynamodb").create_table(
        TableName="t",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "gk", "AttributeType": "S"},
            {"AttributeName": "gn", "AttributeType": "N"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "gsi",
                "KeySchema": [{"AttributeName": "gk", "KeyType": "HASH"}, {"AttributeName": "gn", "KeyType": "RANGE"}],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["status"]},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def _calls() -> list[tuple[str, dict[str, Any]]]:
    """One sequence of calls that exercises what the engine relies on, errors included."""
    key = {"pk": {"S": "WF#1"}, "sk": {"S": "#WF"}}
    item = {**key, "version": {"N": "1"}, "blob": {"B": b"\x00\xff"}, "gk": {"S": "00"}, "gn": {"N": "5"}}
    return [
        ("put_item", {"TableName": "t", "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}),
        ("put_item", {"TableName": "t", "Item": item, "ConditionExpression": "attribute_not_exists(pk)"}),
        (
            "put_item",
            {
                "TableName": "t",
                "Item": {**item, "version": {"N": "2"}},
                "ConditionExpression": "version = :v",
                "ExpressionAttributeValues": {":v": {"N": "7"}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            },
        ),
        (
            "update_item",
            {
                "TableName": "t",
                "Key": key,
                "UpdateExpression": "SET #s = :s ADD version :one",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":s": {"S": "RUNNING"}, ":one": {"N": "1"}},
                "ReturnValues": "ALL_NEW",
            },
        ),
        ("update_item", {"TableName": "t", "Key": key, "UpdateExpression": "SET x = :undefined"}),
        ("get_item", {"TableName": "t", "Key": key, "ConsistentRead": True}),
        ("get_item", {"TableName": "t", "Key": {"pk": {"S": "WF#2"}, "sk": {"S": "#WF"}}}),
        (
            "query",
            {
                "TableName": "t",
                "IndexName": "gsi",
                "KeyConditionExpression": "gk = :k AND gn < :n",
                "ExpressionAttributeValues": {":k": {"S": "00"}, ":n": {"N": "9"}},
            },
        ),
        (
            "query",
            {
                "TableName": "t",
                "IndexName": "gsi",
                "ConsistentRead": True,
                "KeyConditionExpression": "gk = :k",
                "ExpressionAttributeValues": {":k": {"S": "00"}},
            },
        ),
        ("batch_get_item", {"RequestItems": {"t": {"Keys": [key, {"pk": {"S": "WF#9"}, "sk": {"S": "#WF"}}]}}}),
        ("put_item", {"TableName": "t", "Item": {**key, "big": {"S": "x" * 410_000}}}),
        ("put_item", {"TableName": "missing", "Item": key}),
        ("delete_item", {"TableName": "t", "Key": key, "ReturnValues": "ALL_OLD"}),
        ("scan", {"TableName": "t", "ConsistentRead": True}),
    ]


def _answer(client: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    try:
        response = dict(getattr(client, method)(**params))
    except ClientError as error:
        response = {"raised": True, **error.response}
    response.pop("ResponseMetadata", None)
    return response


def test_the_fast_client_answers_every_call_as_boto3_on_moto_does() -> None:
    calls = _calls()
    answers = {}
    for world, client_of in (("moto", lambda: boto3.client("dynamodb")), ("fast", DirectDynamoDB)):
        with offline_aws():  # a fresh moto backend each
            _create_table()
            client = client_of()
            answers[world] = [_answer(client, method, params) for method, params in calls]
            if world == "fast":
                stored = list(table_items("t"))
    actual = answers["fast"]
    assert actual == answers["moto"]
    # and the sequence is not a trivial one: a failed condition with the old item, a validation error, an unknown
    # table, an item over 400 KB, a blob, a GSI query
    codes = [a.get("Error", {}).get("Code") for a in actual]
    assert codes.count("ConditionalCheckFailedException") == 2
    assert codes.count("ValidationException") == 3
    assert "ResourceNotFoundException" in codes
    assert actual[2]["Item"]["blob"] == {"B": b"\x00\xff"}
    assert actual[7]["Count"] == 1 and actual[7]["Items"][0]["status"] == {"S": "RUNNING"}
    assert stored == []  # the last call deleted the only item


def test_table_items_reads_what_a_consistent_scan_returns() -> None:
    with offline_aws():
        _create_table()
        client = DirectDynamoDB()
        for index in range(3):
            client.put_item(
                TableName="t",
                Item={
                    "pk": {"S": f"WF#{index}"},
                    "sk": {"S": "#WF"},
                    "m": {"M": {"l": {"L": [{"N": "1.50"}, {"B": b"\x01"}, {"SS": ["a", "b"]}]}}},
                    "n": {"NULL": True},
                    "b": {"BOOL": False},
                },
            )
        scanned = [
            i for p in client.get_paginator("scan").paginate(TableName="t", ConsistentRead=True) for i in p["Items"]
        ]
        assert list(table_items("t")) == scanned
        assert len(scanned) == 3 and scanned[0]["m"]["M"]["l"]["L"][1] == {"B": b"\x01"}


# ------------------------------------------------------------------------------------------ the differential test
#: Seeds that between them run every feature (maps, claim-checked payloads, callbacks, waits, conditions, operator
#: actions, the hold policy) under every fault; small, because the moto world takes about 5x the fast one's time.
DIFFERENTIAL = {
    "every fault": (3, 30, Faults()),
    "operators": (21, 20, OPERATOR_HEAVY),
    "claim-checks": (41, 20, LARGE_PAYLOADS),
}


def _outcome(report: RunReport) -> dict[str, Any]:
    """Everything a report says except how long it took on this machine."""
    fields = dataclasses.asdict(report)
    fields.pop("wall_seconds")
    return fields


@pytest.fixture(scope="module")
def on_moto() -> dict[str, RunReport]:
    return {
        name: run_one(seed, workflows, faults, world="moto") for name, (seed, workflows, faults) in DIFFERENTIAL.items()
    }


@pytest.mark.parametrize("name", list(DIFFERENTIAL))
def test_a_seed_ends_the_same_on_the_fast_world_as_on_moto(name: str, on_moto: dict[str, RunReport]) -> None:
    seed, workflows, faults = DIFFERENTIAL[name]
    fast = run_one(seed, workflows, faults, world="fast")
    assert _outcome(fast) == _outcome(on_moto[name])
    # the same outcomes, the same invariant results (none violated), the same items stored, byte for byte
    assert fast.violations == [] and sum(fast.statuses.values()) == workflows - fast.tenant_refused
    assert sum(fast.faults.values()) > 0 and len(fast.state_digest) == 64


def test_the_features_the_differential_seeds_cover(on_moto: dict[str, RunReport]) -> None:
    every, operators, claims = (on_moto[name] for name in DIFFERENTIAL)
    assert sum(every.children.values()) > 0  # map steps' children
    assert every.callback_answers["succeeded 200"] > 0  # callbacks answered
    assert sum(operators.operator_actions.values()) > 0
    assert claims.payload_reads > 0


def test_a_fast_world_that_ignores_a_condition_is_caught_by_the_differential_test(
    monkeypatch: pytest.MonkeyPatch, on_moto: dict[str, RunReport]
) -> None:
    """Mutation check: a fast world whose PutItem drops its condition (a double write DynamoDB refuses) ends a seed
    differently from moto, and the comparison above fails."""
    dispatch = DirectDynamoDB._dispatch

    def unconditional(self: DirectDynamoDB, name: str, params: dict[str, Any]) -> Any:
        if name == "PutItem":
            params = {k: v for k, v in params.items() if k not in ("ConditionExpression", "ExpressionAttributeValues")}
        return dispatch(self, name, params)

    monkeypatch.setattr(DirectDynamoDB, "_dispatch", unconditional)
    seed, workflows, faults = DIFFERENTIAL["every fault"]
    mutated = run_one(seed, workflows, faults, world="fast")
    assert _outcome(mutated) != _outcome(on_moto["every fault"])
    assert mutated.state_digest != on_moto["every fault"].state_digest
