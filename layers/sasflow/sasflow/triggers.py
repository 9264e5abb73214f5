"""Triggers: workflows started by a schedule's ticks, a bus's events or a queue's messages, exactly one per occurrence
(docs/triggers.md).

A trigger is declared once in ``triggers.yaml`` and rendered into template.yaml (``devstack/triggers.py``): its own
queue and dead-letter queue, its own function and role, and its source. EventBridge Scheduler sends each tick of a
schedule to the trigger's queue (``{"scheduled_time": "<aws.scheduler.scheduled-time>"}``); an EventBridge rule
sends each event its pattern matches there, as it is; an sqs trigger's producers send their messages there. So every
occurrence is one SQS message, and a failure is a batch-item failure that SQS delivers again and, after five
receives, moves to the trigger's dead-letter queue.

One occurrence, one workflow: the Idempotency-Key of the start derives from the occurrence, never from its delivery
(a schedule's tick time, an event's id, a message's id). A redelivered message or a retried tick asks for the same
workflow id, and the start's conditional create answers the existing workflow (``scheduler.workflow_id_for``). The
workflow's owner is the trigger's principal (its role), and its record and history name the trigger and the
occurrence. A paused sqs trigger keeps its messages (`TriggerKind.holds`): each goes back to the queue, delayed, with
its original id, and starts after the resume.

An occurrence that cannot start a workflow (no such definition, an input the definition refuses) is refused: it goes
to the trigger's dead-letter queue with its reason (`TriggerService.refuse`), where ``sasflow dlq list`` shows it and
an alarm says so. Nothing is dropped without a trace, and nothing was written for it.

Operated like the rest (``ops_api``): an operator pauses a trigger (who, when and why are kept in its item, ``ports.
TriggerStore``), and its ticks are then skipped and counted, as a paused Temporal schedule takes no action; resumes
it; or runs it now: one occurrence as if the tick had come, named by the request's Idempotency-Key and its
principal (``run-now <key> by <principal>``), so a repeated request starts one workflow. A run-now starts even while
the trigger is paused: an operator asked for it.

Overlap (``TriggerConfig.overlap``, Temporal's overlap policies): ``allow`` starts every tick; ``skip`` starts no
tick while the run that holds the trigger's slot has not ended (``states.ENDED_RUN``: a HELD or COMPENSATION_FAILED
run waits for a person and keeps it); ``buffer_one`` keeps at most one tick waiting and starts it when that run ends.
A run-now obeys the policy too, as Temporal's trigger-immediately does. The slot is taken by a conditional write on
the trigger's item (``ports.TriggerStore.claim``), never by a read then a start, and names its holder. The run's end
gives it back (``SchedulerService``, in the call whose write ended it; a redelivery of that call gives it back
again) and sends the waiting tick to the trigger's queue. A later tick repairs what a crash left: a holder that has
ended (its give-back was lost) or that never started within `STARTING_GRACE_SECONDS` (its start failed for good)
is taken over, and a waiting tick whose message was lost is sent again.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .clock import Clock, epoch_seconds
from .definition import render
from .errors import (
    ConditionFailedError,
    ConfigurationError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    PayloadTooLargeError,
    PermanentError,
    RetryableError,
    SasflowError,
    TenantLimitError,
    TriggerAlreadyPausedError,
)
from .messages import canonical_hash
from .ports import MessageBus, Outgoing, TriggerStore
from .records import TriggerRef
from .registry import DefinitionNotRegisteredError, DefinitionRef, DefinitionRegistry
from .states import ENDED_RUN
from .strict_json import parse_json_body
from .types import TriggerName

__all__ = [
    "Message",
    "Occurrence",
    "Overlap",
    "SlotTakenError",
    "TriggerConfig",
    "TriggerKind",
    "TriggerOutcome",
    "TriggerRefusedError",
    "TriggerService",
    "TriggerState",
    "event_occurrence",
    "message_occurrence",
    "occurrence_key",
    "occurrence_of",
    "occurrences_of",
    "run_now_body",
    "run_now_occurrence",
    "trigger_input",
]

#: What a trigger's item counts: ticks skipped (paused, or a run holds the slot), missed (later than the catch-up
#: window), buffered (``buffer_one``: kept waiting for the slot), and held (a queue's or a bucket's occurrences sent
#: back to wait out a pause; one message held three times counts three).
COUNTS = ("skipped", "missed", "buffered", "held")
#: How long a slot's holder may be missing before a later tick takes the slot over (seconds): its start may still be
#: in flight, delivered again by SQS within 5 receives of the trigger queue's visibility timeout.
STARTING_GRACE_SECONDS = 900
#: How long after a claim of the slot no invocation can still be starting its run (seconds): longer than the trigger
#: function's timeout (template.yaml Globals, 30 s).
CLAIM_SETTLED_SECONDS = 60
#: How long a trigger keeps the latest version of its definition before it asks again (seconds); a pinned version
#: is kept for the sandbox's life (versions are immutable).
LATEST_VERSION_SECONDS = 60
#: A tick handled this late (seconds after its time) is on time whatever its trigger's catch-up window: delivery
#: through SQS, a retried batch.
ON_TIME_SECONDS = 60
#: How long a message that reached a paused queue trigger waits before it is looked at again (seconds: SQS's
#: longest delay). It is sent back to the trigger's queue, with its occurrence, and starts after the resume.
HOLD_SECONDS = 900


class TriggerKind(StrEnum):
    """What starts the workflows of a trigger."""

    SCHEDULE = "schedule"
    EVENT = "event"
    SQS = "sqs"
    S3 = "s3"

    @property
    def holds(self) -> bool:
        """Whether a pause keeps its occurrences waiting (a queue's messages and a bucket's uploads are work to do)
        rather than skipping them (a schedule's ticks and a bus's events: what comes while it is paused is not
        started)."""
        return self in (TriggerKind.SQS, TriggerKind.S3)


class Overlap(StrEnum):
    """What a tick does while the run that holds its trigger's slot has not ended (Temporal's overlap policies)."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class TriggerConfig(BaseModel):
    """A trigger function's configuration (its ``TRIGGER`` variable, rendered from triggers.yaml).

    Attributes
    ----------
    name, kind
        The trigger.
    definition, version
        The registered definition it starts (version null: the latest at each start).
    input
        The workflow input: an object whose ``key.$`` entries are JMESPath expressions over the occurrence's
        document (as a step's input is rendered), or one expression whose value (an object) is the input; null
        takes the document itself. A schedule's document is ``{trigger, scheduled_time, at}``; an event's is the
        event as EventBridge delivers it (``id``, ``source``, ``detail-type``, ``time``, ``detail``...).
    catch_up_seconds
        How late a tick may be handled and still start (seconds; None: however late, ``catch_up_window: all``): after
        an outage the ticks wait in the trigger's queue, and those later than this (and than `ON_TIME_SECONDS`)
        are skipped and counted as missed.
    overlap
        What a tick does while the run holding the trigger's slot has not ended (`Overlap`).
    queue_url, dead_letter_url
        The trigger's queue (where a tick kept waiting goes when the slot is given back) and its dead-letter queue,
        where a refused occurrence goes with its reason.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TriggerName
    kind: TriggerKind
    definition: str = Field(min_length=1, max_length=64)
    version: int | None = Field(default=None, ge=1)
    input: dict[str, Any] | str | None = None
    catch_up_seconds: int | None = Field(default=None, ge=0, le=1_209_600)
    overlap: Overlap = Overlap.ALLOW
    queue_url: str = ""
    dead_letter_url: str = Field(min_length=1)
    bucket: str | None = Field(default=None, min_length=3, max_length=63)
    prefix: str = Field(default="", max_length=1024)
    suffix: str = Field(default="", max_length=1024)

    @property
    def slot(self) -> bool:
        """Whether its runs hold the trigger's slot (``skip`` and ``buffer_one``)."""
        return self.overlap is not Overlap.ALLOW

    @model_validator(mode="after")
    def _schedules_only(self) -> TriggerConfig:
        if self.kind is not TriggerKind.SCHEDULE and (
            self.overlap is not Overlap.ALLOW or self.catch_up_seconds is not None
        ):
            raise ValueError(
                f"overlap and catch_up_seconds are a schedule's: an {self.kind.value} trigger starts every occurrence"
            )
        if self.kind.holds and not self.queue_url:
            raise ValueError(f"queue_url: an {self.kind.value} trigger sends a message back to it while paused")
        if self.kind is not TriggerKind.S3 and (self.bucket is not None or self.prefix or self.suffix):
            raise ValueError(f"bucket, prefix and suffix are an s3 trigger's, not an {self.kind.value} trigger's")
        return self

    @classmethod
    def from_env(cls, text: str) -> TriggerConfig:
        """Parse the ``TRIGGER`` variable (JSON).

        Raises
        ------
        errors.ConfigurationError
            When it is not a valid configuration.
        """
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ConfigurationError(f"TRIGGER is not a trigger configuration: {exc}") from exc


class SlotTakenError(ConditionFailedError):
    """The trigger's slot, or the tick waiting for it, changed between the read and the conditional write."""


class TriggerRefusedError(PermanentError):
    """An occurrence cannot start a workflow; ``code`` says why (``DEFINITION_NOT_REGISTERED``, ``INVALID_INPUT``,
    ``PAYLOAD_TOO_LARGE``, ``MALFORMED_OCCURRENCE``). It goes to the trigger's dead-letter queue with its reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TriggerState:
    """A trigger's item: whether an operator paused it (who, when, why); the run that holds its slot (since when)
    and the tick waiting for it (``buffer_one``: the message that starts it, and its queue); its counts (`COUNTS`)."""

    name: str
    paused_by: str | None = None
    paused_at: int | None = None
    pause_reason: str | None = None
    skipped: int = 0
    missed: int = 0
    buffered: int = 0
    held: int = 0
    running: str | None = None
    running_since: int | None = None
    waiting: str | None = None
    waiting_queue: str | None = None

    @property
    def paused(self) -> bool:
        """Whether an operator paused it."""
        return self.paused_by is not None

    @property
    def waiting_occurrence(self) -> str | None:
        """The identity of the tick waiting for the slot (``tick 2026-12-04T10:00:00Z``), if one waits."""
        if self.waiting is None:
            return None
        try:
            return str(json.loads(self.waiting)["buffered"]["identity"])
        except (ValueError, KeyError, TypeError):
            return "(unreadable)"


def already_paused(state: TriggerState) -> TriggerAlreadyPausedError:
    """The refusal of a pause over another one: whose it is, since when and why, and what to do."""
    since = iso_utc(state.paused_at) if state.paused_at is not None else "?"
    return TriggerAlreadyPausedError(
        f"trigger {state.name} is already paused by {state.paused_by} since {since} ({state.pause_reason!r}); "
        "resume it first to pause it with another reason"
    )


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of a trigger.

    Attributes
    ----------
    identity
        What makes it this occurrence and no other (``tick 2026-12-04T10:00:00Z``): the workflow's record and
        history name it, and its Idempotency-Key derives from it.
    document
        What the trigger's input expressions read.
    at
        When it happened (epoch seconds).
    run_now, buffered
        An operator's run-now; a tick that was kept waiting for the slot (`body`), now sent again.
    message, raw
        An sqs trigger's message and its body as it was sent (kept while it waits out a pause, `held`).
    refusal
        An upload of a notification of several that cannot start (`occurrences_of`): handling it refuses it, that
        upload alone (``raw`` is a notification of it alone, for the dead-letter queue).
    """

    identity: str
    document: dict[str, Any]
    at: int
    run_now: bool = False
    buffered: bool = False
    message: Message | None = None
    raw: str | None = None
    refusal: TriggerRefusedError | None = None

    def idempotency_key(self, trigger: str) -> str:
        """The start's Idempotency-Key (`occurrence_key`)."""
        return occurrence_key(trigger, self.identity)

    def body(self) -> str:
        """The message that starts it once the slot is given back (`occurrence_of` reads it)."""
        inner = {"identity": self.identity, "document": self.document, "at": self.at, "run_now": self.run_now}
        return json.dumps({"buffered": inner}, separators=(",", ":"), sort_keys=True)

    def held(self) -> dict[str, Any]:
        """What keeps it waiting while its trigger is paused: the message as it was sent, and its id (sealed and sent
        back by `TriggerService`; read back as this occurrence: the same workflow, whatever the new message's id)."""
        if self.message is None or self.raw is None:
            raise ValueError(f"{self.identity} is no queue's message: nothing to keep waiting")
        return {"body": self.raw, "message": self.message.record()}


def _iso_seconds(text: str) -> int:
    """Epoch seconds of an ISO-8601 time (``2026-12-04T10:00:00Z``); a time without a zone is UTC."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def iso_utc(at: int) -> str:
    """An epoch time as the canonical ISO-8601 text of a tick (``2026-12-04T10:00:00Z``)."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _malformed(config: TriggerConfig, why: str) -> TriggerRefusedError:
    sender = {
        TriggerKind.SCHEDULE: "the schedule's target input is rendered by make template",
        TriggerKind.EVENT: "its rule delivers the event as it was put on the bus",
        TriggerKind.SQS: "the engine wrote it",
        TriggerKind.S3: "S3 sends its notifications as they are: check the bucket's notification configuration",
    }[config.kind]
    return TriggerRefusedError(
        "MALFORMED_OCCURRENCE",
        f"trigger {config.name}: {why}; no delivery of this message can start a workflow: fix what sent it ({sender})",
    )


def occurrence_key(trigger: str, identity: str) -> str:
    """The Idempotency-Key of the start of an occurrence: ``trigger:<name>:<SHA-256 of its identity, 32 hex>``."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return f"trigger:{trigger}:{digest}"


def run_now_body(key: str, at: int, principal: str) -> str:
    """The message an operator's run-now sends to the trigger's queue (`occurrence_of` reads it back)."""
    return json.dumps({"run_now": {"key": key, "at": at, "by": principal}}, separators=(",", ":"))


@dataclass(frozen=True)
class Message:
    """The SQS message that carried an occurrence: its id, when it was first sent (epoch milliseconds, SQS's
    ``SentTimestamp``) and its message attributes (name → text; a binary one as base64)."""

    message_id: str
    sent_ms: int = 0
    attributes: dict[str, str] | None = None

    def record(self) -> dict[str, Any]:
        """What a refusal keeps of it (`TriggerService.refuse`), so a redriven message is the same occurrence."""
        return {"id": self.message_id, "sent_ms": self.sent_ms, "attributes": self.attributes or {}}

    @classmethod
    def from_record(cls, kept: Any) -> Message | None:
        """The message a refusal kept (None: none kept, the refusal of another kind of trigger)."""
        if not isinstance(kept, dict) or not isinstance(kept.get("id"), str) or not kept["id"]:
            return None
        attributes: Any = kept.get("attributes")
        sent = kept.get("sent_ms")
        named = {str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, dict) else {}
        return cls(kept["id"], sent if isinstance(sent, int) else 0, named)


def occurrence_of(config: TriggerConfig, body: str, message: Message | None = None) -> Occurrence:
    """Read the occurrence a message of the trigger's queue carries.

    Parameters
    ----------
    config
        The trigger.
    body
        The SQS message body: EventBridge Scheduler's ``{"scheduled_time": ...}`` (the template's target input), an
        event as an EventBridge rule delivers it (`event_occurrence`), an operator's run-now (`run_now_body`), a
        tick kept waiting for the slot (`Occurrence.body`), or a refused occurrence redriven from the dead-letter
        queue (``{"refused": ..., "body": ...}``: read as its original body, so its identity and Idempotency-Key are
        the original's). An sqs trigger's message is any body (`message_occurrence`).
    message
        The message itself (an sqs trigger's occurrence is its id).

    An s3 trigger's message holds one upload (`occurrences_of` reads any number). A queue's or a bucket's trigger
    opens the engine's sealed envelopes (a held message, a refusal) in `TriggerService.read`, never here.

    Raises
    ------
    TriggerRefusedError
        ``MALFORMED_OCCURRENCE``: the body is not what the trigger's source sends.
    """
    if config.kind is TriggerKind.SQS:  # any body is a message
        if message is None:
            raise _malformed(config, "an sqs trigger's occurrence is its message, and none was given")
        return message_occurrence(config, body, message)
    if config.kind is TriggerKind.S3:
        found = occurrences_of(config, body, message)
        if len(found) != 1:
            raise _malformed(config, f"the message names {len(found)} uploads, not one")
        return found[0]
    document = _strict(config, body)
    if isinstance(document.get("refused"), dict) and isinstance(document.get("body"), str):
        return occurrence_of(config, document["body"], message)
    if "run_now" in document:
        return _run_now(config, document["run_now"])
    if "buffered" in document:
        inner = document["buffered"]
        try:
            identity, kept, at = str(inner["identity"]), dict(inner["document"]), int(inner["at"])
            return Occurrence(identity, kept, at, run_now=bool(inner["run_now"]), buffered=True)
        except (KeyError, TypeError, ValueError):
            raise _malformed(config, "a waiting tick names no identity, document, at and run_now") from None
    if config.kind is TriggerKind.EVENT:
        return event_occurrence(config, document)
    if "scheduled_time" not in document:
        raise _malformed(config, "a schedule's message names no scheduled_time")
    tick = document["scheduled_time"]
    if not isinstance(tick, str):
        raise _malformed(config, f"scheduled_time must be an ISO-8601 time (text), not {type(tick).__name__}")
    try:
        at = _iso_seconds(tick)
    except ValueError:
        raise _malformed(config, f"scheduled_time {tick!r} is not an ISO-8601 time") from None
    canonical = iso_utc(at)
    return Occurrence(f"tick {canonical}", {"trigger": config.name, "scheduled_time": canonical, "at": at}, at)


def event_occurrence(config: TriggerConfig, event: dict[str, Any]) -> Occurrence:
    """An event as an EventBridge rule delivers it: the occurrence is its ``id`` (EventBridge delivers at least
    once, every copy with the same id), its document the event itself, its time the event's ``time``."""
    event_id, when = event.get("id"), event.get("time")
    if not (isinstance(event_id, str) and event_id and isinstance(event.get("detail"), dict)):
        raise _malformed(config, "an event needs an id (text) and a detail (an object): EventBridge delivers both")
    if not isinstance(when, str):
        raise _malformed(config, "an event names no time")
    try:
        at = _iso_seconds(when)
    except ValueError:
        raise _malformed(config, f"the event's time {when!r} is not an ISO-8601 time") from None
    return Occurrence(f"event {event_id}", event, at)


def occurrences_of(config: TriggerConfig, body: str, message: Message | None = None) -> list[Occurrence]:
    """Read every occurrence a message of the trigger's queue carries: one (`occurrence_of`), but for an s3 trigger,
    whose notification holds its uploads as ``Records`` (one each, in practice) and whose test event
    (``s3:TestEvent``, sent when the notification is configured) holds none.

    Raises
    ------
    TriggerRefusedError
        ``MALFORMED_OCCURRENCE``: the body is not what the trigger's source sends.
    """
    if config.kind is not TriggerKind.S3:
        return [occurrence_of(config, body, message)]
    document = _strict(config, body)
    if document.get("Event") == "s3:TestEvent":
        return []  # S3 checks that it can send: nothing was uploaded
    records = document.get("Records")
    if not isinstance(records, list) or not records:
        raise _malformed(
            config,
            "an S3 notification names no Records (nor is it S3's test event; one sent through SNS needs the "
            "subscription's raw message delivery)",
        )
    if len(records) == 1:
        return [_upload(config, records[0], message)]
    found = []
    for record in records:  # each upload started or refused alone (found by a trial: one bad one refused all)
        try:
            found.append(_upload(config, record, message))
        except TriggerRefusedError as error:
            raw = json.dumps({"Records": [record]}, separators=(",", ":"))
            found.append(Occurrence("a refused upload", {}, 0, message=message, raw=raw, refusal=error))
    return found


def _upload(config: TriggerConfig, record: Any, message: Message | None) -> Occurrence:
    """One upload of an S3 notification: the occurrence is the object's key and version id (or, unversioned, its
    ETag and the sequencer S3 orders a key's events by), so a duplicate notification is the same one and another
    upload to the same key is another. Its key arrives URL-encoded (a space as ``+``): the input has it decoded."""
    try:
        event, when, bucket = str(record["eventName"]), str(record["eventTime"]), str(record["s3"]["bucket"]["name"])
        found = record["s3"]["object"]
        encoded = found["key"]
    except (KeyError, TypeError):
        raise _malformed(config, "an S3 record names no eventName, eventTime, bucket and object key") from None
    if not isinstance(encoded, str) or not encoded:
        raise _malformed(config, "an S3 record's object key is not text")
    if not event.startswith("ObjectCreated:"):
        raise _malformed(config, f"an S3 record of {event}: an s3 trigger starts on uploads (ObjectCreated) only")
    try:
        key = unquote_plus(encoded, errors="strict")
    except UnicodeDecodeError:
        raise _malformed(
            config, f"an S3 record's object key {encoded!r} does not decode as URL-encoded UTF-8"
        ) from None
    if config.bucket is not None and bucket != config.bucket:
        raise _malformed(
            config,
            f"the upload of {bucket}/{key}: trigger {config.name} watches bucket {config.bucket}; the notification "
            "configuration of that other bucket sends its uploads to this trigger's queue: remove it there",
        )
    if not (key.startswith(config.prefix) and key.endswith(config.suffix)):
        raise _malformed(
            config,
            f"the upload of {bucket}/{key} is not one of the keys {config.prefix}*{config.suffix} trigger "
            f"{config.name} watches: give the bucket's notification configuration the trigger's prefix and suffix",
        )
    version = found.get("versionId") if found.get("versionId") not in (None, "", "null") else None
    etag, sequencer = found.get("eTag"), found.get("sequencer")
    if version is not None:
        identity = f"object {bucket}/{key} version {version}"
    elif etag and sequencer:
        identity = f"object {bucket}/{key} etag {etag} sequencer {sequencer}"
    else:
        raise _malformed(config, f"the upload of {bucket}/{key} names no version id, nor an ETag and a sequencer")
    try:
        at = _iso_seconds(when)
    except ValueError:
        raise _malformed(config, f"the upload's eventTime {when!r} is not an ISO-8601 time") from None
    document = {
        "trigger": config.name,
        "bucket": bucket,
        "key": key,
        "size": found.get("size"),
        "etag": etag,
        "version_id": version,
        "sequencer": sequencer,
        "event": event,
        "time": when,
    }
    raw = json.dumps({"Records": [record]}, separators=(",", ":"))
    return Occurrence(identity, document, at, message=message, raw=raw)


#: What an upload's workflow input is when its trigger names none (the object itself is read by the steps).
UPLOAD_INPUT = ("bucket", "key", "size", "etag", "version_id")


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def message_occurrence(config: TriggerConfig, body: str, message: Message) -> Occurrence:
    """A message of an sqs trigger's queue: the occurrence is its id (SQS delivers a message at least once, every
    copy with its id), its document ``{trigger, message_id, sent_at, attributes, body}`` (the body as JSON when it is
    JSON, else as its text), its time when it was sent."""
    try:
        parsed: Any = parse_json_body(body)
    except ValueError:  # not JSON, or not strict JSON (NaN, a duplicate key, too deep): its text
        parsed = body
    at = message.sent_ms // 1000
    document = {
        "trigger": config.name,
        "message_id": message.message_id,
        "sent_at": iso_utc(at),
        "attributes": dict(message.attributes or {}),
        "body": parsed,
    }
    return Occurrence(f"message {message.message_id}", document, at, message=message, raw=body)


def run_now_occurrence(key: str, principal: str) -> str:
    """The identity of an operator's run-now: its Idempotency-Key and who asked (the same request made twice is one
    occurrence; two operators' are two)."""
    return f"run-now {key} by {principal}"


def _run_now(config: TriggerConfig, request: Any) -> Occurrence:
    """An operator's run-now: the tick of its time, named by its key and its principal."""
    key, at, by = (request.get(k) for k in ("key", "at", "by")) if isinstance(request, dict) else (None,) * 3
    if not (isinstance(key, str) and key and isinstance(by, str) and by and isinstance(at, int) and at >= 0):
        raise _malformed(config, "a run-now names no key, at (epoch seconds) and by")
    tick = iso_utc(at)
    document = {"trigger": config.name, "scheduled_time": tick, "at": at, "run_now": True}
    return Occurrence(run_now_occurrence(key, by), document, at, run_now=True)


def trigger_input(config: TriggerConfig, occurrence: Occurrence) -> dict[str, Any]:
    """The workflow input of an occurrence (see `TriggerConfig.input`).

    Raises
    ------
    TriggerRefusedError
        ``INVALID_INPUT``: an expression finds nothing (without a default), fails, or the input is not an object.
    """
    where = f"triggers[{config.name}].input"
    if config.kind is TriggerKind.EVENT:
        fix = (
            "; the event lacks what the trigger's input reads: put a corrected event on the bus (a new id), or fix "
            "the trigger's input in triggers.yaml (make template, deploy) and redrive its dead-letter queue"
        )
    elif config.kind is TriggerKind.SQS:
        fix = (
            "; the message lacks what the trigger's input reads: send a corrected message (a new message id), or fix "
            "the trigger's input in triggers.yaml (make template, deploy) and redrive its dead-letter queue"
        )
    elif config.kind is TriggerKind.S3:
        fix = (
            "; the upload's notification lacks what the trigger's input reads: fix the trigger's input in "
            "triggers.yaml (make template, deploy) and redrive its dead-letter queue"
        )
    else:
        fix = "; fix the trigger's input in triggers.yaml (make template, deploy), then redrive its dead-letter queue"
    if config.input is None and config.kind is TriggerKind.SQS:
        body = occurrence.document.get("body")  # a message's input is its body (an object)
        if not isinstance(body, dict):
            raw = occurrence.raw
            shown = (
                f"text that is not JSON ({_json_problem(raw)})" if raw is not None and body == raw else _json_kind(body)
            )
            raise TriggerRefusedError(
                "INVALID_INPUT",
                f"{where}: the message's body is the workflow input and must be a JSON object, got {shown}; send "
                "it as one (a new message), or give the trigger an input that reads body in triggers.yaml (make "
                "template, deploy) and redrive its dead-letter queue",
            )
        return body
    try:
        if config.input is None and config.kind is TriggerKind.S3:
            value: Any = {name: occurrence.document.get(name) for name in UPLOAD_INPUT}
        elif config.input is None:
            value = occurrence.document
        elif isinstance(config.input, str):
            value = render({"input.$": config.input}, occurrence.document, where=where)["input"]
        else:
            value = render(config.input, occurrence.document, where=where)
    except SasflowError as exc:  # MissingReferenceError, and render's own errors for a bad expression
        said = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"  # render names the place already
        raise TriggerRefusedError("INVALID_INPUT", f"{said}{fix}") from exc
    except Exception as exc:  # jmespath raises its own errors for a wrong type, not ValueError
        raise TriggerRefusedError("INVALID_INPUT", f"{where}: {type(exc).__name__}: {exc}{fix}") from exc
    if not isinstance(value, dict):
        raise TriggerRefusedError(
            "INVALID_INPUT", f"{where}: the input must be a JSON object, got {_json_kind(value)}{fix}"
        )
    return value


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (an array, not a list; null, not NoneType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _json_problem(text: str) -> str:
    """Why ``text`` is not strict JSON (what `parse_json_body` says)."""
    try:
        parse_json_body(text)
    except json.JSONDecodeError as exc:  # parse_json_body raises nothing else for a body it refuses
        return exc.msg
    return "it is"


def _strict(config: TriggerConfig, body: str) -> dict[str, Any]:
    """A message's body as strict JSON (`strict_json`: no NaN, no duplicate key, no deeper than 64 levels), an object.

    Raises
    ------
    TriggerRefusedError
        ``MALFORMED_OCCURRENCE``, saying why.
    """
    try:
        document: Any = parse_json_body(body)
    except json.JSONDecodeError as exc:  # parse_json_body raises nothing else for a body it refuses
        raise _malformed(config, f"the message is not JSON ({exc.msg})") from None
    if not isinstance(document, dict):
        raise _malformed(config, f"the message is not a JSON object but {_json_kind(document)}")
    return document


@dataclass(frozen=True)
class TriggerOutcome:
    """What one occurrence did: the workflow it started (``created``) or found started by an earlier delivery, or
    nothing (``skipped`` says why: the trigger is paused, the tick is late, or a run holds the slot, and then
    ``buffered`` if it was kept waiting; ``held``: a queue trigger's message sent back to wait out a pause)."""

    workflow_id: str | None
    created: bool
    skipped: str | None = None
    buffered: bool = False
    held: bool = False


class TriggerService:
    """Starts the workflow of an occurrence, once.

    Parameters
    ----------
    config
        The trigger.
    scheduler
        The engine's ``SchedulerService`` (its ``start_workflow`` and ``store``).
    bus
        Sends the first steps' requests, and refused occurrences to the dead-letter queue.
    triggers
        The triggers' items (``ports.TriggerStore``): whether it is paused.
    principal
        Who the trigger starts workflows as (its role's ARN): their owner.
    clock
        Time (injected, DESIGN Rule 7).
    metrics
        Counts ``TriggerWorkflowsStarted``, ``TriggerTicksSkipped``, ``TriggerTicksMissed``,
        ``TriggerTicksBuffered``, ``TriggerMessagesHeld``, ``TriggerOccurrencesRefused`` and
        ``TriggerStartMessagesNotSent``.
    """

    def __init__(
        self,
        config: TriggerConfig,
        scheduler: Any,
        bus: MessageBus,
        triggers: TriggerStore,
        *,
        principal: str,
        clock: Clock,
        metrics: Callable[..., None] | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.bus = bus
        self.triggers = triggers
        self.principal = principal
        self.clock = clock
        self.metrics = metrics or (lambda name, value=1: None)
        self._cached: tuple[float, Any] | None = None
        self._batch_state: TriggerState | None = None
        self._batching = False

    def handle(self, occurrence: Occurrence, outbox: list[Outgoing] | None = None) -> TriggerOutcome:
        """Start the occurrence's workflow and send its first requests; a repeat finds the one it started.

        ``outbox``: the first requests are added to it instead, for the caller to send with the other occurrences'
        of its batch (one SQS request for up to ten; `send_outbox`). Lost, they are resent by the supervisor at
        their complete-by, as any first request whose send failed.

        Raises
        ------
        TriggerRefusedError
            The occurrence cannot start a workflow (the caller sends it to the dead-letter queue, `refuse`).
        ContentionError, and the store's and the bus's errors
            Retryable: the message fails and SQS delivers it again.
        """
        if occurrence.refusal is not None:
            raise occurrence.refusal
        config, now = self.config, epoch_seconds(self.clock)
        scheduled = not (occurrence.run_now or occurrence.buffered)  # a tick or an event, as it came
        key = occurrence.idempotency_key(config.name)
        workflow_id = self.scheduler.workflow_id(self.principal, key)
        # The slot is decided on a strongly consistent read and a conditional write; the pause alone may be read
        # eventually consistent (it takes effect within a second or so), once per batch (`begin_batch`).
        state = self._state() if scheduled or config.slot else None
        # An earlier delivery of this occurrence that took the slot (on time) and crashed before its start decided
        # it: this one completes the start, however late now. Were it missed instead, the slot would stay held by a
        # run that never comes, and the tick waiting behind it would wait (found by the simulation); giving the slot
        # back instead could free it under a run another delivery is starting.
        claimed = state is not None and config.slot and state.running == workflow_id
        if scheduled and not claimed:
            late = now - occurrence.at
            window = config.catch_up_seconds
            if window is not None and late > max(ON_TIME_SECONDS, window):
                self.triggers.count(config.name, "missed")
                self.metrics("TriggerTicksMissed")
                return TriggerOutcome(None, created=False, skipped=f"missed: handled {late} s after its tick")
        if scheduled and state is not None and state.paused and config.kind.holds:
            return self._hold(occurrence, state)
        if scheduled and state is not None and state.paused:
            run = self.scheduler.store.load(workflow_id, consistent=True) if claimed else None
            if run is not None:
                # Another delivery of the tick whose run holds the slot (that run started before the pause): it
                # found its workflow, which keeps the slot until it ends (found by the simulation, seed 22: this
                # delivery gave it back, and a run-now started a second run beside it). A run that has ended gave
                # the slot back already; a delivery that took it again and crashed left it held: it goes back
                # (found by the simulation, seed 46 of session 57's make sim).
                if run.workflow.status in ENDED_RUN:
                    self.give_back(workflow_id)
                return TriggerOutcome(workflow_id, created=False)
            self.triggers.count(config.name, "skipped")
            self.metrics("TriggerTicksSkipped")
            if claimed and state.running_since is not None and now - state.running_since > CLAIM_SETTLED_SECONDS:
                # Paused since its claim, it starts nothing (a pause stops what comes while it lasts): the slot its
                # crashed delivery took goes back, once no invocation can still be starting it.
                self.give_back(workflow_id)
            return TriggerOutcome(None, created=False, skipped=f"paused by {state.paused_by}: {state.pause_reason}")
        definition = self._definition()
        try:
            workflow_input = trigger_input(config, occurrence)
        except TriggerRefusedError:
            # A copy of an occurrence whose workflow exists (an event put again by hand with another detail, a tick
            # whose input has changed since) is that occurrence: it found its workflow, nothing to refuse.
            existing = self.scheduler.store.load(workflow_id)
            if existing is not None:
                return TriggerOutcome(workflow_id, created=False)
            raise
        request_hash = canonical_hash({"trigger": config.name, "occurrence": occurrence.identity})
        if state is not None and config.slot:
            busy = self._take_slot(state, occurrence, workflow_id, now)
            if busy is not None:
                return busy
        try:
            result = self.scheduler.start_workflow(
                definition,
                workflow_input,
                request_hash=request_hash,
                owner=self.principal,
                idempotency_key=key,
                trigger=TriggerRef(config.name, occurrence.identity, slot=config.slot),
            )
        except TenantLimitError:
            # Its tenant runs tenancy.max_running workflows: nothing was written; the occurrence is delivered again
            # (its queue's visibility timeout), and the trigger's slot this start took waits for it no longer.
            if config.slot:
                self.give_back(workflow_id)
            raise
        except (InvalidDefinitionError, PayloadTooLargeError, IdempotencyKeyConflictError) as exc:
            # Refused before anything was written (DESIGN Rule 9): a first step's reference finds nothing in the
            # input, a payload over its limit. The slot this start took is given back before the refusal is sent.
            if config.slot:
                self.give_back(workflow_id)
            code = "PAYLOAD_TOO_LARGE" if isinstance(exc, PayloadTooLargeError) else "INVALID_INPUT"
            # A message's body is what its producer sent (found by the trial: the fix named triggers.yaml only)
            sender = (
                "send a corrected message (a new message id), or "
                if config.kind is TriggerKind.SQS and config.input is None
                else ""
            )
            raise TriggerRefusedError(
                code,
                f"trigger {config.name}: the definition refused the input: {exc}; {sender}fix the trigger's input in "
                "triggers.yaml or publish a version of the definition that takes it, then redrive the trigger's "
                "dead-letter queue",
            ) from exc
        if result.messages and outbox is not None:
            outbox.extend(result.messages)
        elif result.messages:
            self.send_outbox(list(result.messages))
        if result.created:
            self.metrics("TriggerWorkflowsStarted")
        if config.slot and result.workflow.status in ENDED_RUN:
            # It ended as it started (every step's `when` false), or this is a late delivery of a tick whose run has
            # ended since: the slot this call took goes back at once.
            self.give_back(result.workflow.workflow_id)
        return TriggerOutcome(result.workflow.workflow_id, created=result.created)

    def _hold(self, occurrence: Occurrence, state: TriggerState) -> TriggerOutcome:
        """A queue trigger's message while it is paused: sent back to its queue (`HOLD_SECONDS` later, with its
        occurrence, so it is the same workflow when it starts), not skipped: it is work someone asked for.

        Raises
        ------
        errors.RetryableError
            When it could not be sent back (the message fails, and SQS delivers it again).
        """
        held = Outgoing(self.config.queue_url, self._sealed({"held": occurrence.held()}), delay_seconds=HOLD_SECONDS)
        if self.bus.send([held]):
            raise RetryableError(f"trigger {self.config.name} is paused and its message could not be kept waiting")
        self.triggers.count(self.config.name, "held")
        self.metrics("TriggerMessagesHeld")
        return TriggerOutcome(
            None, created=False, skipped=f"held while paused by {state.paused_by}: {state.pause_reason}", held=True
        )

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One invocation's batch: the pause is read once for its occurrences (when no slot is kept), not once each."""
        self._batch_state, self._batching = None, True
        try:
            yield
        finally:
            self._batch_state, self._batching = None, False

    def _state(self) -> TriggerState:
        """The trigger's item: strongly consistent for each occurrence of a trigger with a slot; otherwise eventually
        consistent, once a `batch` (a pause that lands while a batch is handled is one the read does not see yet)."""
        if self.config.slot:
            return self.triggers.state(self.config.name, consistent=True)
        if self._batch_state is not None:
            return self._batch_state
        state = self.triggers.state(self.config.name, consistent=False)
        if self._batching:
            self._batch_state = state
        return state

    def send_outbox(self, outbox: list[Outgoing]) -> None:
        """Send the first requests of the workflows started (batched by queue, ten a request)."""
        if outbox and self.bus.send(outbox):
            # the steps are durable as PROCESSING: the supervisor resends them after complete-by (Rule 1)
            self.metrics("TriggerStartMessagesNotSent")

    def give_back(self, workflow_id: str) -> None:
        """Give the slot back if ``workflow_id`` holds it, and send the tick waiting for it."""
        waiting = self.triggers.release(self.config.name, workflow_id)
        if waiting is not None:
            self.bus.send([waiting])  # lost: the next tick sends it again (`_take_slot`)

    def _take_slot(
        self, state: TriggerState, occurrence: Occurrence, workflow_id: str, now: int
    ) -> TriggerOutcome | None:
        """Take the trigger's slot for ``workflow_id`` by a conditional write (None: start it), or skip or keep
        waiting the occurrence because a run holds it.

        Timeline it protects: two ticks read the slot free (or held by a run that has ended) and both write; the
        condition (the holder each read) lets exactly one in, and the other reads again and finds it held.
        """
        for _ in range(3):
            holder = state.running
            if holder == workflow_id:
                return None  # a delivery of this occurrence took it already (and crashed before the start, or not)
            if holder is not None and self._holds(holder, state.running_since, now):
                return self._busy(state, occurrence)
            if state.waiting is not None and not occurrence.buffered:
                # A tick waits, yet the slot is free: the message that starts it was lost (the give-back crashed
                # before its send). Send it again, to go first; this occurrence finds the buffer full.
                self.bus.send([Outgoing(state.waiting_queue or self.config.queue_url, state.waiting)])
                return self._busy(state, occurrence)
            try:
                self.triggers.claim(
                    self.config.name,
                    workflow_id,
                    now,
                    expect=holder,
                    buffered=occurrence.body() if occurrence.buffered else None,
                )
                return None
            except SlotTakenError:
                state = self.triggers.state(self.config.name, consistent=True)
        return self._busy(state, occurrence)

    def _holds(self, holder: str, since: int | None, now: int) -> bool:
        """Whether the slot's holder still runs: not ended, or not there yet while its start may be in flight."""
        snapshot = self.scheduler.store.load(holder, consistent=True)
        if snapshot is None:
            return since is not None and now - since < STARTING_GRACE_SECONDS
        return snapshot.workflow.status not in ENDED_RUN

    def _busy(self, state: TriggerState, occurrence: Occurrence) -> TriggerOutcome:
        """A run holds the slot: ``buffer_one`` keeps the occurrence if none waits yet; otherwise it is skipped."""
        holder = state.running or "a run"
        if occurrence.buffered:  # another delivery of this waiting tick took the slot, or started and ended it
            return TriggerOutcome(None, created=False, skipped="the waiting tick was started by another delivery")
        kept = self.config.overlap is Overlap.BUFFER_ONE and self.triggers.buffer(
            self.config.name, occurrence.body(), self.config.queue_url
        )
        if kept:
            self.metrics("TriggerTicksBuffered")
            return TriggerOutcome(None, created=False, skipped=f"waiting: {holder} runs", buffered=True)
        self.triggers.count(self.config.name, "skipped")
        self.metrics("TriggerTicksSkipped")
        return TriggerOutcome(None, created=False, skipped=f"{holder} runs ({self.config.overlap.value})")

    def _definition(self) -> Any:
        """The definition it starts: a pinned version once per sandbox, the latest again after
        `LATEST_VERSION_SECONDS` (two reads saved per occurrence)."""
        now = self.clock.now()
        if self._cached is not None and (self.config.version is not None or now < self._cached[0]):
            return self._cached[1]
        try:
            definition = DefinitionRegistry(self.scheduler.store).resolve(
                DefinitionRef(name=self.config.definition, version=self.config.version)
            )
        except DefinitionNotRegisteredError as exc:
            raise TriggerRefusedError(
                "DEFINITION_NOT_REGISTERED",
                f"trigger {self.config.name}: {exc} (or sasflow definitions push FILE), then redrive the trigger's "
                "dead-letter queue",
            ) from exc
        self._cached = (now + LATEST_VERSION_SECONDS, definition)
        return definition

    def read(self, body: str, message: Message | None = None) -> list[Occurrence]:
        """The occurrences of a message of the trigger's queue (`occurrences_of`). A queue's or a bucket's trigger
        first opens the engine's own envelopes: a message held while paused, a refusal redriven from the dead-letter
        queue; each is read as the message it keeps, under that message's id. Only a sealed one is opened: anyone
        who may send to the queue could send a body of that shape, which is then a message like any other.

        Raises
        ------
        TriggerRefusedError
            ``MALFORMED_OCCURRENCE``: the body is not what the trigger's source sends.
        """
        kept = self.unsealed(body)
        if kept is not None:
            return self.read(*kept) if kept[1] is not None else self.read(kept[0], message)
        return occurrences_of(self.config, body, message)

    def unsealed(self, body: str) -> tuple[str, Message | None] | None:
        """The body and message a sealed envelope of this trigger's keeps (a message held while paused, a refusal);
        None when ``body`` is none: not JSON, not that shape, or not sealed with the stack's key."""
        if '"seal"' not in body:  # every envelope has the key (`_sealed`): the others are not parsed a second time
            return None
        try:
            document: Any = parse_json_body(body)
        except ValueError:  # json.JSONDecodeError, a too deep one included
            return None
        if not isinstance(document, dict) or not isinstance(document.get("seal"), str):
            return None
        content = {k: v for k, v in document.items() if k != "seal"}
        if not hmac.compare_digest(document["seal"], self._seal(_canonical(content))):
            return None
        held, refused = content.get("held"), content.get("refused")
        if isinstance(held, dict) and isinstance(held.get("body"), str):
            return held["body"], Message.from_record(held.get("message"))
        if isinstance(refused, dict) and isinstance(content.get("body"), str):
            return content["body"], Message.from_record(refused.get("message"))
        return None

    def _seal(self, text: str) -> str:
        """A MAC of ``text`` under the stack's workflow-id key (`scheduler.workflow_id_for`): only the engine makes
        one."""
        return str(self.scheduler.workflow_id(self.principal, f"envelope {text}"))

    def _sealed(self, content: dict[str, Any]) -> str:
        """``content`` as a message body with its seal."""
        return _canonical({**content, "seal": self._seal(_canonical(content))})

    def refuse(self, body: str, error: TriggerRefusedError, message_id: str, message: Message | None = None) -> None:
        """Send a refused occurrence to the trigger's dead-letter queue with its reason, and count it. A held message
        or a redriven refusal is refused as the message it keeps (its body as sent, its original id).

        Raises
        ------
        errors.RetryableError
            When the dead-letter queue could not be written (the message then fails, and SQS retries it).
        """
        if message is not None and self.config.kind is TriggerKind.SQS:
            message_id = message.message_id  # the message it is (a held one's, a redriven one's original)
        kept = self.unsealed(body) if self.config.kind.holds else None
        while kept is not None:
            body = kept[0]
            if kept[1] is not None:
                message, message_id = kept[1], kept[1].message_id
            kept = self.unsealed(body)
        record = {
            "refused": {
                "code": error.code,
                "reason": str(error),
                "trigger": self.config.name,
                "message_id": message_id,
                # an sqs trigger's message: redriven, it is the same occurrence (its id), not a new message's
                **(
                    {"message": message.record()} if message is not None and self.config.kind is TriggerKind.SQS else {}
                ),
            },
            "body": body,
        }
        text = self._sealed(record) if self.config.kind.holds else json.dumps(record, separators=(",", ":"))
        failed = self.bus.send([Outgoing(self.config.dead_letter_url, text)])
        if failed:
            raise RetryableError(
                f"the refused occurrence could not be written to {self.config.name}'s dead-letter queue"
            )
        self.metrics("TriggerOccurrencesRefused")
