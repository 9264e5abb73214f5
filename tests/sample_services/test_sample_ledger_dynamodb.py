"""The DynamoDB ledger under moto, on a table built from SampleLedgerTable in template.yaml."""

from __future__ import annotations

import json
import random
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from sample_fakes import START, FakeClock

from sample_ledger_dynamodb import DynamoDBLedger
from travel_services import FaultKnobs, LedgerRecord, LedgerUnavailableError, TravelService

pytestmark = pytest.mark.integration


def record(token: str, **fields: Any) -> LedgerRecord:
    return LedgerRecord(
        kind="response",
        service="flights",
        action="reserve",
        token=token,
        workflow_id="wf",
        step="s",
        created_at=START,
        **fields,
    )


def call(
    service: TravelService, action: str, token: str, original_token: str | None = None
) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {
        "token": token,
        "workflow_id": "wf",
        "step": "s",
        "input": {},
        "original_token": original_token,
    }
    return service.handle(action, {"Idempotency-Key": token}, json.dumps(body).encode())


def test_put_if_absent_stores_once_and_returns_the_winner(sample_ledger_table: str, uid: str) -> None:
    # Given an empty ledger table
    ledger = DynamoDBLedger(sample_ledger_table, boto3.client("dynamodb"))
    first = record(f"a-{uid}", status=200, body={"confirmation": "FL-00000000", "n": 1.5}, effect=True)
    second = record(f"b-{uid}", status=409, body={"error": "NO_SEATS"})

    # When two records are put under the same key
    stored = ledger.put_if_absent(f"flights#token#{uid}", first)
    lost = ledger.put_if_absent(f"flights#token#{uid}", second)

    # Then the first is stored, the second gets the first back, and reads and scans return it intact
    assert stored is None
    assert lost == first
    assert ledger.get(f"flights#token#{uid}") == first
    assert ledger.get(f"flights#token#missing-{uid}") is None
    assert ledger.records() == [(f"flights#token#{uid}", first)]


def test_the_item_holds_pk_kind_and_the_record_as_json(sample_ledger_table: str, uid: str) -> None:
    # Given a stored tombstone
    client = boto3.client("dynamodb")
    tombstone = record(f"t-{uid}").model_copy(update={"kind": "tombstone"})
    DynamoDBLedger(sample_ledger_table, client).put_if_absent(f"k-{uid}", tombstone)

    # When the raw item is read
    item = client.get_item(TableName=sample_ledger_table, Key={"pk": {"S": f"k-{uid}"}})["Item"]

    # Then it has the table's hash key, the kind, and the record as JSON
    assert set(item) == {"pk", "kind", "record"}
    assert item["kind"] == {"S": "tombstone"}
    assert LedgerRecord.model_validate_json(item["record"]["S"]) == tombstone


def test_default_client_is_created_lazily(sample_ledger_table: str, uid: str) -> None:
    # Given a ledger built without a client
    ledger = DynamoDBLedger(sample_ledger_table)
    assert ledger._client is None

    # When it is used / Then it creates its client and works
    assert ledger.put_if_absent(f"k-{uid}", record(f"t-{uid}")) is None
    assert ledger._client is not None


def test_travel_service_over_dynamodb_keeps_the_contract(sample_ledger_table: str, uid: str) -> None:
    # Given flights and hotels sharing one DynamoDB ledger table
    ledger = DynamoDBLedger(sample_ledger_table, boto3.client("dynamodb"))
    clock = FakeClock()
    flights = TravelService("flights", ledger, FaultKnobs(), random.Random(0), clock)
    hotels = TravelService("hotels", ledger, FaultKnobs(), random.Random(0), clock)

    # When a reservation is replayed and cancelled, and a hotel cancel comes before its (same-token) booking
    replies = [call(flights, "reserve", f"t-{uid}") for _ in range(3)]
    undone = call(flights, "cancel_reservation", f"c-{uid}", original_token=f"t-{uid}")
    early = call(hotels, "cancel_booking", f"c-{uid}", original_token=f"t-{uid}")
    late = call(hotels, "book", f"t-{uid}")

    # Then the flight applied once and was undone once; the hotel never applied; keys are per service
    assert [body["replayed"] for _, body in replies] == [False, True, True]
    assert (undone[0], undone[1]["undone"]) == (200, True)
    assert (early[0], early[1]["undone"], late[0], late[1]["error"]) == (200, False, 409, "ALREADY_COMPENSATED")
    assert flights.effects() == {f"t-{uid}": 1}
    assert flights.compensations() == {f"t-{uid}": 1}
    assert hotels.effects() == {}
    assert sorted(key for key, _ in ledger.records()) == sorted(
        [
            f"flights#token#t-{uid}",
            f"flights#token#c-{uid}",
            f"flights#undo#t-{uid}",
            f"hotels#token#t-{uid}",
            f"hotels#token#c-{uid}",
        ]
    )


class _ThrottledClient:
    """A DynamoDB client stand-in whose every call is throttled."""

    def _fail(self, **_: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}}, "PutItem"
        )

    put_item = get_item = _fail


def test_other_dynamodb_errors_become_ledger_unavailable_and_503(uid: str) -> None:
    # Given a ledger whose DynamoDB calls are throttled
    ledger = DynamoDBLedger("table", _ThrottledClient())  # type: ignore[arg-type]
    flights = TravelService("flights", ledger, FaultKnobs(), random.Random(0), FakeClock())

    # When it is written directly and through the service
    with pytest.raises(LedgerUnavailableError, match="ProvisionedThroughputExceededException"):
        ledger.put_if_absent("k", record("t"))
    status, body = call(flights, "reserve", f"t-{uid}")

    # Then the service answers a retryable 503 and counts no effect
    assert (status, body["error"]) == (503, "UNAVAILABLE")
    assert flights.effects() == {}
