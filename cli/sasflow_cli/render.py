"""Tables for people: a workflow and its steps, a history, a listing, the overdue, the dead-letter queues, the
registered definitions.

Every function takes the API's JSON (the shapes of ``api_models`` / ``ops_api`` in the layer) and returns a rich
renderable; nothing here calls the API. Times are shown in UTC, with the seconds since the workflow started where
that says more (a history). Each table is a `fit.FitTable`: its ``*_COLUMNS`` say which columns stay whole (ids,
statuses, errors) and in which order the others give way on a narrow terminal; ``wide=True`` keeps them all.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from .fit import Col, FitTable

__all__ = [
    "STATUS_STYLES",
    "clock",
    "dead_letters_table",
    "definitions_table",
    "history_table",
    "overdue_tables",
    "when",
    "workflow_list_table",
    "workflow_table",
]

#: What waits for a person: the kinds of the attention index, which ``sasflow list`` and the console list first.
ATTENTION_KINDS = ("HELD", "COMPENSATION_FAILED", "PAUSED")

STATUS_STYLES = {
    "COMPLETED": "green",
    "COMPENSATED": "yellow",
    "COMPENSATION_FAILED": "bold red",
    "CANCELLED": "dim",
    "FAILED": "red",
    "HELD": "bold magenta",
    "PROCESSING": "cyan",
    "COMPENSATING": "cyan",
    "RUNNING": "cyan",
    "CANCELLING": "cyan",
    "PENDING": "dim",
    "SKIPPED": "dim",
    "QUEUED": "blue",
}


def when(epoch: Any) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SSZ``; empty for None."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def clock(epoch: Any) -> str:
    """Epoch seconds as ``HH:MM:SS`` (UTC); empty for None."""
    return "" if epoch is None else datetime.fromtimestamp(int(epoch), UTC).strftime("%H:%M:%S")


def _status(value: Any) -> Text:
    text = "" if value is None else str(value)
    return Text(text, style=STATUS_STYLES.get(text, ""))


def _short(value: Any, width: int = 60) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


#: An error's message is shown up to this many characters (``--json`` has all of it); its code always whole.
MESSAGE_CHARS = 160


def _error(error: Any) -> Text:
    """An error cell: its code and the start of its message, as plain text (``steps[b]`` is not Rich markup)."""
    if not error:
        return Text("")
    if isinstance(error, Mapping):
        return Text(f"{error.get('code', '')} {_short(error.get('message', ''), MESSAGE_CHARS)}".strip())
    return Text(_short(error, MESSAGE_CHARS))


#: The step table's columns. Step, status and error are never cut; the others give way, the first dropped first:
#: the finish and start times, the deferrals and resends, the agent's action, the complete-by, the attempt.
STEP_COLUMNS = (
    Col("step", "whole"),
    Col("agent.action", drop=5),
    Col("status", "whole"),
    Col("att", drop=7, justify="right"),
    Col("resends", drop=4, justify="right"),
    Col("defer", drop=3, justify="right"),
    Col("complete-by", drop=6),
    Col("started", drop=2),
    Col("finished", drop=1),
    Col("error", "wrap", minimum=16),
)
#: The row under a step that shows its compensation (its status, attempt, times and error).
COMPENSATION_ROW = "↳ compensation"


#: How much of a workflow's input `workflow_table` shows on its line (characters; --wide shows all of it).
INPUT_SHOWN = 200


def workflow_table(view: Mapping[str, Any], *, now: float | None = None, wide: bool = False) -> RenderableType:
    """A workflow's header line and one row per step, with a row under it for its compensation once that ran.

    Parameters
    ----------
    view
        A WorkflowView (``GET /ops/workflows/{id}``): times in epoch seconds.
    now
        Epoch seconds: a complete-by already past shows how late it is (``+84s late``).
    wide
        Every column, nothing wrapped, one line a row (see `fit.FitTable`).
    """
    header = Text.assemble(
        (f"{view['workflow_id']}  ", "bold"),
        _status(view.get("status")),
        f"  {view.get('definition_name')} v{view.get('definition_version')}",
        f"  created {when(view.get('created_at'))}  updated {when(view.get('updated_at'))}",
    )
    lines: list[RenderableType] = [header]
    notes = []
    if view.get("reason"):
        notes.append(f"reason: {view['reason']}")
    if view.get("owner"):
        notes.append(f"owner: {view['owner']}")
    if view.get("trigger"):
        notes.append(f"started by trigger {view['trigger']['name']}: {view['trigger']['occurrence']}")
    if view.get("tenant"):
        notes.append(f"tenant: {view['tenant']}")  # whose tenancy.max_running it counts in
    if view.get("queue_ticket") is not None:
        place = f", place {view['queue_position']} in its tenant's queue" if view.get("queue_position") else ""
        notes.append(f"queue ticket: {view['queue_ticket']}{place}")  # it starts in ticket order (tenancy: queue)
    if view.get("paused"):
        notes.append("PAUSED by an operator")
    if view.get("hold_until"):
        notes.append(f"held until {when(view['hold_until'])}")
    if notes:
        lines.append(Text("  ".join(notes), style="dim"))
    if "input" in view:  # found by the trial: a triggered workflow's input was shown with --json only
        shown = json.dumps(view["input"], ensure_ascii=False, separators=(", ", ": "))
        if not wide and len(shown) > INPUT_SHOWN:
            shown = shown[: INPUT_SHOWN - 1] + "… (--wide or --json: all of it)"
        lines.append(Text(f"input: {shown}", style="dim"))

    def deadline(complete_by: Any) -> str:
        if complete_by is None:
            return ""
        late = f" +{int(now - complete_by)}s late" if now is not None and now > complete_by else ""
        return clock(complete_by) + late

    rows: list[dict[str, Text]] = []
    for step in view.get("steps", []):
        compensated = bool(step.get("compensation_status") or step.get("compensation_attempt"))
        compensation_status = step.get("compensation_status") or step.get("status")
        # the step's complete-by is its phase in flight: the compensation's while that runs
        on_compensation = compensated and compensation_status == "COMPENSATING"
        rows.append(
            {
                "step": Text(str(step["name"])),
                "agent.action": Text(
                    f"{step.get('agent')}.{step.get('action')}" if step.get("agent") else str(step.get("type", "task"))
                ),
                "status": _status(step.get("status")),
                "att": Text(str(step.get("attempt", 0))),
                "resends": Text(str(step.get("resends", 0))),
                # an open circuit's deferrals, then the call limits' waits ("2+3 lim"): busy is not failing
                "defer": Text(
                    f"{step.get('deferrals', 0)}+{step['limit_deferrals']} lim"
                    if step.get("limit_deferrals")
                    else str(step.get("deferrals", 0))
                ),
                "complete-by": Text("" if on_compensation else deadline(step.get("complete_by"))),
                "started": Text(clock(step.get("started_at"))),
                "finished": Text(clock(step.get("finished_at"))),
                "error": _error(step.get("error")),
            }
        )
        if compensated:
            rows.append(
                {
                    "step": Text(COMPENSATION_ROW, style="dim"),
                    "status": _status(compensation_status),
                    "att": Text(str(step.get("compensation_attempt", 0))),
                    "complete-by": Text(deadline(step.get("complete_by")) if on_compensation else ""),
                    "started": Text(clock(step.get("compensation_started_at"))),
                    "finished": Text(clock(step.get("compensation_finished_at"))),
                    "error": _error(step.get("compensation_error")),
                }
            )
    lines.append(FitTable(STEP_COLUMNS, rows, wide=wide))
    if view.get("cost"):
        lines.append(cost_lines(view["cost"]))
    for step in view.get("steps", []):
        if step.get("task_token"):
            # whole, never cut by the terminal's width: it is what `sasflow approve` takes
            lines.append(Text(f"waiting for a callback: {step['name']}  task token {step['task_token']}", style="bold"))
    return Group(*lines)


def dollars(value: Any) -> str:
    """Dollars as a person reads a small bill: ``$0.0000132`` (three significant digits), ``$0.00`` for none."""
    amount = float(value or 0)
    if 0 < amount < 0.01:
        return f"${amount:.{2 - math.floor(math.log10(amount))}f}"
    return f"${amount:,.2f}"


def cost_lines(cost: Mapping[str, Any]) -> RenderableType:
    """A workflow's cost (a CostView): the total (and what a million such would cost) and each line that cost
    anything, with its quantity."""
    shown = [line for line in cost.get("lines", []) if line.get("dollars")]
    total = Text.assemble(
        ("cost ", "bold"),
        (dollars(cost.get("dollars")), "bold"),
        f" (${float(cost.get('dollars') or 0) * 1_000_000:,.2f} per million like it)",
    )
    rows = [
        Text(f"  {line['name']:<16} {dollars(line['dollars']):>13}  {line['quantity']}", style="dim") for line in shown
    ]
    return Group(total, *rows, Text(f"  at {cost.get('prices')} list prices", style="dim"))


def principal_name(principal: Any) -> str:
    """A principal's ARN as a person reads it in a table, short enough never to be cut in the middle: an assumed
    role's ``role/session``, a user's ``user/name``, anything else as it is. ``--wide`` and ``--json`` keep the ARN.

    >>> principal_name("arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall")
    'sasflow-operator/oncall'
    >>> principal_name("arn:aws:iam::123456789012:user/client-a")
    'user/client-a'
    """
    text = str(principal)
    parts = text.split(":", 5)
    if len(parts) == 6 and parts[0] == "arn":
        resource = parts[5]
        return resource.removeprefix("assumed-role/") if resource.startswith("assumed-role/") else resource
    return text


def _principal(principal: Any, wide: bool) -> str:
    return str(principal) if wide else principal_name(principal)


def _event_detail(event: Mapping[str, Any], *, wide: bool = False) -> str:
    """What an event says beyond its kind; a dispatch's complete-by counts from the dispatch (its time budget)."""
    parts = []
    if event.get("outcome"):
        parts.append(str(event["outcome"]))
    if event.get("calls") is not None:
        parts.append(f"{event['calls']} call(s)")
    if event.get("complete_by") is not None:
        parts.append(f"complete-by +{int(event['complete_by']) - int(event['time'])}s")
    if event.get("status"):
        parts.append(str(event["status"]))
    detail = event.get("detail")
    if detail and detail.get("trigger"):  # a start by a trigger: which, and for which occurrence
        parts.append(f"trigger {detail['trigger']}, {detail.get('occurrence')}")
    elif detail and event.get("kind") == "queued":  # its ticket in its tenant's queue (found by a trial: shown as
        parts.append(f"ticket {detail.get('ticket')} in its tenant's queue")  # an operator's action by None)
    elif detail:
        parts.append(
            f"{detail.get('action')} by "
            f"{_principal(detail.get('principal'), wide)}: {detail.get('reason')!r}"
            + (f" (id {detail.get('id')})" if detail.get("id") and not detail.get("batch") else "")
            + (f" (batch {detail['batch']})" if detail.get("batch") else "")
            + (f", replacing attempt {detail['replaced_attempt']}" if detail.get("replaced_attempt") else "")
        )
    return ", ".join(parts)


#: The history's columns: the number, the phase (its event's kind says it) and the clock time give way first;
#: then the attempt folds into the step (``reserve_flight #2``) and the error code into the detail, still whole.
HISTORY_COLUMNS = (
    Col("#", drop=1, justify="right"),
    Col("time", drop=3),
    Col("+s", "whole", justify="right"),
    Col("event", "whole"),
    Col("step", "whole"),
    Col("phase", drop=2),
    Col("att", drop=4, into="step", sep=" #"),
    Col("error", drop=5, into="detail", sep=": ", before=True),
    Col("detail", "wrap", minimum=20),
)


def history_table(page: Mapping[str, Any], *, created_at: int | None = None, wide: bool = False) -> RenderableType:
    """One row per event: its number, time (and seconds since the start), kind, step, phase, attempt, error, detail.

    Parameters
    ----------
    page
        A HistoryPage (``GET /ops/workflows/{id}/history``, every page's events): times in epoch seconds.
    created_at
        Epoch seconds that ``+s`` counts from [default: the first event's time].
    wide
        Every column, nothing wrapped, one line a row (see `fit.FitTable`).
    """
    events: Sequence[Mapping[str, Any]] = page.get("events", [])
    base = created_at if created_at is not None else (int(events[0]["time"]) if events else 0)
    title = f"{page.get('workflow_id')}  {page.get('status')}: {len(events)} events from {when(base)}"
    rows: list[dict[str, Text]] = []
    styles: list[str] = []
    for event in events:
        style = "bold magenta" if event.get("kind") == "operator_action" else ""
        if event.get("error_code") or event.get("outcome") in ("failed", "rejected"):
            style = style or "red"
        styles.append(style)
        rows.append(
            {
                "#": Text(str(event.get("seq"))),
                "time": Text(clock(event.get("time"))),
                "+s": Text(str(int(event["time"]) - base)),
                "event": Text(str(event.get("kind"))),
                "step": Text(str(event.get("step") or "")),
                "phase": Text(str(event.get("phase") or "")),
                "att": Text("" if event.get("attempt") is None else str(event["attempt"])),
                "error": Text(str(event.get("error_code") or "")),
                "detail": Text(_event_detail(event, wide=wide)),
            }
        )
    return FitTable(HISTORY_COLUMNS, rows, title=title, wide=wide, styles=styles)


#: A listing's columns: the workflow id, its status and reason are kept; its times and counts give way, and its
#: attention (HELD, PAUSED, ...) folds into the status where it says more than the status.
SUMMARY_COLUMNS = (
    Col("workflow", "whole"),
    Col("status", "whole"),
    Col("definition", drop=4),
    Col("created", drop=2),
    Col("complete-by", drop=5),
    Col("trouble", drop=3, justify="right"),
    Col("attention", drop=6, into="status", sep=" "),
    Col("since", drop=1),
    Col("cost", drop=7, justify="right"),
    Col("reason", "wrap", minimum=12),
)


def _summaries(
    title: str, rows: Sequence[Mapping[str, Any]], wide: bool, *, sorted_by: str | None = None
) -> RenderableType:
    if not rows:
        return Text(f"{title} (none)")
    cells: list[dict[str, Text]] = []
    folds: list[dict[str, Text]] = []
    for row in rows:
        attention = row.get("attention")
        cells.append(
            {
                "workflow": Text(str(row.get("workflow_id"))),
                "status": _status(row.get("status")),
                "definition": Text(str(row.get("definition_name") or "")),
                "created": Text(when(row.get("created_at"))),
                "complete-by": Text(when(row.get("complete_by"))),
                "trouble": Text(str(row.get("trouble", 0))),
                "attention": _status(attention),
                "since": Text(when(row.get("attention_since"))),
                "cost": Text(dollars(row["cost"]) if row.get("cost") is not None else ""),
                "reason": Text(_short(row.get("reason"), MESSAGE_CHARS)),
            }
        )
        # COMPENSATION_FAILED is its own attention: said once; PAUSED on a RUNNING workflow says more
        folds.append({"attention": _status(attention if attention != row.get("status") else None)})
    # the column a listing is sorted by never gives way
    columns = [dataclasses.replace(c, kind="whole") if c.header == sorted_by else c for c in SUMMARY_COLUMNS]
    return FitTable(columns, cells, title=title, wide=wide, folds=folds)


def workflow_list_table(
    pages: Sequence[Mapping[str, Any]], *, wide: bool = False, sorted_by: str | None = None
) -> RenderableType:
    """The workflows of every page, then the first page's counts by status, where it came from and its notes; the
    column ``sorted_by`` is kept at any width."""
    rows = [row for page in pages for row in page.get("workflows", [])]
    first = pages[0] if pages else {}
    parts: list[RenderableType] = [
        _summaries(f"{len(rows)} workflow(s) from the {first.get('source', '?')}", rows, wide, sorted_by=sorted_by)
    ]
    counts = first.get("counts")
    if counts:
        parts.append(Text("in flight or waiting: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))))
    costs = [float(row["cost"]) for row in rows if row.get("cost") is not None]
    if costs:
        # what an incident's workflows cost together (with --all: every one the filter finds)
        parts.append(Text(f"cost of the {len(costs)} listed with a tally: {dollars(sum(costs))}"))
    for note in first.get("notes", []):
        parts.append(Text(f"note: {note}", style="dim"))
    if pages and pages[-1].get("next_cursor"):
        parts.append(
            Text(f"more: --cursor {pages[-1]['next_cursor']} for the next page; --all follows every page", style="dim")
        )
    return Group(*parts)


def overdue_tables(body: Mapping[str, Any], *, wide: bool = False) -> RenderableType:
    """The overdue workflows (the supervisor's query now) and the stuck ones."""
    return Group(
        Text(
            f"now {when(body.get('now'))}, grace {body.get('grace_seconds')} s, overdue by more than "
            f"{body.get('older_than_seconds', 0)} s, oldest first; stuck from "
            f"{body.get('stuck_after')} resends+deferrals"
        ),
        _summaries(f"overdue: {len(body.get('overdue', []))}", body.get("overdue", []), wide),
        _summaries(f"stuck: {len(body.get('stuck', []))}", body.get("stuck", []), wide),
    )


#: A trigger's columns: its name, kind, state and what it starts are kept; the buffered count and the slot give way
#: first, then held, missed and skipped (what a person checks after a pause), who paused it last.
TRIGGER_COLUMNS = (
    Col("trigger", "whole"),
    Col("kind", "whole"),
    Col("state", "whole"),
    Col("definition", "whole"),
    Col("source", "wrap", minimum=14),
    Col("slot", drop=2),
    Col("skipped", drop=5, justify="right"),
    Col("missed", drop=4, justify="right"),
    Col("buffered", drop=1, justify="right"),
    Col("held", drop=3, justify="right"),
    Col("paused by", drop=6, into="reason", sep=": ", before=True),
    Col("reason", "wrap", minimum=12),
)


def _slot(trigger: Mapping[str, Any]) -> str:
    """Who holds a trigger's slot (overlap skip or buffer_one) and what waits for it."""
    held = str(trigger.get("running") or "")
    if trigger.get("waiting"):
        held += f" (waiting: {trigger['waiting']})"
    return held.strip()


def triggers_table(body: Mapping[str, Any], *, wide: bool = False) -> RenderableType:
    """The triggers (``GET /ops/triggers``): paused ones say by whom, since when and why."""
    rows = [
        {
            "trigger": Text(str(t["name"])),
            "kind": Text(str(t.get("kind", ""))),
            "state": Text("PAUSED", style="yellow") if t.get("paused") else Text("active", style="green"),
            "definition": Text(str(t.get("definition"))),
            "source": Text(str(t.get("source"))),
            "skipped": Text(str(t.get("skipped", 0))),
            "missed": Text(str(t.get("missed", 0))),
            "buffered": Text(str(t.get("buffered", 0))),
            "held": Text(str(t.get("held", 0))),
            "slot": Text(_slot(t)),
            "paused by": Text(
                _principal(t.get("paused_by"), wide) + f" {when(t['paused_at'])}" if t.get("paused") else ""
            ),
            "reason": Text(str(t.get("pause_reason") or "")),
        }
        for t in body.get("triggers", [])
    ]
    return FitTable(TRIGGER_COLUMNS, rows, title="triggers", wide=wide)


DEPTH_COLUMNS = (Col("queue", "whole"), Col("messages", "whole", justify="right"))
#: A dead-letter message's columns: its workflow, step, kind and age are kept; phase and attempt fold into the step.
DEAD_LETTER_COLUMNS = (
    Col("message", drop=3),
    Col("kind", "whole"),
    Col("workflow", "whole"),
    Col("step", "whole"),
    Col("phase", drop=5, into="step", sep=" "),
    Col("att", drop=6, into="step", sep=" #"),
    Col("sent", drop=1),
    Col("age s", "whole", justify="right"),
    Col("receives", drop=4, justify="right"),
    Col("bytes", drop=2, justify="right"),
    Col("reason", "wrap"),
)


def dead_letters_table(body: Mapping[str, Any], *, wide: bool = False) -> RenderableType:
    """Every queue's depth; for one queue, its messages and move tasks too."""
    depths = [
        {"queue": Text(str(q["queue"])), "messages": Text(str(q.get("approximate_messages", 0)))}
        for q in body.get("queues", [])
    ]
    parts: list[RenderableType] = [FitTable(DEPTH_COLUMNS, depths, title="dead-letter queues", wide=wide)]
    for queue in body.get("queues", []):
        if queue.get("messages"):
            rows = [
                {
                    "message": Text(str(message.get("message_id"))),
                    "kind": Text(str(message.get("kind"))),
                    "workflow": Text(str(message.get("workflow_id") or "")),
                    "step": Text(str(message.get("step") or "")),
                    "phase": Text(str(message.get("phase") or "")),
                    "att": Text("" if message.get("attempt") is None else str(message["attempt"])),
                    "sent": Text(when(message.get("sent_at"))),
                    "age s": Text(str(message.get("age_seconds"))),
                    "receives": Text(str(message.get("receive_count"))),
                    "bytes": Text(str(message.get("body_bytes"))),
                    "reason": Text(str(message.get("reason") or "")),
                }
                for message in queue["messages"]
            ]
            parts.append(FitTable(DEAD_LETTER_COLUMNS, rows, title=f"{queue['queue']}: messages", wide=wide))
        for task in queue.get("move_tasks", []):
            parts.append(Text(move_progress(task), style="dim"))
    return Group(*parts)


#: SQS message move task statuses after which nothing moves any more (ListMessageMoveTasks).
MOVE_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


def this_move(tasks: list[Mapping[str, Any]], task_handle: str, started_at: float) -> Mapping[str, Any] | None:
    """The move task a redrive started, among a queue's recent ones (newest first): the one with its handle, which
    SQS gives only while it runs; once it ended, the newest that started no earlier than the redrive (epoch
    seconds, one second of clock difference allowed)."""
    for task in tasks:
        if task.get("task_handle") == task_handle:
            return task
    return next((task for task in tasks if int(task.get("started_at") or 0) >= int(started_at) - 1), None)


def move_progress(task: Mapping[str, Any] | None) -> str:
    """One line of a message move task's progress: ``move COMPLETED: 5 of 5 moved, started 12:00:01``."""
    if task is None:
        return "move: not listed by SQS yet"
    to_move = task.get("to_move")
    total = f" of {to_move}" if to_move is not None else ""
    line = f"move {task.get('status')}: {task.get('moved', 0)}{total} moved, started {when(task.get('started_at'))}"
    if task.get("failure_reason"):
        line += f" ({task['failure_reason']})"
    return line


DEFINITION_COLUMNS = (
    Col("name", "whole"),
    Col("latest", "whole", justify="right"),
    Col("created", drop=1),
    Col("owner", "wrap", minimum=16),
)
VERSION_COLUMNS = (
    Col("version", "whole", justify="right"),
    Col("content id", "whole"),
    Col("published", drop=1),
    Col("published by", "wrap", minimum=16),
)


def definitions_table(body: Mapping[str, Any], *, wide: bool = False) -> RenderableType:
    """``GET /definitions`` (every name, its latest version and owner) or ``GET /definitions/{name}`` (its versions).

    A content id is shown by its first 12 characters (all of it with ``wide``).
    """
    if "versions" in body:
        rows = [
            {
                "version": Text(str(v["version"])),
                "content id": Text(str(v["content_id"]) if wide else str(v["content_id"])[:12]),
                "published": Text(when(v.get("created_at"))),
                "published by": Text(_principal(v.get("published_by", ""), wide)),
            }
            for v in body["versions"]
        ]
        title = f"{body.get('name')}: {len(rows)} version(s), owner {body.get('owner')}"
        return FitTable(VERSION_COLUMNS, rows, title=title, wide=wide)
    rows = [
        {
            "name": Text(str(d["name"])),
            "latest": Text(f"v{d['latest_version']}"),
            "created": Text(when(d.get("created_at"))),
            "owner": Text(_principal(d.get("owner", ""), wide)),
        }
        for d in body.get("definitions", [])
    ]
    return FitTable(DEFINITION_COLUMNS, rows, title=f"{len(rows)} definition(s)", wide=wide)


#: A batch's columns (``GET /ops/batches``): its id, action, state and progress stay; the filter wraps.
BATCH_COLUMNS = (
    Col("batch", "whole"),
    Col("action", "whole"),
    Col("state", "whole"),
    Col("matched", "whole", justify="right"),
    Col("done", "whole", justify="right"),
    Col("refused", drop=3, justify="right"),
    Col("failed", drop=4, justify="right"),
    Col("where", "wrap", minimum=14),
    Col("started", drop=2),
    Col("by", drop=1, into="where", sep=" by ", before=False),
    Col("reason", drop=5),
)

_BATCH_STYLE = {"RUNNING": "cyan", "COMPLETED": "green", "CANCELLED": "yellow"}


def where_text(where: Mapping[str, Any]) -> str:
    """A batch's filter as the CLI's ``--where`` takes it: ``status=HELD definition=trip-booking``."""
    return " ".join(f"{key}={value}" for key, value in where.items())


def batches_table(batches: Sequence[Mapping[str, Any]], *, wide: bool = False) -> RenderableType:
    """Batches of operator actions, one row each: what, which workflows, how far."""
    rows = [
        {
            "batch": Text(str(b["batch_id"])),
            "action": Text(str(b["action"]) + (f" {b['step']}" if b.get("step") else "")),
            "state": Text(str(b["status"]), style=_BATCH_STYLE.get(str(b["status"]), "")),
            "matched": Text(str(b["counts"]["matched"])),
            "done": Text(str(b["counts"]["done"])),
            "refused": Text(str(b["counts"]["refused"])),
            "failed": Text(str(b["counts"]["failed"]), style="red" if b["counts"]["failed"] else ""),
            "where": Text(where_text(b.get("where") or {})),
            "started": Text(when(b.get("created_at"))),
            "by": Text(_principal(b.get("principal"), wide)),
            "reason": Text(str(b.get("reason") or "")),
        }
        for b in batches
    ]
    return FitTable(BATCH_COLUMNS, rows, title="batches", wide=wide)


BATCH_WORKFLOW_COLUMNS = (Col("workflow", "whole"), Col("outcome", "wrap", minimum=20))


def batch_workflows_table(page: Mapping[str, Any], *, wide: bool = False) -> RenderableType:
    """What a batch touched, in the order it claimed them, and what became of each."""
    rows = [
        {
            "workflow": Text(str(w["workflow_id"])),
            "outcome": _outcome(w.get("outcome")),
        }
        for w in page.get("workflows", [])
    ]
    return FitTable(BATCH_WORKFLOW_COLUMNS, rows, title=f"batch {page.get('batch_id')}", wide=wide)


def _outcome(outcome: Any) -> Text:
    if outcome is None:
        return Text("(being acted on)", style="dim")
    kind = str(outcome).partition(":")[0]
    return Text(str(outcome), style={"done": "green", "refused": "yellow", "failed": "red"}.get(kind, ""))


def preview_lines(body: Mapping[str, Any]) -> RenderableType:
    """A dry run: how many workflows the batch would act on, by status, and the first of them."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(body.get("by_status", {}).items()))
    more = " (more match: counting stopped at 100,000)" if body.get("truncated") else ""
    lines = [
        Text(f"dry run: {body['action']} would act on {body['matched']} workflow(s){more}"),
        Text(f"  where {where_text(body.get('where') or {})}: {counts or 'none'}"),
    ]
    if body.get("step_not_failed"):
        lines.append(
            Text(
                f"  {body['step_not_failed']} of them would be refused: their step {body.get('step')} has not failed "
                f"(--where step={body.get('step')} finds those where it has)",
                style="yellow",
            )
        )
    lines += [Text(f"  {workflow_id}") for workflow_id in body.get("sample", [])]
    if body["matched"] > len(body.get("sample", [])):
        lines.append(Text(f"  ... and {body['matched'] - len(body.get('sample', []))} more", style="dim"))
    return Group(*lines)
