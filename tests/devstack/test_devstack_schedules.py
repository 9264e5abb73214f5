"""devstack.schedules: EventBridge Scheduler's ticks on the local stack (rate, cron in a time zone, at, start and end
dates) and the emulator that sends each tick's input to the target queue."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest

from devstack.schedules import ScheduleExpressionError, SchedulerEmulator, ScheduleTicks, scheduled_input

CREATED = datetime(2026, 12, 6, 9, 0, 30, tzinfo=UTC)


def ticks(ticks_: ScheduleTicks, after: datetime, count: int) -> list[str]:
    found = []
    for _ in range(count):
        nxt = ticks_.next_after(after, CREATED)
        if nxt is None:
            break
        found.append(nxt.strftime("%Y-%m-%dT%H:%M:%SZ"))
        after = nxt
    return found


def test_a_rate_ticks_every_period_from_its_creation_or_its_start_date() -> None:
    assert ticks(ScheduleTicks("rate(1 minute)"), CREATED, 3) == [
        "2026-12-06T09:01:30Z",
        "2026-12-06T09:02:30Z",
        "2026-12-06T09:03:30Z",
    ]
    assert ticks(ScheduleTicks("rate(2 hours)", start_date="2026-12-06T10:00:00Z"), CREATED, 2) == [
        "2026-12-06T10:00:00Z",
        "2026-12-06T12:00:00Z",
    ]


@pytest.mark.parametrize(
    ("expression", "timezone", "expected"),
    [
        # every 15 minutes in hours 9-10, weekdays only (6 December 2026 is a Sunday)
        (
            "cron(0/15 9-10 ? * MON-FRI *)",
            "UTC",
            ["2026-12-07T09:00:00Z", "2026-12-07T09:15:00Z", "2026-12-07T09:30:00Z"],
        ),
        # 08:00 in New York (UTC-5 in December), on the 1st and 15th
        ("cron(0 8 1,15 * ? *)", "America/New_York", ["2026-12-15T13:00:00Z", "2027-01-01T13:00:00Z"]),
        # Sundays (1) at 10:00 in 2026 only
        ("cron(0 10 ? * 1 2026)", "UTC", ["2026-12-06T10:00:00Z", "2026-12-13T10:00:00Z", "2026-12-20T10:00:00Z"]),
        ("cron(30 23 31 DEC ? *)", "Europe/Paris", ["2026-12-31T22:30:00Z", "2027-12-31T22:30:00Z"]),
    ],
)
def test_a_cron_ticks_where_its_fields_match_in_its_time_zone(
    expression: str, timezone: str, expected: list[str]
) -> None:
    assert ticks(ScheduleTicks(expression, timezone), CREATED, len(expected)) == expected


def test_at_ticks_once_and_an_end_date_stops_the_ticks() -> None:
    assert ticks(ScheduleTicks("at(2026-12-24T18:00:00)", "Europe/London"), CREATED, 3) == ["2026-12-24T18:00:00Z"]
    assert ticks(ScheduleTicks("at(2026-01-01T00:00:00)"), CREATED, 1) == []  # passed already
    ending = ScheduleTicks("rate(1 hour)", end_date="2026-12-06T11:00:00Z")
    assert ticks(ending, CREATED, 5) == ["2026-12-06T10:00:30Z"]


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("cron(0 8 * * * *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 8 ? * ? *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 8 * *)", "needs 6 fields"),
        ("cron(0 8 L * ? *)", "not emulated locally"),
        ("cron(0 8 ? * 6#3 *)", "not emulated locally"),
        ("cron(61 8 * * ? *)", "out of 0-59"),
        ("cron(0 8 * FOO ? *)", "is not a number"),
        ("every minute", "unsupported schedule expression"),
    ],
)
def test_an_expression_it_cannot_tick_is_refused_with_why(expression: str, why: str) -> None:
    with pytest.raises(ScheduleExpressionError, match=why):
        ScheduleTicks(expression).next_after(CREATED, CREATED)


def test_the_input_carries_the_ticks_time() -> None:
    body = scheduled_input(
        '{"scheduled_time": "<aws.scheduler.scheduled-time>"}', datetime(2026, 12, 6, 9, 1, tzinfo=UTC)
    )
    assert json.loads(body) == {"scheduled_time": "2026-12-06T09:01:00Z"}


def test_the_emulator_sends_each_tick_when_its_time_comes_and_stops() -> None:
    sent: list[str] = []
    arrived = threading.Event()
    now = [CREATED]

    def send(body: str) -> None:
        sent.append(body)
        now[0] = datetime(2026, 12, 6, 10, 59, tzinfo=UTC)  # the next tick (11:00:30) is 90 s away
        arrived.set()

    emulator = SchedulerEmulator(
        "EveryHour", ScheduleTicks("rate(1 hour)"), send, '{"t": "<aws.scheduler.scheduled-time>"}', now=lambda: now[0]
    )
    now[0] = datetime(2026, 12, 6, 10, 0, 30, tzinfo=UTC)  # an hour after its creation: its first tick is due
    emulator.start()
    assert arrived.wait(5)
    emulator.stop()
    assert [json.loads(body) for body in sent] == [{"t": "2026-12-06T10:00:30Z"}]
    with pytest.raises(ScheduleExpressionError):
        SchedulerEmulator("Bad", ScheduleTicks("cron(0 8 L * ? *)"), send, "{}")
