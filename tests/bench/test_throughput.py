"""bench.throughput: a very small throughput run on the local stack, and the call recorder on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moto import mock_aws

from bench.throughput import TARGET_RATIO, CallRecorder, measure_throughput, read_calls, record_calls, uncounted


def test_a_small_run_counts_the_products_calls_and_replays_them_for_the_ceiling(tmp_path: Path) -> None:
    # Given the local stack, warm, and 3 trip bookings of 3 steps each, without faults
    # When the throughput is measured
    rows, raw = measure_throughput(3, warmup_workflows=0, log_dir=tmp_path / "logs")

    # Then every step completed and the product's calls were counted where they are made
    assert raw["steps"] == 9
    calls = raw["calls"]
    for key in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"):
        assert calls.get(key, 0) > 0, key
    for key in ("sqs:SendMessageBatch", "sqs:ReceiveMessage", "sqs:DeleteMessageBatch"):
        assert calls.get(key, 0) > 0, key
    assert "dynamodb:TransactWriteItems" not in calls
    api = raw["calls_by_function"]["ApiFunction"]
    # One write-ahead write per start, and the definition once per API sandbox that had not seen it stored (the
    # local stack runs up to 2 workers per function, and both may look before either writes)
    assert 3 + 1 <= api["dynamodb:PutItem"] <= 3 + 2
    assert raw["calls_by_function"]["SchedulerFunction"]["dynamodb:PutItem"] == 9  # one write per reply
    assert set(raw["calls_by_function"]) >= {"SchedulerFunction", "FlightsAgentFunction", "PaymentsAgentFunction"}
    assert raw["calls_total"] == sum(calls.values())
    # and the replay made the same calls without errors and the same messages went through the queues
    replay = raw["replay"]
    assert replay["calls"] + replay["skipped"] == raw["calls_total"]
    # (a conditional write that lost in the run, such as two API sandboxes storing one new definition, loses again)
    assert replay["errors"] == raw["product_errors"]
    assert replay["received"] == 9 + 9  # 9 step requests, 9 replies
    # and the rows carry the figures: ratio = ours / anchor, against the target
    speed, requests = rows
    assert speed.ours == pytest.approx(raw["steps"] / raw["elapsed_seconds"])
    assert speed.anchor == pytest.approx(raw["steps"] / raw["ceiling_seconds"])
    assert speed.ratio == pytest.approx(speed.ours / speed.anchor)
    assert raw["ratio"] == pytest.approx(speed.ratio)
    assert speed.target == f">= {TARGET_RATIO:g}"
    assert speed.met == (speed.ratio >= TARGET_RATIO)
    assert requests.ours == pytest.approx(raw["calls_total"] / 9)
    assert requests.ratio is None


def test_the_recorder_writes_one_line_per_call_and_skips_clients_made_uncounted(tmp_path: Path) -> None:
    import boto3

    # Given a queue in moto, a client that is recorded and one made under uncounted()
    with mock_aws(), record_calls(tmp_path):
        counted = boto3.client("sqs", region_name="us-east-1")
        with uncounted():
            ignored = boto3.client("sqs", region_name="us-east-1")
        url = ignored.create_queue(QueueName="bench-recorder")["QueueUrl"]

        # When each sends a batch and the recorded one receives twice (the second time the queue is empty)
        counted.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "a"}, {"Id": "2", "MessageBody": "b"}]
        )
        ignored.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "c"}])
        counted.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        counted.receive_message(QueueUrl=url, MaxNumberOfMessages=10)

    # Then only the recorded client's calls are in the file, with their parameters, in the order they ended
    calls = read_calls(tmp_path)
    assert [call.key for call in calls] == ["sqs:SendMessageBatch", "sqs:ReceiveMessage", "sqs:ReceiveMessage"]
    assert calls[0].params["Entries"][1]["MessageBody"] == "b"
    assert [call.received for call in calls[1:]] == [3, 0]
    assert [call.idle for call in calls] == [False, False, True]
    assert all(call.error is None and call.seconds >= 0 for call in calls)


def test_a_line_cut_short_by_a_killed_worker_is_skipped(tmp_path: Path) -> None:
    # Given a call file whose last line was cut short
    recorder = CallRecorder(tmp_path)
    recorder.close()
    line = {
        "started": 1.0,
        "seconds": 0.5,
        "service": "dynamodb",
        "operation": "GetItem",
        "error": None,
        "received": None,
        "retries": 0,
        "cpu": 0.1,
        "params": {"TableName": "t", "Data": {"__bytes__": "AAE="}},
    }
    recorder.path.write_text(json.dumps(line) + "\n" + json.dumps(line)[:40])

    # When it is read
    calls = read_calls(tmp_path)

    # Then the whole line is read (bytes restored) and the cut one skipped
    assert len(calls) == 1
    assert calls[0].params["Data"] == b"\x00\x01"
    assert calls[0].ended == 1.5
