"""bench.sweep: one small sweep-scaling run with the real supervisor over moto, and the moto speed-up on its own."""

from __future__ import annotations

import uuid

import boto3
from moto import mock_aws
from moto.dynamodb.models import dynamodb_backends

from bench.sweep import _moto_item_order_by_strings, measure_sweep


def test_a_sweep_reads_exactly_the_overdue_entries_and_resends_them() -> None:
    # Given 200 finished steps and 3 overdue ones in the state table
    # When one supervisor sweep is measured
    rows, raw = measure_sweep(sizes=(200,), overdue=3)

    # Then the table held what was asked: 67 trips (the last with 2 of its 3 steps), 3 stuck trips, 1 definition
    counts = raw["sizes"]["200"]
    assert counts["finished_steps"] == 200
    assert counts["items_in_table"] == 67 + 3 + 1
    assert counts["index_entries"] == 3  # the stuck workflows; finished ones are not in the index
    # and the sweep read the 3 overdue index entries and nothing else, with one page per shard
    assert counts["index_items_read"] == 3
    assert counts["index_items_returned"] == 3
    # (and one page of the tenants' queues' shard, TQ: empty, read every sweep: tenancy.py)
    assert counts["index_pages"] == counts["shards"] + 1 == 9
    # and resent the 3 steps
    assert counts["messages"] == 3
    assert counts["sweep_report"] == {"overdue": 3, "messages": 3, "pages": 8}
    # and handling them read each stuck workflow's one item (and, once, the definition they share)
    assert counts["handling_items_read"] == 3 + 1
    assert counts["handling_items_read_by_operation"] == {"GetItem": 4}
    assert counts["calls"]["GetItem"] == 4
    assert "Query" not in counts["calls"]
    # and the rows: items read / overdue is exactly 1, within the target; the handling row has no target
    index_row, handling_row = rows
    assert (index_row.ours, index_row.anchor, index_row.ratio) == (3, 3, 1.0)
    assert (index_row.target, index_row.met) == ("<= 1.05", True)  # the verdict on each side: test_report.py
    assert (handling_row.ours, handling_row.anchor) == (4, 3)
    assert handling_row.met is None


def test_the_moto_speed_up_keeps_motos_own_order_of_items() -> None:
    # Given a table keyed by strings, with keys that sort differently as strings and as insertion order
    with mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        client.create_table(
            TableName=f"t-{uuid.uuid4().hex[:8]}",
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            BillingMode="PAY_PER_REQUEST",
        )
        name = client.list_tables()["TableNames"][0]
        for pk in ("WF#b", "WF#a", "LEASE#x", "WF#a0", "é", "Z"):
            for sk in ("STEP#z", "#WF", "STEP#a", "STEP#B"):
                client.put_item(TableName=name, Item={"pk": {"S": pk}, "sk": {"S": sk}})
        table = dynamodb_backends["123456789012"]["us-east-1"].get_table(name)

        def keys() -> list[tuple[str, str]]:
            return [(item.hash_key.value, item.range_key.value) for item in table.all_items()]

        # When the items are listed with and without the speed-up
        motos = keys()
        with _moto_item_order_by_strings():
            fast = keys()

    # Then the order is the same
    assert fast == motos
    assert len(motos) == 24
