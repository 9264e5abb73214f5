"""The simulated world around the real handlers: SQS, faults, remote services and time.

Everything draws from one seeded ``random.Random`` and one ``ManualClock``, so a seed replays exactly.

- ``SimQueues`` models SQS standard queues with the template's visibility timeout and redrive policy: a received
  message is invisible until its visibility timeout, comes back if it is not deleted, and moves to its dead-letter
  queue when it is received more than ``maxReceiveCount`` times. Delivery order among visible messages is random.
- ``SimBus`` is the handlers' ``MessageBus``: it may crash before or after sending, duplicate a message, or delay
  it (which reorders it).
- ``CrashInjector`` raises ``SimCrash`` just before or just after any DynamoDB call (botocore event hooks), so the
  state store, the idempotency layer and the circuit breaker all see crash points.
- ``SimRemote`` is a remote service with fault knobs that records every effect and every compensation by token:
  the ground truth the invariants are checked against.
- ``powertools_on_clock`` makes powertools' idempotency read the simulated clock.
- ``FaultLog`` counts the faults and attributes each one to the attempts it touched (``Tag``: workflow, step,
  phase, attempt), so the invariants can tell an unwind the faults explain from one the product caused.
"""

from __future__ import annotations

import datetime
import itertools
import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sasflow.clock import Clock, ManualClock
from sasflow.errors import RemoteRejectedError, RemoteTransientError
from sasflow.messages import StepRequest
from sasflow.ports import Outgoing, Receipt


class SimCrash(RuntimeError):
    """An injected crash: the process 'dies' at this point (it is not a botocore error, so nothing catches it)."""


@dataclass(frozen=True)
class Faults:
    """Fault rates (probabilities per event) and magnitudes of one simulation."""

    crash_before_call: float = 0.005
    crash_after_call: float = 0.005
    crash_before_send: float = 0.01
    crash_after_send: float = 0.01
    duplicate: float = 0.03
    delay: float = 0.05
    delay_max_seconds: int = 60
    consumer_lost: float = 0.02
    remote_transient: float = 0.08
    remote_reject: float = 0.05
    remote_slow: float = 0.05
    remote_hang: float = 0.02
    remote_outages: int = 1
    outage_seconds: int = 120
    #: Chance that a run's outage lasts `long_outage_seconds` instead (15 minutes: longer than any forward retry,
    #: shorter than a compensation's default time budget of 30, which must outlast it: issue 19).
    long_outage: float = 0.3
    long_outage_seconds: int = 900
    clock_skew_seconds: float = 4.0
    second_supervisor: float = 0.3
    concurrent_invocation: float = 0.15
    slow_poller: float = 0.3
    concurrent_sibling: float = 0.5
    stale_read: float = 0.2
    agent_killed_after_effect: float = 0.01
    #: Share of workflows started under the hold policy (a step that fails for good waits for a person, then its
    #: hold timeout compensates it), and the chance per supervisor tick that the operator acts on a workflow.
    hold_policy: float = 0.25
    operator_action: float = 0.6
    #: Share of workflows whose hotel step has a condition (``when: input.needs_hotel``), true half the time.
    conditional: float = 0.3
    #: Share of workflows with a wait step after the flight (0 s to 20 minutes: timers and the supervisor resume them).
    wait_step: float = 0.3
    #: Share of workflows with an approval (a callback step) after the flight; the approver answers at supervisor
    #: ticks: approves, rejects, sends heartbeats, forgets (the step times out, its retry issues a new token), and
    #: uses tokens twice and late.
    callback_step: float = 0.3
    #: Share of workflows with a map step after the flight: a child workflow per order (0 to 3 of them).
    map_step: float = 0.3
    #: Chance that a start comes at the same instant as the one before (a client starting a batch of trips): their
    #: steps reach the services together, where the hotels agent's call limits (``run.SIM_CALL_LIMITS``) make some
    #: wait and defer some (invariant 21).
    burst_start: float = 0.4
    #: Share of workflows carrying a payload above the claim-check threshold (the simulation lowers it to
    #: ``SIM_CLAIM_CHECK_THRESHOLD`` bytes): their input, the hotel's rendered input and its output are claim-checked.
    large_payload: float = 0.25
    #: Chance per started workflow that a poison message (a body no handler can read: not JSON, or JSON that is not
    #: a step request or reply) is put on one of the consumers' queues, drawn from a generator of its own.
    poison_message: float = 0.05
    #: Share of workflows whose definition limits its tenants (``tenancy``: a run's max_running, 1 or 2, per customer
    #: of five, named by ``tenant_key``), drawn from a generator of its own; a start over the limit is refused (429)
    #: and its client gives up (invariant 22).
    tenancy: float = 0.3
    #: Ticks of the trigger (simulation/triggers.py) as a share of the workflows, sent besides the API's starts; the
    #: chance a tick is delivered again (and, squared, a third time), and that a message is not a tick at all.
    triggered: float = 0.05
    trigger_duplicate: float = 0.35
    trigger_bad: float = 0.1
    #: Chance per supervisor tick that the operator pauses, resumes or runs the trigger now (while it has ticks).
    trigger_operator: float = 0.2
    #: Chance per supervisor tick that the operator starts a batch (``POST /ops/batches``: retry what is HELD, pause
    #: what is RUNNING, ...), sends the same request again, or cancels a running batch (invariant 23). Drawn from a
    #: generator of its own; BatchFunction runs its messages under the crash faults of every function.
    operator_batch: float = 0.08

    @classmethod
    def none(cls) -> Faults:
        """No faults at all (a baseline)."""
        return cls(**{name: 0 for name in cls.__dataclass_fields__})


#: One attempt of one phase of one step: (workflow id, step, phase, attempt).
Tag = tuple[str, str, str, int]


def tag_of(body: str) -> Tag | None:
    """The attempt a step request or a step reply (an SQS body) belongs to, or None for another body."""
    try:
        message = json.loads(body)
        tag = (message["workflow_id"], message["step"], message["phase"], message["attempt"])
    except (ValueError, KeyError, TypeError):
        return None
    return tag if all(isinstance(part, str) for part in tag[:3]) and isinstance(tag[3], int) else None


def in_flight_tags(item: dict[str, Any]) -> list[Tag]:
    """The attempts in flight in a workflow item (a PutItem's ``Item``, DynamoDB JSON)."""
    workflow_id = item.get("pk", {}).get("S", "")[len("WF#") :]
    tags: list[Tag] = []
    for name, value in item.get("steps", {}).get("M", {}).items():
        step = value.get("M", {})
        status = step.get("status", {}).get("S")
        if status == "PROCESSING":
            tags.append((workflow_id, name, "action", int(step.get("attempt", {}).get("N", "0"))))
        elif status == "COMPENSATING":
            tags.append((workflow_id, name, "compensation", int(step.get("comp_attempt", {}).get("N", "0"))))
    return tags


class FaultLog:
    """Counts injected faults by kind, and which attempts each one touched.

    A fault touches the attempts it names (``tags``: the messages it delayed or lost, the request the remote service
    failed) and, unless ``attribute`` is false, every attempt of the invocation running when it struck (``context``,
    a stack: a concurrent invocation runs inside another): a crash fails the whole batch, and a slow call uses the
    time of the calls after it. Events that cannot make an attempt fail (a second supervisor, a concurrent
    invocation) are counted with ``attribute=False``.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.touched: defaultdict[Tag, set[str]] = defaultdict(set)
        self.context: list[list[Tag]] = []
        #: Per running invocation (a stack, as ``context``): the attempts its writes put in flight whose messages it
        #: has not sent yet. A crash anywhere in it loses them: a give-back that starts a tenant's queued workflow
        #: writes it RUNNING, then deletes its queue entry, then starts the next, and sends at the end.
        self.unsent: list[list[Tag]] = []

    def __call__(self, kind: str, tags: Iterable[Tag | None] = (), *, attribute: bool = True) -> None:
        self.counts[kind] += 1
        if not attribute:
            return
        unsent = self.unsent[-1] if self.unsent else ()
        for tag in [*tags, *(self.context[-1] if self.context else ()), *unsent]:
            if tag is not None:
                self.touched[tag].add(kind)


# ---------------------------------------------------------------------------------------------------- SQS
@dataclass
class SimMessage:
    message_id: str
    body: str
    sent_at: float
    visible_at: float
    receive_count: int = 0
    first_received_at: float | None = None
    receipt: str = ""
    #: When each receive happened, and when the invocation that handled it returned, by receive (1-based count);
    #: invariant 19 reads a poison message's next receive against the end of the invocation before it.
    received_at: list[float] = field(default_factory=list)
    handled_at: dict[int, float] = field(default_factory=dict)
    dead_lettered_at: float | None = None


@dataclass
class QueueSpec:
    url: str
    visibility_timeout: int
    max_receive_count: int | None
    dead_letter_url: str | None


class SimQueues:
    """SQS standard queues on the simulated clock."""

    def __init__(self, specs: Sequence[QueueSpec], clock: Clock, rng: random.Random) -> None:
        self.specs = {spec.url: spec for spec in specs}
        self.messages: dict[str, list[SimMessage]] = {spec.url: [] for spec in specs}
        self.clock = clock
        self.rng = rng
        self._ids = itertools.count(1)

    def send(self, url: str, body: str, delay_seconds: float = 0) -> str:
        if url not in self.messages:
            raise KeyError(f"no queue {url}")
        now = self.clock.now()
        message = SimMessage(f"m-{next(self._ids):07d}", body, now, now + delay_seconds)
        self.messages[url].append(message)
        return message.message_id

    def receive(
        self,
        url: str,
        max_messages: int,
        prefer: Callable[[SimMessage], bool] | None = None,
        group: Callable[[SimMessage], object] | None = None,
    ) -> list[SimMessage]:
        """Receive up to ``max_messages`` visible messages (random order); redrive over-received ones to the DLQ.

        ``prefer`` puts the messages it accepts first (still in random order among themselves): the simulation uses
        it to hand a concurrent instance the messages most likely to race with the running one. ``group`` takes at
        most one message per group (for example per workflow), leaving the others visible for another consumer.
        """
        spec = self.specs[url]
        now = self.clock.now()
        visible = [m for m in self.messages[url] if m.visible_at <= now]
        self.rng.shuffle(visible)
        if prefer is not None:
            visible.sort(key=lambda m: not prefer(m))
        received: list[SimMessage] = []
        groups: set[object] = set()
        for message in visible:
            if len(received) >= max_messages:
                break
            if group is not None:
                key = group(message)
                if key in groups:
                    continue
                groups.add(key)
            if spec.max_receive_count is not None and message.receive_count >= spec.max_receive_count:
                # SQS moves a message to the DLQ when a receive would exceed maxReceiveCount.
                self.messages[url].remove(message)
                assert spec.dead_letter_url is not None
                message.visible_at = now
                message.dead_lettered_at = now
                self.messages[spec.dead_letter_url].append(message)
                continue
            message.receive_count += 1
            message.received_at.append(now)
            message.first_received_at = message.first_received_at or now
            message.visible_at = now + spec.visibility_timeout
            message.receipt = f"{message.message_id}#{message.receive_count}"
            received.append(message)
        return received

    def visible(self, url: str, accept: Callable[[SimMessage], bool]) -> int:
        """How many visible messages of ``url`` ``accept`` takes."""
        now = self.clock.now()
        return sum(1 for m in self.messages[url] if m.visible_at <= now and accept(m))

    def delete(self, url: str, receipt: str) -> None:
        self.messages[url] = [m for m in self.messages[url] if m.receipt != receipt]

    def make_visible(self, receipt: str) -> bool:
        """Make the message received as ``receipt`` visible now (ChangeMessageVisibility 0); False if it is gone."""
        for messages in self.messages.values():
            for message in messages:
                if message.receipt == receipt:
                    message.visible_at = self.clock.now()
                    return True
        return False

    def next_visible_at(self, urls: Sequence[str]) -> float | None:
        times = [m.visible_at for url in urls for m in self.messages[url]]
        return min(times) if times else None

    def pending(self, urls: Sequence[str]) -> int:
        return sum(len(self.messages[url]) for url in urls)


class SimBus:
    """The handlers' message bus, over ``SimQueues``, with send faults."""

    def __init__(self, queues: SimQueues, rng: random.Random, faults: Faults, log: FaultLog) -> None:
        self.queues = queues
        self.rng = rng
        self.faults = faults
        self.log = log
        self.armed = False

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        tags = [tag_of(message.body) for message in messages]
        if self.armed and self.rng.random() < self.faults.crash_before_send:
            self.log("crash before send", tags)
            raise SimCrash("crash before SendMessageBatch")
        for message, tag in zip(messages, tags, strict=True):
            delay = float(message.delay_seconds)
            if self.armed and self.rng.random() < self.faults.delay:
                self.log("delayed delivery", [tag])
                delay += self.rng.uniform(1, self.faults.delay_max_seconds)
            self.queues.send(message.queue_url, message.body, delay)
            if self.armed and self.rng.random() < self.faults.duplicate:
                self.log("duplicate delivery", [tag])
                self.queues.send(message.queue_url, message.body, delay + self.rng.uniform(0, 5))
        if self.log.unsent:
            sent = set(tags)
            self.log.unsent[-1][:] = [tag for tag in self.log.unsent[-1] if tag not in sent]
        if self.armed and self.rng.random() < self.faults.crash_after_send:
            self.log("crash after send", tags)
            raise SimCrash("crash after SendMessageBatch")
        return []

    def make_visible(self, receipts: Sequence[Receipt]) -> int:
        """ChangeMessageVisibilityBatch with 0: each message received as one of ``receipts`` is visible now."""
        return sum(1 for receipt in receipts if not self.queues.make_visible(receipt.receipt_handle))


# ---------------------------------------------------------------------------------------------------- DynamoDB crashes
class CrashInjector:
    """Raises ``SimCrash`` just before or just after DynamoDB calls made while ``armed``.

    ``idempotency_table`` names the agents' table: a write of an idempotency record's result there (an UpdateItem
    of a key that is not a circuit breaker's) is where an agent dies after its remote effect and before recording
    it (``Faults.agent_killed_after_effect``): the record stays in progress until the invocation's deadline.
    """

    def __init__(self, rng: random.Random, faults: Faults, log: FaultLog, *, idempotency_table: str = "") -> None:
        self.rng = rng
        self.faults = faults
        self.log = log
        self.idempotency_table = idempotency_table
        self.armed = False
        self.calls = 0
        self.on_call: Any = None  # hook (operation, request body) for interleaving a second instance

    def install(self, client: Any) -> None:
        client.meta.events.register("before-call.dynamodb.*", self._before)
        client.meta.events.register("after-call.dynamodb.*", self._after)

    def _before(self, model: Any, params: Any = None, **_: Any) -> None:
        if not self.armed:
            return
        self.calls += 1
        body = params.get("body", b"") if isinstance(params, dict) else b""
        text = body.decode() if isinstance(body, bytes) else str(body)
        if self.on_call is not None:
            self.on_call(model.name, text)
        killed = self.faults.agent_killed_after_effect
        if model.name == "UpdateItem" and self._records_a_result(text) and self.rng.random() < killed:
            self.log("agent killed after its remote effect")
            raise SimCrash("agent killed before recording its result")
        if self.rng.random() < self.faults.crash_before_call:
            self.log("crash before DynamoDB call")
            raise SimCrash(f"crash before {model.name}")

    def _records_a_result(self, text: str) -> bool:
        if not self.idempotency_table:
            return False
        request = json.loads(text or "{}")
        key = request.get("Key", {}).get("id", {}).get("S", "")
        return bool(request.get("TableName") == self.idempotency_table and key and not key.startswith("circuit"))

    def _after(self, model: Any, context: Any = None, **_: Any) -> None:
        if self.armed and self.rng.random() < self.faults.crash_after_call:
            # A workflow written just before the crash has attempts in flight whose messages are never sent.
            item = (context or {}).get("sim_params", {}).get("Item", {}) if model.name == "PutItem" else {}
            self.log("crash after DynamoDB call", in_flight_tags(item) if "version" in item else ())
            raise SimCrash(f"crash after {model.name}")
        if self.armed and self.log.unsent and model.name == "PutItem":
            item = (context or {}).get("sim_params", {}).get("Item", {})
            if "version" in item:
                self.log.unsent[-1].extend(in_flight_tags(item))


# ---------------------------------------------------------------------------------------------------- stale reads
class StaleReads:
    """Eventually consistent GetItems of workflow items that sometimes return the version before the latest.

    DynamoDB may answer an eventually consistent read from a replica that has not seen the latest write yet (an
    older item, or none right after the item was created); moto always answers from the latest. Every workflow write
    DynamoDB accepts is remembered (``committed``), and a read with ``ConsistentRead`` false returns, with the
    ``stale_read`` probability, the image that write replaced. Strongly consistent reads are never stale.
    """

    def __init__(self, rng: random.Random, faults: Faults, log: FaultLog) -> None:
        self.rng = rng
        self.faults = faults
        self.log = log
        self.armed = False
        self._previous: dict[str, dict[str, Any] | None] = {}
        self._latest: dict[str, dict[str, Any]] = {}

    def committed(self, key: str, item: dict[str, Any]) -> None:
        """Remember that ``item`` (a PutItem's ``Item`` parameter: DynamoDB JSON, as a read parses it) is now stored
        under ``key`` (``WF#<id>``)."""
        self._previous[key] = self._latest.get(key)
        self._latest[key] = item

    def latest(self, key: str) -> dict[str, Any] | None:
        """The item last committed under ``key``, or None."""
        return self._latest.get(key)

    def install(self, client: Any) -> None:
        client.meta.events.register("before-call.dynamodb.GetItem", self._before_get)

    def _before_get(self, params: Any, **_: Any) -> Any:
        if not self.armed:
            return None
        body = json.loads(params.get("body", b"{}") or b"{}")
        key = body.get("Key", {}).get("pk", {}).get("S", "")
        if body.get("ConsistentRead") or not key.startswith("WF#") or key not in self._previous:
            return None
        if self.rng.random() >= self.faults.stale_read:
            return None
        self.log("stale read")
        old = self._previous[key]
        parsed: dict[str, Any] = {"Item": old} if old is not None else {}
        return _FakeHttpResponse(), parsed


class _FakeHttpResponse:
    """Enough of a botocore HTTP response for a ``before-call`` handler's answer."""

    def __init__(self) -> None:
        self.status_code = 200
        self.headers: dict[str, str] = {}
        self.content = b""
        self.text = ""


# ---------------------------------------------------------------------------------------------------- remote services
@dataclass
class Effect:
    token: str
    step: str
    workflow_id: str
    applied_at: float
    seq: int
    undone_by: list[int] = field(default_factory=list)


class SimRemote:
    """A remote service with fault knobs and a ground-truth ledger (effects and compensations by token).

    A forward token is applied at most once; a replay returns the stored answer. A compensation undoes the effect of
    its ``original_token`` once; a compensation that arrives first leaves a tombstone that refuses the late action.
    """

    def __init__(
        self, name: str, clock: ManualClock, rng: random.Random, faults: Faults, log: FaultLog, seq: Iterator[int]
    ) -> None:
        self.name = name
        self.clock = clock
        self.rng = rng
        self.faults = faults
        self.log = log
        self.seq = seq
        self.outages: list[tuple[float, float]] = []
        self.effects: dict[str, Effect] = {}
        self.applications: Counter[str] = Counter()
        self.answers: dict[str, dict[str, Any] | RemoteRejectedError] = {}
        self.tombstones: set[str] = set()
        self.undo_log: list[tuple[int, str, str]] = []  # (seq, original token, compensation token)
        self.calls = 0
        #: When each call started (the simulation's clock), and what to check as one starts (invariant 21).
        self.starts: list[float] = []
        self.on_call: Callable[[], None] | None = None

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        self.calls += 1
        now = self.clock.now()
        self.starts.append(now)
        if self.on_call is not None:
            self.on_call()
        tag = (request.workflow_id, request.step, request.phase.value, request.attempt)
        if any(start <= now < end for start, end in self.outages):
            self.log("remote outage", [tag])
            raise RemoteTransientError("503 outage", status=503)
        if self.rng.random() < self.faults.remote_transient:
            self.log("remote transient 5xx", [tag])
            raise RemoteTransientError("503 transient", status=503)
        if self.rng.random() < self.faults.remote_slow:
            self.log("remote slow", [tag])
            self.clock.advance(min(timeout_seconds * 0.5, self.rng.uniform(0.5, 3.0)))
        hang = self.rng.random() < self.faults.remote_hang
        result = self._apply(request)
        if hang:
            # The caller gives up at its timeout; whether the effect happened is unknown to it.
            self.log("remote hang past timeout", [tag])
            self.clock.advance(timeout_seconds)
            raise RemoteTransientError("read timeout", outcome_unknown=True)
        if isinstance(result, RemoteRejectedError):
            raise result
        return result

    def _apply(self, request: StepRequest) -> dict[str, Any] | RemoteRejectedError:
        token = request.token
        if token in self.answers:
            return self.answers[token]
        answer: dict[str, Any] | RemoteRejectedError
        if request.original_token is None:
            if token in self.tombstones:
                answer = RemoteRejectedError("ALREADY_COMPENSATED", "compensated before it arrived", 409)
            elif self.rng.random() < self.faults.remote_reject:
                self.log(
                    "remote business rejection",
                    [(request.workflow_id, request.step, request.phase.value, request.attempt)],
                )
                answer = RemoteRejectedError("REJECTED", f"{self.name} says no", 409)
            else:
                seq = next(self.seq)
                self.applications[token] += 1
                self.effects[token] = Effect(token, request.step, request.workflow_id, self.clock.now(), seq)
                answer = {"service": self.name, "confirmation": f"{self.name[:2].upper()}-{token[:8]}", "seq": seq}
                if "manifest" in request.input:
                    answer["manifest"] = request.input["manifest"]  # a large output: the agent claim-checks it
        else:
            original = request.original_token
            effect = self.effects.get(original)
            seq = next(self.seq)
            if effect is not None:
                effect.undone_by.append(seq)
                answer = {"undone": True, "seq": seq}
            else:
                self.tombstones.add(original)
                answer = {"undone": False, "reason": "nothing_to_undo", "seq": seq}
            self.undo_log.append((seq, original, token))
        self.answers[token] = answer
        return answer


# ---------------------------------------------------------------------------------------------------- time
@contextmanager
def powertools_on_clock(clock: Clock) -> Iterator[None]:
    """Make powertools' idempotency (record expiry, in-progress expiry) read ``clock`` instead of the wall clock."""
    from aws_lambda_powertools.utilities.idempotency import base
    from aws_lambda_powertools.utilities.idempotency.persistence import base as persistence_base
    from aws_lambda_powertools.utilities.idempotency.persistence import datarecord, dynamodb

    class _Datetime(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> _Datetime:
            moment = datetime.datetime.fromtimestamp(clock.now(), tz)
            return cls(*moment.timetuple()[:6], moment.microsecond, moment.tzinfo)

    stdlib = datetime

    class _Module:
        datetime = _Datetime
        timedelta = stdlib.timedelta
        timezone = stdlib.timezone

    modules: tuple[Any, ...] = (base, persistence_base, datarecord, dynamodb)
    saved = [module.dt for module in modules]
    for module in modules:
        module.dt = _Module
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.dt = original
