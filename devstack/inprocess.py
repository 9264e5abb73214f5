"""Run a template function's handler in this process, as its own sandbox (for tests and the simulation).

The local stack runs each function in a worker process; tests and the deterministic simulation need the handler in
process instead, so they can inject a clock and fault hooks. ``load_function_module`` imports the handler module
under a unique name (one sandbox per function: the three agents share ``agent_handler.py`` but keep separate
cold-start state) with the function's environment applied; ``environment`` applies it again around each call.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType

from devstack.template import FunctionSpec

_counter = itertools.count()

#: Offline only: fake credentials, no config files, no instance-metadata probe, quiet powertools, no tracing.
FAKE_AWS_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "ERROR",
}
#: Variables that could point an SDK at a real account or endpoint; `offline_aws` removes them.
_REAL_ACCOUNT_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


@contextmanager
def offline_aws() -> Iterator[None]:
    """moto in process with `FAKE_AWS_ENV`, and nothing that could reach a real account; ``os.environ`` is restored
    exactly afterwards. The simulation and the bench run inside it."""
    from moto import mock_aws

    from devstack import fair_queues, moto_sqs

    moto_sqs.install()  # DLQ redrive (StartMessageMoveTask...), which moto lacks
    fair_queues.install()  # a quiet tenant's messages before a noisy one's backlog, as SQS fair queues
    with environment(FAKE_AWS_ENV):
        for name in list(os.environ):
            if name in _REAL_ACCOUNT_ENV or name.startswith("AWS_ENDPOINT_URL"):
                del os.environ[name]
        with mock_aws():
            yield


@contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Apply ``variables`` to ``os.environ`` for the duration, then restore it exactly."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def function_environment(spec: FunctionSpec) -> dict[str, str]:
    """The environment a function sees: the template's variables plus what Lambda itself sets."""
    return {
        **spec.environment,
        "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "POWERTOOLS_METRICS_DISABLED": "true",
    }


def load_function_module(spec: FunctionSpec) -> ModuleType:
    """Import the handler module of ``spec`` as a fresh module, with the function's environment applied.

    Raises
    ------
    ImportError
        When the handler module cannot be found or imported.
    """
    module_name, _ = spec.handler.rsplit(".", 1)
    path = spec.code_dir / f"{module_name}.py"
    unique = f"{module_name}__{spec.logical_id}__{next(_counter)}"
    with environment(function_environment(spec)):
        loader_spec = importlib.util.spec_from_file_location(unique, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[unique] = module
        loader_spec.loader.exec_module(module)
    return module


class FakeLambdaContext:
    """A Lambda context whose deadline is read from a clock (``deadline`` in epoch seconds, or a fixed budget)."""

    def __init__(self, function_name: str, timeout_seconds: int, memory_mb: int = 256) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2026/11/29/[$LATEST]local"
        self.remaining_ms = timeout_seconds * 1000

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left in the invocation."""
        return self.remaining_ms
