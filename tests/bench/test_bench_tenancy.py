"""The tenants' limits in `make bench`: S1-tenancy (what the slots cost on S1's happy path) and S7 (a tenant's burst
beside a quiet tenant, queued over max_running), at a tiny scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import cli
from bench.accounting import _of_tenancy
from bench.cost import p95


def test_s1_tenancy_and_s7_report_what_the_slots_cost_and_the_quiet_tenants_time_beside_the_burst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "RESULTS_MD", tmp_path / "results.md")
    monkeypatch.setattr(cli, "RESULTS_JSON", tmp_path / "results.json")
    arguments = ["--only", "cost", "--scenarios", "S1-tenancy,S7-alone,S7", "--scale", "0.01"]
    result = CliRunner().invoke(cli.app, arguments)
    raw = json.loads((tmp_path / "results.json").read_text())

    # S1-tenancy: per workflow, the start reads its tenant's queue's head (empty) and takes a slot, its end gives the
    # slot back (whose write says no queue waits: no read): 3 requests, 2 write units and 1 read unit
    s1 = raw["scenarios"]["S1-tenancy"]
    assert s1["workflows"] == 2 and s1["statuses"] == {"COMPLETED": 2}
    assert s1["usage"]["tenancy"] == {"requests": 6, "wru": 4, "rru": 2.0}
    rows = {row["metric"]: row for row in raw["rows"]}
    limits = next(metric for metric in rows if metric.startswith("S1-tenancy the tenants' limits"))
    assert rows[limits]["ours"].endswith("0 of 2 workflows queued")

    # S7: the burst (20 at this scale) and the quiet tenant's 20, all COMPLETED; its times measured beside the burst
    # and alone (S7-alone, whose own rows are not printed), compared against the 1.5 target
    s7 = raw["scenarios"]["S7"]
    assert s7["statuses"] == {"COMPLETED": 40}
    assert [len(s7["tenancy"]["durations"][tenant]) for tenant in ("burst", "quiet")] == [20, 20]
    assert not any(metric.startswith("S7-alone") for metric in rows)
    [fairness] = [row for metric, row in rows.items() if metric.startswith("S7 the quiet tenant's p95")]
    assert fairness["ours"] == p95(s7["tenancy"]["durations"]["quiet"])
    assert fairness["anchor"] == p95(raw["scenarios"]["S7-alone"]["tenancy"]["durations"]["quiet"])
    assert fairness["target"] == "<= 1.5"
    assert result.exit_code == (0 if fairness["met"] else 1), result.output


def test_p95_is_the_nearest_rank() -> None:
    assert p95([float(n) for n in range(1, 21)]) == 19.0
    assert p95([3.0]) == 3.0
    assert p95([5.0, 1.0]) == 5.0


def test_the_tenants_requests_are_told_by_their_keys_and_the_queues_shard() -> None:
    assert _of_tenancy({"Key": {"pk": {"S": "TENANCY#trip#key#acme"}, "sk": {"S": "#TENANCY"}}})
    assert _of_tenancy({"Item": {"pk": {"S": "TENANCY#trip#key#acme"}, "sk": {"S": "Q#000000000001"}}})
    assert _of_tenancy({"ExpressionAttributeValues": {":pk": {"S": "TENANCY#trip#key#acme"}, ":queue": {"S": "Q#"}}})
    assert _of_tenancy({"ExpressionAttributeValues": {":shard": {"S": "TQ"}, ":before": {"N": "1"}}})
    assert not _of_tenancy({"ExpressionAttributeValues": {":shard": {"S": "03"}, ":before": {"N": "1"}}})
    assert not _of_tenancy({"Key": {"pk": {"S": "WF#123"}, "sk": {"S": "#WF"}}})
    assert not _of_tenancy({"Key": {"id": {"S": "call-limits#hotels"}}})


def test_an_instances_wait_moves_its_own_time_and_what_it_sends_waits_for_that_time() -> None:
    import boto3

    from bench.scenarios import InstanceClock, _moto_sqs_on
    from devstack.inprocess import offline_aws
    from sasflow.clock import ManualClock

    world = ManualClock(1_800_000_000.0)
    instance = InstanceClock(world)
    instance.sleep(2.5)  # a call limit's token 2.5 s away: the instance waits, the world does not
    assert (instance.now() - world.now(), world.now()) == (2.5, 1_800_000_000.0)
    reading = [instance]
    with offline_aws(), _moto_sqs_on(lambda: reading[0]):
        sqs = boto3.client("sqs")
        url = sqs.create_queue(QueueName="replies")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="sent by the instance at +2.5 s")
        reading[0] = world
        assert "Messages" not in sqs.receive_message(QueueUrl=url)  # at +0 s: not sent yet
        world.advance(2.0)
        assert instance.now() == world.now() + 0.5  # still busy
        assert "Messages" not in sqs.receive_message(QueueUrl=url)
        world.advance(0.5)
        assert instance.now() == world.now()  # free: the instance's time is the world's again
        [message] = sqs.receive_message(QueueUrl=url)["Messages"]
        assert message["Body"] == "sent by the instance at +2.5 s"


def test_s7s_fairness_comes_from_max_running_and_its_target_is_missed_without_it() -> None:
    """The fairness row can fail: with 200 starts of the bursting tenant (scale 0.1) and its limit lifted, its steps
    crowd the hotels agent's call limits (10 calls/s) and the quiet tenant's requests wait behind them."""
    import dataclasses

    from bench.cost import FAIRNESS_TARGET
    from bench.scenarios import run_scenario, scenarios

    by_name = {scenario.name: scenario for scenario in scenarios(0.1)}
    alone = p95(run_scenario(by_name["S7-alone"]).durations["quiet"])
    limited = p95(run_scenario(by_name["S7"]).durations["quiet"])
    unlimited = p95(run_scenario(dataclasses.replace(by_name["S7"], max_running=1_000)).durations["quiet"])
    # (alone: each of the 3 steps waits up to the agents' 2 s window; beside the burst, full batches go at once)
    assert limited <= FAIRNESS_TARGET * alone < unlimited, (limited, alone, unlimited)
