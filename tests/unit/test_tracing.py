"""build_tracer: powertools' Tracer, without importing the X-Ray SDK when tracing is off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
from sasflow.tracing import build_tracer
tracer = build_tracer()

@tracer.capture_lambda_handler
def handler(event, context):
    if event == "boom":
        raise ValueError("boom")
    return {"echo": event}

result = handler("hi", None)
try:
    handler("boom", None)
    raised = False
except ValueError:
    raised = True
print(json.dumps({
    "xray_core_imported": "aws_xray_sdk.core" in sys.modules,
    "provider": type(tracer.provider).__module__ + "." + type(tracer.provider).__name__,
    "disabled": bool(tracer.disabled),
    "result": result,
    "raised": raised,
}))
"""


def _probe(disabled: str) -> dict[str, object]:
    env = {**os.environ, "POWERTOOLS_TRACE_DISABLED": disabled, "PYTHONPATH": str(ROOT / "layers" / "sasflow")}
    env["LAMBDA_TASK_ROOT"] = str(ROOT)  # powertools turns tracing off outside Lambda by itself
    env["AWS_XRAY_CONTEXT_MISSING"] = "IGNORE_ERROR"  # no segment outside Lambda: the SDK must not raise
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_with_tracing_off_the_handler_runs_and_the_xray_sdk_is_never_imported() -> None:
    probe = _probe("true")
    assert probe == {
        "xray_core_imported": False,
        "provider": "sasflow.tracing.DisabledTracingProvider",
        "disabled": True,
        "result": {"echo": "hi"},
        "raised": True,
    }


@pytest.mark.parametrize("value", ["false", "0"])
def test_with_tracing_on_it_is_powertools_xray_tracer(value: str) -> None:
    probe = _probe(value)
    assert probe["xray_core_imported"] is True
    assert probe["provider"] == "aws_xray_sdk.core.async_recorder.AsyncAWSXRayRecorder"  # powertools' own
    assert (probe["disabled"], probe["result"], probe["raised"]) == (False, {"echo": "hi"}, True)
