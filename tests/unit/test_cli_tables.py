"""sasflow_cli tables for a person: at 80 and 120 columns the ids, statuses and errors stay whole, the rest gives way;
``--wide`` keeps every column on one line a row; a history's complete-by counts from its dispatch.

Each table command runs through the CLI (typer's runner) against canned API answers, printed by a rich Console of a
fixed width, so what is asserted is what a terminal of that width shows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import pytest
from rich.console import Console
from rich.text import Text
from typer.testing import CliRunner

from sasflow_cli import app as cli_app
from sasflow_cli import render
from sasflow_cli.app import CliState, app
from sasflow_cli.client import SasflowClient
from sasflow_cli.fit import Col, FitTable

T0 = 1_800_000_000
ARN = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


def documents(wid: str, child: str, message_id: str) -> dict[str, Any]:
    """The API's answers by path: a compensation that failed, its history, a listing, the overdue, a dead letter."""
    view = {
        "workflow_id": wid,
        "status": "COMPENSATION_FAILED",
        "definition_name": "trip-booking",
        "definition_version": 3,
        "created_at": T0,
        "updated_at": T0 + 40,
        "reason": "CARD_DECLINED at charge_card",
        "steps": [
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "status": "COMPLETED",
                "attempt": 2,
                "resends": 1,
                "complete_by": T0 + 16,
                "started_at": T0,
                "finished_at": T0 + 12,
                "compensation_status": "COMPENSATION_FAILED",
                "compensation_attempt": 3,
                "compensation_error": {"code": "TRANSIENT_EXHAUSTED", "message": "flights answered 503 three times"},
            },
            {
                "name": "book_hotel",
                "agent": "hotels",
                "action": "book",
                "status": "COMPLETED",
                "attempt": 1,
                "deferrals": 1,
                "complete_by": T0 + 21,
                "started_at": T0 + 12,
                "finished_at": T0 + 17,
                "compensation_status": "COMPENSATED",
                "compensation_attempt": 2,
            },
            {
                "name": "charge_card",
                "agent": "payments",
                "action": "charge",
                "status": "FAILED",
                "attempt": 1,
                "complete_by": T0 + 22,
                "started_at": T0 + 17,
                "finished_at": T0 + 18,
                "error": {"code": "CARD_DECLINED", "message": "the issuer declined the card: insufficient funds"},
            },
        ],
    }
    events = [
        {"seq": 1, "time": T0, "kind": "started"},
        {
            "seq": 2,
            "time": T0,
            "kind": "dispatched",
            "step": "reserve_flight",
            "phase": "action",
            "attempt": 1,
            "complete_by": T0 + 5,
        },
        {"seq": 3, "time": T0 + 11, "kind": "resent", "step": "reserve_flight", "phase": "action", "attempt": 1},
        {
            "seq": 4,
            "time": T0 + 11,
            "kind": "dispatched",
            "step": "reserve_flight",
            "phase": "action",
            "attempt": 2,
            "complete_by": T0 + 16,
        },
        {
            "seq": 5,
            "time": T0 + 12,
            "kind": "reply_applied",
            "step": "reserve_flight",
            "phase": "action",
            "attempt": 2,
            "outcome": "succeeded",
            "calls": 1,
        },
        {
            "seq": 6,
            "time": T0 + 18,
            "kind": "reply_applied",
            "step": "charge_card",
            "phase": "action",
            "attempt": 1,
            "outcome": "rejected",
            "calls": 1,
            "error_code": "CARD_DECLINED",
        },
        {
            "seq": 7,
            "time": T0 + 19,
            "kind": "compensation_reply_applied",
            "step": "reserve_flight",
            "phase": "compensation",
            "attempt": 3,
            "outcome": "failed",
            "calls": 3,
            "error_code": "TRANSIENT_EXHAUSTED",
        },
        {"seq": 8, "time": T0 + 32, "kind": "finished", "status": "COMPENSATION_FAILED"},
        {
            "seq": 9,
            "time": T0 + 50,
            "kind": "operator_action",
            "step": "reserve_flight",
            "detail": {"action": "retry-compensation", "principal": ARN, "reason": "flights back", "id": "k1"},
        },
    ]
    summaries = [
        {
            "workflow_id": wid,
            "status": "RUNNING",
            "definition_name": "trip-booking",
            "created_at": T0,
            "complete_by": T0 + 30,
            "trouble": 2,
            "attention": "PAUSED",
            "attention_since": T0 + 20,
            "reason": "CARD_DECLINED at charge_card: the issuer declined",
        },
        {
            "workflow_id": child,
            "status": "COMPENSATION_FAILED",
            "definition_name": "trip-booking",
            "created_at": T0,
            "trouble": 0,
            "attention": "COMPENSATION_FAILED",
        },
    ]
    dead_letter = {
        "queue": "FlightsDeadLetterQueue",
        "message_id": message_id,
        "kind": "step_request",
        "workflow_id": wid,
        "step": "reserve_flight",
        "phase": "action",
        "attempt": 2,
        "sent_at": T0,
        "age_seconds": 3600,
        "receive_count": 3,
        "body_bytes": 512,
    }
    return {
        f"/ops/workflows/{wid}": view,
        f"/ops/workflows/{wid}/history": {"workflow_id": wid, "status": "COMPENSATION_FAILED", "events": events},
        "/ops/workflows": {"workflows": summaries, "counts": {"RUNNING": 3}, "source": "attention index"},
        "/ops/overdue": {
            "now": T0 + 100,
            "grace_seconds": 5,
            "older_than_seconds": 0,
            "stuck_after": 5,
            "overdue": summaries,
            "stuck": summaries[:1],
        },
        "/ops/dead-letters": {
            "queues": [{"queue": "FlightsDeadLetterQueue", "approximate_messages": 1, "messages": [dead_letter]}]
        },
        "/definitions": {
            "definitions": [{"name": "trip-booking", "latest_version": 3, "owner": ARN, "created_at": T0}]
        },
        "/definitions/trip-booking": {
            "name": "trip-booking",
            "owner": ARN,
            "latest_version": 3,
            "versions": [
                {
                    "name": "trip-booking",
                    "version": 3,
                    "content_id": "c0ffee" * 8,
                    "published_by": ARN,
                    "created_at": T0,
                }
            ],
        },
    }


class Api:
    """Answers each GET with the document of its path."""

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = answers

    def __call__(self, method: str, url: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        return 200, json.dumps(self.answers[urlsplit(url).path]).encode()


@pytest.fixture
def ids() -> Iterator[tuple[str, str, str]]:
    wid = str(uuid.uuid4())
    yield wid, f"{wid}:2:17", str(uuid.uuid4())  # a workflow, a map step's child of it, a dead-letter message


def screen(ids: tuple[str, str, str], width: int, *args: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines ``sasflow ARGS`` prints on a terminal ``width`` columns wide."""
    monkeypatch.setattr(cli_app, "console", Console(width=width, highlight=False, color_system=None))
    client = SasflowClient("http://api.test", lambda m, u, b, h: dict(h), transport=Api(documents(*ids)))
    result = CliRunner().invoke(app, list(args), obj=CliState(client_=client, now=lambda: T0 + 100.0))
    assert result.exit_code == 0, result.output
    return [line.rstrip() for line in result.stdout.splitlines()]


def whole(lines: list[str], *values: str) -> None:
    """Every value is on one line, uncut, and nothing is cut short with an ellipsis."""
    for value in values:
        assert any(value in line for line in lines), f"{value!r} is not whole in:\n" + "\n".join(lines)
    assert not any("…" in line for line in lines), "\n".join(lines)


COMMANDS = ["get", "history", "list", "overdue", "dlq", "definitions", "versions"]


def args_of(command: str, wid: str) -> list[str]:
    return {
        "get": ["get", wid],
        "history": ["history", wid],
        "list": ["list"],
        "overdue": ["overdue"],
        "dlq": ["dlq", "list", "FlightsDeadLetterQueue"],
        "definitions": ["definitions", "list"],
        "versions": ["definitions", "list", "trip-booking"],
    }[command]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_table_fits_the_terminal_with_ids_statuses_and_errors_whole(
    ids: tuple[str, str, str], command: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the API's answers for a compensation that failed
    wid, child, _ = ids
    # When the table command prints on a terminal of 80 or 120 columns
    lines = screen(ids, width, *args_of(command, wid), monkeypatch=monkeypatch)
    # Then no line is wider than the terminal, and what a person copies or reads is whole
    assert max(len(line) for line in lines) <= width
    expected = {
        "get": [wid, "COMPENSATION_FAILED", "CARD_DECLINED", "TRANSIENT_EXHAUSTED", "insufficient funds"],
        "history": [wid, "compensation_reply_applied", "TRANSIENT_EXHAUSTED", "CARD_DECLINED", "succeeded, 1 call(s)"],
        "list": [wid, child, "COMPENSATION_FAILED", "PAUSED", "CARD_DECLINED"],
        "overdue": [wid, child, "COMPENSATION_FAILED", "CARD_DECLINED"],
        "dlq": [wid, "reserve_flight", "step_request", "3600"],
        "definitions": ["trip-booking", "v3"],
        "versions": ["c0ffeec0ffee", "trip-booking"],
    }[command]
    whole(lines, *expected)


def test_get_keeps_step_status_and_error_and_folds_the_compensation_under_its_step(
    ids: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by trying it: at 80 columns `get` showed "COMP…" and no error; at 120 the error column was zero-width
    wid = ids[0]
    narrow = screen(ids, 80, "get", wid, monkeypatch=monkeypatch)
    # Then at 80 the columns are step, status, attempt and error; times and counts gave way
    header = next(line for line in narrow if line.startswith("step"))
    assert header.split() == ["step", "status", "att", "error"]
    # And each compensation is a row under its step, with its own status, attempt and error
    rows = [line for line in narrow if line.startswith(("reserve_flight", "↳", "book_hotel", "charge_card"))]
    assert [row.split()[:3] for row in rows] == [
        ["reserve_flight", "COMPLETED", "2"],
        ["↳", "compensation", "COMPENSATION_FAILED"],
        ["book_hotel", "COMPLETED", "1"],
        ["↳", "compensation", "COMPENSATED"],
        ["charge_card", "FAILED", "1", "CARD_DECLINED"][:3],
    ]
    assert rows[1].split()[3:5] == ["3", "TRANSIENT_EXHAUSTED"]
    assert rows[4].split()[3] == "CARD_DECLINED"
    # And at 120 the error column is as wide as the rest leaves (20 columns or more), after the complete-by
    wider = screen(ids, 120, "get", wid, monkeypatch=monkeypatch)
    header = next(line for line in wider if line.startswith("step"))
    assert header.split() == ["step", "agent.action", "status", "att", "resends", "defer", "complete-by", "error"]
    assert 120 - header.index("error") >= 20
    assert any("08:00:22 +78s late  CARD_DECLINED the issuer" in line for line in wider)


def test_history_detail_keeps_a_readable_width_at_80_columns(
    ids: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by trying it: `history` squeezed the detail to 5 characters
    lines = screen(ids, 80, "history", ids[0], monkeypatch=monkeypatch)
    header = next(line for line in lines if line.lstrip().startswith("+s"))
    # Then the number, phase and clock gave way; the attempt is folded into the step, the error into the detail
    assert header.split() == ["+s", "event", "step", "detail"]
    assert 80 - header.index("detail") >= 20
    assert any(line.split()[:4] == ["18", "reply_applied", "charge_card", "#1"] for line in lines)
    assert any("charge_card #1     CARD_DECLINED: rejected, 1" in line for line in lines)


def test_a_dispatch_complete_by_counts_from_the_dispatch_not_from_the_start(
    ids: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a flight dispatched at +0 s with complete-by +5 s, and resent at +11 s with complete-by at +16 s
    lines = screen(ids, 120, "history", ids[0], monkeypatch=monkeypatch)
    # When its history is shown, then each dispatch says its own time budget: 5 s, both times
    dispatches = [line.split() for line in lines if " dispatched " in line]
    assert [(words[words.index("dispatched") - 1], words[-1]) for words in dispatches] == [("0", "+5s"), ("11", "+5s")]


@pytest.mark.parametrize("command", COMMANDS)
def test_wide_prints_every_column_one_line_a_row(
    ids: tuple[str, str, str], command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a terminal of 80 columns
    wid, _, message_id = ids
    # When a table command is given --wide
    lines = screen(ids, 80, *args_of(command, wid), "--wide", monkeypatch=monkeypatch)
    # Then every column of its table is there, and each row is one line holding its id and its error
    columns = {
        "get": render.STEP_COLUMNS,
        "history": render.HISTORY_COLUMNS,
        "list": render.SUMMARY_COLUMNS,
        "overdue": render.SUMMARY_COLUMNS,
        "dlq": render.DEAD_LETTER_COLUMNS,
        "definitions": render.DEFINITION_COLUMNS,
        "versions": render.VERSION_COLUMNS,
    }[command]
    headers = [col.header for col in columns]
    assert any(line.split() == " ".join(headers).split() for line in lines), "\n".join(lines)
    one_line = {
        "get": ["charge_card", "payments.charge", "CARD_DECLINED the issuer declined the card: insufficient funds"],
        "history": ["operator_action", f"retry-compensation by {ARN}: 'flights back' (id k1)"],
        "list": [wid, "2027-01-15 08:00:30Z", "PAUSED", "CARD_DECLINED at charge_card: the issuer declined"],
        "overdue": [wid, "CARD_DECLINED at charge_card: the issuer declined"],
        "dlq": [message_id, wid, "reserve_flight", "action", "512"],
        "definitions": ["trip-booking", "v3", ARN],
        "versions": ["c0ffee" * 8, "2027-01-15 08:00:00Z", ARN],
    }[command]
    assert any(all(value in line for value in one_line) for line in lines), "\n".join(lines)
    assert max(len(line) for line in lines) > 80


def test_a_terminal_too_narrow_for_any_table_gets_each_row_as_lines_with_the_id_whole() -> None:
    # Given a table whose whole columns together are wider than the terminal
    wid = str(uuid.uuid4())
    columns = [Col("workflow", "whole"), Col("status", "whole"), Col("reason", "wrap")]
    table = FitTable(columns, [{"workflow": Text(wid), "status": Text("COMPENSATION_FAILED")}])
    # When it is printed on 50 columns
    console = Console(width=50, record=True, color_system=None)
    console.print(table)
    # Then the row is printed as `column: value` lines, the id whole on its line
    assert console.export_text().splitlines() == [f"workflow: {wid}", "status: COMPENSATION_FAILED"]


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("command", COMMANDS)
def test_no_table_cuts_an_arn_in_the_middle(
    ids: tuple[str, str, str], command: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # From a clean-clone trial: the history wrapped the operator's ARN in the middle of a word
    lines = screen(ids, width, *args_of(command, ids[0]), monkeypatch=monkeypatch)
    text = "\n".join(lines)
    # Then an ARN is printed whole or not at all, and a history names the operator by role and session
    assert all(ARN in line for line in lines if "arn:" in line), text
    assert "umed-role" not in text.replace("assumed-role", "")
    if command == "history":
        assert any("retry-compensation by" in line for line in lines)
        assert any("sasflow-operator/oncall:" in line for line in lines), text


def test_a_principal_is_named_by_its_role_and_session_or_its_user() -> None:
    assert render.principal_name(ARN) == "sasflow-operator/oncall"
    assert render.principal_name("arn:aws:iam::123456789012:user/client-a") == "user/client-a"
    assert render.principal_name("local-operator") == "local-operator"


def test_the_cli_prints_words_between_colons_as_typed_never_as_emoji(capsys: pytest.CaptureFixture[str]) -> None:
    # From a new user's trial: `sasflow get 'abc:fire:1'` answered "no workflow abc🔥1" (Rich's emoji codes)
    cli_app.errors.print("error: WORKFLOW_NOT_FOUND (404): no workflow abc:fire:1")
    cli_app.console.print("wf:x:1 abc:fire:1")
    printed = capsys.readouterr()
    assert printed.err.strip() == "error: WORKFLOW_NOT_FOUND (404): no workflow abc:fire:1"
    assert printed.out.strip() == "wf:x:1 abc:fire:1"
    # and so do the tables, whose titles name a workflow id
    cli_app.console.print(render.history_table({"workflow_id": "wf:fire:1", "status": "RUNNING", "events": []}))
    assert "wf:fire:1" in capsys.readouterr().out


def test_a_start_by_a_trigger_names_the_trigger_and_the_tick_and_a_refused_tick_its_reason() -> None:
    started = {
        "kind": "started",
        "time": 0,
        "detail": {"trigger": "nightly", "occurrence": "tick 2027-01-02T01:00:00Z"},
    }
    assert render._event_detail(started) == "trigger nightly, tick 2027-01-02T01:00:00Z"
    assert render._event_detail({"kind": "started", "time": 0}) == ""
    letter = {
        "message_id": "m-1",
        "kind": "trigger.refused",
        "sent_at": 0,
        "age_seconds": 3,
        "receive_count": 1,
        "body_bytes": 90,
        "reason": "DEFINITION_NOT_REGISTERED: publish it (sasflow definitions push FILE)",
    }
    console = Console(width=200, record=True)
    console.print(
        render.dead_letters_table({"queues": [{"queue": "NightlyTriggerDeadLetterQueue", "messages": [letter]}]})
    )
    text = console.export_text()
    assert "trigger.refused" in text and "DEFINITION_NOT_REGISTERED: publish it (sasflow definitions push FILE)" in text


def test_get_says_which_trigger_started_a_workflow_and_for_which_tick() -> None:
    view = {
        "workflow_id": "w-1",
        "status": "COMPLETED",
        "definition_name": "trip-booking",
        "definition_version": 1,
        "created_at": 0,
        "updated_at": 0,
        "owner": "trigger:every-minute-trip",
        "trigger": {"name": "every-minute-trip", "occurrence": "tick 2026-12-06T08:57:26Z"},
        "input": {"traveller": "Ada Lovelace", "route": "LHR-JFK", "booked_for": "2026-12-06T08:57:26Z"},
        "steps": [],
    }
    console = Console(width=120, record=True)
    console.print(render.workflow_table(view))
    text = console.export_text()
    assert "owner: trigger:every-minute-trip" in text
    assert "started by trigger every-minute-trip: tick 2026-12-06T08:57:26Z" in text
    # the input too (found by the trial: --json only), cut short unless --wide
    assert 'input: {"traveller": "Ada Lovelace", "route": "LHR-JFK", "booked_for": "2026-12-06T08:57:26Z"}' in text
    long = {**view, "input": {"notes": "x" * 500}}
    console = Console(width=120, record=True)
    console.print(render.workflow_table(long))
    assert "… (--wide or --json: all of it)" in console.export_text()
    console = Console(width=1000, record=True)
    console.print(render.workflow_table(long, wide=True))
    assert "x" * 500 in console.export_text()


def test_triggers_list_says_who_paused_a_trigger_and_why() -> None:
    body = {
        "triggers": [
            {"name": "nightly", "kind": "schedule", "definition": "report", "source": "cron(0 2 * * ? *) Europe/Paris",
             "paused": False, "skipped": 0},
            {"name": "every-minute-trip", "kind": "schedule", "definition": "trip-booking",
             "source": "rate(1 minute) UTC", "paused": True, "paused_by": "arn:aws:iam::123456789012:user/ada",
             "paused_at": 0, "pause_reason": "migration", "skipped": 3},
            {"name": "orders", "kind": "sqs", "definition": "fulfil", "source": "queue orders, batch 10",
             "paused": True, "paused_by": "arn:aws:iam::123456789012:user/ada", "paused_at": 0,
             "pause_reason": "migration", "skipped": 0, "held": 7},
        ]
    }  # fmt: skip
    console = Console(width=160, record=True)
    console.print(render.triggers_table(body))
    lines = console.export_text().splitlines()
    [paused] = [line for line in lines if line.startswith("every-minute-trip")]
    assert paused.split()[:4] == ["every-minute-trip", "schedule", "PAUSED", "trip-booking"]
    assert "3" in paused.split() and "ada" in paused and "migration" in paused
    [active] = [line for line in lines if line.startswith("nightly")]
    assert active.split()[:3] == ["nightly", "schedule", "active"]
    [held] = [line for line in lines if line.startswith("orders")]
    assert held.split()[:2] == ["orders", "sqs"] and "7" in held.split()  # messages held while paused
    # found by the trial: at 80 columns the counts give way before who paused it
    narrow = Console(width=80, record=True)
    narrow.print(render.triggers_table(body))
    text = narrow.export_text()
    assert "ada" in text and "migration" in text
    assert [line.split()[1] for line in text.splitlines() if line.startswith(("nightly", "orders"))] == [
        "schedule",
        "sqs",
    ]  # the kind stays (found by the trial: it was not shown)


def test_triggers_list_shows_the_run_that_holds_the_slot_and_the_tick_waiting_for_it() -> None:
    body = {
        "triggers": [
            {"name": "hourly-trip", "definition": "trip-booking", "source": "rate(1 hour) UTC, overlap buffer_one",
             "paused": False, "skipped": 2, "missed": 0, "buffered": 1, "running": "wf-7",
             "waiting": "tick 2026-12-06T10:00:00Z"},
        ]
    }  # fmt: skip
    console = Console(width=200, record=True)
    console.print(render.triggers_table(body))
    [line] = [line for line in console.export_text().splitlines() if line.startswith("hourly-trip")]
    assert "wf-7 (waiting: tick 2026-12-06T10:00:00Z)" in line
    assert line.split()[-4:] == ["2", "0", "1", "0"]  # skipped, missed, buffered, held


def test_get_says_how_often_a_step_waited_for_its_agents_call_limits_beside_its_circuits_deferrals() -> None:
    # Given a hotel step deferred once by an open circuit and 3 times by its agent's call limits (found by a trial:
    # the table showed only the circuit's count, so a step waiting its turn looked like one that never waited)
    from sasflow_cli.render import workflow_table

    step = {"name": "book_hotel", "agent": "hotels", "action": "book", "status": "PROCESSING", "attempt": 1}
    view = {"workflow_id": "w", "status": "RUNNING", "steps": [{**step, "deferrals": 1, "limit_deferrals": 3}]}
    plain = {"workflow_id": "w", "status": "RUNNING", "steps": [{**step, "deferrals": 2}]}

    # When `get --wide` renders them
    def row(shown: Mapping[str, Any]) -> list[str]:
        console = Console(width=160, record=True)
        console.print(workflow_table(shown, wide=True))
        return next(line for line in console.export_text().splitlines() if line.startswith("book_hotel")).split()

    # Then the defer column gives both counts, the limits' marked, and a step without limit waits stays a number
    assert row(view)[2:7] == ["PROCESSING", "1", "0", "1+3", "lim"]
    assert row(plain)[2:6] == ["PROCESSING", "1", "0", "2"]


def test_get_names_the_tenant_whose_limit_the_workflow_counts_in() -> None:
    from sasflow_cli.render import workflow_table

    view = {"workflow_id": "w", "status": "RUNNING", "tenant": "key#acme", "steps": []}
    console = Console(width=160, record=True)
    console.print(workflow_table(view))
    assert "tenant: key#acme" in console.export_text()
    console = Console(width=160, record=True)
    console.print(workflow_table({**view, "tenant": None}))
    assert "tenant" not in console.export_text()


def test_get_gives_a_queued_workflows_ticket_and_its_place() -> None:
    from sasflow_cli.render import workflow_table

    view = {"workflow_id": "w", "status": "QUEUED", "tenant": "key#acme", "queue_ticket": 7, "queue_position": 3}
    console = Console(width=160, record=True)
    console.print(workflow_table({**view, "steps": []}))
    assert "queue ticket: 7, place 3 in its tenant's queue" in console.export_text()
    console = Console(width=160, record=True)
    console.print(workflow_table({**view, "queue_position": None, "steps": []}))
    assert "queue ticket: 7" in console.export_text() and "place" not in console.export_text()


def test_history_gives_a_queued_events_ticket_not_an_operators_action() -> None:
    from sasflow_cli import render

    queued = {"kind": "queued", "time": 0, "detail": {"ticket": 7}}
    assert render._event_detail(queued) == "ticket 7 in its tenant's queue"
    assert render._event_detail({"kind": "dequeued", "time": 3}) == ""


def test_a_batch_its_dry_run_and_what_it_touched_read_whole_at_80_columns() -> None:
    batch = {
        "batch_id": "b-0123456789abcdef0123",
        "action": "retry",
        "step": "charge_card",
        "where": {"status": "HELD", "error_code": "CARD_DECLINED"},
        "principal": ARN,
        "reason": "payments are back",
        "status": "RUNNING",
        "counts": {"matched": 75, "done": 70, "refused": 4, "failed": 1},
        "max_per_second": 50,
        "created_at": T0,
    }
    console = Console(width=80, record=True, color_system=None)
    console.print(render.batches_table([batch]))
    text = console.export_text()
    assert "b-0123456789abcdef0123" in text
    assert "retry charge_card" in text
    assert "RUNNING" in text
    assert [n for n in ("75", "70") if n in text] == ["75", "70"]
    assert "status=HELD" in text
    preview = {
        "action": "retry",
        "where": {"status": "HELD"},
        "matched": 23,
        "by_status": {"HELD": 23},
        "sample": ["wf-1", "wf-2"],
        "truncated": False,
    }
    console = Console(width=80, record=True, color_system=None)
    console.print(render.preview_lines(preview))
    assert console.export_text().splitlines() == [
        "dry run: retry would act on 23 workflow(s)",
        "  where status=HELD: 23 HELD",
        "  wf-1",
        "  wf-2",
        "  ... and 21 more",
    ]
    console = Console(width=140, record=True, color_system=None)
    console.print(render.preview_lines({**preview, "step": "book_hotel", "step_not_failed": 23}))
    assert console.export_text().splitlines()[2] == (
        "  23 of them would be refused: their step book_hotel has not failed (--where step=book_hotel finds those "
        "where it has)"
    )
    page = {
        "batch_id": "b-0123456789abcdef0123",
        "workflows": [
            {"workflow_id": "wf-1", "outcome": "done"},
            {"workflow_id": "wf-2", "outcome": "refused: workflow is RUNNING: only a step of a HELD workflow can be"},
            {"workflow_id": "wf-3", "outcome": None},
        ],
    }
    console = Console(width=80, record=True, color_system=None)
    console.print(render.batch_workflows_table(page))
    text = console.export_text()
    assert "wf-1" in text and "done" in text and "(being acted on)" in text and "refused: workflow is" in text


def test_a_batch_action_in_the_history_names_its_batch_and_the_attempt_it_replaced() -> None:
    event = {
        "kind": "operator_action",
        "time": T0,
        "detail": {
            "action": "retry",
            "principal": ARN,
            "reason": "payments are back",
            "id": "batch:b-0123456789abcdef0123:abc",
            "batch": "b-0123456789abcdef0123",
            "replaced_attempt": 3,
        },
    }
    detail = render._event_detail(event)
    assert detail == (
        "retry by sasflow-operator/oncall: 'payments are back' (batch b-0123456789abcdef0123), replacing attempt 3"
    )
