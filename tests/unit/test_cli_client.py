"""sasflow_cli: safe retries with one Idempotency-Key, the API's errors, the watch loop, commands' output."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sasflow_cli import render
from sasflow_cli.app import CliState, app
from sasflow_cli.client import ApiError, SasflowClient
from sasflow_cli.watch import watch


class FakeTransport:
    """Answers from a script of (status, body) and records every request."""

    def __init__(self, *answers: tuple[int, Any] | OSError) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        self.requests.append((method, url, body, dict(headers)))
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        status, document = answer
        return status, json.dumps(document).encode()


def signer(method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]:
    return {**headers, "Authorization": f"signed {method} {url}"}


def client(transport: FakeTransport, sleeps: list[float]) -> SasflowClient:
    return SasflowClient("http://api.test/", signer, transport=transport, sleep=sleeps.append)


def test_an_action_is_retried_with_the_same_idempotency_key_after_a_503_and_a_dropped_connection() -> None:
    # Given an API that answers 503, then drops the connection, then applies the action
    transport = FakeTransport((503, {"message": "Service Unavailable"}), OSError("reset"), (200, {"status": "RUNNING"}))
    sleeps: list[float] = []
    # When the CLI pauses a workflow
    view = client(transport, sleeps).act("wf 1", "pause", reason="look first", idempotency_key="key-1")
    # Then it tried three times, each with the same key and body, signed again each time, backing off in between
    assert view == {"status": "RUNNING"}
    assert [(m, u) for m, u, _, _ in transport.requests] == [("POST", "http://api.test/ops/workflows/wf%201/pause")] * 3
    assert {r[3]["Idempotency-Key"] for r in transport.requests} == {"key-1"}
    assert [json.loads(r[2]) for r in transport.requests] == [{"reason": "look first"}] * 3
    assert all(r[3]["Authorization"].startswith("signed POST") for r in transport.requests)
    assert sleeps == [0.5, 1.0]


def test_a_post_without_a_key_is_not_retried_and_errors_carry_the_api_code() -> None:
    # A redrive has no Idempotency-Key: a 503 is reported, not repeated
    transport = FakeTransport((503, {"error": "UNAVAILABLE", "message": "try later"}))
    with pytest.raises(ApiError) as raised:
        client(transport, []).redrive("FlightsDeadLetterQueue")
    assert (raised.value.status, raised.value.code, raised.value.message) == (503, "UNAVAILABLE", "try later")
    assert len(transport.requests) == 1
    # API Gateway's own refusal has a message only
    transport = FakeTransport((403, {"message": "Forbidden"}))
    with pytest.raises(ApiError) as raised:
        client(transport, []).get("wf-1")
    assert (raised.value.code, raised.value.message) == ("HTTP_403", "Forbidden")
    # A GET that never gets an answer is UNREACHABLE after every try
    transport = FakeTransport(OSError("refused"), OSError("refused"), OSError("refused"))
    with pytest.raises(ApiError) as raised:
        client(transport, []).get("wf-1")
    assert (raised.value.status, raised.value.code) == (0, "UNREACHABLE")


def test_history_and_list_follow_their_cursors() -> None:
    transport = FakeTransport(
        (200, {"workflow_id": "wf-1", "status": "RUNNING", "events": [{"seq": 1}, {"seq": 2}], "next_cursor": "2"}),
        (200, {"workflow_id": "wf-1", "status": "COMPLETED", "events": [{"seq": 3}], "next_cursor": None}),
    )
    page = client(transport, []).history("wf-1", limit=2)
    assert ([e["seq"] for e in page["events"]], page["status"], page["next_cursor"]) == ([1, 2, 3], "COMPLETED", None)
    assert [r[1] for r in transport.requests] == [
        "http://api.test/ops/workflows/wf-1/history?limit=2",
        "http://api.test/ops/workflows/wf-1/history?cursor=2&limit=2",
    ]
    transport = FakeTransport(
        (200, {"workflows": [{"workflow_id": "a"}], "next_cursor": "c1", "counts": {"HELD": 2}, "source": "x"}),
        (200, {"workflows": [{"workflow_id": "b"}], "next_cursor": None, "source": "x"}),
    )
    pages = list(client(transport, []).list_pages(status="HELD", follow=True))
    assert [w["workflow_id"] for p in pages for w in p["workflows"]] == ["a", "b"]
    assert transport.requests[1][1] == "http://api.test/ops/workflows?status=HELD&cursor=c1"


def test_watch_reads_until_the_workflow_is_terminal_without_waiting() -> None:
    # Given a workflow that is read RUNNING twice, then COMPENSATED
    statuses = iter(["RUNNING", "COMPENSATING", "COMPENSATED"])
    shown: list[tuple[str, float]] = []
    sleeps: list[float] = []
    clock = [100.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    # When it is watched every 3 s
    result = watch(
        lambda: {"status": next(statuses)},
        lambda view, now: shown.append((view["status"], now)),
        interval_seconds=3.0,
        clock=lambda: clock[0],
        now=lambda: clock[0] + 1_800_000_000,
        sleep=sleep,
    )
    # Then it read three times, slept twice, and stopped at the terminal status
    assert (result.view["status"], result.reads, result.timed_out) == ("COMPENSATED", 3, False)
    assert sleeps == [3.0, 3.0]
    assert shown == [("RUNNING", 1_800_000_100.0), ("COMPENSATING", 1_800_000_103.0), ("COMPENSATED", 1_800_000_106.0)]
    # And a watch with a timeout gives up before sleeping past it
    clock[0] = 0.0
    result = watch(
        lambda: {"status": "RUNNING"},
        lambda view, now: None,
        interval_seconds=2.0,
        timeout_seconds=5.0,
        clock=lambda: clock[0],
        sleep=sleep,
    )
    assert (result.reads, result.timed_out) == (3, True)


def test_a_refused_action_prints_the_api_code_and_message_and_exits_1() -> None:
    # Given an API that refuses a retry of a running workflow
    transport = FakeTransport(
        (409, {"error": "CONFLICT", "message": "workflow is RUNNING: only a HELD workflow's step"})
    )
    state = CliState(client_=client(transport, []), new_key=lambda: "key-7")
    # When the operator retries it
    result = CliRunner().invoke(app, ["retry", "wf-1", "--reason", "why not", "--step", "charge_card"], obj=state)
    # Then the error code and message are printed, and the exit code is 1
    assert result.exit_code == 1
    assert "error: CONFLICT (409): workflow is RUNNING: only a HELD workflow's step" in result.stderr
    method, url, body, headers = transport.requests[0]
    assert (method, url, json.loads(body), headers["Idempotency-Key"]) == (
        "POST",
        "http://api.test/ops/workflows/wf-1/retry",
        {"reason": "why not", "step": "charge_card"},
        "key-7",
    )
    # And an action without --reason is a usage error that sends nothing
    transport.requests.clear()
    result = CliRunner().invoke(app, ["pause", "wf-1"], obj=state)
    assert result.exit_code == 2 and "--reason" in result.stderr and transport.requests == []


@pytest.mark.parametrize(
    ("options", "body"),
    [
        ([], {"reason": "by phone", "step": "reserve_flight"}),
        (["--output", "null"], {"reason": "by phone", "step": "reserve_flight", "output": None}),
        (
            ["--output", '{"ref": "BY-PHONE"}'],
            {"reason": "by phone", "step": "reserve_flight", "output": {"ref": "BY-PHONE"}},
        ),
    ],
)
def test_skip_sends_no_output_without_the_option_and_an_explicit_null_as_null(
    options: list[str], body: dict[str, Any]
) -> None:
    # Given an API that takes the skip
    transport = FakeTransport((200, {"status": "RUNNING", "steps": []}))
    state = CliState(client_=client(transport, []), new_key=lambda: "key-9")
    # When the operator skips a step with or without --output
    args = ["skip", "wf-1", "--reason", "by phone", "--step", "reserve_flight", *options, "--json"]
    result = CliRunner().invoke(app, args, obj=state)
    # Then the body has no output without the option, and JSON null with --output null (the API tells them apart)
    assert result.exit_code == 0, result.output
    assert json.loads(transport.requests[0][2]) == body


def test_no_target_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["get", "wf-1"], env={"SASFLOW_URL": "", "SASFLOW_STACK": ""})
    assert result.exit_code == 2
    assert "--url URL (local stack) or --stack NAME (deployed)" in result.stderr


def test_a_message_that_names_a_step_path_is_printed_as_it_is() -> None:
    # Found by a new user: Rich read "[b]" of "steps[b].when" as markup and printed "steps.when"
    message = "steps[b].when: 'abs(input.t)' could not be evaluated"
    transport = FakeTransport((422, {"error": "CONDITION_NOT_EVALUATED", "message": message}))
    state = CliState(client_=client(transport, []), new_key=lambda: "key-8")
    result = CliRunner().invoke(app, ["retry", "wf-1", "--reason", "r", "--step", "b"], obj=state)
    assert result.exit_code == 1
    assert f"error: CONDITION_NOT_EVALUATED (422): {message}" in result.stderr
    view = {
        "workflow_id": "w",
        "steps": [{"name": "b", "error": {"code": "MISSING_REFERENCE", "message": "steps[b].x"}}],
    }
    screen = Console(width=200, record=True)
    screen.print(render.workflow_table(view))
    assert "MISSING_REFERENCE steps[b].x" in screen.export_text()
