"""The triggers' items, on DynamoDB (the table template.yaml declares, in moto) and in memory, kept to one contract:
the slot and the waiting tick move by conditional writes only."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from devstack.provision import provision
from devstack.template import Stack
from sasflow.adapters.memory import InMemoryTriggerStore
from sasflow.adapters.trigger_dynamodb import DynamoDBTriggerStore
from sasflow.ports import Outgoing, TriggerStore
from sasflow.triggers import SlotTakenError
from tests.support.lambdas import ROOT

NAME = "hourly-trip"


@pytest.fixture(params=["dynamodb", "memory"])
def store(request: pytest.FixtureRequest) -> Iterator[TriggerStore]:
    if request.param == "memory":
        yield InMemoryTriggerStore()
        return
    with mock_aws():
        stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
        physical = provision(stack)
        yield DynamoDBTriggerStore(physical["StateTable"], boto3.client("dynamodb"))


def test_the_slot_is_taken_only_from_the_holder_that_was_read(store: TriggerStore) -> None:
    store.claim(NAME, "wf-1", 100, expect=None, buffered=None)
    with pytest.raises(SlotTakenError):
        store.claim(NAME, "wf-2", 101, expect=None, buffered=None)  # read free, taken since
    with pytest.raises(SlotTakenError):
        store.claim(NAME, "wf-2", 101, expect="wf-0", buffered=None)  # read another holder
    state = store.state(NAME, consistent=True)
    assert (state.running, state.running_since) == ("wf-1", 100)
    store.claim(NAME, "wf-2", 102, expect="wf-1", buffered=None)  # the holder read (it has ended): taken over
    assert store.state(NAME, consistent=True).running == "wf-2"


def test_one_tick_waits_and_the_give_back_answers_it_until_its_own_claim_takes_it(store: TriggerStore) -> None:
    store.claim(NAME, "wf-1", 100, expect=None, buffered=None)
    assert store.buffer(NAME, '{"buffered": 1}', "queue/hourly-trip") is True
    assert store.buffer(NAME, '{"buffered": 2}', "queue/hourly-trip") is False  # the buffer is full
    assert store.state(NAME, consistent=True).buffered == 1
    assert store.release(NAME, "wf-0") is None  # not the holder: nothing moves
    assert store.state(NAME, consistent=True).running == "wf-1"
    assert store.release(NAME, "wf-1") == Outgoing("queue/hourly-trip", '{"buffered": 1}')
    # a give-back made again (its first send may be lost) answers the waiting tick again
    assert store.release(NAME, "wf-1") == Outgoing("queue/hourly-trip", '{"buffered": 1}')
    with pytest.raises(SlotTakenError):
        store.claim(NAME, "wf-2", 103, expect=None, buffered='{"buffered": 2}')  # not the tick that waits
    store.claim(NAME, "wf-2", 103, expect=None, buffered='{"buffered": 1}')
    state = store.state(NAME, consistent=True)
    assert (state.running, state.waiting, state.waiting_queue) == ("wf-2", None, None)
    with pytest.raises(SlotTakenError):  # a second delivery of the waiting tick finds it gone
        store.claim(NAME, "wf-2", 104, expect="wf-2", buffered='{"buffered": 1}')
    assert store.release(NAME, "wf-2") is None


def test_counts_and_the_pause_live_beside_the_slot(store: TriggerStore) -> None:
    store.claim(NAME, "wf-1", 100, expect=None, buffered=None)
    for what in ("skipped", "skipped", "missed", "buffered"):
        store.count(NAME, what)
    store.pause(NAME, "ops", "migration", 200)
    state = store.state(NAME, consistent=True)
    assert (state.skipped, state.missed, state.buffered, state.paused_by, state.running) == (2, 1, 1, "ops", "wf-1")
    with pytest.raises(ValueError, match="unknown trigger count"):
        store.count(NAME, "started")
