"""The timeline picture of a workflow: one bar per attempt of each phase of each step, drawn from its history.

`timeline` is pure: it reads a HistoryPage's events (and the WorkflowView, for the steps' order and the time now)
and returns `Timeline`, the bars and markers. `write_png` (matplotlib, Agg backend, imported only then) and
`write_html` (a self-contained page: inline SVG and CSS, no script, no network) draw it.

How a bar is read from the history (``history.py`` in the layer writes these events):

- it starts at the attempt's dispatch (``dispatched`` / ``compensation_dispatched``), which carries its
  complete-by (marked on the bar);
- it ends at the event that settles the attempt: the reply applied (its outcome: succeeded, rejected, failed or
  deferred, with the error code and the remote calls), a timeout (``resent`` / ``timed_out``: timed out), or the
  next dispatch of the same phase (an attempt re-sent without a reply of its own);
- a request that could not be prepared (``not_prepared``) is a bar of no length, failed, with its error code;
- an attempt with no end yet is in flight, drawn up to ``now`` (the view's ``updated_at`` or the last event).

A deferred attempt (an open circuit) is dispatched again under the same number, so it has a bar per dispatch.
Operator actions are markers with who, what and why; started, unwinding, held and finished are milestones.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

__all__ = [
    "COLOURS",
    "Bar",
    "Label",
    "Layout",
    "Marker",
    "Timeline",
    "draw",
    "layout",
    "svg",
    "timeline",
    "write_html",
    "write_png",
]

#: Colour of each bar outcome (also the legend's order).
COLOURS: Final = {
    "succeeded": "#2e9d4d",
    "rejected": "#e08a1e",
    "failed": "#d0392b",
    "deferred": "#9a9a9a",
    "timed_out": "#7d3c98",
    "in_flight": "#2f7fd1",
}
_DISPATCH = {"dispatched": "action", "compensation_dispatched": "compensation"}
#: What ends an attempt with an outcome: a reply applied, a callback step's token answered, a wait step's resume.
_REPLY = {"reply_applied", "compensation_reply_applied", "callback_applied", "resumed"}
_TIMEOUT = {"resent", "compensation_resent", "timed_out", "compensation_timed_out"}
_MILESTONES = {"started", "unwinding", "held", "finished"}


@dataclass(frozen=True)
class Bar:
    """One attempt of one phase of one step. Times are epoch seconds; ``end`` is None while in flight."""

    step: str
    phase: str
    attempt: int
    start: int
    end: int | None
    outcome: str
    complete_by: int | None = None
    error_code: str | None = None
    calls: int | None = None

    @property
    def lane(self) -> str:
        """The row it is drawn on: the step, or the step's compensation."""
        return self.step if self.phase == "action" else f"{self.step} (compensation)"


@dataclass(frozen=True)
class Marker:
    """A point in time: an operator action (``kind`` operator_action, with ``label`` and ``detail``) or a milestone."""

    time: int
    kind: str
    label: str
    step: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    """What to draw: the lanes in order, the bars, the markers, and the time span (epoch seconds)."""

    workflow_id: str
    status: str
    lanes: tuple[str, ...]
    bars: tuple[Bar, ...]
    markers: tuple[Marker, ...]
    start: int
    now: int


@dataclass
class _Open:
    step: str
    phase: str
    attempt: int
    start: int
    complete_by: int | None


def timeline(events: Sequence[Mapping[str, Any]], view: Mapping[str, Any]) -> Timeline:
    """The bars and markers of a workflow (see the module docstring for the rules).

    Parameters
    ----------
    events
        A HistoryPage's ``events`` (every page's, oldest first).
    view
        The WorkflowView: its ``steps`` give the lanes' order, ``created_at`` / ``updated_at`` the span.

    Returns
    -------
    Timeline
        Bars in the order their attempts were dispatched.
    """
    bars: list[tuple[int, Bar]] = []  # (seq of the dispatch, bar): sorted by dispatch at the end
    markers: list[Marker] = []
    open_: dict[tuple[str, str], tuple[int, _Open]] = {}

    def close(key: tuple[str, str], end: int, outcome: str, error_code: str | None, calls: int | None) -> None:
        seq, attempt = open_.pop(key)
        bar = Bar(
            attempt.step,
            attempt.phase,
            attempt.attempt,
            attempt.start,
            end,
            outcome,
            attempt.complete_by,
            error_code,
            calls,
        )
        bars.append((seq, bar))

    for event in events:
        kind = str(event["kind"])
        time = int(event["time"])
        step = event.get("step")
        phase = str(event.get("phase") or "action")
        if kind in _DISPATCH and step is not None:
            key = (step, _DISPATCH[kind])
            if key in open_:  # dispatched again without a reply: the earlier attempt ends here
                close(key, time, "timed_out", None, None)
            open_[key] = (
                int(event["seq"]),
                _Open(step, key[1], int(event.get("attempt") or 0), time, _int(event.get("complete_by"))),
            )
        elif kind in _REPLY and step is not None and (step, phase) in open_:
            outcome = "succeeded" if kind == "resumed" else str(event.get("outcome") or "failed")
            close((step, phase), time, outcome, event.get("error_code"), event.get("calls"))
        elif kind in _TIMEOUT and step is not None and (step, phase) in open_:
            close((step, phase), time, "timed_out", None, None)
        elif kind == "not_prepared" and step is not None:
            seq = int(event["seq"])
            bars.append((seq, Bar(step, phase, 0, time, time, "failed", None, event.get("error_code"), 0)))
        elif kind == "operator_action":
            detail = dict(event.get("detail") or {})
            label = f"{detail.get('action', 'action')} by {detail.get('principal', '?')}: {detail.get('reason', '')}"
            markers.append(Marker(time, kind, label, step, detail))
        elif kind in _MILESTONES:
            label = kind if kind != "finished" else f"finished {event.get('status') or ''}".strip()
            if event.get("error_code"):
                label += f" ({event['error_code']})"
            markers.append(Marker(time, kind, label))
    for key in list(open_):
        seq, attempt = open_.pop(key)
        bars.append(
            (
                seq,
                Bar(
                    attempt.step, attempt.phase, attempt.attempt, attempt.start, None, "in_flight", attempt.complete_by
                ),
            )
        )
    ordered = tuple(bar for _, bar in sorted(bars, key=lambda pair: pair[0]))
    times = [int(e["time"]) for e in events]
    created = int(view.get("created_at") or (min(times) if times else 0))
    now = max([int(view.get("updated_at") or created), *times, created])
    return Timeline(
        workflow_id=str(view.get("workflow_id", "")),
        status=str(view.get("status", "")),
        lanes=_lanes(view, ordered),
        bars=ordered,
        markers=tuple(markers),
        start=created,
        now=now,
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _lanes(view: Mapping[str, Any], bars: Iterable[Bar]) -> tuple[str, ...]:
    used = {bar.lane for bar in bars}
    lanes: list[str] = []
    names = [str(step["name"]) for step in view.get("steps", [])]
    names += sorted({bar.step for bar in bars} - set(names))
    for name in names:
        lanes.append(name)  # a step never dispatched still has its row (empty): the picture shows it did not run
        if f"{name} (compensation)" in used:
            lanes.append(f"{name} (compensation)")
    return tuple(lanes)


#: How far past the last event a complete-by may lie and still stretch the x-axis, as a share of the workflow's
#: time so far. A farther one (a day-long callback, a wait) is written at the axis' right edge with its value:
#: stretched to it, a minute of attempts would be a sliver at the left.
HEADROOM = 0.5
#: ... and always this many seconds past it: a young workflow's first deadline is on the axis.
REACH_SECONDS = 30
#: The PNG is this wide (11 in at 100 dpi).
PNG_WIDTH_PX = 1100
#: One character of a 7 pt label, in pixels: DejaVu Sans' capitals and digits are at most this wide, so a label's
#: extent is known before it is drawn (and two labels never share a place).
CHAR_PX = 6.5
#: One character of a lane's name (8 pt), in pixels.
LANE_CHAR_PX = 7.0
#: A label of an operator action is cut to this many characters (the HTML page's list has all of it).
LABEL_CHARS = 70


@dataclass(frozen=True)
class Label:
    """A marker's label: where its line is and the extent it takes, in seconds since the start, and its level
    (0 just above the lanes, then upwards: labels that would overlap go to different levels)."""

    text: str
    kind: str
    x: float
    left: float
    right: float
    level: int

    @property
    def leftwards(self) -> bool:
        """Written leftwards of its line (a label near the right edge)."""
        return self.right <= self.x


@dataclass(frozen=True)
class Layout:
    """Where things go on the PNG: the x-axis (seconds since the start), the labels, the plot's place in pixels."""

    end: float
    beyond: tuple[Bar, ...]
    labels: tuple[Label, ...]
    attempt_labels: frozenset[int]
    left_px: float
    plot_px: float

    @property
    def xlim(self) -> tuple[float, float]:
        """The x-axis' limits: a little room either side of 0 .. `end`."""
        return -self.end * 0.02, self.end * 1.05

    @property
    def levels(self) -> int:
        """Rows of labels above the lanes."""
        return max((label.level for label in self.labels), default=-1) + 1


def _axis_end(line: Timeline) -> tuple[float, tuple[Bar, ...]]:
    """Seconds from the start to the axis' end, and the bars whose complete-by lies beyond it (see `HEADROOM` and
    `REACH_SECONDS`)."""
    activity = float(max(1, line.now - line.start))
    reach = max(activity * (1 + HEADROOM), activity + REACH_SECONDS)
    near = [bar.complete_by - line.start for bar in line.bars if bar.complete_by is not None]
    end = max([activity, *(c for c in near if c <= reach)])
    beyond = tuple(bar for bar in line.bars if bar.complete_by is not None and bar.complete_by - line.start > end)
    return end, beyond


def layout(line: Timeline, *, width_px: int = PNG_WIDTH_PX) -> Layout:
    """Where the PNG puts its axis, marker labels and attempt numbers (pure: no matplotlib).

    Parameters
    ----------
    line
        The timeline.
    width_px
        The picture's width in pixels.

    Returns
    -------
    Layout
        The x-axis ends at the workflow's last event, or at a complete-by within reach of it (`HEADROOM`,
        `REACH_SECONDS`); the marker labels
        (operator actions and milestones, in time order) each take the lowest level where they overlap no other;
        an attempt's number is written only on a bar wide enough for it, clear of the previous one in its lane.
    """
    end, beyond = _axis_end(line)
    left_px = 24 + LANE_CHAR_PX * max((len(lane) for lane in line.lanes), default=10)
    plot_px = width_px - left_px - 24
    low, high = -end * 0.02, end * 1.05
    seconds_per_px = (high - low) / plot_px
    markers = sorted(line.markers, key=lambda m: m.time)
    texts = [_short_label(marker) for marker in markers]
    spans = _stack(
        [
            (float(m.time - line.start), (len(t) + 2) * CHAR_PX * seconds_per_px)
            for m, t in zip(markers, texts, strict=True)
        ],
        high,
    )
    labels = [
        Label(text, marker.kind, float(marker.time - line.start), left, right, level)
        for marker, text, (left, right, level) in zip(markers, texts, spans, strict=True)
    ]
    attempt_labels: set[int] = set()
    lane_edge: dict[str, float] = {}
    for index, bar in enumerate(line.bars):
        start = bar.start - line.start
        finish = (bar.end if bar.end is not None else line.now) - line.start
        needed = (len(str(bar.attempt)) + 1) * CHAR_PX * seconds_per_px
        if finish - start >= needed and start >= lane_edge.get(bar.lane, low):
            attempt_labels.add(index)
            lane_edge[bar.lane] = start + needed
    return Layout(end, beyond, tuple(labels), frozenset(attempt_labels), left_px, plot_px)


def _stack(items: Sequence[tuple[float, float]], high: float) -> list[tuple[float, float, int]]:
    """Place labels of ``(x, width)``, in order: each right of its x (left of it if it would pass ``high``), on the
    lowest level where it overlaps no label placed before. Returns ``(left, right, level)`` for each."""
    placed: list[tuple[float, float, int]] = []
    for x, width in items:
        left, right = (x, x + width) if x + width <= high else (x - width, x)
        level = 0
        while any(lv == level and lo < right and left < hi for lo, hi, lv in placed):
            level += 1
        placed.append((left, right, level))
    return placed


def _short_label(marker: Marker) -> str:
    """A marker's label for the PNG: an operator action names its principal by its last two path parts (an assumed
    role's name and session: ``sasflow-operator/alice``, the person), and is cut to `LABEL_CHARS`."""
    if marker.kind != "operator_action":
        return marker.label
    principal = str(marker.detail.get("principal", "?"))
    if principal.startswith("arn:"):
        principal = "/".join(principal.rsplit(":", 1)[-1].split("/")[-2:])
    text = f"{marker.detail.get('action', 'action')} by {principal}: {marker.detail.get('reason', '')}"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def _seconds(value: float) -> str:
    """A duration for a label: seconds, minutes or hours."""
    if value >= 7200:
        return f"{value / 3600:.1f} h"
    if value >= 600:
        return f"{value / 60:.0f} min"
    return f"{value:.0f} s"


def _title(line: Timeline) -> str:
    started = datetime.fromtimestamp(line.start, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return f"{line.workflow_id}  {line.status}  (started {started}, seconds from its start)"


# ---------------------------------------------------------------------------------------------------- PNG
#: Inches of a lane, of a level of labels, and of the title, the x-axis' ticks and name, and the legend.
_LANE_IN, _LEVEL_UNITS, _TOP_IN, _BOTTOM_IN = 0.45, 0.5, 0.35, 0.95


def draw(line: Timeline) -> Any:
    """The PNG's matplotlib Figure (Agg backend: no display needed); `write_png` saves and closes it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.patches import Patch

    lanes = list(line.lanes) or ["(no steps)"]
    placed = layout(line)
    top = 0.6 + placed.levels * _LEVEL_UNITS  # lane units above lane 0: the labels' band
    bottom = len(lanes) - 0.4
    axes_in = _LANE_IN * (bottom + top)
    height = axes_in + _TOP_IN + _BOTTOM_IN
    figure, axes = pyplot.subplots(figsize=(PNG_WIDTH_PX / 100, height), dpi=100)
    # fixed margins (no tight_layout): the plot's width in pixels is the one `layout` placed the labels for
    figure.subplots_adjust(
        left=placed.left_px / PNG_WIDTH_PX,
        right=1 - 24 / PNG_WIDTH_PX,
        top=1 - _TOP_IN / height,
        bottom=_BOTTOM_IN / height,
    )
    row = {lane: index for index, lane in enumerate(lanes)}
    low, high = placed.xlim
    minimum = (high - low) / 300  # a bar of 0 s (one second's resolution) stays visible
    for index, bar in enumerate(line.bars):
        y = row[bar.lane]
        left = bar.start - line.start
        end = (bar.end if bar.end is not None else line.now) - line.start
        axes.barh(
            y,
            max(end - left, minimum),
            left=left,
            height=0.6,
            color=COLOURS[bar.outcome],
            edgecolor="black",
            linewidth=0.4,
        )
        if index in placed.attempt_labels:
            axes.text(left, y, f" {bar.attempt}", va="center", ha="left", fontsize=7, color="white")
        if bar.complete_by is not None and bar not in placed.beyond:
            axes.plot([bar.complete_by - line.start] * 2, [y - 0.38, y + 0.38], color="black", linewidth=1.2)
    for lane in sorted({row[bar.lane] for bar in placed.beyond}):
        # the latest complete-by of the lane beyond the axis, written at its right edge
        far = max(bar.complete_by or 0 for bar in placed.beyond if row[bar.lane] == lane) - line.start
        axes.text(high, lane - 0.32, f"complete-by +{_seconds(far)} →", fontsize=7, ha="right", va="bottom")
    for label in placed.labels:
        operator = label.kind == "operator_action"
        colour = "#c2185b" if operator else "#555555"
        axes.axvline(label.x, color="#c2185b" if operator else "#bbbbbb", linestyle="--" if operator else ":", lw=0.9)
        axes.text(
            label.x,
            -0.6 - label.level * _LEVEL_UNITS,
            f" {label.text} ",
            fontsize=7,
            color=colour,
            va="bottom",
            ha="right" if label.leftwards else "left",
        )
    axes.set_yticks(range(len(lanes)), lanes, fontsize=8)
    axes.set_ylim(bottom, -top)
    axes.set_xlim(low, high)
    axes.set_xlabel("seconds since the workflow started")
    axes.set_title(_title(line), fontsize=9, loc="left")
    handles = [Patch(color=colour, label=name.replace("_", " ")) for name, colour in COLOURS.items()]
    handles.append(Patch(color="black", label="| complete-by"))
    figure.legend(handles=handles, fontsize=7, loc="lower center", ncol=7, frameon=False)
    axes.grid(axis="x", color="#eeeeee")
    return figure


def write_png(line: Timeline, path: Path) -> Path:
    """Draw ``line`` as a PNG at ``path`` with matplotlib (see `layout` for where things go). Returns the path."""
    figure = draw(line)
    from matplotlib import pyplot

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    finally:
        pyplot.close(figure)
    return path


# ---------------------------------------------------------------------------------------------------- HTML
_CSS = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 15px; font-weight: 600; }
svg text { font: 11px system-ui, sans-serif; }
.lane { fill: #333; } .grid { stroke: #eee; } .ms { stroke: #bbb; stroke-dasharray: 2 3; }
.op { stroke: #c2185b; stroke-dasharray: 5 3; } .optext { fill: #c2185b; } .cb { stroke: #000; stroke-width: 2; }
.bar { stroke: #000; stroke-width: 0.4; } .legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }
table { border-collapse: collapse; margin-top: 12px; } td, th { padding: 2px 8px; border-bottom: 1px solid #eee; }
"""


def svg(line: Timeline) -> str:
    """``line`` as one SVG element (bars coloured by outcome, complete-bys, markers; every text escaped): the page of
    `write_html` and the console's workflow page draw the same picture."""
    esc = html.escape
    lanes = list(line.lanes) or ["(no steps)"]
    label_width, plot_width, row_height = 260, 760, 26
    end, beyond = _axis_end(line)
    span = end * 1.05

    def x(time: float) -> float:
        return label_width + plot_width * (time - line.start) / span

    # operator actions' labels, 11 px type taken as 7 px a character, stacked 14 px apart where they would overlap
    operator = sorted((m for m in line.markers if m.kind == "operator_action"), key=lambda m: m.time)
    action_texts = [_short_label(m) for m in operator]
    stacked = _stack(
        [(x(m.time) + 3, 7.0 * len(t)) for m, t in zip(operator, action_texts, strict=True)], label_width + plot_width
    )
    top = 40 + 14 * max(0, max((level for _, _, level in stacked), default=0))
    height = top + row_height * len(lanes) + 30

    full_width = label_width + plot_width + 20
    parts = [f'<svg width="{full_width}" height="{height}" viewBox="0 0 {full_width} {height}" role="img">']
    for second in _ticks(span):
        parts.append(
            f'<line class="grid" x1="{x(line.start + second):.1f}" y1="{top - 6}" '
            f'x2="{x(line.start + second):.1f}" y2="{height - 24}"/>'
        )
        parts.append(f'<text x="{x(line.start + second):.1f}" y="{height - 10}" text-anchor="middle">{second}s</text>')
    row = {lane: index for index, lane in enumerate(lanes)}
    for lane, index in row.items():
        parts.append(f'<text class="lane" x="4" y="{top + row_height * index + 16}">{esc(lane)}</text>')
    for bar in line.bars:
        y = top + row_height * row[bar.lane] + 4
        left = x(bar.start)
        width = max(3.0, x(bar.end if bar.end is not None else line.now) - left)
        tip = f"{bar.step} {bar.phase} attempt {bar.attempt}: {bar.outcome.replace('_', ' ')}"
        if bar.error_code:
            tip += f" {bar.error_code}"
        if bar.calls is not None:
            tip += f", {bar.calls} call(s)"
        parts.append(
            f'<rect class="bar" x="{left:.1f}" y="{y}" width="{width:.1f}" height="{row_height - 8}" '
            f'fill="{COLOURS[bar.outcome]}"><title>{esc(tip)}</title></rect>'
        )
        if bar.complete_by is not None and bar in beyond:
            if bar is not max((b for b in beyond if b.lane == bar.lane), key=lambda b: b.complete_by or 0):
                continue  # one note a lane: its latest complete-by
            parts.append(
                f'<text x="{label_width + plot_width:.1f}" y="{y + 10}" text-anchor="end">'
                f"complete-by +{_seconds(bar.complete_by - line.start)} →</text>"
            )
        elif bar.complete_by is not None:
            cx = x(bar.complete_by)
            parts.append(
                f'<line class="cb" x1="{cx:.1f}" y1="{y - 2}" x2="{cx:.1f}" y2="{y + row_height - 6}">'
                f"<title>complete-by of attempt {bar.attempt}</title></line>"
            )
    for marker in line.markers:
        mx = x(marker.time)
        css = "op" if marker.kind == "operator_action" else "ms"
        parts.append(
            f'<line class="{css}" x1="{mx:.1f}" y1="{top - 14}" x2="{mx:.1f}" y2="{height - 24}">'
            f"<title>{esc(marker.label)}</title></line>"
        )
    for text, (left, _, level) in zip(action_texts, stacked, strict=True):
        parts.append(f'<text class="optext" x="{left:.1f}" y="{top - 18 - 14 * level}">{esc(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_html(line: Timeline, path: Path) -> Path:
    """Write ``line`` as one self-contained HTML page (inline SVG and CSS; no script, no link). Returns the path."""
    esc = html.escape
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{esc(name.replace("_", " "))}</span>'
        for name, colour in COLOURS.items()
    )

    def offset(time: int | None) -> str:
        return "" if time is None else f"{time - line.start}s"

    rows = "".join(
        f"<tr><td>{esc(bar.lane)}</td><td>{bar.attempt}</td><td>{offset(bar.start)}</td><td>{offset(bar.end)}</td>"
        f"<td>{esc(bar.outcome)}</td><td>{esc(bar.error_code or '')}</td><td>{offset(bar.complete_by)}</td></tr>"
        for bar in line.bars
    )
    actions = "".join(
        f"<li>{m.time - line.start}s: {esc(m.label)}</li>" for m in line.markers if m.kind == "operator_action"
    )
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{esc(line.workflow_id)} timeline</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(_title(line))}</h1><div class='legend'>{legend}<span>| complete-by</span></div>"
        + svg(line)
        + "<table><tr><th>lane</th><th>attempt</th><th>start</th><th>end</th><th>outcome</th><th>error</th>"
        f"<th>complete-by</th></tr>{rows}</table>"
        + (f"<h2>operator actions</h2><ul>{actions}</ul>" if actions else "")
        + "</body></html>"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def _ticks(span: float) -> list[int]:
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 86_400) if span / s <= 12)
    return list(range(0, int(span) + 1, step))
