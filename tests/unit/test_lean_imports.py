"""sasflow.lean_imports, and what each handler's cold start leaves out (a package's re-exports, the engine for the
agent, the adapters until the clients are built)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sasflow.lean_imports import defer_package_init


def _package(root: Path, init: str) -> str:
    name = f"pkg_{uuid.uuid4().hex[:8]}"
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text(init)
    (folder / "light.py").write_text("IMPORTED.append('light')\nclass Light: ...\n")
    (folder / "heavy.py").write_text("IMPORTED.append('heavy')\nclass Heavy: ...\n")
    return name


@pytest.fixture
def imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    monkeypatch.syspath_prepend(str(tmp_path))
    record: list[str] = []
    monkeypatch.setattr("builtins.IMPORTED", record, raising=False)
    yield record
    for name in [n for n in sys.modules if n.startswith("pkg_")]:
        del sys.modules[name]


def test_a_submodule_is_imported_without_the_packages_other_reexports(tmp_path: Path, imported: list[str]) -> None:
    # Given a package whose __init__ re-exports a light and a heavy submodule
    name = _package(
        tmp_path, '"""doc"""\nfrom .light import Light\nfrom .heavy import Heavy\n__all__ = ["Light", "Heavy"]\n'
    )
    # When it is deferred and its light submodule imported
    defer_package_init(name)
    light = importlib.import_module(f"{name}.light")
    # Then only that submodule ran
    assert imported == ["light"]
    # and a re-exported name still resolves to the same object, importing its submodule then
    package = sys.modules[name]
    assert package.Light is light.Light
    assert imported == ["light"]
    assert package.Heavy is importlib.import_module(f"{name}.heavy").Heavy
    assert imported == ["light", "heavy"]
    assert package.__all__ == ["Light", "Heavy"]
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        _ = package.Nothing


def test_a_package_whose_init_does_more_than_reexport_is_imported_as_usual(tmp_path: Path, imported: list[str]) -> None:
    name = _package(tmp_path, "from .light import Light\nIMPORTED.append('init')\n")
    defer_package_init(name)
    assert imported == ["light", "init"]
    assert sys.modules[name].Light.__name__ == "Light"


def test_an_unknown_package_is_an_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        defer_package_init(f"no_such_package_{uuid.uuid4().hex[:8]}")


# What each handler's cold start leaves out: a module in a handler's list must not be imported when the handler
# module is (a fresh interpreter each, the layer and the function's code dir on the path, as on Lambda).
_LEFT_OUT_AT_COLD_START: dict[str, tuple[str, ...]] = {
    # the agent needs the bus and the messages, never the engine: no scheduler, records or definitions' models
    "agent_handler": (
        "sasflow.scheduler",
        "sasflow.supervisor",
        "sasflow.records",
        "sasflow.definition",
        "sasflow.transitions",
        "aws_lambda_powertools.utilities.data_classes.kinesis_firehose_event",
        "aws_lambda_powertools.utilities.data_classes.appsync_resolver_event",
    ),
    # a trigger starts workflows: the engine, never the agent's runtime; the batch utility as the scheduler's
    "trigger_handler": (
        "sasflow.agent",
        "tenacity",
        "aws_lambda_powertools.utilities.data_classes.kinesis_firehose_event",
        "aws_lambda_powertools.utilities.data_classes.appsync_resolver_event",
    ),
    # powertools' batch utility without the 40 event classes of the data classes' __init__
    "scheduler_handler": (
        "aws_lambda_powertools.utilities.data_classes.kinesis_firehose_event",
        "aws_lambda_powertools.utilities.data_classes.appsync_resolver_event",
    ),
    # the dead-letter adapter and botocore load with the boto3 clients, on the first invocation
    "ops_handler": ("sasflow.adapters.sqs_dead_letters", "botocore.exceptions", "boto3"),
    "api_handler": ("boto3", "aws_lambda_powertools.event_handler.appsync"),
    "supervisor_handler": ("boto3", "sasflow.agent", "tenacity"),
}
#: And what each must still import at init, because its first invocation needs it (nothing moved to the request).
_LOADED_AT_COLD_START: dict[str, tuple[str, ...]] = {
    "agent_handler": ("sasflow.messages", "sasflow.batch", "sasflow.settings"),
    "scheduler_handler": ("sasflow.scheduler", "sasflow.supervisor", "sasflow.batch"),
    "trigger_handler": ("sasflow.scheduler", "sasflow.triggers", "sasflow.registry"),
    "supervisor_handler": ("sasflow.scheduler", "sasflow.supervisor"),
    "api_handler": ("sasflow.scheduler", "sasflow.supervisor", "sasflow.api"),
    "ops_handler": ("sasflow.scheduler", "sasflow.supervisor", "sasflow.ops_api"),
}

_ROOT = Path(__file__).resolve().parents[2]
_FUNCTION_DIRS = {
    "agent_handler": "agent",
    "scheduler_handler": "scheduler",
    "trigger_handler": "trigger",
    "supervisor_handler": "supervisor",
    "api_handler": "api",
    "ops_handler": "ops",
}


@pytest.mark.parametrize("handler", sorted(_LEFT_OUT_AT_COLD_START))
def test_a_handlers_cold_start_imports_what_its_first_request_needs_and_no_more(handler: str) -> None:
    # Given a fresh interpreter with the function's code dir and the layer on its path
    probe = (
        f"import importlib, json, sys\nimportlib.import_module({handler!r})\nprint(json.dumps(sorted(sys.modules)))\n"
    )
    path = [str(_ROOT / "functions" / _FUNCTION_DIRS[handler]), str(_ROOT / "layers" / "sasflow")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "POWERTOOLS_TRACE_DISABLED": "true"}
    # When the handler module is imported (its init phase)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=environment, capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    # Then what it does not need before its first request is not loaded, and what it does need is
    assert not loaded & set(_LEFT_OUT_AT_COLD_START[handler])
    assert set(_LOADED_AT_COLD_START[handler]) <= loaded
