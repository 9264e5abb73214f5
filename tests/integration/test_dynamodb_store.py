"""The DynamoDB state store on the table template.yaml declares (moto): conditions, sparse index, sizes, lease."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws

from bench.accounting import item_size
from devstack.provision import provision
from devstack.template import Stack
from sasflow.adapters.dynamodb_store import DEADLINE_INDEX, DynamoDBStateStore, workflow_key
from sasflow.adapters.memory import InMemoryBus
from sasflow.clock import ManualClock
from sasflow.cost import Tally, ledger, meter
from sasflow.definition import parse_definition
from sasflow.errors import ConditionFailedError, LeaseNotAcquiredError, PayloadTooLargeError
from sasflow.messages import StepReply, canonical_hash, decode_request
from sasflow.records import deadline_shard
from sasflow.scheduler import SchedulerService
from sasflow.settings import AgentRoute, EngineConfig
from sasflow.states import Outcome, Phase, StepStatus
from sasflow.supervisor import SupervisorService
from tests.support.lambdas import ROOT
from tests.support.pipeline import ACTIONS, OWNER, TRIP_INPUT, trip_definition

START = 1_800_000_000.0


@dataclass
class Env:
    store: DynamoDBStateStore
    scheduler: SchedulerService
    supervisor: SupervisorService
    bus: InMemoryBus
    clock: ManualClock
    table: str


def build(max_overdue: int = 1000) -> Env:
    stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
    physical = provision(stack)
    config = EngineConfig(
        state_table=physical["StateTable"],
        response_queue_url=physical["ResponseQueue"],
        agents={agent: AgentRoute(queue_url=f"q/{agent}", actions=ACTIONS[agent]) for agent in ACTIONS},
        deadline_shards=8,
        max_overdue_per_sweep=max_overdue,
    )
    clock = ManualClock(START)
    store = DynamoDBStateStore(config.state_table, boto3.client("dynamodb"), shards=config.deadline_shards)
    scheduler = SchedulerService(store, clock, config, rng=random.Random(3))
    bus = InMemoryBus()
    return Env(
        store, scheduler, SupervisorService(store, bus, scheduler, clock, config), bus, clock, config.state_table
    )


@pytest.fixture
def env() -> Iterator[Env]:
    with mock_aws():
        yield build()


def start(env: Env, key: str | None = None) -> str:
    body = {"definition": trip_definition(), "input": TRIP_INPUT}
    result = env.scheduler.start_workflow(
        parse_definition(body["definition"]),
        TRIP_INPUT,
        request_hash=canonical_hash(body),
        owner=OWNER,
        idempotency_key=key,
    )
    return result.workflow.workflow_id


def index_items(table: str) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb")
    return list(client.scan(TableName=table, IndexName=DEADLINE_INDEX)["Items"])


def raw_item(env: Env, wid: str) -> dict[str, Any]:
    item = boto3.client("dynamodb").get_item(TableName=env.table, Key=workflow_key(wid), ConsistentRead=True)
    return dict(item["Item"])


def reply(wid: str, step: str, attempt: int = 1, output: Any = None) -> StepReply:
    return StepReply(
        workflow_id=wid,
        step=step,
        phase=Phase.ACTION,
        attempt=attempt,
        outcome=Outcome.SUCCEEDED,
        output=output if output is not None else {"confirmation": f"{step[:2].upper()}-123456"},
    )


def test_the_index_key_is_a_lower_bound_of_the_earliest_complete_by_as_an_integer_and_gone_when_terminal(
    env: Env,
) -> None:
    # Given a started trip: the workflow item carries its first step's complete-by as a DynamoDB Number
    wid = start(env)
    item = raw_item(env, wid)
    assert item["complete_by"] == {"N": str(int(START) + 30)}
    assert item["dl_shard"] == {"S": deadline_shard(wid, 8)}
    assert item["version"] == {"N": "1"}
    assert [(i["pk"]["S"], i["complete_by"]["N"]) for i in index_items(env.table)] == [
        (f"WF#{wid}", str(int(START) + 30))
    ]
    # When the flight completes 10 s later, the hotel is dispatched in the same write: the key stays where it is,
    # a lower bound of the hotel's complete-by, not yet overdue (records.index_key_for), and read back as such
    env.clock.advance(10)
    env.scheduler.on_reply(reply(wid, "reserve_flight"))
    assert raw_item(env, wid)["complete_by"] == {"N": str(int(START) + 30)}
    assert raw_item(env, wid)["version"] == {"N": "2"}
    loaded = env.store.load(wid)
    assert loaded is not None
    assert (loaded.stored_key, loaded.deadline) == (int(START) + 30, int(START) + 40)
    # When 61 s have passed, that key is overdue by the grace (30 s): the next write stores the true key
    env.clock.advance(51)
    env.scheduler.on_reply(reply(wid, "book_hotel"))
    assert raw_item(env, wid)["complete_by"] == {"N": str(int(START) + 61 + 30)}
    # Then once the workflow is terminal it leaves the index and gets its TTL
    env.scheduler.on_reply(reply(wid, "charge_card"))
    final = raw_item(env, wid)
    assert final["status"] == {"S": "COMPLETED"}
    assert "complete_by" not in final and "dl_shard" not in final
    assert final["expires_at"] == {"N": str(int(START) + 61 + 30 * 86_400)}
    assert index_items(env.table) == []


def test_a_three_step_trip_stays_under_1_kb_so_each_write_costs_one_write_unit(env: Env) -> None:
    # DynamoDB bills a write per started 1 KB of the larger of the old and new item (Developer Guide, "Item sizes
    # and formats"); the definition lives in its own item, the step inputs are not stored.
    wid = start(env)
    sizes = [item_size(raw_item(env, wid))]
    for step in ("reserve_flight", "book_hotel", "charge_card"):
        env.scheduler.on_reply(reply(wid, step))
        sizes.append(item_size(raw_item(env, wid)))
    assert max(sizes) < 1024, sizes
    assert sizes == sorted(sizes)  # grows with each output, never shrinks until TTL


def test_each_write_adds_its_write_units_and_index_moves_to_the_cost_on_the_item(env: Env) -> None:
    # Given a trip started (its item put, and its deadline index entry) and its three replies applied
    wid = start(env)
    costs = [env.store.load(wid).cost.wru]  # type: ignore[union-attr]
    for step in ("reserve_flight", "book_hotel", "charge_card"):
        env.scheduler.on_reply(reply(wid, step))
        costs.append(env.store.load(wid).cost.wru)  # type: ignore[union-attr]
    # Then each write added what DynamoDB bills for it: 1 WRU (under 1 KB) + 1 for the index entry put at the start;
    # the index key is kept on the first two replies (a lower bound, nothing projected changed) and removed at the end
    assert costs == [2, 3, 4, 6]
    stored = raw_item(env, wid)
    assert len(stored["cost"]["B"]) == 45
    # And the request hash is stored as its 32 bytes, read back as the hex the engine compares
    assert len(stored["request_hash"]["B"]) == 32
    assert env.store.load(wid).workflow.request_hash == canonical_hash(  # type: ignore[union-attr]
        {"definition": trip_definition(), "input": TRIP_INPUT}
    )


def test_the_line_of_a_workflows_end_carries_its_definition_and_cost(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a trip run to its end
    wid = start(env)
    caplog.clear()  # the start's line, if the level already let it through
    with caplog.at_level(logging.INFO, logger="sasflow.scheduler"):
        for step in ("reserve_flight", "book_hotel", "charge_card"):
            env.scheduler.on_reply(reply(wid, step))
    moved = [r for r in caplog.records if r.getMessage() == "moved"]
    # Then only the last line (RUNNING > COMPLETED) has them: what the template's metric filters read
    assert [getattr(r, "to", None) for r in moved] == [None, None, "COMPLETED"]
    end = moved[-1]
    assert end.definition == "trip-booking"  # type: ignore[attr-defined]
    stored = env.store.load(wid)
    assert stored is not None and end.cost == float(f"{stored.cost.dollars():.3g}") > 0  # type: ignore[attr-defined]
    assert not any(hasattr(r, "cost") for r in moved[:-1])


def test_an_item_written_before_the_tally_reads_with_its_hex_hash_and_no_cost(env: Env) -> None:
    # Given an item as the engine wrote it before 2026-12-07: its request hash in hex, no cost
    wid = start(env)
    client = boto3.client("dynamodb")
    digest = "ab" * 32
    client.update_item(
        TableName=env.table,
        Key=workflow_key(wid),
        UpdateExpression="SET request_hash = :h REMOVE #c",
        ExpressionAttributeNames={"#c": "cost"},
        ExpressionAttributeValues={":h": {"S": digest}},
    )
    # When it is read, and written again
    old = env.store.load(wid)
    assert old is not None and old.workflow.request_hash == digest and old.cost == Tally()
    env.scheduler.on_reply(reply(wid, "reserve_flight"))
    # Then the hash is kept (as bytes now) and the cost starts with this write
    again = env.store.load(wid)
    assert again is not None and again.workflow.request_hash == digest and again.cost.wru == 1


def test_a_lost_conditional_write_is_billed_to_the_next_write_of_its_workflow(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    env.store.save(snapshot, expect=snapshot)  # version 2
    with pytest.raises(ConditionFailedError):
        env.store.save(snapshot, expect=snapshot)  # a stale writer: DynamoDB bills its write all the same
    owed = ledger().take(wid)
    assert owed.wru == 1


def test_a_metered_client_charges_a_read_to_the_workflow_it_reads() -> None:
    with mock_aws():
        env = build()
        wid = start(env)
        store = DynamoDBStateStore(env.table, meter(boto3.client("dynamodb")), shards=8)
        ledger().take(wid)
        store.load(wid, consistent=False)  # under 4 KB, eventually consistent: half a read unit
        # and the definition's item, read once by a store (strongly consistent): the work in hand's, taken with it
        assert ledger().take(wid) == Tally(rru=0.5 + 1)
        store.load(wid)
        assert ledger().take(wid) == Tally(rru=1)


def test_wrong_typed_deadline_keys_are_refused_before_dynamodb(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    with pytest.raises(TypeError, match="complete_by of reserve_flight must be int"):
        env.store.save(snapshot.with_step(record.evolve(complete_by=str(record.complete_by))), expect=snapshot)
    with pytest.raises(ValueError, match="milliseconds"):
        env.store.save(snapshot.with_step(record.evolve(complete_by=int(START * 1000))), expect=snapshot)
    again = env.store.load(wid)
    assert again == snapshot


def test_a_stale_version_loses_the_conditional_write(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    assert record.complete_by is not None
    moved = env.store.save(
        snapshot.with_step(record.evolve(attempt=2, complete_by=record.complete_by + 60)), expect=snapshot
    )
    assert moved.version == 2
    done = record.evolve(status=StepStatus.COMPLETED, complete_by=None)
    with pytest.raises(ConditionFailedError, match="changed since version 1"):
        env.store.save(snapshot.with_step(done), expect=snapshot)
    with pytest.raises(ConditionFailedError, match="exists"):
        env.store.create(snapshot)
    assert env.store.load(wid) == moved


def test_an_item_over_400_kb_is_refused_and_nothing_is_written(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    done = record.evolve(status=StepStatus.COMPLETED, complete_by=None, output={"blob": "x" * 410_000})
    with pytest.raises(PayloadTooLargeError, match="limit is 409600 bytes"):
        env.store.save(snapshot.with_step(done), expect=snapshot)
    assert env.store.load(wid) == snapshot


def test_a_definition_is_stored_once_and_read_once_per_store(env: Env) -> None:
    # Given 3 workflows of one definition
    ids = [start(env) for _ in range(3)]
    client = boto3.client("dynamodb")
    items = client.scan(TableName=env.table, ConsistentRead=True)["Items"]
    definitions = [i for i in items if i["pk"]["S"].startswith("DEF#")]
    # Then one definition item holds it, and each workflow names it
    content_id = parse_definition(trip_definition()).content_id
    assert [i["pk"]["S"] for i in definitions] == [f"DEF#{content_id}"]
    assert {raw_item(env, wid)["definition_id"]["S"] for wid in ids} == {content_id}
    # When a fresh store (a new Lambda sandbox) loads two of them
    fresh = DynamoDBStateStore(env.table, client, shards=8)
    calls: list[str] = []
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    loaded = [fresh.load(wid) for wid in ids[:2]]
    # Then it read the definition item once
    assert calls == ["GetItem", "GetItem", "GetItem"]
    assert [s.workflow.definition.content_id for s in loaded if s] == [content_id, content_id]


def test_the_lease_is_exclusive_until_it_expires_and_its_fencing_token_grows(env: Env) -> None:
    now = int(START)
    assert env.store.acquire_lease("supervisor", "a", now, 50) == 1
    with pytest.raises(LeaseNotAcquiredError):
        env.store.acquire_lease("supervisor", "b", now + 10, 50)
    assert env.store.acquire_lease("supervisor", "b", now + 51, 50) == 2
    env.store.release_lease("supervisor", "b", now + 52)
    assert env.store.acquire_lease("supervisor", "a", now + 52, 50) == 3


def test_a_sweep_of_250_overdue_workflows_follows_every_page_and_resends_each_once() -> None:
    with mock_aws():
        env = build(max_overdue=100)
        ids = [start(env) for _ in range(250)]
        env.clock.advance(30 + 30 + 1)
        # When three capped runs sweep (100 per run)
        reports = [env.supervisor.sweep() for _ in range(3)]
        # Then each step was resent exactly once, across runs, and no run read more than its cap
        assert [r.overdue for r in reports] == [100, 100, 50]
        assert [r.complete for r in reports] == [False, False, True]
        sent = [decode_request(m.body) for m in env.bus.queues["q/flights"]]
        assert sorted(r.workflow_id for r in sent) == sorted(ids)
        assert {r.attempt for r in sent} == {2}
        for wid in ids[:5]:
            snapshot = env.store.load(wid)
            assert snapshot is not None
            assert (snapshot.steps["reserve_flight"].attempt, snapshot.steps["reserve_flight"].resends) == (2, 1)
        assert env.supervisor.sweep().overdue == 0


def test_an_output_that_would_overflow_the_workflow_record_fails_its_step_which_is_then_compensated(env: Env) -> None:
    # Given the flight's output, 250,000 bytes, already fills most of the workflow's 400 KB record
    wid = start(env)
    big = {"blob": "x" * 250_000, "confirmation": "FL-1"}
    assert [m.queue_url for m in env.scheduler.on_reply(reply(wid, "reserve_flight", output=big))] == ["q/hotels"]
    # When the hotel answers with 250,000 bytes as well (each reply fits in an SQS message, both do not fit the item)
    messages = env.scheduler.on_reply(reply(wid, "book_hotel", output=big))
    # Then the hotel step failed as OUTPUT_TOO_LARGE, its outcome unknown, and the workflow compensates it first
    snapshot = env.store.load(wid)
    assert snapshot is not None
    hotel = snapshot.steps["book_hotel"]
    assert (hotel.status, hotel.may_have_happened, hotel.output) == (StepStatus.COMPENSATING, True, None)
    assert hotel.error is not None and hotel.error["code"] == "OUTPUT_TOO_LARGE"
    assert snapshot.workflow.status.value == "COMPENSATING"
    assert snapshot.workflow.reason == "step book_hotel failed: OUTPUT_TOO_LARGE"
    assert [decode_request(m.body).action for m in messages] == ["cancel_booking"]
    assert snapshot.steps["reserve_flight"].output == big


def test_current_re_reads_summaries_from_the_items_in_chunks_of_100_and_leaves_out_missing_ids(env: Env) -> None:
    # Given 120 started workflows (two BatchGetItem requests: 100 keys is its limit), one of them completed since
    ids = [start(env) for _ in range(120)]
    for step in ("reserve_flight", "book_hotel", "charge_card"):
        env.scheduler.on_reply(reply(ids[7], step))
    # When their summaries are re-read, with an id that does not exist among them
    found = env.store.current([*ids, "no-such-workflow"])
    # Then each is as its item is now, the missing id left out
    assert sorted(found) == sorted(ids)
    assert found[ids[7]].status == "COMPLETED" and found[ids[7]].complete_by is None
    assert found[ids[0]].status == "RUNNING" and found[ids[0]].complete_by == int(START) + 30
    assert (found[ids[0]].definition_name, found[ids[0]].created_at) == ("trip-booking", int(START))


def test_a_listings_re_read_asks_dynamodb_for_strongly_consistent_items_and_load_many_does_not(env: Env) -> None:
    # Given two workflows, and every BatchGetItem the store sends recorded as DynamoDB receives its parameters
    ids = [start(env), start(env)]
    sent: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        sent.append(params["RequestItems"][env.table])

    env.store.client.meta.events.register("provide-client-params.dynamodb.BatchGetItem", record)
    # When a listing's page is re-read, and a map step's children are loaded
    assert sorted(env.store.current(ids)) == sorted(ids)
    assert sorted(env.store.load_many(ids)) == sorted(ids)
    # Then the re-read is strongly consistent (the indexes lag their table; the items do not), only the summary's
    # attributes are asked for, and load_many keeps BatchGetItem's default (eventually consistent, half the cost)
    reread, loaded = sent
    assert reread["ConsistentRead"] is True
    assert "ProjectionExpression" in reread
    assert "ConsistentRead" not in loaded
