"""The sasflow CLI against the real API handlers on moto (the `deployed` fixture), and --stack against moto.

The CLI's transport is swapped for one that turns each request into the API Gateway event of its route and invokes
the API or the operators' function in-process (as tests/integration/test_ops_api.py does), so every command runs
end to end through the handlers; the local stack over HTTP is tests/system/test_cli_on_call.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from sasflow_cli.app import CliState, app
from sasflow_cli.client import SasflowClient
from sasflow_cli.targets import API_URL_OUTPUT, TargetError, build_client
from tests.integration.conftest import Deployed
from tests.support.lambdas import ROOT

CONSUMERS = ("FlightsAgentFunction", "HotelsAgentFunction", "PaymentsAgentFunction", "SchedulerFunction")


class DeployedTransport:
    """Sends the CLI's requests to the deployed functions as ``caller`` (API Gateway verified it)."""

    def __init__(self, deployed: Deployed, caller: str = "operator") -> None:
        self.deployed = deployed
        self.caller = caller
        self.keys: list[str | None] = []

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        split = urlsplit(url)
        self.keys.append(headers.get("Idempotency-Key"))
        status, document = self.deployed.api(
            method,
            split.path,
            raw_body=body.decode() if body else None,
            headers={k: v for k, v in headers.items() if k.lower() == "idempotency-key"},
            caller=self.caller,
            function="OpsFunction" if split.path.startswith("/ops") else "ApiFunction",
            query=split.query,
        )
        return status, json.dumps(document).encode()


def cli(deployed: Deployed, *args: str, caller: str = "operator") -> Any:
    """Run one command with --json; return its parsed output (asserting exit 0)."""
    for function in ("ApiFunction", "OpsFunction"):
        deployed.fn(function)  # loaded outside the runner: its logger keeps the real stdout, not the runner's
    transport = DeployedTransport(deployed, caller)
    client = SasflowClient(
        "http://deployed.test", lambda m, u, b, h: dict(h), transport=transport, operator=caller == "operator"
    )
    result = CliRunner().invoke(app, [*args, "--json"], obj=CliState(client_=client, now=deployed.clock.now))
    assert result.exit_code == 0, result.output
    # The functions run in this process, so their log lines (one JSON object a line) share stdout with the CLI,
    # whose document is indented: it starts at a line that is only "{".
    lines = result.stdout.splitlines()
    return json.loads("\n".join(lines[max(i for i, line in enumerate(lines) if line == "{") :]))


def pump_slowly(deployed: Deployed, rounds: int = 50) -> None:
    """Deliver the queues one message batch at a time, one second apart, so every event has its own time."""
    for _ in range(rounds):
        delivered = False
        for consumer in CONSUMERS:
            if deployed.driver(consumer).deliver() is not None:
                delivered = True
                deployed.clock.advance(1)
        if not delivered:
            return
    raise AssertionError("queues did not drain")


def test_the_timeline_of_a_compensated_trip_has_one_bar_per_attempt_matching_its_history(
    deployed: Deployed, tmp_path: Path
) -> None:
    # Given a trip started with the CLI whose payment is declined, run one hop per second
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    started = cli(deployed, "start", str(ROOT / "events" / "trip_booking_request.json"))
    wid = started["workflow_id"]
    pump_slowly(deployed)
    view = cli(deployed, "get", wid)
    assert view["status"] == "COMPENSATED"
    history = cli(deployed, "history", wid)["events"]
    # When its timeline is drawn, as PNG and as HTML
    drawn = cli(deployed, "timeline", wid, "--out", str(tmp_path / "trip.png"))
    assert cli(deployed, "timeline", wid, "--out", str(tmp_path / "trip.html"))["bars"] == drawn["bars"]
    # Then there is one bar per attempt: three forward, the declined one rejected, two compensations, in order
    bars = drawn["bars"]
    assert [(b["step"], b["phase"], b["attempt"], b["outcome"], b["error_code"]) for b in bars] == [
        ("reserve_flight", "action", 1, "succeeded", None),
        ("book_hotel", "action", 1, "succeeded", None),
        ("charge_card", "action", 1, "rejected", "CARD_DECLINED"),
        ("book_hotel", "compensation", 1, "succeeded", None),
        ("reserve_flight", "compensation", 1, "succeeded", None),
    ]
    # And each bar starts at its dispatch, ends at its reply and carries the dispatch's complete-by
    dispatches = [e for e in history if e["kind"] in ("dispatched", "compensation_dispatched")]
    replies = [e for e in history if e["kind"] in ("reply_applied", "compensation_reply_applied")]
    assert [(b["start"], b["complete_by"]) for b in bars] == [(e["time"], e["complete_by"]) for e in dispatches]
    assert [b["end"] for b in bars] == [e["time"] for e in replies]
    assert len({b["start"] for b in bars}) == 5  # one hop per second: the bars are told apart by time
    # And the bars agree with the API's own step times
    steps = {s["name"]: s for s in view["steps"]}
    for bar in bars:
        step = steps[bar["step"]]
        prefix = "" if bar["phase"] == "action" else "compensation_"
        assert (bar["start"], bar["end"]) == (step[f"{prefix}started_at"], step[f"{prefix}finished_at"])
    # And both files were written
    assert (tmp_path / "trip.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (tmp_path / "trip.html").read_text(encoding="utf-8")


def test_list_actions_and_dead_letters_through_the_cli(deployed: Deployed, tmp_path: Path) -> None:
    # Given a trip under the hold policy whose payment is declined: HELD
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    request["definition"]["on_failure"] = "hold"
    (tmp_path / "held.json").write_text(json.dumps(request))
    wid = cli(deployed, "start", str(tmp_path / "held.json"))["workflow_id"]
    deployed.pump()
    # When the operator lists the HELD workflows, it is there with the counts
    listing = cli(deployed, "list", "--status", "HELD", "--all")
    assert [(w["workflow_id"], w["status"]) for w in listing["workflows"]] == [(wid, "HELD")]
    assert listing["counts"]["HELD"] == 1
    # And skipping the declined payment with an output completes the trip, audited with the operator
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    after = cli(deployed, "skip", wid, "--reason", "paid by phone", "--step", "charge_card", "--output", '{"paid": 1}')
    view = cli(deployed, "get", wid)
    assert (after["status"], view["status"], view["steps"][2]["output"]) == ("COMPLETED", "COMPLETED", {"paid": 1})
    [audit] = [e for e in cli(deployed, "history", wid)["events"] if e["kind"] == "operator_action"]
    assert (audit["detail"]["action"], audit["detail"]["reason"], audit["detail"]["step"]) == (
        "skip",
        "paid by phone",
        "charge_card",
    )
    assert audit["detail"]["principal"].endswith(":assumed-role/sasflow-operator/oncall")
    # And the dead-letter queues are all empty
    depths = {q["queue"]: q["approximate_messages"] for q in cli(deployed, "dlq", "list")["queues"]}
    assert "FlightsDeadLetterQueue" in depths and sum(depths.values()) == 0


def test_stack_reads_the_api_url_output_and_signs_for_execute_api_with_the_session_credentials() -> None:
    # Given a CloudFormation stack (moto) with the ApiUrl output the template declares
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {API_URL_OUTPUT: {"Value": "https://abc123.execute-api.eu-west-1.amazonaws.com"}},
    }
    with mock_aws():
        session = boto3.Session(region_name="eu-west-1")
        session.client("cloudformation").create_stack(StackName="sasflow-prod", TemplateBody=json.dumps(template))
        sent: list[tuple[str, str, dict[str, str]]] = []

        def transport(method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
            sent.append((method, url, dict(headers)))
            return 200, b'{"status": "RUNNING"}'

        # When the CLI's client is built for --stack sasflow-prod and reads a workflow
        client = build_client(url=None, stack="sasflow-prod", transport=transport, session=session)
        assert client.get("wf-1") == {"status": "RUNNING"}
        # Then it called the stack's API, signed for execute-api in the session's region with its credentials
        [(method, url, headers)] = sent
        assert (method, url) == ("GET", "https://abc123.execute-api.eu-west-1.amazonaws.com/ops/workflows/wf-1")
        credentials = session.get_credentials().get_frozen_credentials()
        assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/")
        assert "/eu-west-1/execute-api/aws4_request" in headers["Authorization"]
        assert headers.get("X-Amz-Security-Token") == credentials.token
        # And a stack without the output, or no stack at all, is a clear error
        del template["Outputs"]
        session.client("cloudformation").create_stack(StackName="other", TemplateBody=json.dumps(template))
        with pytest.raises(TargetError, match="stack other has no ApiUrl output"):
            build_client(url=None, stack="other", session=session)
        with pytest.raises(TargetError, match="stack missing"):
            build_client(url=None, stack="missing", session=session)
