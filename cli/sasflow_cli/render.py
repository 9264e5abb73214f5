"""Tables for people: a workflow and its steps, a history, a listing, the overdue, the dead-letter queues.

Every function takes the API's JSON (the shapes of ``api_models`` / ``ops_api`` in the layer) and returns a rich
renderable; nothing here calls the API. Times are shown in UTC, with the seconds since the workflow started where
that says more (a history).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = [
    "STATUS_STYLES",
    "clock",
    "dead_letters_table",
    "history_table",
    "overdue_tables",
    "when",
    "workflow_list_table",
    "workflow_table",
]

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


def _error(error: Any) -> Text:
    """An error cell: its code and the start of its message, as plain text (``steps[b]`` is not Rich markup)."""
    if not error:
        return Text("")
    if isinstance(error, Mapping):
        return Text(f"{error.get('code', '')} {_short(error.get('message', ''), 50)}".strip())
    return Text(_short(error))


def workflow_table(view: Mapping[str, Any], *, now: float | None = None) -> RenderableType:
    """A workflow's header line and one row per step (both phases)."""
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
    if view.get("paused"):
        notes.append("PAUSED by an operator")
    if view.get("hold_until"):
        notes.append(f"held until {when(view['hold_until'])}")
    if notes:
        lines.append(Text("  ".join(notes), style="dim"))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("step", "agent.action", "status", "att", "resends", "defer", "complete-by", "started", "finished"):
        table.add_column(column, no_wrap=True)
    table.add_column("error", overflow="fold")
    table.add_column("compensation", no_wrap=True)
    table.add_column("c.error", overflow="fold")
    for step in view.get("steps", []):
        complete_by = step.get("complete_by")
        late = ""
        if complete_by is not None and now is not None and now > complete_by:
            late = f" +{int(now - complete_by)}s late"
        compensation = Text()
        if step.get("compensation_status") or step.get("compensation_attempt"):
            compensation = Text.assemble(
                _status(step.get("compensation_status") or step.get("status")),
                f" #{step.get('compensation_attempt', 0)}",
            )
        table.add_row(
            str(step["name"]),
            f"{step.get('agent')}.{step.get('action')}" if step.get("agent") else str(step.get("type", "task")),
            _status(step.get("status")),
            str(step.get("attempt", 0)),
            str(step.get("resends", 0)),
            str(step.get("deferrals", 0)),
            (clock(complete_by) + late) if complete_by is not None else "",
            clock(step.get("started_at")),
            clock(step.get("finished_at")),
            _error(step.get("error")),
            compensation,
            _error(step.get("compensation_error")),
        )
    lines.append(table)
    for step in view.get("steps", []):
        if step.get("task_token"):
            # whole, never cut by the terminal's width: it is what `sasflow approve` takes
            lines.append(Text(f"waiting for a callback: {step['name']}  task token {step['task_token']}", style="bold"))
    return Group(*lines)


def _event_detail(event: Mapping[str, Any], created_at: int) -> str:
    parts = []
    if event.get("outcome"):
        parts.append(str(event["outcome"]))
    if event.get("calls") is not None:
        parts.append(f"{event['calls']} call(s)")
    if event.get("complete_by") is not None:
        parts.append(f"complete-by +{int(event['complete_by']) - created_at}s")
    if event.get("status"):
        parts.append(str(event["status"]))
    detail = event.get("detail")
    if detail:
        parts.append(
            f"{detail.get('action')} by {detail.get('principal')}: {detail.get('reason')!r}"
            + (f" (id {detail.get('id')})" if detail.get("id") else "")
        )
    return ", ".join(parts)


def history_table(page: Mapping[str, Any], *, created_at: int | None = None) -> RenderableType:
    """One row per event: its number, time (and seconds since the start), kind, step, phase, attempt, error."""
    events: Sequence[Mapping[str, Any]] = page.get("events", [])
    base = created_at if created_at is not None else (int(events[0]["time"]) if events else 0)
    title = f"{page.get('workflow_id')}  {page.get('status')}: {len(events)} events from {when(base)}"
    table = Table(title=title, title_justify="left")
    for column in ("#", "time", "+s", "event", "step", "phase", "att", "error"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold")
    for event in events:
        style = "bold magenta" if event.get("kind") == "operator_action" else ""
        if event.get("error_code") or event.get("outcome") in ("failed", "rejected"):
            style = style or "red"
        table.add_row(
            str(event.get("seq")),
            clock(event.get("time")),
            str(int(event["time"]) - base),
            str(event.get("kind")),
            str(event.get("step") or ""),
            str(event.get("phase") or ""),
            "" if event.get("attempt") is None else str(event["attempt"]),
            str(event.get("error_code") or ""),
            _event_detail(event, base),
            style=style,
        )
    return table


def _summaries(title: str, rows: Sequence[Mapping[str, Any]]) -> RenderableType:
    if not rows:
        return Text(f"{title} (none)")
    table = Table(title=title, title_justify="left")
    for column in (
        "workflow",
        "status",
        "definition",
        "created",
        "complete-by",
        "trouble",
        "attention",
        "since",
        "reason",
    ):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row.get("workflow_id")),
            _status(row.get("status")),
            str(row.get("definition_name") or ""),
            when(row.get("created_at")),
            when(row.get("complete_by")),
            str(row.get("trouble", 0)),
            _status(row.get("attention")),
            when(row.get("attention_since")),
            _short(row.get("reason"), 50),
        )
    return table


def workflow_list_table(pages: Sequence[Mapping[str, Any]]) -> RenderableType:
    """The workflows of every page, then the first page's counts by status, where it came from and its notes."""
    rows = [row for page in pages for row in page.get("workflows", [])]
    first = pages[0] if pages else {}
    parts: list[RenderableType] = [_summaries(f"{len(rows)} workflow(s) from the {first.get('source', '?')}", rows)]
    counts = first.get("counts")
    if counts:
        parts.append(Text("in flight or waiting: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))))
    for note in first.get("notes", []):
        parts.append(Text(f"note: {note}", style="dim"))
    if pages and pages[-1].get("next_cursor"):
        parts.append(Text("more: --all follows every page", style="dim"))
    return Group(*parts)


def overdue_tables(body: Mapping[str, Any]) -> RenderableType:
    """The overdue workflows (the supervisor's query now) and the stuck ones."""
    return Group(
        Text(
            f"now {when(body.get('now'))}, grace {body.get('grace_seconds')} s, overdue by more than "
            f"{body.get('older_than_seconds', 0)} s, oldest first; stuck from "
            f"{body.get('stuck_after')} resends+deferrals"
        ),
        _summaries(f"overdue: {len(body.get('overdue', []))}", body.get("overdue", [])),
        _summaries(f"stuck: {len(body.get('stuck', []))}", body.get("stuck", [])),
    )


def dead_letters_table(body: Mapping[str, Any]) -> RenderableType:
    """Every queue's depth; for one queue, its messages and move tasks too."""
    parts: list[RenderableType] = []
    depths = Table(title="dead-letter queues", title_justify="left")
    depths.add_column("queue")
    depths.add_column("messages", justify="right")
    for queue in body.get("queues", []):
        depths.add_row(str(queue["queue"]), str(queue.get("approximate_messages", 0)))
    parts.append(depths)
    for queue in body.get("queues", []):
        if queue.get("messages"):
            table = Table(title=f"{queue['queue']}: messages", title_justify="left")
            for column in ("message", "kind", "workflow", "step", "phase", "att", "sent", "age s", "receives", "bytes"):
                table.add_column(column, overflow="fold")
            for message in queue["messages"]:
                table.add_row(
                    str(message.get("message_id")),
                    str(message.get("kind")),
                    str(message.get("workflow_id") or ""),
                    str(message.get("step") or ""),
                    str(message.get("phase") or ""),
                    "" if message.get("attempt") is None else str(message["attempt"]),
                    when(message.get("sent_at")),
                    str(message.get("age_seconds")),
                    str(message.get("receive_count")),
                    str(message.get("body_bytes")),
                )
            parts.append(table)
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
