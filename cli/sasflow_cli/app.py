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
import sys
import time
import uuid
from collections.abc import Callable
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

console = Console(highlight=False)
#: The API's messages name paths like ``steps[b].input``: printed whole, as they are (never read as Rich markup).
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


@dataclass
class CliState:
    """What the commands share: the API client (built on first use from the target options) and time."""

    factory: Callable[[], SasflowClient] | None = None
    client_: SasflowClient | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], float] = time.time
    new_key: Callable[[], str] = field(default=lambda: str(uuid.uuid4()))

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


def _handled(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the API's refusals and target errors into their code and message on stderr, and exit 1."""

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
            for detail in error.details:
                errors.print(f"  {'.'.join(str(p) for p in detail.get('loc', []))}: {detail.get('msg')}")
            raise typer.Exit(1) from None
        except TargetError as error:
            errors.print(f"error: {error}")
            raise typer.Exit(2) from None

    return run


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def _json_arg(value: str, what: str) -> Any:
    """A JSON value given inline, or the path of a file holding one."""
    text = value
    if not value.lstrip().startswith(("{", "[", '"')) and Path(value).is_file():
        text = Path(value).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except ValueError:
        raise typer.BadParameter(f"{what}: neither JSON nor a file of JSON: {value[:80]!r}") from None


JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON instead of tables.")]
ReasonOption = Annotated[str, typer.Option("--reason", "-r", help="Why (written to the history with your principal).")]
StepOption = Annotated[str | None, typer.Option("--step", "-s", help="The step, when more than one applies.")]
KeyOption = Annotated[
    str | None, typer.Option("--idempotency-key", help="Idempotency-Key to send [default: a new uuid].")
]


@app.callback()
def target(
    ctx: typer.Context,
    url: Annotated[str | None, typer.Option("--url", envvar="SASFLOW_URL", help="Local stack API URL.")] = None,
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
    request = _json_arg(str(file), "FILE")
    if input_ is not None:
        request["input"] = _json_arg(input_, "--input")
    view = state.client.start(request, idempotency_key=key or state.new_key())
    if as_json:
        _print_json(view)
    else:
        console.print(render.workflow_table(view, now=state.now()))
    if watch:
        _watch(state, view["workflow_id"], 2.0, None, as_json)


@app.command()
@_handled
def get(ctx: typer.Context, workflow_id: str, as_json: JsonOption = False) -> None:
    """A workflow and its steps (status, attempts, complete-by, times, errors, compensations)."""
    state = _state(ctx)
    view = state.client.get(workflow_id)
    if as_json:
        _print_json(view)
    else:
        console.print(render.workflow_table(view, now=state.now()))


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
    if result.timed_out:
        errors.print(f"still {result.view.get('status')} after {timeout} s")
        raise typer.Exit(1)
    if result.view.get("status") == "HELD":
        errors.print("HELD: it waits for a person (sasflow retry | skip | compensate | cancel)")


@app.command()
@_handled
def watch(
    ctx: typer.Context,
    workflow_id: str,
    interval: Annotated[float, typer.Option("--interval", "-n", min=0.2, help="Seconds between reads.")] = 2.0,
    timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="Give up after this many seconds.")] = None,
    as_json: JsonOption = False,
) -> None:
    """A live table of the workflow's steps, until it is terminal or HELD."""
    _watch(_state(ctx), workflow_id, interval, timeout, as_json)


@app.command()
@_handled
def history(
    ctx: typer.Context,
    workflow_id: str,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=500, help="Events per page.")] = None,
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
    console.print(render.history_table(page, created_at=created))


@app.command("list")
@_handled
def list_(
    ctx: typer.Context,
    status: Annotated[
        str | None, typer.Option("--status", help="RUNNING, HELD, PAUSED, COMPENSATION_FAILED, ...")
    ] = None,
    definition: Annotated[str | None, typer.Option("--definition", help="Definition name.")] = None,
    started_after: Annotated[int | None, typer.Option("--started-after", min=0, help="Epoch seconds.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Workflows per page.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Follow next_cursor through every page.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Find workflows by status, definition and start (first page, or --all)."""
    pages = list(
        _state(ctx).client.list_pages(
            status=status, definition=definition, started_after=started_after, limit=limit, follow=all_
        )
    )
    if as_json:
        merged = dict(pages[0])
        merged["workflows"] = [row for page in pages for row in page.get("workflows", [])]
        merged["next_cursor"] = pages[-1].get("next_cursor")
        _print_json(merged)
    else:
        console.print(render.workflow_list_table(pages))


@app.command()
@_handled
def overdue(
    ctx: typer.Context,
    limit: Annotated[int | None, typer.Option("--limit", min=1)] = None,
    older_than: Annotated[
        int | None, typer.Option("--older-than", min=0, help="Only what is overdue by more than SECONDS.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """What the supervisor finds overdue now, oldest complete-by first, and the workflows that look stuck."""
    body = _state(ctx).client.overdue(limit=limit, older_than=older_than)
    if as_json:
        _print_json(body)
    else:
        console.print(render.overdue_tables(body))


@app.command()
@_handled
def timeline(
    ctx: typer.Context,
    workflow_id: str,
    out: Annotated[Path, typer.Option("--out", "-o", help="FILE.png (matplotlib) or FILE.html (self-contained).")],
    as_json: JsonOption = False,
) -> None:
    """Draw the workflow's attempts as bars over time (PNG or HTML) from its history."""
    if out.suffix.lower() not in (".png", ".html", ".htm"):
        raise typer.BadParameter("--out must end in .png or .html", param_hint="--out")
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
    workflow_id: str,
    action: str,
    reason: str,
    key: str | None,
    as_json: bool,
    **extra: Any,
) -> None:
    state = _state(ctx)
    view = state.client.act(workflow_id, action, reason=reason, idempotency_key=key or state.new_key(), **extra)
    if as_json:
        _print_json(view)
    else:
        console.print(f"{action}: done")
        console.print(render.workflow_table(view, now=state.now()))


# ----------------------------------------------------------------------------------------------------- callbacks
def _answer(ctx: typer.Context, token: str, body: dict[str, Any], as_json: bool) -> None:
    result = _state(ctx).client.callback(token, body)
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
    as_json: JsonOption = False,
) -> None:
    """Complete a waiting callback step (an approval): its dependents then run, with --output as its output."""
    value = _json_arg(output, "--output") if output is not None else {"approved": True}
    _answer(ctx, token, {"status": "succeeded", "output": value}, as_json)


@app.command()
@_handled
def reject(
    ctx: typer.Context,
    token: Annotated[str, typer.Argument(help="The callback step's task token.")],
    reason: ReasonOption,
    code: Annotated[str, typer.Option("--code", help="The error's code (the step's error names it).")] = "REJECTED",
    as_json: JsonOption = False,
) -> None:
    """Fail a waiting callback step (a rejection): the workflow unwinds, or holds under the hold policy."""
    _answer(ctx, token, {"status": "failed", "error": {"code": code, "message": reason}}, as_json)


@app.command()
@_handled
def cancel(
    ctx: typer.Context, workflow_id: str, reason: ReasonOption, key: KeyOption = None, as_json: JsonOption = False
) -> None:
    """Cancel a RUNNING or HELD workflow: it compensates what may have happened."""
    _act(ctx, workflow_id, "cancel", reason, key, as_json)


@app.command()
@_handled
def retry(
    ctx: typer.Context,
    workflow_id: str,
    reason: ReasonOption,
    step: StepOption = None,
    input_: Annotated[str | None, typer.Option("--input", help="The step's edited input: JSON or a file.")] = None,
    key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Retry a HELD workflow's failed step (a new budget of attempts; optionally an edited input)."""
    step_input = _json_arg(input_, "--input") if input_ is not None else None
    if step_input is not None and not isinstance(step_input, dict):
        raise typer.BadParameter("--input must be a JSON object", param_hint="--input")
    _act(ctx, workflow_id, "retry", reason, key, as_json, step=step, step_input=step_input)


@app.command()
@_handled
def skip(
    ctx: typer.Context,
    workflow_id: str,
    reason: ReasonOption,
    step: StepOption = None,
    output: Annotated[str | None, typer.Option("--output", help="The step's output: JSON or a file.")] = None,
    key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark a HELD workflow's failed step COMPLETED with --output (null allowed); the steps after it run.

    Without --output the step has none: refused (422) when a later step's reference needs it."""
    given = {"output": _json_arg(output, "--output")} if output is not None else {}
    _act(ctx, workflow_id, "skip", reason, key, as_json, step=step, **given)


@app.command()
@_handled
def compensate(
    ctx: typer.Context, workflow_id: str, reason: ReasonOption, key: KeyOption = None, as_json: JsonOption = False
) -> None:
    """Unwind a RUNNING or HELD workflow now."""
    _act(ctx, workflow_id, "compensate", reason, key, as_json)


@app.command("retry-compensation")
@_handled
def retry_compensation(
    ctx: typer.Context,
    workflow_id: str,
    reason: ReasonOption,
    step: StepOption = None,
    key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Try the failed compensations of a COMPENSATION_FAILED workflow again (a new budget of attempts)."""
    _act(ctx, workflow_id, "retry-compensation", reason, key, as_json, step=step)


@app.command()
@_handled
def resolve(
    ctx: typer.Context,
    workflow_id: str,
    reason: ReasonOption,
    step: StepOption = None,
    key: KeyOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mark failed compensations as done by hand (you undid them yourself); the unwind ends COMPENSATED."""
    _act(ctx, workflow_id, "resolve", reason, key, as_json, step=step)


@app.command()
@_handled
def pause(
    ctx: typer.Context, workflow_id: str, reason: ReasonOption, key: KeyOption = None, as_json: JsonOption = False
) -> None:
    """Stop new dispatches of a workflow (steps in flight finish)."""
    _act(ctx, workflow_id, "pause", reason, key, as_json)


@app.command()
@_handled
def resume(
    ctx: typer.Context, workflow_id: str, reason: ReasonOption, key: KeyOption = None, as_json: JsonOption = False
) -> None:
    """Let a paused workflow go on."""
    _act(ctx, workflow_id, "resume", reason, key, as_json)


# ----------------------------------------------------------------------------------------------------- definitions
def definition_files(paths: list[Path]) -> list[Path]:
    """The definition files of ``paths``: each file itself, each directory's ``*.json`` (sorted)."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files


@definitions_app.command("push")
@_handled
def definitions_push(
    ctx: typer.Context,
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Definition files, or directories of *.json [default: definitions/].")
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
        raise typer.BadParameter(f"no definition files in {', '.join(str(p) for p in paths or [Path('definitions')])}")
    for file in files:  # every file is tried; the refused ones are named, and the command then exits 1
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
            name, version = document["name"], document["version"]
            view = state.client.publish_definition(str(name), int(version), document)
        except (OSError, ValueError, KeyError, TypeError) as error:
            refused.append({"file": str(file), "error": "UNREADABLE", "message": f"{type(error).__name__}: {error}"})
            continue
        except ApiError as error:
            refused.append({"file": str(file), "error": error.code, "message": error.message})
            continue
        results.append({"file": str(file), **view})
        if not as_json:
            console.print(f"{file}: {view['name']} v{view['version']} ({view['content_id'][:12]})", highlight=False)
    if as_json:
        _print_json({"published": results, "refused": refused})
    for entry in refused:
        errors.print(f"{entry['file']}: {entry['error']}: {entry['message']}")
    if refused:
        raise typer.Exit(1)


@definitions_app.command("list")
@_handled
def definitions_list(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="One name: list its versions.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Every registered name with its latest version, or one name's versions."""
    client = _state(ctx).client
    body = client.request("GET", f"/definitions/{name}" if name else "/definitions")
    if as_json:
        _print_json(body)
    elif name:
        for version in body["versions"]:
            console.print(f"{name} v{version['version']}  {version['content_id'][:12]}  by {version['published_by']}")
    else:
        for entry in body["definitions"]:
            console.print(f"{entry['name']}  latest v{entry['latest_version']}  owner {entry['owner']}")


# ----------------------------------------------------------------------------------------------------- dead letters
@dlq_app.command("list")
@_handled
def dlq_list(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(help="One queue: list its messages.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, max=100)] = None,
    as_json: JsonOption = False,
) -> None:
    """Every dead-letter queue's depth, or one queue's messages (what, which workflow and step, how old)."""
    body = _state(ctx).client.dead_letters(queue, limit=limit)
    if as_json:
        _print_json(body)
    else:
        console.print(render.dead_letters_table(body))


@dlq_app.command("redrive")
@_handled
def dlq_redrive(
    ctx: typer.Context,
    queue: Annotated[str, typer.Argument(help="The dead-letter queue (sasflow dlq list).")],
    max_per_second: Annotated[int | None, typer.Option("--max-per-second", min=1, max=500)] = None,
    as_json: JsonOption = False,
) -> None:
    """Move a dead-letter queue's messages back to the queues they came from."""
    body = _state(ctx).client.redrive(queue, max_per_second=max_per_second)
    if as_json:
        _print_json(body)
    else:
        console.print(
            f"redrive of {body['queue']} started: {body['approximate_messages']} message(s), task {body['task_handle']}"
        )


def main() -> None:
    """Entry point of the ``sasflow`` console script."""
    app()
