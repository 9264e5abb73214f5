"""sasflow.triggers, an s3 trigger: one workflow per upload (the object's key and version id, or its ETag and
sequencer), its key decoded from the notification's URL encoding, S3's test event starting nothing, and a paused
trigger holding its uploads."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_plus

import pytest

from sasflow.adapters.memory import InMemoryTriggerStore
from sasflow.triggers import (
    HOLD_SECONDS,
    Message,
    TriggerConfig,
    TriggerRefusedError,
    TriggerService,
    occurrence_of,
    occurrences_of,
)
from tests.support.pipeline import Pipeline

QUEUE = "queue/trip-uploads"
DEAD_LETTERS = "queue/trip-uploads-dlq"
PRINCIPAL = "trigger:trip-uploads"
BUCKET = "3f9c2d1e-triprequestsbucket"
#: What a trip's workflow needs, from the upload (a real definition's first step would read the object).
TRIP_INPUT = {"traveller.$": "key", "route": "LHR-JFK", "amount.$": "size"}


def config(**changes: Any) -> TriggerConfig:
    document = {
        "name": "trip-uploads",
        "kind": "s3",
        "definition": "trip",
        "input": TRIP_INPUT,
        "queue_url": QUEUE,
        "dead_letter_url": DEAD_LETTERS,
    }
    return TriggerConfig.model_validate({**document, **changes})


def record(key: str, *, version: str | None = "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY", **changes: Any) -> dict[str, Any]:
    """One record of an S3 event notification as S3 sends it to SQS: the key URL-encoded, a space as ``+``."""
    found: dict[str, Any] = {"key": quote_plus(key), "size": 1024, "eTag": "d41d8cd98f00b204e9800998ecf8427e"}
    found["sequencer"] = changes.pop("sequencer", "0055AED6DCD90281E5")
    if version is not None:
        found["versionId"] = version
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": "2026-12-06T09:00:00.000Z",
        "eventName": changes.pop("event", "ObjectCreated:Put"),
        "s3": {
            "s3SchemaVersion": "1.0",
            "configurationId": "trip-uploads",
            "bucket": {"name": BUCKET},
            "object": found,
        },
    }


def notification(*records: dict[str, Any]) -> str:
    return json.dumps({"Records": list(records)})


MESSAGE = Message("m-1", 1_796_547_600_000)


@pytest.fixture
def pipeline() -> Pipeline:
    pipeline = Pipeline()
    pipeline.publish("trip")
    # a definition whose first step reads the object the upload names (its input left as the trigger gives it)
    pipeline.publish("ingest", reserve_flight={"input": {"traveller.$": "input.key", "route.$": "input.bucket"}})
    return pipeline


def service(pipeline: Pipeline, items: InMemoryTriggerStore | None = None, **changes: Any) -> TriggerService:
    return pipeline.trigger(config(**changes), PRINCIPAL, items or InMemoryTriggerStore())


@pytest.mark.parametrize(
    "key",
    [
        "requests/ada lovelace.json",  # a space: "+" in the notification
        "requests/a+b.json",  # a plus: "%2B"
        "requests/été 日本.json",  # unicode: percent-encoded UTF-8
        "requests/50% off.json",  # a percent: "%25"
        "requests/%41 not an A.json",  # what looks encoded already is the key as it is
    ],
)
def test_the_input_carries_the_key_decoded_from_the_notification(key: str) -> None:
    [upload] = occurrences_of(config(input=None), notification(record(key)), MESSAGE)
    assert upload.document["key"] == key
    assert upload.identity == f"object {BUCKET}/{key} version 3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"


def test_an_upload_starts_one_workflow_whose_default_input_names_the_object_and_a_copy_starts_nothing(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline, input=None, definition="ingest")
    key = "requests/ada lovelace.json"
    first = trigger.handle(occurrence_of(trigger.config, notification(record(key)), MESSAGE))
    # S3 may send a notification twice, and SQS may deliver it twice: the same upload
    again = trigger.handle(occurrence_of(trigger.config, notification(record(key)), Message("m-2")))
    # the same key uploaded again is another version: another workflow
    other = trigger.handle(occurrence_of(trigger.config, notification(record(key, version="v2")), MESSAGE))
    assert first.created and (again.workflow_id, again.created) == (first.workflow_id, False)
    assert other.created and other.workflow_id != first.workflow_id
    workflow = pipeline.snapshot(first.workflow_id).workflow
    assert workflow.trigger.occurrence == f"object {BUCKET}/{key} version 3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"
    # the object is read by the steps, never copied into the item: its name, size, ETag and version
    assert workflow.input == {
        "bucket": BUCKET,
        "key": key,
        "size": 1024,
        "etag": "d41d8cd98f00b204e9800998ecf8427e",
        "version_id": "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY",
    }


def test_an_unversioned_upload_is_named_by_its_etag_and_sequencer_and_one_with_neither_is_refused() -> None:
    [upload] = occurrences_of(config(), notification(record("k.json", version=None)), MESSAGE)
    assert (
        upload.identity == f"object {BUCKET}/k.json etag d41d8cd98f00b204e9800998ecf8427e sequencer 0055AED6DCD90281E5"
    )
    [later] = occurrences_of(
        config(), notification(record("k.json", version=None, sequencer="0055AED6DCD90281F0")), MESSAGE
    )
    assert later.identity != upload.identity  # the same content uploaded again is another upload
    bare = record("k.json", version=None)
    del bare["s3"]["object"]["sequencer"]
    with pytest.raises(TriggerRefusedError, match="names no version id, nor an ETag and a sequencer") as refused:
        occurrences_of(config(), notification(bare), MESSAGE)
    assert refused.value.code == "MALFORMED_OCCURRENCE"


def test_s3s_test_event_starts_nothing_and_is_no_refusal() -> None:
    test_event = {"Service": "Amazon S3", "Event": "s3:TestEvent", "Time": "2026-12-06T09:00:00.000Z", "Bucket": BUCKET}
    assert occurrences_of(config(), json.dumps(test_event), MESSAGE) == []


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("not json", "not JSON"),
        ('{"Records": []}', "names no Records"),
        ('{"hello": 1}', "names no Records"),
        (notification(record("k.json", event="ObjectRemoved:Delete")), "ObjectRemoved:Delete: an s3 trigger starts on"),
        ('{"Records": [{"eventName": "ObjectCreated:Put"}]}', "names no eventName, eventTime, bucket and object key"),
    ],
)
def test_a_message_that_is_not_an_upload_is_refused_as_malformed_naming_the_notification(body: str, why: str) -> None:
    with pytest.raises(TriggerRefusedError, match=why) as refused:
        occurrences_of(config(), body, MESSAGE)
    assert refused.value.code == "MALFORMED_OCCURRENCE"
    assert "check the bucket's notification configuration" in str(refused.value)


def test_each_upload_of_a_notification_is_its_own_occurrence_and_refusal(pipeline: Pipeline) -> None:
    trigger = service(pipeline, input={"traveller.$": "key", "route": "LHR-JFK", "amount.$": "size"})
    bad = record("requests/no-size.json")
    del bad["s3"]["object"]["size"]  # the input reads size: this one is refused, the other starts
    uploads = occurrences_of(trigger.config, notification(record("requests/a.json"), bad), MESSAGE)
    assert [json.loads(u.raw or "")["Records"][0]["s3"]["object"]["key"] for u in uploads] == [
        "requests%2Fa.json",
        "requests%2Fno-size.json",
    ]
    assert trigger.handle(uploads[0]).created
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(uploads[1])
    assert refused.value.code == "INVALID_INPUT" and "fix the trigger's input in triggers.yaml" in str(refused.value)
    trigger.refuse(uploads[1].raw or "", refused.value, "m-1", MESSAGE)
    [dead] = pipeline.bus.peek(DEAD_LETTERS)
    # the dead letter is that upload alone: redriven, it is the same occurrence
    [again] = trigger.read(dead.body, Message("moved"))
    assert again.identity == uploads[1].identity


def test_an_upload_a_notification_cannot_name_is_refused_alone_and_the_others_of_it_start(pipeline: Pipeline) -> None:
    """Found by a trial: an upload outside the trigger's keys in a notification of two refused both, the good one
    under the bad one's reason, and a redrive refused it again (it could never start)."""
    trigger = service(pipeline, bucket=BUCKET, prefix="requests/")
    uploads = occurrences_of(trigger.config, notification(record("requests/a.json"), record("nope/b.json")), MESSAGE)
    assert trigger.handle(uploads[0]).created
    with pytest.raises(TriggerRefusedError, match=r"nope/b\.json is not one of the keys") as refused:
        trigger.handle(uploads[1])
    trigger.refuse(uploads[1].raw or "", refused.value, "m-1", MESSAGE)
    [dead] = pipeline.bus.peek(DEAD_LETTERS)
    # the dead letter is the refused upload alone: redriven, it is refused again, and the started one is not touched
    with pytest.raises(TriggerRefusedError, match=r"nope/b\.json"):
        trigger.read(dead.body, Message("moved"))
    assert len(pipeline.store.workflows) == 1


def test_a_paused_trigger_holds_its_uploads_and_starts_them_after_the_resume(pipeline: Pipeline) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items)
    items.pause("trip-uploads", "ada", "bucket migration", 100)
    upload = occurrence_of(trigger.config, notification(record("requests/ada.json")), MESSAGE)
    held = trigger.handle(upload)
    assert held.held and pipeline.store.workflows == {}
    [back] = pipeline.bus.peek(QUEUE)
    assert back.delay_seconds == HOLD_SECONDS
    items.resume("trip-uploads")
    pipeline.clock.advance(HOLD_SECONDS)
    [due] = pipeline.bus.receive(QUEUE)
    [again] = trigger.read(due.body, Message("held-copy"))
    assert again.identity == upload.identity
    started = trigger.handle(again)
    assert started.created
    assert pipeline.snapshot(started.workflow_id).workflow.input["traveller"] == "requests/ada.json"
    assert items.state("trip-uploads").held == 1  # counted on the trigger's item (sasflow triggers list: held)


@pytest.mark.parametrize(
    ("changes", "body", "why"),
    [
        # a notification configured on another bucket, or without the trigger's filter, sends what it does not watch
        (
            {"bucket": "other-bucket"},
            notification(record("requests/a.json")),
            "trigger trip-uploads watches bucket other-bucket; the notification configuration of that other bucket",
        ),
        (
            {"bucket": BUCKET, "prefix": "requests/"},
            notification(record("archive/a.json")),
            "is not one of the keys requests/\\* trigger trip-uploads watches",
        ),
        (
            {"bucket": BUCKET, "suffix": ".json"},
            notification(record("requests/a.csv")),
            "is not one of the keys \\*.json",
        ),
    ],
)
def test_an_upload_of_another_bucket_or_of_keys_the_trigger_does_not_watch_is_refused(
    changes: dict[str, Any], body: str, why: str
) -> None:
    with pytest.raises(TriggerRefusedError, match=why) as refused:
        occurrences_of(config(**changes), body, MESSAGE)
    assert refused.value.code == "MALFORMED_OCCURRENCE"
    # the bucket and keys it watches start
    [upload] = occurrences_of(
        config(bucket=BUCKET, prefix="requests/", suffix=".json"), notification(record("requests/a.json")), MESSAGE
    )
    assert upload.document["key"] == "requests/a.json"


@pytest.mark.parametrize("encoded", ["requests/%FF.json", "requests/%C3.json", "requests/%E6%97.json"])
def test_a_key_whose_escapes_are_not_utf8_is_refused_not_decoded_to_a_replacement_character(encoded: str) -> None:
    """Found by the trial: ``%FF`` decoded to U+FFFD, so two different keys could name one occurrence."""
    found = record("x")
    found["s3"]["object"]["key"] = encoded
    with pytest.raises(TriggerRefusedError, match="does not decode as URL-encoded UTF-8") as refused:
        occurrences_of(config(), notification(found), MESSAGE)
    assert refused.value.code == "MALFORMED_OCCURRENCE"


def test_bucket_prefix_and_suffix_are_an_s3_triggers_only() -> None:
    with pytest.raises(ValueError, match="bucket, prefix and suffix are an s3 trigger's"):
        config(kind="sqs", prefix="requests/")
