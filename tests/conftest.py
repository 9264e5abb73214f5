"""Session-wide test safety: fake AWS credentials for every test, so nothing can ever reach a real account.

* The environment is scrubbed when this file is imported (before any test module, so module-level boto3
  clients created at import time already see the fake region and credentials), and again around every
  test with ``monkeypatch`` so that a test that changes these variables cannot leak into the next one.
* Tests get a tier marker from their folder: tests/unit -> ``unit``, tests/integration -> ``integration``,
  tests/system -> ``system`` (select with ``pytest -m unit``). tests/unit/conftest.py disables sockets there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

FAKE_AWS_ENV: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never read the developer's ~/.aws files, never probe the EC2 instance-metadata endpoint.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}

# Variables that could point an SDK at a real account or endpoint.
REMOVED_AWS_ENV: tuple[str, ...] = (
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
)
REMOVED_AWS_ENV_PREFIXES: tuple[str, ...] = ("AWS_ENDPOINT_URL_",)  # per-service endpoints, e.g. AWS_ENDPOINT_URL_SQS

# Defaults only (a test may override them): no X-Ray emitter outside a real Lambda.
DEFAULT_ENV: dict[str, str] = {
    "POWERTOOLS_TRACE_DISABLED": "true",
}

TIERS: tuple[str, ...] = ("unit", "integration", "system")
TESTS_DIR = Path(__file__).resolve().parent


def _removed_names(environ: Mapping[str, str]) -> list[str]:
    return [
        name
        for name in environ
        if name in REMOVED_AWS_ENV or any(name.startswith(prefix) for prefix in REMOVED_AWS_ENV_PREFIXES)
    ]


def _scrub_process_env() -> None:
    for name in _removed_names(os.environ):
        del os.environ[name]
    os.environ.update(FAKE_AWS_ENV)
    for name, value in DEFAULT_ENV.items():
        os.environ.setdefault(name, value)


_scrub_process_env()


@pytest.fixture(autouse=True)
def _fake_aws_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Give every test fake AWS credentials and region, and no real endpoint or profile."""
    for name in _removed_names(os.environ):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (unit / integration / system) from the folder it lives in."""
    for item in items:
        try:
            relative = item.path.resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        tier = relative.parts[0] if len(relative.parts) > 1 else ""
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(autouse=True)
def _fresh_ledger() -> Iterator[None]:
    """Every test starts with an empty cost ledger on its thread (sasflow.cost): no work another test left pending."""
    from sasflow.cost import forget_ledgers

    forget_ledgers()
    yield
