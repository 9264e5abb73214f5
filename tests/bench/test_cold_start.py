"""The cold-start bench: one handler timed in pairs with the baseline, the layer measured, the child's sandbox."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import pytest

from bench import cold_start
from bench.cold_start import (
    BASELINE_MODULES,
    ImportProbe,
    Spread,
    handler_function,
    handler_probe,
    layer_distributions,
    link_layer_packages,
    measure_cold_start,
    paired_times,
)
from devstack.template import Stack

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def test_one_handler_is_timed_in_pairs_with_the_baseline_and_the_layer_is_measured() -> None:
    # Given the supervisor handler only, three pairs
    # When the cold start is measured
    rows, raw = measure_cold_start(pairs=3, handlers=("supervisor_handler",))

    # Then each pair timed the baseline and the handler for real, and the figure is the median of the pairs' ratios
    assert raw["baseline"]["modules"] == list(BASELINE_MODULES) and raw["pairs"] == 3
    handler = raw["handlers"]["supervisor_handler"]
    assert handler["function"] == "SupervisorFunction"
    assert len(handler["samples"]) == len(handler["baseline_samples"]) == 3
    assert all(0 < seconds < 60 for seconds in handler["samples"] + handler["baseline_samples"])
    assert all(cpu > 0 for cpu in handler["cpu_samples"] + handler["baseline_cpu_samples"])
    ratios = [ours / base for ours, base in zip(handler["samples"], handler["baseline_samples"], strict=True)]
    assert handler["ratios"] == pytest.approx(ratios)
    assert handler["ratio"] == pytest.approx(statistics.median(ratios))
    assert min(ratios) <= handler["ratio_q1"] <= handler["ratio"] <= handler["ratio_q3"] <= max(ratios)
    timed = rows[0]
    assert timed.metric.startswith("cold start: import supervisor_handler")
    assert f"IQR {handler['ratio_q1']:.3f}-{handler['ratio_q3']:.3f}" in timed.metric
    assert timed.ours == pytest.approx(statistics.median(handler["samples"]))
    assert timed.anchor == pytest.approx(statistics.median(handler["baseline_samples"]))
    assert timed.ratio == handler["ratio"]
    assert timed.target == "<= 1.3"  # the verdict on each side of it: tests/bench/test_report.py
    # And the layer is tens of MB (botocore alone is over 20), zipped smaller than unzipped, as plain rows
    layer = raw["layer"]
    assert layer["bytes_unzipped"] > 10_000_000
    assert 1_000_000 < layer["bytes_zipped"] < layer["bytes_unzipped"]
    assert [row.target for row in rows[1:]] == ["", ""] and all(row.met is None for row in rows[1:])
    assert len(rows) == 3


def test_pairs_alternate_which_side_goes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given imports that take 1 s for the baseline and 2 s for either handler, recorded in the order they run
    order: list[str] = []

    def fake_time_import(probe: ImportProbe) -> tuple[float, float]:
        order.append(probe.label)
        return (1.0, 0.5) if probe.label == "baseline" else (2.0, 0.5)

    monkeypatch.setattr(cold_start, "time_import", fake_time_import)
    probes = [ImportProbe(label, (label,), (), {}) for label in ("baseline", "a", "b")]

    # When two handlers are timed in two pairs each
    timed = paired_times(probes[0], probes[1:], pairs=2)

    # Then each handler ran right beside a baseline, first after it then before it (and the next handler the other
    # way round), and every ratio is 2 / 1
    assert order == ["baseline", "a", "b", "baseline", "a", "baseline", "baseline", "b"]
    assert timed["a"].ratios == timed["b"].ratios == [2.0, 2.0]
    assert timed["a"].cpu_ratios == [1.0, 1.0]


def test_the_spread_is_the_median_and_the_quartiles() -> None:
    # 1..9: median 5, quartiles 3 and 7 (inclusive method: the 25th and 75th percentiles of the values themselves)
    assert Spread.of([9.0, 1.0, 5.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0]) == Spread(5.0, 3.0, 7.0)
    assert Spread.of([1.2]) == Spread(1.2, 1.2, 1.2)
    with pytest.raises(ValueError):
        Spread.of([])


def test_the_child_sees_the_layer_and_the_lambda_environment_only() -> None:
    # Given the packages the layer's requirements pull in
    distributions = {dist.metadata["Name"].lower().replace("_", "-") for dist in layer_distributions()}
    stack = Stack.from_file(TEMPLATE)

    # Then they are the layer's, with the tracer extra, and nothing from the dev venv (moto, pytest, requests)
    assert {"aws-lambda-powertools", "aws-xray-sdk", "boto3", "botocore", "pydantic", "tenacity"} <= distributions
    assert not distributions & {"moto", "pytest", "requests", "httpx"}

    # When the agent's import is prepared
    with tempfile.TemporaryDirectory() as scratch:
        packages = link_layer_packages(layer_distributions(), Path(scratch) / "python")
        probe = handler_probe(stack, handler_function(stack, "agent_handler"), packages)
        linked = {path.name for path in packages.iterdir()}

    # Then it sees the function's code dir, the layer and its variables, tracing off (the template's default
    # Tracing: PassThrough), fake credentials
    assert probe.modules == ("agent_handler",)
    assert probe.path[0].name == "agent" and probe.path[1].name == "sasflow"
    assert {"boto3", "pydantic", "aws_xray_sdk"} <= linked and "moto" not in linked
    environment = probe.environment
    assert environment["AGENT_NAME"] == "flights" and environment["POWERTOOLS_SERVICE_NAME"] == "sasflow"
    assert environment["LAMBDA_TASK_ROOT"] == str(probe.path[0])
    assert environment["AWS_LAMBDA_FUNCTION_NAME"] == "sasflow-FlightsAgentFunction"
    assert "AWS_XRAY_DAEMON_ADDRESS" not in environment and environment["POWERTOOLS_TRACE_DISABLED"] == "true"
    assert environment["AWS_ACCESS_KEY_ID"] == "testing"
    assert not any(name.startswith(("AWS_ENDPOINT_URL", "AWS_PROFILE")) for name in environment)


def test_with_tracing_active_the_child_gets_the_x_ray_daemon_and_the_tracer_on() -> None:
    stack = Stack.from_file(TEMPLATE, parameters={"Tracing": "Active"})
    with tempfile.TemporaryDirectory() as scratch:
        packages = Path(scratch) / "python"
        packages.mkdir()
        probe = handler_probe(stack, handler_function(stack, "scheduler_handler"), packages)
    assert "AWS_XRAY_DAEMON_ADDRESS" in probe.environment
    assert probe.environment["POWERTOOLS_TRACE_DISABLED"] == "false"
