"""devstack.faults and ``python -m devstack faults``: the sample services' knobs of a running `make up`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import devstack.cli
from devstack.cli import app
from devstack.demo import sample_services_importable
from devstack.faults import NO_FAULTS, POISON_BODY, KnobChanges, ServiceKnobs, apply, knobs_table, parse_duration
from devstack.uplock import DEFAULT_LOCK_PATH, UpLock

sample_services_importable()
from http_server import RunningServer, serve_all  # noqa: E402
from travel_services import FaultKnobs  # noqa: E402

#: The services' clock stands still at this epoch (seconds), so an outage window has known ends.
NOW = 1_796_000_000.0


class StillClock:
    def now(self) -> float:
        return NOW

    def sleep(self, seconds: float) -> None:
        raise AssertionError("nothing sleeps in these tests")


@pytest.fixture
def servers() -> Iterator[dict[str, RunningServer]]:
    running = serve_all(rng_seed=3, clock=StillClock())
    yield running
    for server in running.values():
        server.stop()


@pytest.fixture
def up(servers: dict[str, RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UpLock]:
    """A `make up` of a checkout in tmp_path, as far as the faults command sees one: its lock with its services."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(devstack.cli, "console", Console(width=200))
    with UpLock(DEFAULT_LOCK_PATH) as lock:
        lock.publish(api_url="http://127.0.0.1:1", services={n: s.base_url for n, s in servers.items()})
        yield lock


def faults(*args: str) -> Any:
    return CliRunner().invoke(app, ["faults", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60.0), ("60", 60.0), ("2m", 120.0), ("500ms", 0.5), ("1h", 3600.0), ("0", 0.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-5s", "2d", "s", "1 minute"])
def test_parse_duration_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


def test_faults_sets_an_outage_and_an_error_rate_on_one_service_and_shows_all(
    up: UpLock, servers: dict[str, RunningServer]
) -> None:
    # Given a running `make up` whose services have no faults
    # When flights gets a 60-second outage and a 20 % error rate from another terminal
    result = faults("flights", "--outage", "60s", "--error-rate", "0.2", "--latency", "250ms")
    # Then flights has them, in force at once, and the other services are untouched
    assert result.exit_code == 0, result.output
    assert servers["flights"].service.knobs == FaultKnobs(
        transient_error_rate=0.2, latency_ms=250.0, outage_start=NOW, outage_end=NOW + 60
    )
    assert servers["hotels"].service.knobs == FaultKnobs() == servers["payments"].service.knobs
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 6}
    assert set(rows) == {"flights", "hotels", "payments"}
    assert "20%" in rows["flights"] and "250ms" in rows["flights"]
    # And the JSON view reads the same knobs back
    shown = json.loads(faults("--json").output)
    assert shown["flights"]["outage_end"] == NOW + 60 and shown["hotels"]["transient_error_rate"] == 0.0


def test_faults_can_fail_only_the_compensations_of_a_service(up: UpLock, servers: dict[str, RunningServer]) -> None:
    # When flights is told to fail every compensation
    result = faults("flights", "--compensation-error-rate", "1")
    # Then only that knob is set, and the table shows it in its own column
    assert result.exit_code == 0, result.output
    assert servers["flights"].service.knobs == FaultKnobs(compensation_error_rate=1.0)
    header = next(line for line in result.output.splitlines() if "service" in line and "rejects" in line)
    assert "comp 5xx" in header
    rows = {
        cells[1].strip(): cells for cells in (line.split("│") for line in result.output.splitlines()) if len(cells) > 8
    }
    assert (rows["flights"][7].strip(), rows["hotels"][7].strip()) == ("100%", "-")


def test_faults_make_a_service_rate_limited_with_a_quota_it_answers_429_beyond(
    up: UpLock, servers: dict[str, RunningServer]
) -> None:
    # When hotels is given a quota of 5 calls at once and 10 a second
    result = faults("hotels", "--quota-in-flight", "5", "--quota-rate", "10")
    # Then its knobs hold it (burst: a second's calls), and the table shows it in its own column
    assert result.exit_code == 0, result.output
    assert servers["hotels"].service.knobs == FaultKnobs(quota_in_flight=5, quota_rate=10.0)
    rows = {
        cells[1].strip(): cells for cells in (line.split("│") for line in result.output.splitlines()) if len(cells) > 8
    }
    assert (rows["hotels"][8].strip(), rows["flights"][8].strip()) == ("5 at once, 10/s (burst 10)", "-")
    # And a burst without a rate is refused by the service with its reason, changing nothing
    refused = faults("flights", "--quota-burst", "3")
    assert refused.exit_code == 1 and "quota_burst is the calls quota_rate lets through at once" in refused.output
    assert servers["flights"].service.knobs == FaultKnobs()


def test_faults_reset_puts_every_service_back_to_no_faults(up: UpLock, servers: dict[str, RunningServer]) -> None:
    # Given faults on two services
    servers["hotels"].service.update_knobs({"hang_rate": 0.5, "hang_seconds": 45})
    servers["payments"].service.start_outage(300)
    # When every service is reset
    result = faults("--reset")
    # Then none has a fault left
    assert result.exit_code == 0, result.output
    assert [server.service.knobs for server in servers.values()] == [FaultKnobs()] * 3


def test_reset_takes_a_services_quota_away_too(up: UpLock, servers: dict[str, RunningServer]) -> None:
    # Given a quota on hotels (found by a trial: --reset left it, and nothing else could take it away)
    assert faults("hotels", "--quota-in-flight", "2", "--quota-rate", "1").exit_code == 0
    # When every service is reset
    assert faults("--reset").exit_code == 0
    # Then hotels has no quota, as it has no other fault: reset is every knob's default, each one named
    assert servers["hotels"].service.knobs == FaultKnobs()
    assert FaultKnobs().model_dump() == NO_FAULTS


def test_an_outage_of_zero_ends_the_outage_in_force(up: UpLock, servers: dict[str, RunningServer]) -> None:
    servers["flights"].service.start_outage(600)
    assert faults("flights", "--outage", "0").exit_code == 0
    assert not servers["flights"].service.knobs.in_outage(NOW)


def test_a_refused_value_is_an_error_that_names_the_service_and_changes_nothing(
    up: UpLock, servers: dict[str, RunningServer]
) -> None:
    result = faults("flights", "--latency", "2m")  # above the knob's 60,000 ms
    assert result.exit_code == 1
    # one line: which knob, its bound and the value given (not pydantic's dump with its links)
    assert "/_faults: 400 latency_ms: Input should be less than or equal to 60000 (got 120000.0)" in result.output
    assert "errors.pydantic.dev" not in result.output and len(result.output.strip().splitlines()) == 1
    assert servers["flights"].service.knobs == FaultKnobs()


def test_faults_without_a_running_make_up_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(devstack.cli, "console", Console(width=200))
    result = faults()
    assert result.exit_code == 1
    assert "no `make up` is running in this checkout" in result.output


def test_a_poison_message_is_put_on_the_agents_request_queue_of_the_running_stack(
    up: UpLock, moto_server: str, sqs: Any
) -> None:
    # Given a make up whose lock names the moto endpoint and flights' request queue (as _up publishes them)
    url = sqs.create_queue(QueueName="sasflow-FlightsRequestQueue")["QueueUrl"]
    queues = {"flights": {"url": url, "dead_letter_queue": "FlightsDeadLetterQueue"}}
    up.publish(endpoint_url=moto_server, region="us-east-1", request_queues=queues)
    # When the fault command puts a poison message there
    result = faults("flights", "--poison-message")
    # Then one message waits on that queue, JSON that is no step request, and the command says where it will end
    assert result.exit_code == 0, result.output
    [message] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert message["Body"] == POISON_BODY
    assert set(json.loads(message["Body"])) == {"drill"}
    assert f"poison message {message['MessageId']} sent to sasflow-FlightsRequestQueue" in result.output
    assert "sasflow dlq list FlightsDeadLetterQueue" in result.output


def test_a_poison_message_for_a_stack_that_did_not_publish_its_queues_says_to_restart_it(up: UpLock) -> None:
    result = faults("hotels", "--poison-message")
    assert result.exit_code == 1
    assert "did not publish the request queue of hotels; restart it" in result.output


def test_the_table_gives_the_outage_its_end_and_time_left() -> None:
    knobs = FaultKnobs(outage_start=NOW, outage_end=NOW + 60, hang_rate=0.1, hang_seconds=45).model_dump()
    console = Console(width=80, record=True)
    console.print(knobs_table([ServiceKnobs("flights", "http://127.0.0.1:1", knobs)], now=NOW + 15))
    text = console.export_text()
    assert "until 00:54:20Z (45s)" in text and "10% x 45s" in text


def test_apply_resets_before_it_sets_so_reset_and_outage_leave_only_the_outage(
    servers: dict[str, RunningServer],
) -> None:
    servers["hotels"].service.update_knobs({"rejection_rate": 1.0})
    [row] = apply({"hotels": servers["hotels"].base_url}, KnobChanges(outage_seconds=30, reset=True))
    assert servers["hotels"].service.knobs == FaultKnobs(outage_start=NOW, outage_end=NOW + 30)
    assert row.knobs == servers["hotels"].service.knobs.model_dump()


@pytest.mark.parametrize(
    ("option", "value", "bound"),
    [
        ("--port", "99999", "less than or equal to 65535"),
        ("--port", "-1", "greater than or equal to 0"),
        ("--schedule-interval", "0", "greater than or equal to 0.1"),
        ("--schedule-interval", "-1", "greater than or equal to 0.1"),
        ("--sqs-concurrency", "0", "greater than or equal to 1"),
        ("--visibility-timeout", "-5", "greater than or equal to 0"),
    ],
)
def test_make_up_refuses_an_option_out_of_range_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str, bound: str
) -> None:
    # From a new user's trial: --port 99999 and --schedule-interval -1 ended in tracebacks, and 0 was ignored
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["up", option, value], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # the words of Rich's error box
    assert f"Invalid value for '{option}'" in text and bound in text, text
    assert not (tmp_path / ".devstack").exists()  # refused before the lock or anything else
