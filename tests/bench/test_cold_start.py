"""The cold-start bench: one handler timed once against the baseline, the layer measured, the child's sandbox."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from bench.cold_start import (
    BASELINE_MODULES,
    handler_function,
    handler_probe,
    layer_distributions,
    link_layer_packages,
    measure_cold_start,
)
from devstack.template import Stack

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def test_one_handler_is_timed_against_the_baseline_and_the_layer_is_measured() -> None:
    # Given the supervisor handler only, one run each
    # When the cold start is measured
    rows, raw = measure_cold_start(repeats=1, handlers=("supervisor_handler",))

    # Then the baseline and the handler took real time, and the row's ratio is ours / anchor
    baseline = raw["baseline"]["seconds"]
    assert raw["baseline"]["modules"] == list(BASELINE_MODULES)
    assert 0 < baseline < 60
    handler = raw["handlers"]["supervisor_handler"]
    assert handler["function"] == "SupervisorFunction"
    assert 0 < handler["seconds"] < 60 and handler["cpu_seconds"] > 0
    timed = rows[0]
    assert timed.metric.startswith("cold start: import supervisor_handler")
    assert timed.ours == handler["seconds"] and timed.anchor == baseline
    assert timed.ratio is not None and math.isclose(timed.ratio, handler["seconds"] / baseline)
    assert timed.target == "<= 1.3"  # the verdict on each side of it: tests/bench/test_report.py
    # And the layer is tens of MB (botocore alone is over 20), zipped smaller than unzipped, as plain rows
    layer = raw["layer"]
    assert layer["bytes_unzipped"] > 10_000_000
    assert 1_000_000 < layer["bytes_zipped"] < layer["bytes_unzipped"]
    assert [row.target for row in rows[1:]] == ["", ""] and all(row.met is None for row in rows[1:])
    assert len(rows) == 3


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
