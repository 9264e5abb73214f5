"""The sample services' Lambda handler with an HTTP API (payload 2.0) event, over moto."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

import sample_services_handler
from travel_services import confirmation_code

pytestmark = pytest.mark.integration


class FakeLambdaContext:
    function_name = "SampleServicesFunction"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:SampleServicesFunction"
    aws_request_id = "req-1"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 10_000


def http_api_event(
    service: str, action: str, body: str, headers: dict[str, str], base64_encoded: bool = False
) -> dict[str, Any]:
    """An API Gateway HTTP API v2 event for route ``POST /sample/{service}/{action}``."""
    path = f"/sample/{service}/{action}"
    return {
        "version": "2.0",
        "routeKey": "POST /sample/{service}/{action}",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"content-type": "application/json", **{k.lower(): v for k, v in headers.items()}},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "api",
            "domainName": "api.execute-api.eu-west-1.amazonaws.com",
            "http": {
                "method": "POST",
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "test",
            },
            "requestId": "req-1",
            "routeKey": "POST /sample/{service}/{action}",
            "stage": "$default",
            "time": "01/Jan/2024:00:00:00 +0000",
            "timeEpoch": 1_704_067_200_000,
        },
        "pathParameters": {"service": service, "action": action},
        "body": base64.b64encode(body.encode()).decode() if base64_encoded else body,
        "isBase64Encoded": base64_encoded,
    }


def invoke(
    service: str, action: str, token: str, original_token: str | None = None, base64_encoded: bool = False
) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"token": token, "workflow_id": "wf", "step": "s", "input": {}, "original_token": original_token})
    event = http_api_event(service, action, body, {"Idempotency-Key": token}, base64_encoded)
    response = sample_services_handler.handler(event, FakeLambdaContext())  # type: ignore[arg-type]
    assert response["headers"]["Content-Type"] == "application/json"
    return response["statusCode"], json.loads(response["body"])


@pytest.fixture
def lambda_env(sample_ledger_table: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The function's environment, and a fresh cold start before and after the test."""
    monkeypatch.setenv("SAMPLE_LEDGER_TABLE", sample_ledger_table)
    monkeypatch.delenv("SAMPLE_FAULTS_JSON", raising=False)
    sample_services_handler.bootstrap.cache_clear()
    yield sample_ledger_table
    sample_services_handler.bootstrap.cache_clear()


def test_handler_serves_replays_and_compensations(lambda_env: str, uid: str) -> None:
    # Given the deployed function's environment
    # When a payment is charged twice (once base64-encoded) and refunded
    first = invoke("payments", "charge", f"t-{uid}")
    again = invoke("payments", "charge", f"t-{uid}", base64_encoded=True)
    refund = invoke("payments", "refund", f"r-{uid}", original_token=f"t-{uid}")

    # Then the contract holds through API Gateway: one effect, one replay, one undo
    assert first == (
        200,
        {
            "service": "payments",
            "action": "charge",
            "token": f"t-{uid}",
            "replayed": False,
            "confirmation": confirmation_code("payments", f"t-{uid}"),
        },
    )
    assert again == (200, {**first[1], "replayed": True})
    assert (refund[0], refund[1]["undone"]) == (200, True)
    assert sample_services_handler.bootstrap()["payments"].effects() == {f"t-{uid}": 1}


def test_handler_maps_unknown_services_and_actions_to_404(lambda_env: str, uid: str) -> None:
    assert invoke("trains", "reserve", f"t-{uid}") == (
        404,
        {"error": "UNKNOWN_SERVICE", "message": "no service 'trains'"},
    )
    assert invoke("hotels", "reserve", f"t-{uid}")[1]["error"] == "UNKNOWN_ACTION"


def test_handler_takes_fault_knobs_from_the_environment(
    lambda_env: str, monkeypatch: pytest.MonkeyPatch, uid: str
) -> None:
    # Given SAMPLE_FAULTS_JSON that makes hotels reject every booking
    monkeypatch.setenv("SAMPLE_FAULTS_JSON", json.dumps({"hotels": {"rejection_rate": 1}}))

    # When a hotel and a flight are booked
    hotel = invoke("hotels", "book", f"h-{uid}")
    flight = invoke("flights", "reserve", f"f-{uid}")

    # Then the hotel is refused and the flight is not affected
    assert hotel == (409, {"error": "NO_ROOMS", "message": "hotels refused book"})
    assert flight[0] == 200


def test_services_are_built_once_per_cold_start(lambda_env: str, uid: str) -> None:
    # Given a first request
    invoke("flights", "reserve", f"t-{uid}")
    services = sample_services_handler.bootstrap()

    # When a second request is served / Then the same services answer it
    invoke("flights", "reserve", f"u-{uid}")
    assert sample_services_handler.bootstrap() is services
    assert services["flights"].effects() == {f"t-{uid}": 1, f"u-{uid}": 1}


def test_missing_table_setting_fails_the_cold_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAMPLE_LEDGER_TABLE", raising=False)
    sample_services_handler.bootstrap.cache_clear()
    try:
        with pytest.raises(ValueError, match="SAMPLE_LEDGER_TABLE"):
            sample_services_handler.bootstrap()
    finally:
        sample_services_handler.bootstrap.cache_clear()
