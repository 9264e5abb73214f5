"""`make bench` end to end at a tiny scale: the CLI prints one markdown table with the S1 rows and a verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench import cli


def test_the_cli_prints_the_table_and_writes_both_results_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "RESULTS_MD", tmp_path / "results.md")
    monkeypatch.setattr(cli, "RESULTS_JSON", tmp_path / "results.json")
    result = CliRunner().invoke(cli.app, ["--only", "cost", "--scenarios", "S1", "--scale", "0.01"])
    assert result.exit_code == 0, result.output
    assert "| metric | ours | anchor | ratio | target | met? |" in result.output
    assert "S1 orchestration $ per 1M steps (anchor: Step Functions Standard)" in result.output
    raw = json.loads((tmp_path / "results.json").read_text())
    s1 = raw["scenarios"]["S1"]
    assert s1["workflows"] == 2 and s1["steps_run"] == 6
    assert s1["step_functions_transitions"] == 6
    assert raw["rows"][0]["ratio"] == pytest.approx(s1["ours_per_step"] / s1["anchor_per_step"])
    assert (tmp_path / "results.md").read_text().startswith("# Bench results (`make bench`)")
