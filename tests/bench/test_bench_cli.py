"""`make bench` end to end at a tiny scale: the CLI prints one markdown table with the S1 rows and a verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import cli, cold_start
from bench.report import Row


def test_the_cli_prints_the_table_and_writes_both_results_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "RESULTS_MD", tmp_path / "results.md")
    monkeypatch.setattr(cli, "RESULTS_JSON", tmp_path / "results.json")
    # Deployed with both batching windows at 1 s: each queue gathers for 1 s from its first visible message
    windows = "SchedulerBatchingWindowSeconds=1 AgentBatchingWindowSeconds=1"
    arguments = ["--only", "cost", "--scenarios", "S1", "--scale", "0.01", "--parameter-overrides", windows]
    result = CliRunner().invoke(cli.app, arguments)
    assert "| metric | ours | anchor | ratio | target | met? |" in result.output
    assert "S1 orchestration $ per 1M steps (anchor: Step Functions Standard)" in result.output
    raw = json.loads((tmp_path / "results.json").read_text())
    assert raw["parameter_overrides"] == {"SchedulerBatchingWindowSeconds": "1", "AgentBatchingWindowSeconds": "1"}
    s1 = raw["scenarios"]["S1"]
    assert s1["workflows"] == 2 and s1["steps_run"] == 6
    # Counted by hand for 2 trips started 0.5 s apart: Step Functions bills one transition per step, $25 per 1M
    # steps; we write 12 WRU per trip + 1 for the definition, make 2 API requests, and 19 SQS requests: the trips
    # travel together (each queue's 1 s window, from the first trip's message, gathers the second's too), so 7 sends
    # (2 starts, then one batch of two at each of the 5 hops after: flights' replies, hotels' requests, their
    # replies, payments' requests, their replies), 6 receives and 6 deletes (one batch of two per queue visited:
    # flights at 1 s, replies at 2 s, hotels at 3 s, replies at 4 s, payments at 5 s, replies at 6 s)
    assert s1["step_functions_transitions"] == 6
    # + 1 for the hotels agent's call limits: one lease (a GetItem, then one write) serves both trips' calls
    assert sum(s1["usage"]["dynamodb_wru"].values()) == 2 * 12 + 1 + 1
    assert s1["usage"]["call_limits"] == {"requests": 2, "wru": 1, "rru": 1.0}
    assert (s1["usage"]["api_requests"], s1["usage"]["sqs_billed_requests"]) == (2, 19)
    assert (
        s1["usage"]["lambda_invocations"]["ApiFunction"],
        s1["usage"]["lambda_invocations"]["SchedulerFunction"],
    ) == (
        2,
        3,
    )
    cost_row = raw["rows"][0]
    assert cost_row["anchor"] == pytest.approx(25.0)
    assert cost_row["ratio"] == pytest.approx(cost_row["ours"] / 25.0)
    # Those and the engine's 5 Lambda requests alone are (25 x 0.625 + 2 x 1.00 + 19 x 0.40 + 5 x 0.20) / 6 = 4.37 $
    # per 1M steps, a ratio of 0.175: over the 0.17 target whatever the rest (Lambda time, empty polls, logs) adds,
    # so at this scale the verdict is "no"
    assert cost_row["ours"] >= (25 * 0.625 + 2 * 1.00 + 19 * 0.40 + 5 * 0.20) / 6
    assert (cost_row["target"], cost_row["met"]) == ("<= 0.17", False)
    # so the bench exits 1 and names every row that missed, this one among them (the results files are written)
    missed = [row["metric"] for row in raw["rows"] if row["met"] is False]
    assert result.exit_code == 1, result.output
    assert f"targets missed: {len(missed)}" in result.output
    assert cost_row["metric"] in missed
    assert all(f"{metric}: " in result.output for metric in missed)
    # The anchors' raw counts are in results.json: 2 executions of 3 durable steps, 2 Express requests of 17 events
    assert (s1["durable"]["operations"], s1["durable"]["invocations"]) == (6, 2)
    assert (s1["express"]["requests"], s1["express"]["log_events"]) == (2, 34)
    assert (tmp_path / "results.md").read_text().startswith("# Bench results (`make bench`)")


def _cold_rows(*ratios: float) -> tuple[list[Row], dict[str, object]]:
    rows = [
        Row.with_ratio(f"cold start: import handler_{index}", 0.3, 0.25, ratio, at_most=1.3)
        for index, ratio in enumerate(ratios)
    ]
    return [*rows, Row("CoreLayer size, zipped", "24.4 MB")], {}


def test_the_bench_exits_1_and_names_the_rows_when_a_target_is_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a cold-start part whose second handler reads 1.31 against a target of <= 1.3
    monkeypatch.setattr(cold_start, "measure_cold_start", lambda pairs: _cold_rows(1.1, 1.31))
    # When the bench runs it
    result = CliRunner().invoke(cli.app, ["--only", "cold", "--no-write"])
    # Then it exits 1, naming the row that missed and its ratio, and not the one that met its target
    assert result.exit_code == 1, result.output
    assert "targets missed: 1" in result.output
    assert "cold start: import handler_1: 1.310, target <= 1.3" in result.output
    assert "handler_0:" not in result.output


def test_the_bench_exits_0_when_every_target_is_met(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cold_start, "measure_cold_start", lambda pairs: _cold_rows(1.1, 1.3))
    result = CliRunner().invoke(cli.app, ["--only", "cold", "--no-write", "--cold-start-pairs", "7"])
    assert result.exit_code == 0, result.output
    assert "targets missed" not in result.output
