"""The batches' items, on DynamoDB (the table template.yaml declares, in moto) and in memory, kept to one contract:
every write conditional on the batch's version, a page claimed once with the cursor that moves past it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import boto3
import pytest
from moto import mock_aws

from devstack.provision import provision
from devstack.template import Stack
from sasflow.adapters.batch_dynamodb import DynamoDBBatchStore
from sasflow.adapters.memory import InMemoryBatchStore
from sasflow.batches import BatchFilter, BatchPage, Counts, new_batch
from sasflow.errors import ConditionFailedError
from sasflow.finding import WorkflowFinder
from sasflow.ports import BatchStore
from tests.support.lambdas import ROOT

OPERATOR = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest) -> Iterator[BatchStore]:
    if request.param == "memory":
        yield InMemoryBatchStore()
        return
    with mock_aws():
        stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
        physical = provision(stack)
        yield DynamoDBBatchStore(physical["StateTable"], boto3.client("dynamodb"))


def a_batch(batch_id: str = "b-1", now: int = 1_000) -> object:
    where = BatchFilter(status="HELD", definition="trip-booking", error_code="NO_SEATS")
    return new_batch(batch_id, "retry", where, principal=OPERATOR, reason="hotels are back", now=now, step="book_hotel")


def test_a_batch_round_trips_and_each_write_is_conditional_on_its_version(store: BatchStore) -> None:
    batch = store.create(a_batch())  # type: ignore[arg-type]
    assert batch.version == 1
    with pytest.raises(ConditionFailedError, match="exists"):
        store.create(a_batch())  # type: ignore[arg-type]
    read = store.get("b-1", consistent=True)
    assert read == batch
    assert read is not None and read.where == BatchFilter(
        status="HELD", definition="trip-booking", error_code="NO_SEATS"
    )
    moved = store.put(replace(batch, cursor="c-1"), expect=1)
    assert (moved.version, moved.cursor) == (2, "c-1")
    with pytest.raises(ConditionFailedError):
        store.put(replace(batch, cursor="c-stale"), expect=1)  # read at version 1, moved on since
    assert store.get("b-1", consistent=True) == moved
    assert store.get("nope") is None


def test_a_page_is_claimed_once_and_settled_with_its_outcomes(store: BatchStore) -> None:
    batch = store.create(a_batch())  # type: ignore[arg-type]
    page = BatchPage("b-1", 1, ("wf-1", "wf-2"))
    claimed = store.claim(replace(batch, pages=1, cursor="c-1"), page)
    assert (claimed.version, claimed.pages) == (2, 1)
    # A second claim of page 1 (another run read the same version) writes nothing
    with pytest.raises(ConditionFailedError):
        store.claim(replace(batch, pages=1, cursor="c-other"), BatchPage("b-1", 1, ("wf-9",)))
    assert store.page("b-1", 1) == page
    assert store.get("b-1", consistent=True) == claimed
    outcomes = {"wf-1": "done", "wf-2": "refused: workflow is RUNNING: nothing to retry"}
    settled = store.settle(replace(claimed, settled=1, counts=Counts(2, 1, 1, 0)), replace(page, outcomes=outcomes))
    assert (settled.version, settled.counts) == (3, Counts(2, 1, 1, 0))
    assert [p.outcomes for p in store.pages("b-1")] == [outcomes]
    assert store.page("b-1", 1) is not None and store.page("b-1", 1).settled  # type: ignore[union-attr]
    assert store.page("b-1", 2) is None


def test_batches_are_listed_newest_first_a_page_at_a_time(store: BatchStore) -> None:
    for n in range(5):
        store.create(a_batch(f"b-{n}", now=1_000 + n))  # type: ignore[arg-type]
    first, cursor = store.list(3, None)
    assert [b.batch_id for b in first] == ["b-4", "b-3", "b-2"]
    rest, _ = store.list(3, cursor)
    assert [b.batch_id for b in rest] == ["b-1", "b-0"]


def test_a_batch_item_is_in_no_listing_of_workflows() -> None:
    with mock_aws():
        stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
        physical = provision(stack)
        client = boto3.client("dynamodb")
        store = DynamoDBBatchStore(physical["StateTable"], client)
        batch = store.create(a_batch())  # type: ignore[arg-type]
        store.claim(replace(batch, pages=1), BatchPage("b-1", 1, ("wf-1",)))
        from sasflow.adapters.dynamodb_store import DynamoDBStateStore

        index = DynamoDBStateStore(physical["StateTable"], client)
        finder = WorkflowFinder(index, 8)  # type: ignore[arg-type]
        for status in ("HELD", "PAUSED", "COMPLETED", "RUNNING", None):
            assert finder.find(status=status).workflows == [], status
