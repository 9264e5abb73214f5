"""Triggers in the simulation: workflows started by a schedule's ticks, a bus's events or a queue's messages through
the real trigger function (``run.trigger_kind``: the seed says which).

Besides the API's starts, the template's trigger function (triggers.yaml's ``every-minute-trip``, its ``TRIGGER`` as
the template renders it) receives ticks on its own queue, as EventBridge Scheduler sends them: at least once, and
out of order. Each tick comes once, twice or three times (a retried delivery), each copy a message of its own at a
random delay, so a later tick often arrives first; every fault of the world hits these deliveries as it hits the
engine's (crashes around every DynamoDB call and send, so between the start's write and the acknowledgement;
consumers lost after a receive; a concurrent instance running a batch inside another). An operator pauses the
trigger (its ticks are then skipped), resumes it, and runs it now (sometimes twice with one Idempotency-Key). Some
messages are not ticks at all (a hand-written send with a time that is not one): those must be refused into the
trigger's dead-letter queue with their reason, and start nothing.

The ground truth (`TriggerLog`) is what was sent; ``invariants.trigger_violations`` (invariant 20) checks the
workflows and the dead-letter queue against it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus

from devstack.events import envelope


@dataclass(frozen=True)
class Delivery:
    """One message sent to the trigger's queue at ``at`` (epoch seconds): a tick's (its ``identity``), or a bad one
    (``identity`` None) that must be refused."""

    at: float
    body: str
    identity: str | None


@dataclass
class TriggerLog:
    """What was sent to the trigger's queue in one run."""

    #: Every occurrence sent (``tick <ISO time>``, and the operator's ``run-now <key> by <principal>``), the bodies of
    #: the bad messages, and the messages sent.
    occurrences: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)
    deliveries: int = 0
    #: An sqs or s3 trigger's messages sent back to wait while it was paused (their occurrences), and the test
    #: events S3 sent (none may start a workflow or be refused).
    held: set[str] = field(default_factory=set)
    test_events: int = 0
    #: Ticks a handler call skipped (the trigger was paused) or missed (later than the catch-up window), and
    #: violations seen as they happened.
    skipped: set[str] = field(default_factory=set)
    missed: set[str] = field(default_factory=set)
    seen: list[Any] = field(default_factory=list)
    #: Overlap skip and buffer_one: ticks kept waiting for the slot, the trigger's runs seen so far (when each was
    #: created), and those of them seen ended.
    buffered: set[str] = field(default_factory=set)
    runs: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)


#: A delivery whose occurrence is the id SQS gives the message when it is sent (an sqs trigger's).
MESSAGE = "message"
#: S3's test event: no occurrence, and no refusal either.
TEST_EVENT = "s3:TestEvent"
#: What the uploads' keys hold besides their number: what S3 URL-encodes in a notification.
UPLOAD_NAMES = ("Ada Lovelace", "a+b", "été 日本", "50% off", "%41 as is", "plain")


def _upload(bucket: str, key: str, version: str, event: str, at: float) -> str:
    """S3's notification of one upload as it reaches the trigger's queue (the key URL-encoded, a space as ``+``)."""
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "eventTime": _iso(at).replace("Z", ".000Z"),
        "eventName": event,
        "s3": {
            "bucket": {"name": bucket},
            "object": {"key": quote_plus(key), "size": 64, "eTag": "e" * 32, "versionId": version, "sequencer": "0A"},
        },
    }
    return json.dumps({"Records": [record]})


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_deliveries(
    rng: random.Random,
    start: float,
    window: float,
    ticks: int,
    *,
    duplicate: float,
    bad: float,
    events: str | None = None,
    messages: bool = False,
    uploads: str | None = None,
) -> list[Delivery]:
    """The messages of one run: ``ticks`` ticks within ``window`` seconds of ``start`` (whole seconds apart), each
    delivered again with probability ``duplicate`` (twice more with its square), each late by up to 45 s; and a bad
    message in place of a tick with probability ``bad``. Sorted by time.

    ``events`` (a prefix of their ids): events as an EventBridge rule delivers them instead of ticks, each copy of one
    the same event (its id); a bad one names no detail. ``messages``: messages sent to an sqs trigger's queue (the
    trip as the body), each sent once (its occurrence is the message id, `MESSAGE`: SQS's redeliveries are the
    world's faults); a bad one's body is not a JSON object. ``uploads`` (a bucket's name): S3's notifications of
    uploads to it, each sent once to three times (S3 may notify twice), their keys with spaces, plus signs, unicode
    and percent signs (URL-encoded in the notification); S3's test event now and then (it starts nothing, and is no
    refusal); a bad one is a deletion's notification, an upload to another bucket, or of a key outside the
    trigger's prefix (a notification configured wrongly)."""
    deliveries: list[Delivery] = []
    if uploads is not None:  # S3 sends one when the bucket's notification is configured
        deliveries.append(Delivery(start, json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}), TEST_EVENT))
    interval = max(1.0, window / (ticks + 1))
    for i in range(ticks):
        at = float(int(start + interval * (i + 1)))
        if uploads is not None and rng.random() < 0.05:
            deliveries.append(Delivery(at, json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"}), TEST_EVENT))
        if rng.random() < bad:
            if uploads is not None:  # a deletion's notification, another bucket's upload, a key it does not watch
                body = rng.choice(
                    [
                        _upload(uploads, f"requests/deleted {i}.json", f"v{i}", "ObjectRemoved:Delete", at),
                        _upload(f"other-{uploads}", f"requests/{i}.json", f"v{i}", "ObjectCreated:Put", at),
                        _upload(uploads, f"elsewhere/{i}.json", f"v{i}", "ObjectCreated:Put", at),
                    ]
                )
            elif messages:
                body = rng.choice([f"not json {i}", json.dumps([i]), json.dumps(f"text {i}")])
            else:
                body = json.dumps(
                    {"scheduled_time": f"not-a-time-{i}"} if events is None else {"id": f"{events}-bad-{i}"}
                )
            deliveries.append(Delivery(at + rng.uniform(0, 45), body, None))
            continue
        if uploads is not None:
            key = f"requests/{rng.choice(UPLOAD_NAMES)} {i}.json"
            body, identity = (
                _upload(uploads, key, f"v{i}", "ObjectCreated:Put", at),
                f"object {uploads}/{key} version v{i}",
            )
            for _ in range(1 + (rng.random() < duplicate) + (rng.random() < duplicate * duplicate)):
                deliveries.append(Delivery(at + rng.uniform(0, 45), body, identity))
            continue
        if messages:
            trip = {"traveller": f"traveller {i}", "route": "LHR-JFK", "nights": rng.randint(1, 5), "amount": 120}
            deliveries.append(Delivery(at + rng.uniform(0, 45), json.dumps(trip), MESSAGE))
            continue
        if events is None:
            tick = _iso(at)
            body, identity = json.dumps({"scheduled_time": tick}), f"tick {tick}"
        else:
            body, identity = _event(f"{events}-{i}", at, rng), f"event {events}-{i}"
        copies = 1 + (rng.random() < duplicate) + (rng.random() < duplicate * duplicate)
        for _ in range(copies):
            deliveries.append(Delivery(at + rng.uniform(0, 45), body, identity))
    deliveries.sort(key=lambda delivery: delivery.at)
    return deliveries


def _event(event_id: str, at: float, rng: random.Random) -> str:
    """An event of the sample event trigger (triggers.yaml's trip-requested) as its rule delivers it."""
    detail = {"traveller": f"traveller {event_id}", "route": "CDG-NRT", "nights": rng.randint(1, 5), "amount": 240}
    when = datetime.fromtimestamp(int(at), UTC)
    return json.dumps(
        envelope("sasflow.demo", "TripRequested", detail, region="us-east-1", event_id=event_id, time=when)
    )
