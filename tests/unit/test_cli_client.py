"""sasflow_cli: safe retries with one Idempotency-Key, the API's errors, the watch loop, commands' output."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from devstack.uplock import UpLock
from sasflow_cli import render
from sasflow_cli.app import CliState, app
from sasflow_cli.client import OPS_FORBIDDEN_HINT, UNREACHABLE_HINT, ApiError, SasflowClient
from sasflow_cli.targets import TargetError, build_client, running_local_url
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
        client(transport, []).redrive("FlightsDeadLetterQueue", reason="flights is back")
    assert (raised.value.status, raised.value.code, raised.value.message) == (503, "UNAVAILABLE", "try later")
    assert len(transport.requests) == 1
    # API Gateway's own refusal has a message only
    transport = FakeTransport((403, {"message": "Forbidden"}))
    with pytest.raises(ApiError) as raised:
        client(transport, []).get("wf-1")
    assert (raised.value.code, raised.value.message) == ("HTTP_403", "Forbidden" + OPS_FORBIDDEN_HINT)
    # A GET that never gets an answer is UNREACHABLE after every try
    transport = FakeTransport(OSError("refused"), OSError("refused"), OSError("refused"))
    with pytest.raises(ApiError) as raised:
        client(transport, []).get("wf-1")
    assert (raised.value.status, raised.value.code) == (0, "UNREACHABLE")
    assert raised.value.message.endswith(UNREACHABLE_HINT) and "make up" in UNREACHABLE_HINT


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


def test_no_target_is_a_usage_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no make up here to default to
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


def _aws_canonical_query(url: str) -> str:
    """The canonical query string as the service computes it from what it received (SigV4 guide, "Create a
    canonical request"): each name and value percent-decoded, then encoded per RFC 3986, sorted by name."""
    from urllib.parse import quote, unquote, urlsplit

    pairs = [pair.partition("=") for pair in urlsplit(url).query.split("&") if pair]
    encoded = sorted((quote(unquote(k), safe="-_.~"), quote(unquote(v), safe="-_.~")) for k, _, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def test_odd_names_and_query_values_are_signed_exactly_as_the_service_canonicalizes_them() -> None:
    # Given botocore's SigV4 signer recording the URL it signs, and an API that answers every request
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    signed: list[tuple[str, str]] = []

    def aws_signer(method: str, url: str, body: bytes, headers: Mapping[str, str]) -> dict[str, str]:
        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        auth = SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "execute-api", "us-east-1")
        auth.add_auth(request)
        signed.append((url, auth.canonical_query_string(request)))
        return dict(request.headers.items())

    transport = FakeTransport((200, {"versions": []}), (200, {"workflows": []}), (200, {"status": "HELD"}))
    api = SasflowClient("http://api.test", aws_signer, transport=transport, sleep=lambda _: None)
    # When a definition name with a space and a slash, a query value with a space and a plus, and a map child's
    # id (colons) are sent
    api.definitions("order saga/v2")
    next(api.list_pages(definition="order saga+x", status="HELD"))
    api.get("wf-1:0:3")
    # Then each path segment is encoded per RFC 3986 and each query value with %20 (never '+')
    sent = [url for _, url, _, _ in transport.requests]
    assert sent == [
        "http://api.test/definitions/order%20saga%2Fv2",
        "http://api.test/ops/workflows?status=HELD&definition=order%20saga%2Bx",
        "http://api.test/ops/workflows/wf-1%3A0%3A3",
    ]
    # And the URL signed is the URL sent, whose canonical query is the one the service computes
    assert [url for url, _ in signed] == sent
    assert [query for _, query in signed] == [_aws_canonical_query(url) for url in sent]
    assert signed[1][1] == "definition=order%20saga%2Bx&status=HELD"


def page(*rows: dict[str, Any], counts: dict[str, int] | None = None, cursor: str | None = None) -> dict[str, Any]:
    return {"workflows": list(rows), "next_cursor": cursor, "counts": counts, "source": "attention index", "notes": []}


def row(wid: str, status: str, since: int) -> dict[str, Any]:
    return {
        "workflow_id": wid,
        "status": status,
        "definition_name": "trip",
        "created_at": since - 60,
        "trouble": 0,
        "attention": status,
        "attention_since": since,
    }


def test_list_without_a_filter_lists_what_waits_for_a_person_newest_first() -> None:
    # Given 2 HELD, 1 COMPENSATION_FAILED and no PAUSED workflow (the in-flight listing would show none of them)
    counts = {"COMPENSATION_FAILED": 1, "HELD": 2, "PAUSED": 0, "RUNNING": 4}
    transport = FakeTransport(
        (200, page(row("h-1", "HELD", 1_800_000_010), row("h-2", "HELD", 1_800_000_030), counts=counts)),
        (200, page(row("f-1", "COMPENSATION_FAILED", 1_800_000_020), counts=counts)),
        (200, page(counts=counts)),
    )
    state = CliState(client_=client(transport, []))
    # When the operator runs `sasflow list` with no filter
    result = CliRunner().invoke(app, ["list", "--json"], obj=state)
    # Then it asked for each kind that waits for a person, and lists them newest attention first
    assert result.exit_code == 0, result.output
    assert [url.split("?")[1] for _, url, _, _ in transport.requests] == [
        "status=HELD",
        "status=COMPENSATION_FAILED",
        "status=PAUSED",
    ]
    listing = json.loads(result.stdout)
    assert [w["workflow_id"] for w in listing["workflows"]] == ["h-2", "f-1", "h-1"]
    assert listing["counts"] == counts
    # And --in-flight asks for the in-flight listing (no status), as `list` did before
    transport = FakeTransport((200, page(counts=counts)))
    state = CliState(client_=client(transport, []))
    assert CliRunner().invoke(app, ["list", "--in-flight", "--json"], obj=state).exit_code == 0
    assert [url for _, url, _, _ in transport.requests] == ["http://api.test/ops/workflows"]
    # And the start's bounds are sent as given
    transport = FakeTransport((200, page(counts=counts)))
    state = CliState(client_=client(transport, []))
    bounded = ["list", "--in-flight", "--started-after", "1800000000", "--started-before", "1800000600", "--json"]
    assert CliRunner().invoke(app, bounded, obj=state).exit_code == 0
    assert [url.split("?")[1] for _, url, _, _ in transport.requests] == [
        "started_after=1800000000&started_before=1800000600"
    ]


@pytest.mark.parametrize(
    ("status", "exit_code", "said"),
    [
        ("COMPLETED", 0, ""),
        ("HELD", 3, "HELD: it waits for a person"),
        ("COMPENSATED", 3, "COMPENSATED: it did not complete"),
        ("COMPENSATION_FAILED", 3, "COMPENSATION_FAILED: a compensation gave up"),
        ("CANCELLED", 3, "CANCELLED: it was cancelled"),
    ],
)
def test_watch_exits_non_zero_naming_the_status_when_the_workflow_did_not_complete(
    status: str, exit_code: int, said: str
) -> None:
    # Given a workflow that has stopped in `status`
    transport = FakeTransport((200, {"workflow_id": "wf-1", "status": status, "steps": []}))
    state = CliState(client_=client(transport, []), sleep=lambda _: None)
    # When it is watched
    result = CliRunner().invoke(app, ["watch", "wf-1", "--json"], obj=state)
    # Then only COMPLETED exits 0; the others exit 3 and name the status on stderr
    assert result.exit_code == exit_code
    assert json.loads(result.stdout)["status"] == status
    assert said in result.stderr if said else result.stderr == ""


def test_dlq_redrive_sends_the_reason_and_follows_the_move_to_its_end() -> None:
    # Given an API that starts a move of 5 messages, then lists it running, then completed
    started = {"queue": "FlightsDeadLetterQueue", "task_handle": "aGFuZGxl", "approximate_messages": 5}
    running = {"task_handle": "aGFuZGxl", "status": "RUNNING", "started_at": 1_800_000_000, "moved": 2, "to_move": 5}
    done = {"task_handle": None, "status": "COMPLETED", "started_at": 1_800_000_000, "moved": 5, "to_move": 5}
    transport = FakeTransport(
        (202, started),
        (200, {"queues": [{"queue": "FlightsDeadLetterQueue", "approximate_messages": 3, "move_tasks": [running]}]}),
        (200, {"queues": [{"queue": "FlightsDeadLetterQueue", "approximate_messages": 0, "move_tasks": [done]}]}),
    )
    sleeps: list[float] = []
    state = CliState(client_=client(transport, sleeps), sleep=sleeps.append, now=lambda: 1_800_000_000.0)
    # When the operator redrives the queue with a reason
    result = CliRunner().invoke(
        app, ["dlq", "redrive", "FlightsDeadLetterQueue", "--reason", "flights is back", "-n", "0.5"], obj=state
    )
    # Then the reason is sent, the progress is read without receiving any message (limit=0), and printed as words
    assert result.exit_code == 0, result.output
    assert json.loads(transport.requests[0][2]) == {"queue": "FlightsDeadLetterQueue", "reason": "flights is back"}
    assert [url.split("?")[1] for _, url, _, _ in transport.requests[1:]] == [
        "queue=FlightsDeadLetterQueue&limit=0"
    ] * 2
    lines = result.stdout.splitlines()
    assert lines[0] == "redrive of FlightsDeadLetterQueue started: 5 message(s) to move back"
    assert lines[1].startswith("move RUNNING: 2 of 5 moved, started ")
    assert lines[2].startswith("move COMPLETED: 5 of 5 moved, started ")
    assert "aGFuZGxl" not in result.stdout and "{" not in result.stdout
    assert sleeps == [0.5]
    # And a redrive without --reason sends nothing
    transport.requests.clear()
    result = CliRunner().invoke(app, ["dlq", "redrive", "FlightsDeadLetterQueue"], obj=state)
    assert result.exit_code == 2 and "--reason" in result.stderr and transport.requests == []


def test_every_cli_error_about_a_file_is_one_line_naming_its_cause(tmp_path: Any) -> None:
    transport = FakeTransport()
    state = CliState(client_=client(transport, []))
    runner = CliRunner()
    # A start of a JSON array
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    result = runner.invoke(app, ["start", str(array)], obj=state)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: FILE {array}: expected a JSON object {{...}}, got an array\n",
    )
    # An input that is not an object is refused before any request: the API's workflow input is an object
    trip = tmp_path / "trip.json"
    trip.write_text('{"definition": {}, "input": {}}')
    result = runner.invoke(app, ["start", str(trip), "--input", "[1]"], obj=state)
    assert (result.exit_code, result.stderr) == (2, "error: --input: expected a JSON object {...}, got an array\n")
    assert transport.requests == []
    # A JSON syntax error names its line and column
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "definition": {},\n  "input": {"a": 1,}\n}\n')
    result = runner.invoke(app, ["start", str(broken)], obj=state)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: FILE {broken}: not JSON: line 3 column 20: Expecting property name enclosed in double quotes\n",
    )
    # And definitions push names what each other file lacks, one line each
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "notes.json").write_text('{"comment": "not a definition"}')
    (tmp_path / "defs" / "list.json").write_text("[]")
    (tmp_path / "defs" / "v.json").write_text('{"name": "trip", "version": "2"}')
    result = runner.invoke(app, ["definitions", "push", str(tmp_path / "defs")], obj=state)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"{tmp_path}/defs/list.json: NOT_A_DEFINITION: file {tmp_path}/defs/list.json: expected a JSON object {{...}}, "
        "got an array",
        f"{tmp_path}/defs/notes.json: NOT_A_DEFINITION: no 'name' and no 'version': a definition file needs a name "
        "and a version",
        f"{tmp_path}/defs/v.json: NOT_A_DEFINITION: 'version' must be a whole number from 1, not \"2\"",
    ]
    assert state.client.transport.requests == []  # type: ignore[attr-defined]


def test_watch_into_a_pipe_ends_its_last_table_with_a_line_end() -> None:
    # Found by a new user: `sasflow watch ID > file` left the table's last line unterminated, so the next output
    # joined it
    transport = FakeTransport((200, {"workflow_id": "wf-1", "status": "COMPLETED", "steps": []}))
    state = CliState(client_=client(transport, []), sleep=lambda _: None)
    result = CliRunner().invoke(app, ["watch", "wf-1"], obj=state)
    assert result.exit_code == 0
    assert result.stdout.endswith("\n") and "wf-1" in result.stdout


def test_an_empty_id_or_a_missing_definition_file_is_refused_before_any_request(tmp_path: Any) -> None:
    # From a new user's trial: `get ''` (an unset $ID) answered a bare 404 of another route, and `definitions push`
    # of a missing file was a NOT_A_DEFINITION about JSON, where `start` names the missing file
    transport = FakeTransport()
    state = CliState(client_=client(transport, []))
    runner = CliRunner()
    for args in (
        ["get", ""],
        ["history", " "],
        ["cancel", "", "--reason", "r"],
        ["retry", "", "--step", "s", "-r", "r"],
    ):
        result = runner.invoke(app, args, obj=state)
        assert result.exit_code == 2, args
        assert "Invalid value for 'ID': empty: give the id a `start` or `list` printed" in result.output, args
    missing = tmp_path / "nope.json"
    for args in (["start", str(missing)], ["definitions", "push", str(missing)]):
        result = runner.invoke(app, args, obj=state)
        assert result.exit_code == 2, args
        assert f"'{missing}' does not exist" in result.output.replace("\n", ""), args
    assert transport.requests == []


def test_api_gateways_bare_403_on_an_operators_route_says_who_may_call_it() -> None:
    # From a new user's trial: `sasflow --as client-a list` answered `HTTP_403 (403): Forbidden` and nothing else
    forbidden = (403, {"message": "Forbidden"})
    transport = FakeTransport(forbidden, forbidden, (403, {"error": "FORBIDDEN_HERE", "message": "ours"}))
    api = client(transport, [])
    with pytest.raises(ApiError) as raised:
        api.request("GET", "/ops/workflows")
    assert (raised.value.status, raised.value.code) == (403, "HTTP_403")
    assert raised.value.message == "Forbidden" + OPS_FORBIDDEN_HINT
    assert "--as operator" in raised.value.message
    # a clients' route's 403 is left as it is, and so is a 403 the function itself wrote
    with pytest.raises(ApiError) as raised:
        api.request("POST", "/workflows", body={})
    assert raised.value.message == "Forbidden"
    with pytest.raises(ApiError) as raised:
        api.request("GET", "/ops/overdue")
    assert raised.value.message == "ours"


def test_careless_targets_and_inputs_are_one_line_errors_not_tracebacks(tmp_path: Any) -> None:
    # From a new user's trial: each of these ended in a Python traceback or an unreadable 422
    runner = CliRunner()
    for url in ("127.0.0.1:3000", "localhost:3000", "not a url", "ftp://127.0.0.1:3000"):
        result = runner.invoke(app, ["--url", url, "list"])
        assert result.exit_code == 2, url
        assert f"error: --url {url}: expected the API's URL with its scheme" in result.stderr, url
    transport = FakeTransport()
    state = CliState(client_=client(transport, []))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5_000 + "]" * 5_000)
    trip = tmp_path / "trip.json"
    trip.write_text('{"definition": {}, "input": {}}')
    result = runner.invoke(app, ["start", str(trip), "--input", str(deep)], obj=state)
    assert (result.exit_code, result.stderr) == (
        2,
        f"error: --input {deep}: JSON nested too deeply (the API takes 64 levels)\n",
    )
    result = runner.invoke(app, ["start", str(trip), "--input", "[" * 5_000 + "]" * 5_000], obj=state)
    assert (result.exit_code, result.stderr) == (
        2,
        "error: --input: JSON nested too deeply (the API takes 64 levels)\n",
    )
    definition = tmp_path / "trip-booking.json"
    definition.write_text('{"name": "trip-booking", "version": 1, "steps": []}')
    result = runner.invoke(app, ["start", str(definition)], obj=state)
    assert result.exit_code == 2
    assert "is a definition, not a start request" in result.stderr
    assert f"definitions push {definition}" in result.stderr.replace("\n", "")
    assert transport.requests == []


def test_list_of_held_workflows_says_where_a_paused_held_one_is() -> None:
    # From an on-call trial: a paused HELD workflow is counted and listed as PAUSED, so the alarm's own command
    # (`list --status HELD`) showed none of it
    counts = {"COMPENSATION_FAILED": 0, "HELD": 1, "PAUSED": 1}
    transport = FakeTransport((200, page(row("h-1", "HELD", 1_800_000_010), counts=counts)))
    result = CliRunner().invoke(app, ["list", "--status", "HELD"], obj=CliState(client_=client(transport, [])))
    assert result.exit_code == 0, result.output
    assert "h-1" in result.stdout
    assert result.stderr == (
        "note: 1 paused workflow(s) are listed under --status PAUSED (a paused HELD one counts there, not here); "
        "`sasflow list` shows everything that waits for a person\n"
    )
    # and with nothing paused there is no note
    counts["PAUSED"] = 0
    transport = FakeTransport((200, page(row("h-1", "HELD", 1_800_000_010), counts=counts)))
    result = CliRunner().invoke(app, ["list", "--status", "HELD"], obj=CliState(client_=client(transport, [])))
    assert result.stderr == ""


def test_without_a_target_the_cli_talks_to_the_make_up_running_in_this_folder(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From a new user's trial: `sasflow list` beside a running `make up` said to give --url, though
    # `python -m devstack faults` finds that stack through its lock
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SASFLOW_URL", raising=False)
    monkeypatch.delenv("SASFLOW_STACK", raising=False)
    lock = tmp_path / ".devstack" / "up.lock"
    lock.parent.mkdir()
    # no lock file, or one nobody holds (its stack stopped, even with its URL still in it): no default
    assert running_local_url() is None
    lock.write_text(json.dumps({"pid": 2**22 + 12_345, "api_url": "http://127.0.0.1:3999"}))
    assert running_local_url() is None
    with pytest.raises(TargetError, match="no `make up` is running in this folder"):
        build_client(url=None, stack=None)
    # held by a live make up (devstack.uplock): still starting (no URL yet), then its URL
    with UpLock(lock) as held:
        assert running_local_url() is None
        held.publish(api_url="http://127.0.0.1:3999")
        assert running_local_url() == "http://127.0.0.1:3999"
        assert build_client(url=None, stack=None).base_url.rstrip("/") == "http://127.0.0.1:3999"
    # and an emptied one (released) is no default
    assert lock.read_text() == "" and running_local_url() is None


def test_an_action_on_a_paused_workflow_says_it_waits_for_resume() -> None:
    # From an on-call trial: cancel of a paused HELD workflow answered "cancel: done", then stayed CANCELLING
    view = {"workflow_id": "w", "status": "CANCELLING", "paused": True, "steps": []}
    for action, args in (("cancel", []), ("compensate", []), ("retry", ["--step", "b"])):
        transport = FakeTransport((200, view))
        state = CliState(client_=client(transport, []), new_key=lambda: "key-9")
        result = CliRunner().invoke(app, [action, "w", "--reason", "r", *args], obj=state)
        assert result.exit_code == 0, result.output
        assert result.stderr == (
            f"note: the workflow is paused: what {action} starts is dispatched once you `resume` it (replies to "
            "steps in flight are still handled)\n"
        )
    # and not for pause itself, nor for a workflow that is not paused
    for action, paused in (("pause", True), ("cancel", False)):
        transport = FakeTransport((200, {**view, "paused": paused}))
        state = CliState(client_=client(transport, []), new_key=lambda: "key-9")
        assert CliRunner().invoke(app, [action, "w", "--reason", "r"], obj=state).stderr == ""


def test_list_sort_cost_lists_the_dearest_first_and_a_workflow_without_a_tally_last() -> None:
    # Given three held workflows, one written before the tally (no cost)
    rows = [row("cheap", "HELD", 1), row("dear", "HELD", 2), row("old", "HELD", 3)]
    rows[0]["cost"], rows[1]["cost"] = 0.0000125, 0.0004
    transport = FakeTransport((200, page(*rows)))
    state = CliState(client_=client(transport, []))
    # When the operator lists them by cost
    result = CliRunner().invoke(app, ["list", "--status", "HELD", "--sort", "cost", "--json"], obj=state)
    # Then the dearest comes first, the one without a tally last
    assert result.exit_code == 0, result.output
    assert [w["workflow_id"] for w in json.loads(result.stdout)["workflows"]] == ["dear", "cheap", "old"]
    # And a sort the listing does not know is refused, naming the one it knows
    refused = CliRunner().invoke(app, ["list", "--sort", "age"], obj=CliState(client_=client(FakeTransport(), [])))
    assert refused.exit_code == 2 and "--sort cost" in refused.output
    # (in any case: the trial's --sort COST was refused)
    transport = FakeTransport((200, page(*rows)))
    upper = ["list", "--status", "HELD", "--sort", "COST", "--json"]
    result = CliRunner().invoke(app, upper, obj=CliState(client_=client(transport, [])))
    assert result.exit_code == 0 and json.loads(result.stdout)["workflows"][0]["workflow_id"] == "dear"


def test_get_shows_what_the_workflow_has_cost_and_its_lines() -> None:
    view = {
        "workflow_id": "w-1",
        "status": "COMPLETED",
        "definition_name": "trip",
        "definition_version": 1,
        "created_at": 1_800_000_000,
        "updated_at": 1_800_000_010,
        "input": {},
        "steps": [],
        "cost": {
            "dollars": 0.0000132,
            "prices": "us-east-1, read 2026-11-29",
            "lines": [
                {"name": "DynamoDB writes", "quantity": "12 WRU", "dollars": 0.0000075},
                {"name": "S3", "quantity": "0 writes, 0 reads, 0 bytes written", "dollars": 0.0},
                {"name": "SQS", "quantity": "6.00 requests", "dollars": 0.0000024},
            ],
        },
    }
    console = Console(width=160, highlight=False, color_system=None, record=True)
    console.print(render.workflow_table(view))
    text = console.export_text()
    assert "cost $0.0000132 ($13.20 per million like it)\n" in text
    assert "\n  at us-east-1, read 2026-11-29 list prices" in text
    # each line that cost anything, with its quantity; a line of nothing is left out
    assert "  DynamoDB writes    $0.00000750  12 WRU\n  SQS                $0.00000240  6.00 requests\n" in text
    assert "S3" not in text


def test_list_continues_from_the_cursor_its_last_page_printed_and_says_a_sort_saw_one_page() -> None:
    # Given a listing of completed workflows whose first page has more after it (found by a trial: the CLI printed
    # "more" but no cursor, and had no --cursor to continue with)
    first = [row("w-1", "COMPLETED", 1), row("w-2", "COMPLETED", 2)]
    first[0]["cost"] = 0.0000125
    first[1]["cost"] = 0.0000199
    for r in first:
        r["reason"] = "a long reason that would push the cost column out of an 80-column terminal " * 2
    transport = FakeTransport((200, page(*first, cursor="c-2")), (200, page(row("w-3", "COMPLETED", 3))))
    state = CliState(client_=client(transport, []))
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        app, ["list", "--status", "COMPLETED", "--limit", "2", "--sort", "cost"], obj=state
    )
    assert result.exit_code == 0, result.output
    # Then it prints the cursor to continue with, keeps the column it sorted by, and says the sort saw one page
    assert "more: --cursor c-2 for the next page; --all follows every page" in " ".join(result.stdout.split())
    assert "$0.0000199" in result.stdout and result.stdout.index("$0.0000199") < result.stdout.index("$0.0000125")
    assert "sorted by cost within the workflows read; --all reads and sorts every one listed" in result.stderr
    # and what the workflows listed cost together (an incident's cost: found by the same trial)
    assert "cost of the 2 listed with a tally: $0.0000324" in result.stdout
    # When it continues from that cursor
    result = CliRunner().invoke(app, ["list", "--status", "COMPLETED", "--cursor", "c-2", "--json"], obj=state)
    # Then the next page is asked for from it
    assert result.exit_code == 0, result.output
    assert [w["workflow_id"] for w in json.loads(result.stdout)["workflows"]] == ["w-3"]
    assert "cursor=c-2" in transport.requests[-1][1]
    # And a cursor without the listing it continues, or a page over the API's 200, is refused before any request
    for args in (["list", "--cursor", "c-2"], ["list", "--status", "COMPLETED", "--limit", "201"]):
        refused = CliRunner().invoke(app, args, obj=CliState(client_=client(FakeTransport(), [])))
        assert refused.exit_code == 2, refused.output
