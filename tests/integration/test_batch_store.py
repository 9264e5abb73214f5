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


class Throttling:
    """A DynamoDB client whose BatchGetItem leaves the last key of each call unprocessed ``stubborn`` times."""

    def __init__(self, client: object, stubborn: int) -> None:
        self.client = client
        self.stubborn = stubborn
        self.calls: list[int] = []

    def batch_get_item(self, RequestItems: dict) -> dict:  # noqa: N803 (boto3's parameter name)
        [(table, request)] = RequestItems.items()
        keys = request["Keys"]
        self.calls.append(len(keys))
        if self.stubborn and len(keys) > 0:
            self.stubborn -= 1
            served = {table: {**request, "Keys": keys[:-1]}}
            answer = self.client.batch_get_item(RequestItems=served) if len(keys) > 1 else {"Responses": {}}  # type: ignore[attr-defined]
            return {**answer, "UnprocessedKeys": {table: {"Keys": keys[-1:]}}}
        return self.client.batch_get_item(RequestItems=RequestItems)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)


def test_a_listing_reads_its_batches_in_one_call_and_asks_again_for_keys_left_unprocessed() -> None:
    from sasflow.adapters import batch_get
    from sasflow.adapters.batch_dynamodb import batch_key

    with mock_aws():
        stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
        table = provision(stack)["StateTable"]
        client = boto3.client("dynamodb")
        for n in range(5):
            DynamoDBBatchStore(table, client).create(a_batch(f"b-{n}", now=1_000 + n))  # type: ignore[arg-type]
        # A listing of 5 batches is one BatchGetItem, and a key DynamoDB left unprocessed is asked for again
        throttled = Throttling(client, stubborn=1)
        listed, _ = DynamoDBBatchStore(table, throttled).list(5, None)  # type: ignore[arg-type]
        assert [b.batch_id for b in listed] == ["b-4", "b-3", "b-2", "b-1", "b-0"]
        assert throttled.calls == [5, 1]
        # A key still unprocessed after every round is given back to the caller, not dropped silently
        stubborn = Throttling(client, stubborn=3)
        items, left = batch_get(stubborn, table, [batch_key("b-0"), batch_key("b-1")], rounds=3)
        assert stubborn.calls == [2, 1, 1]
        assert ([i["pk"]["S"] for i in items], left) == (["BATCH#b-0"], [batch_key("b-1")])
        # 250 keys are three calls: 100 keys each at most
        counting = Throttling(client, stubborn=0)
        items, left = batch_get(counting, table, [batch_key(f"b-{n}") for n in range(250)], rounds=3)
        assert (counting.calls, len(items), left) == ([100, 100, 50], 5, [])
