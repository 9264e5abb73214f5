"""EventBridge Scheduler's schedules on the local stack: each ``AWS::Scheduler::Schedule`` of the template whose
target is a queue of the stack sends its ``Input`` to that queue at every tick, as the service does.

When a schedule ticks (EventBridge Scheduler user guide, "Schedule types"): ``rate(N unit)`` every N units from the
schedule's start (its ``StartDate``, else when it was created: here, when the stack came up); ``cron(...)`` at the
times its six fields match, in the schedule's time zone; ``at(...)`` once. Ticks outside ``StartDate`` ..
``EndDate`` do not happen; a ``DISABLED`` schedule does not tick. The target's input has the tick's time in place of
``<aws.scheduler.scheduled-time>`` (ISO-8601, UTC, seconds), which is what a trigger's Idempotency-Key derives from.

The cron fields are minutes, hours, day-of-month, month (1-12 or JAN-DEC), day-of-week (1-7 or SUN-SAT) and year, with
``*``, ``?``, ``,``, ``-`` and ``/``; ``L``, ``W`` and ``#`` are valid on AWS but not emulated here (the local stack
refuses them with that said, never ticks them wrongly).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo

logger = logging.getLogger(__name__)

SCHEDULED_TIME: Final = "<aws.scheduler.scheduled-time>"
_RATE: Final = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
_AT: Final = re.compile(r"^at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)$")
_CRON: Final = re.compile(r"^cron\(([^()]+)\)$")
_UNIT_SECONDS: Final = {"minute": 60, "hour": 3600, "day": 86_400}
_MONTHS: Final = {
    m: i
    for i, m in enumerate(["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], start=1)
}
_DAYS: Final = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"], start=1)}
#: (low, high, names) of each cron field, in order.
_FIELDS: Final[tuple[tuple[int, int, dict[str, int]], ...]] = (
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (1, 12, _MONTHS),
    (1, 7, _DAYS),
    (1970, 2199, {}),
)
#: How far ahead a cron expression is searched for its next tick (days).
_HORIZON_DAYS: Final = 366 * 5


class ScheduleExpressionError(ValueError):
    """A schedule expression that EventBridge Scheduler would refuse, or that the local stack does not emulate."""


def _field(text: str, index: int) -> frozenset[int] | None:
    """The values a cron field matches; None for ``?`` (any: the other day field decides)."""
    low, high, names = _FIELDS[index]
    if text == "?":
        if index not in (2, 4):
            raise ScheduleExpressionError("'?' is only for day-of-month or day-of-week")
        return None
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ScheduleExpressionError(f"cron field {text!r}: a step must be positive")
        if body == "*":
            start, end = low, high
        else:
            first, _, last = body.partition("-")
            start = _value(first, names)
            end = _value(last, names) if last else (high if step_text else start)
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ScheduleExpressionError(f"cron field {text!r}: out of {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, names: dict[str, int]) -> int:
    upper = text.upper()
    if upper in names:
        return names[upper]
    if text.isdigit():
        return int(text)
    if any(mark in upper for mark in ("L", "W", "#")):
        raise ScheduleExpressionError(f"cron value {text!r}: L, W and # are valid on AWS but not emulated locally")
    raise ScheduleExpressionError(
        f"cron value {text!r} is not a number" + (f" nor one of {list(names)}" if names else "")
    )


@dataclass(frozen=True)
class Cron:
    """A parsed ``cron(...)`` expression."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] | None
    months: frozenset[int]
    weekdays: frozenset[int] | None
    years: frozenset[int]

    @classmethod
    def parse(cls, body: str) -> Cron:
        """Parse the six fields (``0 8 * * ? *``).

        Raises
        ------
        ScheduleExpressionError
            When a field is invalid or not emulated, or neither or both day fields are ``?``.
        """
        fields = body.split()
        if len(fields) != 6:
            raise ScheduleExpressionError(
                f"cron({body}) needs 6 fields: minutes hours day-of-month month day-of-week year"
            )
        parsed = [_field(text, index) for index, text in enumerate(fields)]
        if (parsed[2] is None) == (parsed[4] is None):
            raise ScheduleExpressionError(f"cron({body}): exactly one of day-of-month and day-of-week must be '?'")
        minutes, hours, days, months, weekdays, years = parsed
        assert minutes is not None and hours is not None and months is not None and years is not None
        return cls(minutes, hours, days, months, weekdays, years)

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months or day.year not in self.years:
            return False
        if self.days is not None:
            return day.day in self.days
        assert self.weekdays is not None
        return (day.isoweekday() % 7) + 1 in self.weekdays  # AWS: 1 is Sunday

    def next_after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (an aware time in the schedule's zone), or None within the
        horizon."""
        zone = moment.tzinfo
        start = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        day = start.date()
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        candidate = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                        if candidate >= start:
                            return candidate
            day += timedelta(days=1)
        return None


def _aware(text: str | None, zone: ZoneInfo) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=zone)


@dataclass(frozen=True)
class ScheduleTicks:
    """When a schedule ticks: its expression, time zone and start and end dates.

    ``created`` is when the schedule came to exist: a rate schedule without a start date counts from it.
    """

    expression: str
    timezone: str = "UTC"
    start_date: str | None = None
    end_date: str | None = None

    def next_after(self, moment: datetime, created: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (UTC), or None when it never ticks again.

        Raises
        ------
        ScheduleExpressionError
            When the expression is invalid or not emulated.
        """
        zone = ZoneInfo(self.timezone)
        start, end = _aware(self.start_date, zone), _aware(self.end_date, zone)
        after = max(moment, start - timedelta(microseconds=1)) if start is not None else moment
        expression = self.expression.strip()
        tick: datetime | None
        if rate := _RATE.match(expression):
            period = int(rate[1]) * _UNIT_SECONDS[rate[2].rstrip("s")]
            if period <= 0:
                raise ScheduleExpressionError(f"{expression}: the rate must be positive")
            origin = (start or created).astimezone(UTC).replace(microsecond=0)
            elapsed = (after - origin).total_seconds()
            count = max(0, int(elapsed // period) + 1) if elapsed >= 0 else 0
            tick = origin + timedelta(seconds=count * period)
        elif at := _AT.match(expression):
            once = datetime.fromisoformat(at[1]).replace(tzinfo=zone)
            tick = once if once > after else None
        elif cron := _CRON.match(expression):
            tick = Cron.parse(cron[1]).next_after(after.astimezone(zone))
        else:
            raise ScheduleExpressionError(f"unsupported schedule expression {expression!r}")
        if tick is None or (end is not None and tick > end):
            return None
        return tick.astimezone(UTC)


def scheduled_input(template: str, tick: datetime) -> str:
    """The target's input for a tick: ``template`` with the tick's time for ``<aws.scheduler.scheduled-time>``."""
    return template.replace(SCHEDULED_TIME, tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


class SchedulerEmulator:
    """Send a schedule's input to its target queue at every tick, on a thread, until stopped.

    Parameters
    ----------
    name
        The schedule's logical id (for logs).
    ticks
        When it ticks.
    send
        Sends one message body to the target queue.
    input_template
        The target's ``Input`` (``<aws.scheduler.scheduled-time>`` filled in per tick).
    now
        The wall clock (UTC), injectable for tests.
    """

    def __init__(
        self,
        name: str,
        ticks: ScheduleTicks,
        send: Callable[[str], Any],
        input_template: str,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.name = name
        self.ticks = ticks
        self.send = send
        self.input_template = input_template
        self.now = now
        self.created = now()
        ticks.next_after(self.created, self.created)  # an expression it cannot emulate fails at start, not later
        self.sent: list[datetime] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fire(self, tick: datetime) -> None:
        """Send the input of ``tick`` (what the thread does at each tick)."""
        self.send(scheduled_input(self.input_template, tick))
        self.sent.append(tick)

    def start(self) -> None:
        """Start ticking."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"scheduler-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop ticking."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        last = self.created
        while True:
            tick = self.ticks.next_after(last, self.created)
            if tick is None:
                return
            if self._stop.wait(max(0.0, (tick - self.now()).total_seconds())):
                return
            try:
                self.fire(tick)
            except Exception:  # the next tick is sent whatever this one raised (the service retries; we log)
                logger.exception("schedule %s: the tick %s was not sent", self.name, tick.isoformat())
            last = tick
