"""devstack.event_sources.ScheduleEmulator: EventBridge's "Scheduled Event", never overlapping."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel

from devstack.event_sources import ScheduleEmulator, parse_schedule_interval
from devstack.lambda_runtime import InvokeResult
from devstack.template import ScheduleEventSpec
from tests.support.polling import wait_until


class SlowFunction:
    """Records events and how many invocations overlapped; each run takes ``seconds``."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.events: list[dict[str, Any]] = []
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def invoke(self, event: Any) -> InvokeResult:
        with self._lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.events.append(event)
        time.sleep(self.seconds)  # the handler's own work, not a wait for a deadline
        with self._lock:
            self.running -= 1
        return InvokeResult(ok=True, payload={"n": len(self.events)}, error=None, duration_ms=1.0, cold_start=False)


@pytest.mark.parametrize(
    ("expression", "seconds"),
    [
        ("rate(1 minute)", 60.0),
        ("rate(5 minutes)", 300.0),
        ("rate(2 hours)", 7200.0),
        ("rate(1 day)", 86400.0),
        ("rate(30 seconds)", 30.0),
        ("cron(0/5 * * * ? *)", 60.0),
    ],
)
def test_schedule_expressions(expression: str, seconds: float) -> None:
    assert parse_schedule_interval(expression) == seconds


@pytest.mark.parametrize("expression", ["rate(0 minutes)", "every minute", "rate(1 fortnight)"])
def test_bad_schedule_expressions(expression: str) -> None:
    with pytest.raises(ValueError, match="schedule"):
        parse_schedule_interval(expression)


def test_runs_on_the_override_interval_with_the_scheduled_event_shape() -> None:
    # Given a rate(1 minute) schedule shortened to 50 ms for the demo
    function = SlowFunction()
    schedule = ScheduleEmulator(
        "SupervisorFunction", ScheduleEventSpec("rate(1 minute)", name="Sweep"), function, region="us-east-1",
        interval_seconds=0.05,
    )  # fmt: skip
    # When it runs for three periods
    schedule.start()
    try:
        wait_until(lambda: len(function.events) >= 3)
    finally:
        schedule.stop()
    # Then every event is EventBridge's "Scheduled Event" for the rule
    event = function.events[0]
    assert set(event) == {"version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"}
    assert (event["detail-type"], event["source"], event["detail"]) == ("Scheduled Event", "aws.events", {})
    assert (event["account"], event["region"], event["version"]) == ("123456789012", "us-east-1", "0")
    assert event["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/sasflow-SupervisorFunctionSweep"]
    assert len({e["id"] for e in function.events}) == len(function.events)
    assert event["time"].endswith("Z") and event["time"][10] == "T"
    EventBridgeModel.model_validate(event)
    assert schedule.runs == len(function.events)


def test_runs_never_overlap_even_with_fire_now() -> None:
    # Given runs (100 ms) longer than the period (10 ms)
    function = SlowFunction(seconds=0.1)
    schedule = ScheduleEmulator(
        "Fn", ScheduleEventSpec("rate(1 minute)"), function, region="us-east-1", interval_seconds=0.01
    )
    schedule.start()
    try:
        extra = [threading.Thread(target=schedule.fire_now) for _ in range(3)]
        for thread in extra:
            thread.start()
        wait_until(lambda: len(function.events) >= 6)
        for thread in extra:
            thread.join(10)
    finally:
        schedule.stop()
    assert function.max_running == 1


def test_disabled_schedule_only_fires_on_demand() -> None:
    function = SlowFunction()
    schedule = ScheduleEmulator(
        "Fn", ScheduleEventSpec("rate(1 minute)", enabled=False), function, region="us-east-1", interval_seconds=0.01
    )
    schedule.start()
    result = schedule.fire_now()
    schedule.stop()
    assert result.ok and result.payload == {"n": 1}
    assert len(function.events) == 1


def test_input_replaces_the_scheduled_event() -> None:
    function = SlowFunction()
    schedule = ScheduleEmulator(
        "Fn", ScheduleEventSpec("rate(1 minute)", input='{"sweep": true}'), function, region="x"
    )
    schedule.fire_now()
    assert function.events == [{"sweep": True}]
