"""``sasflow``: the operators' command line (issue 11).

Nouns then verbs where there are several (``sasflow dlq list``), the same flags everywhere: ``--json`` on every
read prints the API's JSON as it came (for scripts); without it, tables (for people). Every action takes
``--reason`` (written to the workflow's history with your principal) and sends a fresh ``Idempotency-Key``, reused
on the CLI's own retries, so a retried action is applied once. An API error prints its code and message and
exits 1.

Target: ``--url URL`` (the local stack, signed as ``--as operator|client-a|client-b``) or ``--stack NAME`` (a
deployed stack: its ``ApiUrl`` output, signed with your AWS credentials); or ``SASFLOW_URL`` / ``SASFLOW_STACK``.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.live import Live

from . import render
from .client import ApiError, SasflowClient
from .targets import LOCAL_IDENTITIES, TargetError, build_client
from .timeline import timeline as build_timeline
from .timeline import write_html, write_png
from .watch import watch as watch_loop

__all__ = ["CliState", "app", "main"]

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="sasflow",
    help="Find, read, watch and act on sasflow workflows; dead-letter queues; timelines.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
dlq_app = typer.Typer(help="Dead-letter queues: depths, messages, redrive.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")
definitions_app = typer.Typer(help="Definitions registered by name and version.", no_args_is_help=True)
app.add_typer(definitions_app, name="definitions")
triggers_app = typer.Typer(help="Triggers (triggers.yaml): list, pause, resume, run now.", no_args_is_help=True)
app.add_typer(triggers_app, name="triggers")
batches_app = typer.Typer(
    help="Batches of operator actions (retry ... --where): list, get, cancel.", no_args_is_help=True
)
app.add_typer(batches_app, name="batches")

#: Ids, names and messages are printed as they are: a map child's id ``wf:fire:1`` never becomes an emoji.
console = Console(highlight=False, emoji=False)
#: The API's messages name paths like ``steps[b].input``: printed whole, as they are (never read as Rich markup).
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True, emoji=False)


@dataclass
class CliState:
    """What the commands share: the API client (built on first use from the target options) and time."""

    factory: Callable[[], SasflowClient] | None = None
    client_: SasflowClient | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], float] = time.time
    new_key: Callable[[], str] = field(default=lambda: str(uuid.uuid4()))
    #: Who signs, in words (the local identity, or the AWS credentials of a stack's caller).
    identity: str = "operator"

    @property
    def client(self) -> SasflowClient:
        if self.client_ is None:
            if self.factory is None:
                raise TargetError("no target: give --url URL or --stack NAME")
            self.client_ = self.factory()
        return self.client_


def _state(ctx: typer.Context) -> CliState:
    state = ctx.find_root().obj
    assert isinstance(state, CliState)  # nosec B101 # set by the callback (or a test) before any command
    return state


class CliUsageError(Exception):
    """What the operator gave cannot be used (a file that is not JSON, an option out of place): printed as one line
    ``error: <cause>``, exit 2."""


def _problem_lines(details: list[dict[str, Any]]) -> list[str]:
    """One indented line per problem the API named (``loc: msg``), as ``start`` and ``definitions push`` print them."""
    return [f"  {'.'.join(str(part) for part in detail.get('loc', []))}: {detail.get('msg')}" for detail in details]


def _handled(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the API's refusals and target errors into their code and message on stderr, and exit 1 (2 for what the
    operator gave, and for a missing target)."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except ApiError as error:
            errors.print(
                f"error: {error.code} ({error.status}): {error.message}"
                if error.status
                else f"error: {error.code}: {error.message}"
            )
            for line in _problem_lines(error.details):
                errors.print(line)
            raise typer.Exit(1) from None
        except (TargetError, CliUsageError) as error:
            errors.print(f"error: {error}")
            raise typer.Exit(2) from None

    return run


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _print_table(renderable: Any, wide: bool) -> None:
    """A table for people: fitted to the terminal, or with --wide as wide as it is (lines not cut at the edge)."""
    console.print(renderable, crop=not wide)


def _json_arg(value: str, what: str) -> Any:
    """A JSON value given inline, or the path of a file holding one.

    Raises
    ------
    CliUsageError
        Neither JSON nor a readable file of JSON: the message names the file, and the line and column of a syntax
        error.
    """
    path = Path(value)
    if not value.lstrip().startswith(("{", "[", '"')) and path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except RecursionError:
            raise CliUsageError(f"{what} {value}: JSON nested too deeply (the API takes 64 levels)") from None
        except json.JSONDecodeError as error:
            raise CliUsageError(
                f"{what} {value}: not JSON: line {error.lineno} column {error.colno}: {error.msg}"
            ) from None
        except (OSError, UnicodeDecodeError) as error:
            raise CliUsageError(f"{what} {value}: cannot be read: {error}") from None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise CliUsageError(
            f"{what}: neither a file nor JSON ({error.msg} at line {error.lineno} column {error.colno}): {value[:80]!r}"
        ) from None
    except RecursionError:
        raise CliUsageError(f"{what}: JSON nested too deeply (the API takes 64 levels)") from None


def _json_object(value: str, what: str) -> dict[str, Any]:
    """`_json_arg` that must be a JSON object (`CliUsageError` names what it is instead)."""
    document = _json_arg(value, what)
    if not isinstance(document, dict):
        source = f"{what} {value}" if Path(value).is_file() else what
        raise CliUsageError(f"{source}: expected a JSON object {{...}}, got {_json_type(document)}")
    return document


def _json_type(document: Any) -> str:
    names = {
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }
    return names.get(type(document), type(document).__name__)


JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of tables.")]
ReasonOption = Annotated[str, typer.Option("--reason", "-r", help="Why (written to the history with your principal).")]
StepOption = Annotated[str | None, typer.Option("--step", "-s", help="The step, when more than one applies.")]
WideOption = Annotated[
    bool, typer.Option("--wide", help="Every column, nothing wrapped: one line a row, wider than the terminal.")
]


def _a_key(value: str | None) -> str | None:
    """An Idempotency-Key typed on the command line: what the API takes, never an empty one (an unset ``$KEY``
    would otherwise start something new on every retry)."""
    if value is not None and not IDEMPOTENCY_KEY.fullmatch(value):
        raise typer.BadParameter(
            "1 to 128 characters of A-Z a-z 0-9 _ . : - (is the shell variable set?); leave the option out for a "
            "new key"
        )
    return value


#: What the API takes as an Idempotency-Key (sasflow.types.IdempotencyKey).
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
KeyOption = Annotated[
    str | None,
    typer.Option("--idempotency-key", help="Idempotency-Key to send [default: a new uuid].", callback=_a_key),
]


def _an_id(value: str) -> str:
    """An id typed on the command line: an empty one (``get ''``, an unset ``$ID``) names no workflow, and would
    be another route of the API."""
    if not value.strip():
        raise typer.BadParameter("empty: give the id a `start` or `list` printed (is the shell variable set?)")
    return value


WorkflowId = Annotated[str, typer.Argument(metavar="ID", help="The workflow's id.", callback=_an_id)]
#: An action's target: one workflow, or (without an ID) every workflow --where matches, as a batch.
TargetId = Annotated[
    str | None,
    typer.Argument(
        metavar="ID",
        help="The workflow's id; leave it out to act on every workflow --where matches (a batch).",
        callback=lambda value: None if value is None else _an_id(value),
        show_default=False,
    ),
]
#: The listing's filters, as a batch's (``POST /ops/batches``): NAME=VALUE, the option given once per filter.
WHERE_NAMES = {
    "status": str,
    "definition": str,
    "version": int,
    "error_code": str,
    "trigger": str,
    "owner": str,
    "started_after": int,
    "started_before": int,
    "step": str,
}
WhereOption = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        "-w",
        metavar="NAME=VALUE",
        help="Act on every workflow that matches (a batch), e.g. --where status=HELD --where error_code=CARD_DECLINED"
        f"; names: {', '.join(WHERE_NAMES)} (status is needed).",
    ),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="With --where: count what the batch would act on, and start nothing.")
]
RateOption = Annotated[
    int | None, typer.Option("--rate", min=1, max=500, help="With --where: workflows a second [default: 50].")
]


def _where(values: list[str]) -> dict[str, Any]:
    """The filter of ``--where NAME=VALUE`` options (a dash in a name reads as an underscore).

    Raises
    ------
    CliUsageError
        A value without ``=``, an unknown name, a name given twice, a number that is not one, or no status.
    """
    where: dict[str, Any] = {}
    for value in values:
        name, equals, given = value.partition("=")
        name = name.strip().lower().replace("-", "_")
        if not equals or not given:
            raise CliUsageError(f"--where {value!r}: give NAME=VALUE, e.g. --where status=HELD")
        if name not in WHERE_NAMES:
            raise CliUsageError(f"--where {value!r}: no filter {name!r}; the filters: {', '.join(WHERE_NAMES)}")
        if name in where:
            raise CliUsageError(f"--where {name} given twice: a batch takes one value of each filter")
        if WHERE_NAMES[name] is int:
            if not given.isdigit():
                raise CliUsageError(f"--where {value!r}: {name} is a whole number")
            where[name] = int(given)
        else:
            where[name] = given.upper() if name == "status" else given
    if "status" not in where:
        raise CliUsageError("--where needs a status (the workflows to act on: HELD to retry, RUNNING to pause, ...)")
    if where["status"] in ("COMPLETED", "COMPENSATED", "CANCELLED"):
        raise CliUsageError(
            f"--where status={where['status']}: those workflows have ended, no action applies to them; a batch acts "
            "on workflows in flight or waiting (HELD, RUNNING, PAUSED, COMPENSATION_FAILED, QUEUED, ...)"
        )
    return where


@app.callback()
def target(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", envvar="SASFLOW_URL", help="Local stack API URL [default: the make up running in this folder]."
        ),
    ] = None,
    stack: Annotated[
        str | None, typer.Option("--stack", envvar="SASFLOW_STACK", help="Deployed CloudFormation stack name.")
    ] = None,
    caller: Annotated[
        str, typer.Option("--as", help=f"Local identity that signs ({'|'.join(LOCAL_IDENTITIES)}); --url only.")
    ] = "operator",
    region: Annotated[str | None, typer.Option("--region", help="AWS region [default: the session's].")] = None,
) -> None:
    """Pick the API: --url (local stack) or --stack (deployed)."""
    if ctx.obj is None:
        ctx.obj = CliState()
    state: CliState = ctx.obj
    if state.factory is None and state.client_ is None:
        state.factory = lambda: build_client(url=url, stack=stack, caller=caller, region=region)
        state.identity = f"your AWS credentials (stack {stack})" if stack else caller


# ----------------------------------------------------------------------------------------------------- workflows
@app.command()
@_handled
def start(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="JSON file with {definition, input}.", exists=True, dir_okay=False)],
    input_: Annotated[str | None, typer.Option("--input", help="Replace the input: JSON, or a file of JSON.")] = None,
    key: KeyOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="Then watch it until it stops.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Start a workflow from a file like events/trip_booking_request.json."""
    state = _state(ctx)
    request = _json_object(str(file), "FILE")
    if "definition" not in request and "steps" in request:
        name = request.get("name", "<name>")
        raise CliUsageError(
            f"FILE {file} is a definition, not a start request ({{definition, input}}): publish it with "
            f"`sasflow --as client-a definitions push {file}`, then start it by name with a file of "
            f'{{"definition": {{"name": "{name}"}}, "input": {{...}}}}'
        )
    if input_ is not None:
        request["input"] = _json_object(input_, "--input")  # the workflow input is an object (steps read input.*)
    view = state.client.start(request, idempotency_key=key or state.new_key())
    if as_json:
        _print_json(view)
    else:
        console.print(render.workflow_table(view, now=state.now()))
    if watch:
        _watch(state, view["workflow_id"], 2.0, None, as_json)


@app.command()
@_handled
def get(ctx: typer.Context, workflow_id: WorkflowId, wide: WideOption = False, as_json: JsonOption = False) -> None:
    """A workflow and its steps (status, attempts, complete-by, times, errors, compensations)."""
    state = _state(ctx)
    view = state.client.get(workflow_id)
    if as_json:
        _print_json(view)
    else:
        _print_table(render.workflow_table(view, now=state.now(), wide=wide), wide)


def _watch(state: CliState, workflow_id: str, interval: float, timeout: float | None, as_json: bool) -> None:
    if as_json:
        result = watch_loop(
            lambda: state.client.get(workflow_id),
            lambda view, now: None,
            interval_seconds=interval,
            timeout_seconds=timeout,
            clock=state.clock,
            now=state.now,
            sleep=state.sleep,
        )
        _print_json(result.view)
    else:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            result = watch_loop(
                lambda: state.client.get(workflow_id),
                lambda view, now: live.update(render.workflow_table(view, now=now), refresh=True),
                interval_seconds=interval,
                timeout_seconds=timeout,
                clock=state.clock,
                now=state.now,
                sleep=state.sleep,
            )
        if not console.is_terminal:
            console.line()  # Live leaves its last frame without a line end in a pipe or a file
    if result.timed_out:
        errors.print(f"still {result.view.get('status')} after {timeout} s")
        raise typer.Exit(1)
    status = result.view.get("status")
    if status in NOT_COMPLETED:
        errors.print(f"{status}: {NOT_COMPLETED[status]}")
        raise typer.Exit(WATCH_NOT_COMPLETED_EXIT)


#: How ``watch`` ends without COMPLETED (exit `WATCH_NOT_COMPLETED_EXIT`), and what it means for a person.
NOT_COMPLETED = {
    "HELD": "it waits for a person (sasflow retry | skip | compensate | cancel)",
    "COMPENSATED": "it did not complete: the steps that may have happened were undone",
    "COMPENSATION_FAILED": "a compensation gave up: a person must finish it (sasflow retry-compensation | resolve)",
    "CANCELLED": "it was cancelled",
}
#: ``watch``'s exit code for a workflow that stopped without completing (1 is an error or a timeout).
WATCH_NOT_COMPLETED_EXIT = 3


@app.command()
@_handled
def watch(
    ctx: typer.Context,
    workflow_id: WorkflowId,
    interval: Annotated[float, typer.Option("--interval", "-n", min=0.2, help="Seconds between reads.")] = 2.0,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Give up after this many seconds.")] = None,
    as_json: JsonOption = False,
) -> None:
    """A live table of the workflow's steps, until it is terminal or HELD.

    Exits 0 when it COMPLETED, 3 when it stopped otherwise (HELD, COMPENSATED, COMPENSATION_FAILED, CANCELLED;
    the status is named on stderr), 1 on an error or at --timeout.
    """
    _watch(_state(ctx), workflow_id, interval, timeout, as_json)


@app.command()
@_handled
def history(
    ctx: typer.Context,
    workflow_id: WorkflowId,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=500, help="Events per page.")] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Every event of the workflow, oldest first (all pages): attempts, replies, timeouts, operator actions."""
    state = _state(ctx)
    page = state.client.history(workflow_id, limit=limit)
    if as_json:
        _print_json(page)
        return
    events = page.get("events", [])
    created = int(events[0]["time"]) if events else None
    _print_table(render.history_table(page, created_at=created, wide=wide), wide)


@app.command("list")
@_handled
def list_(
    ctx: typer.Context,
    status: Annotated[
        str | None, typer.Option("--status", help="RUNNING, HELD, PAUSED, QUEUED, COMPENSATION_FAILED, COMPLETED, ...")
    ] = None,
    in_flight: Annotated[
        bool, typer.Option("--in-flight", help="Every workflow in flight (RUNNING, COMPENSATING, CANCELLING).")
    ] = False,
    definition: Annotated[str | None, typer.Option("--definition", help="Definition name.")] = None,
    version: Annotated[int | None, typer.Option("--version", min=1, help="Definition version.")] = None,
    owner: Annotated[str | None, typer.Option("--owner", help="The principal that started it (its ARN).")] = None,
    error_code: Annotated[
        str | None, typer.Option("--error-code", help="A code of a step's last error, e.g. CARD_DECLINED.")
    ] = None,
    started_after: Annotated[int | None, typer.Option("--started-after", min=0, help="Epoch seconds.")] = None,
    started_before: Annotated[int | None, typer.Option("--started-before", min=0, help="Epoch seconds.")] = None,
    step: Annotated[
        str | None, typer.Option("--step", help="A step whose last attempt failed (action or compensation).")
    ] = None,
    trigger: Annotated[
        str | None,
        typer.Option(
            "--trigger",
            help="Only what this trigger started, newest first, in any status.",
            callback=lambda value: value if value is None else _a_trigger(value),
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=200, help="Workflows per page.")] = None,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", help="Continue a listing where its last page ended (the next_cursor it printed)."),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Follow next_cursor through every page.")] = False,
    batch: Annotated[
        str | None,
        typer.Option("--batch", help="What this batch touched, with what became of each (sasflow batches list)."),
    ] = None,
    sort: Annotated[
        str | None,
        typer.Option(
            "--sort",
            help="cost: the dearest first (of the pages read: give --all to sort every workflow listed).",
            callback=lambda value: None if value is None else _a_sort(value),
        ),
    ] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Find workflows. Without --status, --in-flight or --trigger: what waits for a person (HELD,
    COMPENSATION_FAILED, PAUSED), newest first; with counts of everything in flight or waiting. Each shows what
    its work has cost so far; --sort cost lists the dearest first."""
    if batch is not None:
        others = [
            status,
            in_flight or None,
            definition,
            version,
            owner,
            error_code,
            step,
            started_after,
            started_before,
            trigger,
            sort,
        ]
        if any(o is not None for o in others):
            raise CliUsageError("--batch lists what the batch touched: it takes --limit, --cursor and --all only")
        _list_batch(ctx, batch, limit, cursor, all_, wide, as_json)
        return
    if status is not None and in_flight:
        raise CliUsageError("give --status or --in-flight, not both")
    if trigger is not None and in_flight:
        raise CliUsageError("give --trigger (any status, or one with --status) or --in-flight, not both")
    if cursor is not None and status is None and not in_flight and trigger is None:
        raise CliUsageError("--cursor continues a listing by --status, --in-flight or --trigger: give the same one")
    client = _state(ctx).client

    def pages_of(one: str | None) -> list[dict[str, Any]]:
        return list(
            client.list_pages(
                status=one,
                definition=definition,
                started_after=started_after,
                started_before=started_before,
                trigger=trigger,
                version=version,
                owner=owner,
                error_code=error_code,
                step=step,
                limit=limit,
                cursor=cursor,
                follow=all_,
            )
        )

    if status is not None or in_flight or trigger is not None:
        pages = pages_of(status)
    else:
        pages = [_attention_page([pages_of(kind) for kind in render.ATTENTION_KINDS])]
    if sort == "cost":
        pages = _by_cost(pages)
    if as_json:
        merged = dict(pages[0])
        merged["workflows"] = [row for page in pages for row in page.get("workflows", [])]
        merged["next_cursor"] = pages[-1].get("next_cursor")
        _print_json(merged)
    else:
        _print_table(render.workflow_list_table(pages, wide=wide, sorted_by=sort), wide)
        if sort == "cost" and pages[-1].get("next_cursor"):
            errors.print("note: sorted by cost within the workflows read; --all reads and sorts every one listed")
        paused = int((pages[0].get("counts") or {}).get("PAUSED") or 0)
        if status in ("HELD", "COMPENSATION_FAILED") and paused:
            errors.print(
                f"note: {paused} paused workflow(s) are listed under --status PAUSED (a paused {status} one counts "
                "there, not here); `sasflow list` shows everything that waits for a person"
            )


def _a_sort(value: str) -> str:
    if value.strip().lower() != "cost":
        raise typer.BadParameter(f"{value!r}: the listing sorts by cost only (--sort cost)")
    return "cost"


def _by_cost(pages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pages as one, the dearest workflow first (a workflow without a tally last); the last page's cursor."""
    rows = [row for page in pages for row in page.get("workflows", [])]
    rows.sort(key=lambda row: -1.0 if row.get("cost") is None else float(row["cost"]), reverse=True)
    merged = dict(pages[0]) if pages else {}
    merged["workflows"] = rows
    merged["next_cursor"] = pages[-1].get("next_cursor") if pages else None
    return [merged]


def _attention_page(per_kind: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One page of what waits for a person, from each attention kind's pages: newest attention first; the counts
    of the first page; a cursor left only when some kind has more (--all follows them all)."""
    rows = [row for pages in per_kind for page in pages for row in page.get("workflows", [])]
    rows.sort(key=lambda row: row.get("attention_since") or 0, reverse=True)
    first = per_kind[0][0]
    notes = [note for pages in per_kind for note in pages[0].get("notes", [])]
    notes.append("without --status: what waits for a person; --in-flight lists every workflow in flight")
    more = next((pages[-1]["next_cursor"] for pages in per_kind if pages[-1].get("next_cursor")), None)
    return {
        "workflows": rows,
        "counts": first.get("counts"),
        "source": f"attention index ({', '.join(render.ATTENTION_KINDS)})",
        "notes": notes,
        "next_cursor": more,
    }


@app.command()
@_handled
def overdue(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1)] = None,
    older_than: Annotated[
        int | None, typer.Option("--older-than", min=0, help="Only what is overdue by more than SECONDS.")
    ] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """What the supervisor finds overdue now, oldest complete-by first, and the workflows that look stuck."""
    body = _state(ctx).client.overdue(limit=limit, older_than=older_than)
    if as_json:
        _print_json(body)
    else:
        _print_table(render.overdue_tables(body, wide=wide), wide)


@app.command()
@_handled
def timeline(
    ctx: typer.Context,
    workflow_id: WorkflowId,
    out: Annotated[Path, typer.Option("--out", "-o", help="FILE.png (matplotlib) or FILE.html (self-contained).")],
    as_json: JsonOption = False,
) -> None:
    """Draw the workflow's attempts as bars over time (PNG or HTML) from its history."""
    if out.suffix.lower() not in (".png", ".html", ".htm"):
        raise CliUsageError(f"--out {out}: must end in .png or .html")
    state = _state(ctx)
    view = state.client.get(workflow_id)
    page = state.client.history(workflow_id)
    line = build_timeline(page["events"], view)
    written = write_png(line, out) if out.suffix.lower() == ".png" else write_html(line, out)
    if as_json:
        _print_json(
            {
                "file": str(written),
                "bars": [
                    {
                        "step": b.step,
                        "phase": b.phase,
                        "attempt": b.attempt,
                        "start": b.start,
                        "end": b.end,
                        "outcome": b.outcome,
                        "complete_by": b.complete_by,
                        "error_code": b.error_code,
                    }
                    for b in line.bars
                ],
                "markers": [{"time": m.time, "kind": m.kind, "label": m.label} for m in line.markers],
            }
        )
    else:
        console.print(f"{len(line.bars)} bars, {len(line.markers)} markers -> {written}")


# ----------------------------------------------------------------------------------------------------- actions
def _act(
    ctx: typer.Context,
    workflow_id: str | None,
    action: str,
    reason: str,
    key: str | None,
    as_json: bool,
    *,
    where: list[str] | None = None,
    dry_run: bool = False,
    rate: int | None = None,
    **extra: Any,
) -> None:
    if where:
        if workflow_id is not None:
            raise CliUsageError("give a workflow's ID or --where (every workflow that matches), not both")
        _act_on_fleet(ctx, action, reason, key, as_json, _where(where), dry_run=dry_run, rate=rate, **extra)
        return
    if workflow_id is None:
        raise CliUsageError("give the workflow's ID, or --where NAME=VALUE to act on every workflow that matches")
    if dry_run or rate is not None:
        raise CliUsageError("--dry-run and --rate go with --where (a batch)")
    state = _state(ctx)
    view = state.client.act(workflow_id, action, reason=reason, idempotency_key=key or state.new_key(), **extra)
    if as_json:
        _print_json(view)
    else:
        console.print(f"{action}: done")
        console.print(render.workflow_table(view, now=state.now()))
        if view.get("paused") and action in _WAITS_FOR_RESUME:
            errors.print(
                f"note: the workflow is paused: what {action} starts is dispatched once you `resume` it "
                "(replies to steps in flight are still handled)"
            )


def _act_on_fleet(
    ctx: typer.Context,
    action: str,
    reason: str,
    key: str | None,
    as_json: bool,
    where: dict[str, Any],
    *,
    dry_run: bool,
    rate: int | None,
    **extra: Any,
) -> None:
    """One action on every workflow ``where`` matches: a batch (``POST /ops/batches``), or its dry run."""
    if extra.get("step_input") is not None:
        raise CliUsageError("--input acts on one workflow: a batch retries each workflow with its own input")
    state = _state(ctx)
    body = state.client.start_batch(
        action,
        where,
        reason=reason,
        idempotency_key=key or state.new_key(),
        step=extra.get("step"),
        max_per_second=rate,
        dry_run=dry_run,
        **({"output": extra["output"]} if "output" in extra else {}),
    )
    if as_json:
        _print_json(body)
    elif dry_run:
        console.print(render.preview_lines(body))
    else:
        console.print(render.batches_table([body]))
        errors.print(
            f"note: the batch runs at {body['max_per_second']} workflows a second; follow it with "
            f"`sasflow batches get {body['batch_id']}`, list what it touched with `sasflow list --batch "
            f"{body['batch_id']}`, stop it with `sasflow batches cancel {body['batch_id']} --reason WHY`"
        )


#: Actions whose effect is new dispatches, which a paused workflow holds back until it is resumed.
_WAITS_FOR_RESUME = frozenset({"cancel", "compensate", "retry", "retry-compensation"})


# ----------------------------------------------------------------------------------------------------- callbacks
def _answer(ctx: typer.Context, token: str, body: dict[str, Any], reason: str | None, as_json: bool) -> None:
    """As an operator, through ``POST /ops/callbacks/{token}`` (any workflow; audited with the reason); as a client,
    through ``POST /callbacks/{token}`` (its own workflows)."""
    state = _state(ctx)
    if state.client.routes.operator:
        if not reason:
            raise typer.BadParameter("an operator's answer needs --reason: it is written to the history with you")
        answer = "approve" if body["status"] == "succeeded" else "reject"
        result = state.client.answer_callback(
            token,
            answer,
            reason=reason,
            output=body.get("output"),
            code=(body.get("error") or {}).get("code"),
            idempotency_key=state.new_key(),
        )
    else:
        result = state.client.callback(token, body)
    if as_json:
        _print_json(result)
    else:
        console.print(
            f"{body['status']}: step {result['step']} is {result['step_status']}, "
            f"workflow {result['workflow_id']} is {result['workflow_status']}"
        )


@app.command()
@_handled
def approve(
    ctx: typer.Context,
    token: Annotated[str, typer.Argument(help="The callback step's task token (shown on the step while it waits).")],
    output: Annotated[str | None, typer.Option("--output", help="The step's output: JSON, or a file of JSON.")] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="Why: needed as an operator (written to the history).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Complete a waiting callback step (an approval): its dependents then run, with --output as its output. As an
    operator (any workflow's step, audited with --reason), or as the workflow's owner (--as a client)."""
    value = _json_arg(output, "--output") if output is not None else {"approved": True}
    _answer(ctx, token, {"status": "succeeded", "output": value}, reason, as_json)


@app.command()
@_handled
def reject(
    ctx: typer.Context,
    token: Annotated[str, typer.Argument(help="The callback step's task token.")],
    reason: ReasonOption,
    code: Annotated[str, typer.Option("--code", help="The error's code (the step's error names it).")] = "REJECTED",
    as_json: JsonOption = False,
) -> None:
    """Fail a waiting callback step (a rejection): the workflow unwinds, or holds under the hold policy. As an
    operator (any workflow's step, audited), or as the workflow's owner (--as a client)."""
    _answer(ctx, token, {"status": "failed", "error": {"code": code, "message": reason}}, reason, as_json)


@app.command()
@_handled
def cancel(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a RUNNING or HELD workflow: it compensates what may have happened."""
    _act(ctx, workflow_id, "cancel", reason, key, as_json, where=where, dry_run=dry_run, rate=rate)


@app.command()
@_handled
def retry(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    step: StepOption = None,
    input_: Annotated[str | None, typer.Option("--input", help="The step's edited input: JSON or a file.")] = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retry a HELD workflow's failed step (a new budget of attempts; optionally an edited input)."""
    step_input = _json_object(input_, "--input") if input_ is not None else None
    _act(
        ctx,
        workflow_id,
        "retry",
        reason,
        key,
        as_json,
        where=where,
        dry_run=dry_run,
        rate=rate,
        step=step,
        step_input=step_input,
    )


@app.command()
@_handled
def skip(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    step: StepOption = None,
    output: Annotated[str | None, typer.Option("--output", help="The step's output: JSON or a file.")] = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark a HELD workflow's failed step COMPLETED with --output (null allowed); the steps after it run.

    Without --output the step has none: refused (422) when a later step's reference needs it."""
    given = {"output": _json_arg(output, "--output")} if output is not None else {}
    _act(ctx, workflow_id, "skip", reason, key, as_json, where=where, dry_run=dry_run, rate=rate, step=step, **given)


@app.command()
@_handled
def compensate(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Unwind a RUNNING or HELD workflow now."""
    _act(ctx, workflow_id, "compensate", reason, key, as_json, where=where, dry_run=dry_run, rate=rate)


@app.command("retry-compensation")
@_handled
def retry_compensation(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    step: StepOption = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Try the failed compensations of a COMPENSATION_FAILED workflow again (a new budget of attempts)."""
    _act(
        ctx, workflow_id, "retry-compensation", reason, key, as_json, where=where, dry_run=dry_run, rate=rate, step=step
    )


@app.command()
@_handled
def resolve(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    step: StepOption = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark failed compensations as done by hand (you undid them yourself); the unwind ends COMPENSATED."""
    _act(ctx, workflow_id, "resolve", reason, key, as_json, where=where, dry_run=dry_run, rate=rate, step=step)


@app.command()
@_handled
def pause(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Stop new dispatches of a workflow (steps in flight finish)."""
    _act(ctx, workflow_id, "pause", reason, key, as_json, where=where, dry_run=dry_run, rate=rate)


@app.command()
@_handled
def resume(
    ctx: typer.Context,
    reason: ReasonOption,
    workflow_id: TargetId = None,
    key: KeyOption = None,
    where: WhereOption = None,
    dry_run: DryRunOption = False,
    rate: RateOption = None,
    as_json: JsonOption = False,
) -> None:
    """Let a paused workflow go on."""
    _act(ctx, workflow_id, "resume", reason, key, as_json, where=where, dry_run=dry_run, rate=rate)


# ----------------------------------------------------------------------------------------------------- batches
BatchId = Annotated[
    str, typer.Argument(metavar="BATCH", help="The batch's id (b-..., printed when it started).", callback=_an_id)
]


@batches_app.command("list")
@_handled
def batches_list(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100, help="Batches per page.")] = None,
    cursor: Annotated[str | None, typer.Option("--cursor", help="Continue where the last page ended.")] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """The batches of operator actions, newest first: what each does, to which workflows, how far it is."""
    body = _state(ctx).client.batches(limit=limit, cursor=cursor)
    if as_json:
        _print_json(body)
        return
    _print_table(render.batches_table(body.get("batches", []), wide=wide), wide)
    if body.get("next_cursor"):
        errors.print(f"note: more batches: --cursor {body['next_cursor']}")


@batches_app.command("get")
@_handled
def batches_get(ctx: typer.Context, batch_id: BatchId, wide: WideOption = False, as_json: JsonOption = False) -> None:
    """A batch: its filter, who started it and why, its progress (matched, done, refused, failed)."""
    body = _state(ctx).client.batch(batch_id)
    if as_json:
        _print_json(body)
        return
    _print_table(render.batches_table([body], wide=wide), wide)
    if body.get("cancelled_by"):
        errors.print(f"note: cancelled by {body['cancelled_by']}: {body.get('cancel_reason')!r}")
    if body["counts"]["refused"] or body["counts"]["failed"]:
        errors.print(f"note: what was refused or failed, and why: `sasflow list --batch {batch_id}`")


@batches_app.command("cancel")
@_handled
def batches_cancel(ctx: typer.Context, batch_id: BatchId, reason: ReasonOption, as_json: JsonOption = False) -> None:
    """Stop a batch: it claims no more workflows (those of the page being acted on are finished)."""
    body = _state(ctx).client.cancel_batch(batch_id, reason=reason)
    if as_json:
        _print_json(body)
    else:
        console.print(render.batches_table([body]))


def _list_batch(
    ctx: typer.Context, batch_id: str, limit: int | None, cursor: str | None, all_: bool, wide: bool, as_json: bool
) -> None:
    """``list --batch``: what the batch touched, in the order it claimed them, with what became of each."""
    client = _state(ctx).client
    pages = [client.batch_workflows(batch_id, cursor=cursor, limit=limit)]
    while all_ and pages[-1].get("next_cursor"):
        pages.append(client.batch_workflows(batch_id, cursor=pages[-1]["next_cursor"], limit=limit))
    merged = dict(pages[0])
    merged["workflows"] = [row for page in pages for row in page.get("workflows", [])]
    merged["next_cursor"] = pages[-1].get("next_cursor")
    if as_json:
        _print_json(merged)
        return
    _print_table(render.batch_workflows_table(merged, wide=wide), wide)
    if merged["next_cursor"]:
        errors.print(f"note: more: --cursor {merged['next_cursor']} (or --all)")


# ----------------------------------------------------------------------------------------------------- definitions
def definition_files(paths: list[Path]) -> list[Path]:
    """The definition files of ``paths``: each file itself, each directory's ``*.json`` (sorted)."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files


def _definition_file(file: Path) -> tuple[dict[str, Any], str, int]:
    """A definition file's document, name and version.

    Raises
    ------
    CliUsageError
        Not readable, not JSON (with the line and column), not an object, or without a name and a whole-number
        version (the cause in one line).
    """
    document = _json_object(str(file), "file")
    missing = [key for key in ("name", "version") if key not in document]
    if missing:
        raise CliUsageError(
            f"no {' and no '.join(repr(k) for k in missing)}: a definition file needs a name and a version"
        )
    name, version = document["name"], document["version"]
    if not isinstance(name, str) or not name:
        raise CliUsageError(f"'name' must be a non-empty string, not {_json_type(name)}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CliUsageError(f"'version' must be a whole number from 1, not {json.dumps(version)}")
    return document, name, version


@definitions_app.command("push")
@_handled
def definitions_push(
    ctx: typer.Context,
    paths: Annotated[
        list[Path] | None,
        typer.Argument(help="Definition files, or directories of *.json [default: definitions/].", exists=True),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Publish each definition as its name and version (a file needs both; an unchanged one is accepted again, a
    changed one under a published version is refused)."""
    state = _state(ctx)
    results: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    files = definition_files(paths or [Path("definitions")])
    if not files:
        raise CliUsageError(f"no definition files in {', '.join(str(p) for p in paths or [Path('definitions')])}")
    for file in files:  # every file is tried; the refused ones are named, and the command then exits 1
        try:
            document, name, version = _definition_file(file)
            view = state.client.publish_definition(name, version, document)
        except CliUsageError as error:
            refused.append({"file": str(file), "error": "NOT_A_DEFINITION", "message": str(error)})
            continue
        except ApiError as error:
            refused.append({"file": str(file), "error": error.code, "message": error.message, "details": error.details})
            continue
        results.append({"file": str(file), **view})
        if not as_json:
            console.print(f"{file}: {view['name']} v{view['version']} ({view['content_id'][:12]})", highlight=False)
    if as_json:
        _print_json({"published": results, "refused": refused})
    for entry in refused:
        errors.print(f"{entry['file']}: {entry['error']}: {entry['message']}")
        for line in _problem_lines(entry.get("details") or []):
            errors.print(line)
    if refused:
        raise typer.Exit(1)


@definitions_app.command("list")
@_handled
def definitions_list(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="One name: list its versions.")] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Every registered name with its latest version, or one name's versions."""
    client = _state(ctx).client
    body = client.definitions(name)
    if as_json:
        _print_json(body)
    else:
        _print_table(render.definitions_table(body, wide=wide), wide)


# ----------------------------------------------------------------------------------------------------- triggers
def _a_trigger(value: str) -> str:
    """A trigger's name typed on the command line: as in triggers.yaml."""
    if not TRIGGER_NAME.fullmatch(value):
        raise typer.BadParameter(
            "a trigger's name as in triggers.yaml: lower case letters, digits and '-' (sasflow triggers list)"
        )
    return value


#: A trigger's name (sasflow.types.TriggerName).
TRIGGER_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
TriggerArgument = Annotated[str, typer.Argument(help="The trigger (sasflow triggers list).", callback=_a_trigger)]
TriggerReasonOption = Annotated[
    str, typer.Option("--reason", "-r", help="Why (kept with a pause; logged with your principal for every action).")
]


@triggers_app.command("list")
@_handled
def triggers_list(ctx: typer.Context, wide: WideOption = False, as_json: JsonOption = False) -> None:
    """Every trigger of triggers.yaml: what it starts, what makes it tick, whether it is paused, what it skipped."""
    body = _state(ctx).client.triggers()
    if as_json:
        _print_json(body)
    else:
        _print_table(render.triggers_table(body, wide=wide), wide)


def _trigger_action(ctx: typer.Context, name: str, action: str, reason: str, key: str | None, as_json: bool) -> None:
    state = _state(ctx)
    body = state.client.trigger_action(name, action, reason=reason, idempotency_key=key or state.new_key())
    if as_json:
        _print_json(body)
    elif action == "run-now":
        console.print(f"{body['trigger']}: {body['occurrence']} sent; it starts workflow {body['workflow_id']}")
        console.print(f"  sasflow get {body['workflow_id']}", style="dim")
    else:
        _print_table(render.triggers_table({"triggers": [body]}), False)


def _trigger_command(action: str, help_text: str) -> None:
    """Register ``sasflow triggers ACTION NAME --reason R`` (pause, resume and run-now take the same options)."""

    def command(
        ctx: typer.Context,
        name: TriggerArgument,
        reason: TriggerReasonOption,
        key: KeyOption = None,
        as_json: JsonOption = False,
    ) -> None:
        _trigger_action(ctx, name, action, reason, key, as_json)

    command.__doc__ = help_text
    triggers_app.command(action)(_handled(command))


_trigger_command(
    "pause", "Pause a trigger: its ticks are skipped (and counted) until it is resumed; who and why are kept."
)
_trigger_command(
    "resume", "Resume a paused trigger: its next tick starts a workflow again (the ticks skipped meanwhile do not)."
)
_trigger_command(
    "run-now",
    "Start one occurrence now, as if the tick had come (paused or not); the same --idempotency-key starts one.",
)


# ----------------------------------------------------------------------------------------------------- dead letters
@dlq_app.command("list")
@_handled
def dlq_list(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(help="One queue: list its messages.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100)] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Every dead-letter queue's depth, or one queue's messages (what, which workflow and step, how old)."""
    body = _state(ctx).client.dead_letters(queue, limit=limit)
    if as_json:
        _print_json(body)
    else:
        _print_table(render.dead_letters_table(body, wide=wide), wide)


@dlq_app.command("redrive")
@_handled
def dlq_redrive(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="The dead-letter queue (sasflow dlq list).")],
    reason: ReasonOption,
    max_per_second: Annotated[int | None, typer.Option("--max-per-second", min=1, max=500)] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow the move until it ends.")] = True,
    interval: Annotated[float, typer.Option("--interval", "-n", min=0.2, help="Seconds between reads.")] = 2.0,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Stop following after SECONDS.")] = 600.0,
    as_json: JsonOption = False,
) -> None:
    """Move a dead-letter queue's messages back to the queues they came from, and follow the move.

    Exits 0 when the move completed, 1 when SQS reports it FAILED or CANCELLED or it is still running at --timeout.
    """
    state = _state(ctx)
    started_at = state.now()
    body = state.client.redrive(queue, reason=reason, max_per_second=max_per_second)
    if not as_json:
        console.print(f"redrive of {body['queue']} started: {body['approximate_messages']} message(s) to move back")
    task: Mapping[str, Any] | None = None
    shown = ""
    if wait:
        deadline = state.clock() + timeout
        while True:
            listing = state.client.dead_letters(queue, limit=0)["queues"][0]
            task = render.this_move(listing.get("move_tasks", []), body["task_handle"], started_at)
            line = render.move_progress(task)
            if line != shown and not as_json:
                console.print(line)
                shown = line
            if task is None or task["status"] in render.MOVE_ENDED or state.clock() >= deadline:
                break
            state.sleep(interval)
    if as_json:
        _print_json({**body, "move_task": task})
    if task is not None and task["status"] in ("FAILED", "CANCELLED"):
        errors.print(f"the move {task['status']}: {task.get('failure_reason') or 'no reason given by SQS'}")
        raise typer.Exit(1)
    if wait and task is not None and task["status"] not in render.MOVE_ENDED:
        errors.print(f"still moving after {timeout:g} s: follow it with sasflow dlq list {queue}")
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------------------------- console
@app.command("console")
@_handled
def console_command(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1 (0: any free one).")] = 0,
) -> None:
    """Serve the operators' web console on 127.0.0.1 and print its URL (with a one-run token) until Ctrl-C.

    The console signs every API call here with the target's credentials (--url/--as, --stack): the browser holds
    only a session cookie. See docs/console.md."""
    from .console import Console, ConsoleServer

    state = _state(ctx)
    client = state.client  # the target is checked before anything listens
    try:
        server = ConsoleServer(lambda bound: Console(client, state.identity, bound), port)
    except OSError as error:
        raise CliUsageError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({error.strerror})") from None
    console.print(f"sasflow console for {client.base_url}, signed as {state.identity}:")
    console.print(f"  {server.url}", soft_wrap=True)
    console.print("Open it in a browser on this machine (Ctrl-C stops the console).")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("console stopped")


def main() -> None:
    """Entry point of the ``sasflow`` console script."""
    app()
