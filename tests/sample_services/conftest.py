"""Fixtures of the sample services' tests: fake clocks, unique ids, a moto table built from template.yaml."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# The Lambda's CodeUri is functions/sample_services, so its modules import each other as top-level modules; the
# fakes sit beside this file under a name no other test folder uses.
for folder in (ROOT / "functions" / "sample_services", Path(__file__).resolve().parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from sample_fakes import FakeClock  # noqa: E402

from travel_services import FaultKnobs, InMemoryLedger, TravelService  # noqa: E402


class _CfnLoader(yaml.SafeLoader):
    """YAML loader that keeps CloudFormation short-form tags (!Ref, !Sub, ...) as plain values."""


def _cfn_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


_CfnLoader.add_multi_constructor("!", _cfn_tag)


def template_resource(logical_id: str) -> dict[str, Any]:
    """Return the Properties of ``logical_id`` in template.yaml."""
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=_CfnLoader)
    properties: dict[str, Any] = template["Resources"][logical_id]["Properties"]
    return properties


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def uid() -> str:
    """A unique id per test, so tokens never collide across tests or runs."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def make_service(clock: FakeClock) -> Any:
    """Build a ``TravelService`` over a fresh in-memory ledger with a seeded rng and the fake clock."""
    import random

    def make(name: str = "flights", seed: int = 7, **knobs: Any) -> TravelService:
        return TravelService(name, InMemoryLedger(), FaultKnobs(**knobs), random.Random(seed), clock)

    return make


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region, so that nothing can reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def sample_ledger_table(aws_env: None, uid: str) -> Iterator[str]:
    """A moto DynamoDB table shaped like SampleLedgerTable in template.yaml; yields its name."""
    import boto3
    from moto import mock_aws

    properties = template_resource("SampleLedgerTable")
    with mock_aws():
        name = f"sample-ledger-{uid}"
        boto3.client("dynamodb").create_table(
            TableName=name,
            AttributeDefinitions=properties["AttributeDefinitions"],
            KeySchema=properties["KeySchema"],
            BillingMode=properties["BillingMode"],
        )
        yield name
