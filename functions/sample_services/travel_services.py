"""Sample remote services of the trip-booking saga: flights, hotels and payments.

These are the *remote services* of the Scheduler Agent Supervisor pattern, i.e. the systems that the agents call.
They are deliberately imperfect: each carries fault knobs (latency, transient errors, an outage window, business
rejections, and hangs whose effect lands after the caller has given up), so that the workflow engine can be tested
against the failures the pattern exists for.

This module is pure logic. It has no boto3 and no HTTP: the ledger, the random source and the clock are injected,
so a run with a seeded ``random.Random`` and a fake clock replays exactly.

Wire contract (what the agents are written against)
---------------------------------------------------
``POST {base_url}/{action}`` with headers ``Content-Type: application/json`` and ``Idempotency-Key: <token>`` and
the JSON body ``{"token", "workflow_id", "step", "input", "original_token"}``. ``original_token`` is null on a
forward action and names the forward token to undo on a compensation.

==========================  ======  ====================================================================
outcome                     status  body
==========================  ======  ====================================================================
effect applied              200     ``{"service", "action", "confirmation", "token", "replayed": false}``
replay of a stored token    same    the stored body; a 200 body carries ``"replayed": true``
business rejection          409     ``{"error": "NO_SEATS" | "NO_ROOMS", "message"}`` (stored by token)
                            422     ``{"error": "CARD_DECLINED", "message"}`` (stored by token)
late forward action         409     ``{"error": "ALREADY_COMPENSATED", "message"}``
compensation                200     ``{..., "undone": true}`` or ``{..., "undone": false, "reason": "nothing_to_undo"}``
transient failure, outage   503     ``{"error": "UNAVAILABLE", "message"}`` (nothing applied, nothing stored)
over the service's quota    429     ``{"error": "THROTTLED", "message"}`` (nothing applied, nothing stored)
unknown action              404     ``{"error": "UNKNOWN_ACTION", "message"}``
malformed request           400     ``{"error": "BAD_REQUEST" | "TOKEN_REUSED", "message"}``
==========================  ======  ====================================================================

Large payloads (the claim-check demo)
-------------------------------------
A forward action's 200 body also carries ``"manifest"``, a deterministic text of ``input.output_bytes`` bytes (at
most `MAX_DEMO_PAYLOAD_BYTES`; derived from the token, never stored in the ledger), and, when the input holds a
string ``manifest``, its ``"manifest_sha256"`` and ``"manifest_bytes"``: so a 5 MB output of one step can be seen
to reach the next one intact (docs/definitions.md, "Large payloads").

Calls counted and a quota
-------------------------
Each service counts the calls it is serving at once and the calls that reach it in every one-second window
(``CallMeter``; ``stats()`` reports the peaks). The knobs ``quota_in_flight``, ``quota_rate`` and ``quota_burst``
make it a rate-limited service as real ones are: a call beyond them is answered 429 ``THROTTLED`` at the door. The
rate is metered as a token bucket (GCRA: ``quota_rate`` calls per second, ``quota_burst`` at once) that lets a
call arrive up to ``quota_tolerance_ms`` early, the jitter of the network between a caller's clock and the
service's (ATM's cell delay variation tolerance); so a caller that keeps the same bucket by its own clock is never
refused. ``make burst`` gives the hotels service the hotels agent's limits from agents.yaml and checks that nothing
was throttled.

Ledger layout
-------------
One ledger (key -> record, put-if-absent) holds, per service:

* ``{service}#token#{token}``: the outcome of a request token. Either a stored response (effect, rejection or
  compensation response), or a *tombstone* written by a compensation that found nothing to undo.
* ``{service}#undo#{original_token}``: the undo of a forward token's effect (at most one per forward token).

A forward action and the compensation of its token race for the *same* key, ``{service}#token#{token}``, so the
ledger's put-if-absent decides which came first. That is what guarantees that a late forward action never takes
effect after its compensation (Compensating Transaction pattern: a compensation must be able to run before the
action it undoes has been seen).

Every record carries ``created_at`` (the service clock, epoch seconds) and ``sequence``, drawn from a monotonic
counter when the record is written. Services built without their own counter share one per process (the local
stack and the tests run all three in one process), so ``TravelService.history`` can tell in which order effects
were applied and undone *across* services, e.g. that a saga undid the hotel before the flight.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from random import Random
from types import MappingProxyType
from typing import Annotated, Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

logger = logging.getLogger(__name__)

EpochSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False, description="Epoch seconds (UTC).")]
Rate = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, description="Probability per request, 0..1.")]
Token = Annotated[str, StringConstraints(min_length=1, max_length=512)]
NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=512)]

IDEMPOTENCY_HEADER = "idempotency-key"


# ---------------------------------------------------------------- catalogue


@dataclass(frozen=True)
class ServiceSpec:
    """What one sample service does and how it says no.

    Attributes
    ----------
    name : str
        Service name, also the path segment on AWS (``/sample/{name}/{action}``).
    action : str
        The forward action.
    compensation : str
        The compensating action that undoes ``action``.
    rejection_code : str
        Business rejection code returned when the forward action is refused.
    rejection_status : int
        HTTP status of that rejection (409 or 422).
    confirmation_prefix : str
        Prefix of the confirmation code, e.g. ``FL`` gives ``FL-1A2B3C4D``.
    """

    name: str
    action: str
    compensation: str
    rejection_code: str
    rejection_status: int
    confirmation_prefix: str

    @property
    def actions(self) -> tuple[str, str]:
        """Both routable actions, forward first."""
        return (self.action, self.compensation)


SERVICES: Mapping[str, ServiceSpec] = MappingProxyType(
    {
        "flights": ServiceSpec("flights", "reserve", "cancel_reservation", "NO_SEATS", 409, "FL"),
        "hotels": ServiceSpec("hotels", "book", "cancel_booking", "NO_ROOMS", 409, "HT"),
        "payments": ServiceSpec("payments", "charge", "refund", "CARD_DECLINED", 422, "PY"),
    }
)


# ---------------------------------------------------------------- ports


class Clock(Protocol):
    """Source of time. Tests inject a fake whose ``sleep`` advances ``now`` instantly."""

    def now(self) -> float:
        """Return the current time in epoch seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (blocking for a real clock)."""
        ...


class SystemClock:
    """The wall clock: ``time.time`` and ``time.sleep``."""

    def now(self) -> float:
        """Return the current time in epoch seconds."""
        return time.time()

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` seconds."""
        time.sleep(seconds)


class SequenceCounter:
    """A thread-safe monotonic counter (1, 2, 3, ...): the order in which records are written.

    Parameters
    ----------
    start : int
        The first number handed out (>= 1).
    """

    def __init__(self, start: int = 1) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count(start)

    def __call__(self) -> int:
        """Return the next number; each call gets a larger one than every earlier call."""
        with self._lock:
            return next(self._numbers)


#: The counter of services built without their own: one order for every record written by this process.
PROCESS_SEQUENCE = SequenceCounter()


class LedgerRecord(BaseModel):
    """A store item of the sample ledger (see the module docstring for the key layout).

    ``kind`` is ``response`` (a stored outcome of a request token), ``tombstone`` (a compensation reached the token
    before its forward action) or ``undo`` (a forward token's effect was undone). ``sequence`` orders the records
    written by one process (0: written before records carried it); ``created_at`` is the service clock's time.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["response", "tombstone", "undo"]
    service: str
    action: str
    token: str
    workflow_id: str
    step: str
    created_at: EpochSeconds
    sequence: int = Field(default=0, ge=0)
    status: int | None = None
    body: dict[str, Any] | None = None
    effect: bool = False
    original_token: str | None = None
    compensation_token: str | None = None


class Ledger(Protocol):
    """Durable, thread-safe key -> record store with put-if-absent (the idempotency ledger of a service)."""

    def put_if_absent(self, key: str, record: LedgerRecord) -> LedgerRecord | None:
        """Store ``record`` under ``key`` unless the key exists.

        Returns
        -------
        LedgerRecord or None
            None when ``record`` was stored, else the record already under ``key`` (which is left unchanged).

        Raises
        ------
        LedgerUnavailableError
            The store could not be reached; nothing is known to have been written.
        """
        ...

    def get(self, key: str) -> LedgerRecord | None:
        """Return the record under ``key``, or None. Raises ``LedgerUnavailableError`` like ``put_if_absent``."""
        ...

    def records(self) -> list[tuple[str, LedgerRecord]]:
        """Return every ``(key, record)`` pair, in no particular order."""
        ...


class InMemoryLedger:
    """A ``Ledger`` in a dict behind a lock (the local stack and tests)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, LedgerRecord] = {}

    def put_if_absent(self, key: str, record: LedgerRecord) -> LedgerRecord | None:
        """Store ``record`` under ``key`` unless present; return None if stored, else the existing record."""
        with self._lock:
            existing = self._items.get(key)
            if existing is None:
                self._items[key] = record
            return existing

    def get(self, key: str) -> LedgerRecord | None:
        """Return the record under ``key``, or None."""
        with self._lock:
            return self._items.get(key)

    def records(self) -> list[tuple[str, LedgerRecord]]:
        """Return every ``(key, record)`` pair in insertion order."""
        with self._lock:
            return list(self._items.items())


# ---------------------------------------------------------------- errors


class TravelServiceError(Exception):
    """Base of the sample services' errors; each maps to one HTTP status and error code."""

    status: int = 500
    code: str = "INTERNAL"

    def to_response(self) -> tuple[int, dict[str, Any]]:
        """Return ``(status, {"error": code, "message": str(self)})``."""
        return self.status, {"error": self.code, "message": str(self)}


class BadRequestError(TravelServiceError):
    """The request is malformed (body, token or header). Permanent."""

    status = 400
    code = "BAD_REQUEST"


class TokenReusedError(BadRequestError):
    """The token is already used by another action of this service. Permanent."""

    code = "TOKEN_REUSED"


class UnknownActionError(TravelServiceError):
    """The service has no such action. Permanent."""

    status = 404
    code = "UNKNOWN_ACTION"


class ServiceUnavailableError(TravelServiceError):
    """The service cannot answer now and applied nothing. Retryable."""

    status = 503
    code = "UNAVAILABLE"


class LedgerUnavailableError(ServiceUnavailableError):
    """The ledger could not be reached (raised by ledger adapters). Retryable."""


# ---------------------------------------------------------------- models


class FaultKnobs(BaseModel):
    """Fault knobs of one service; immutable, replace them with ``TravelService.update_knobs``.

    Attributes
    ----------
    latency_ms : float
        Fixed latency added to every request that is not refused by an outage, in milliseconds (0..60000).
    transient_error_rate : float
        Probability (0..1) that a request is answered 503 ``UNAVAILABLE`` before any effect.
    rejection_rate : float
        Probability (0..1) that a new forward action is refused with the service's business rejection.
    hang_rate : float
        Probability (0..1) that a new action hangs for ``hang_seconds`` and *then* applies its effect and answers 200.
    hang_seconds : float
        Length of a hang in seconds (0..3600). Make it longer than the step's complete-by budget.
    compensation_error_rate : float
        Probability (0..1) that a compensation is answered 503 ``UNAVAILABLE`` before any effect, forward actions
        untouched: how a drill makes a workflow end ``COMPENSATION_FAILED``. Drawn from a stream of its own, so
        setting it changes no other fault of a seeded run.
    outage_start, outage_end : float or None
        Outage window ``[outage_start, outage_end)`` in epoch seconds; both set or both None.
    quota_in_flight : int or None
        Calls the service serves at once; one more is answered 429 ``THROTTLED`` (None: no limit).
    quota_rate, quota_burst : float or None, int or None
        Calls per second, and how many may come at once (default: one second's worth), metered as a token bucket;
        a call beyond it is answered 429 ``THROTTLED`` (None: no limit). ``quota_burst`` needs ``quota_rate``.
    quota_tolerance_ms : float
        How early a call may arrive for the rate and still pass (0..10000 ms): the delay variation of the network.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_ms: Annotated[float, Field(ge=0, le=60_000, allow_inf_nan=False)] = 0.0
    transient_error_rate: Rate = 0.0
    rejection_rate: Rate = 0.0
    hang_rate: Rate = 0.0
    hang_seconds: Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)] = 30.0
    compensation_error_rate: Rate = 0.0
    outage_start: EpochSeconds | None = None
    outage_end: EpochSeconds | None = None
    quota_in_flight: Annotated[int, Field(ge=1, le=100_000)] | None = None
    quota_rate: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)] | None = None
    quota_burst: Annotated[int, Field(ge=1, le=100_000)] | None = None
    quota_tolerance_ms: Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)] = 50.0

    @model_validator(mode="after")
    def _outage_window_is_whole(self) -> FaultKnobs:
        if (self.outage_start is None) != (self.outage_end is None):
            raise ValueError("outage_start and outage_end are set together")
        if self.outage_start is not None and self.outage_end is not None and self.outage_end < self.outage_start:
            raise ValueError("outage_end must not be before outage_start")
        if self.quota_burst is not None and self.quota_rate is None:
            raise ValueError("quota_burst is the calls quota_rate lets through at once: set quota_rate with it")
        return self

    @property
    def quota_burst_calls(self) -> int:
        """The burst of the rate quota in effect: ``quota_burst``, else one second's calls (at least 1)."""
        if self.quota_burst is not None:
            return self.quota_burst
        return max(1, math.ceil(self.quota_rate or 1))

    def in_outage(self, now: float) -> bool:
        """Return True when ``now`` (epoch seconds) lies in ``[outage_start, outage_end)``."""
        if self.outage_start is None or self.outage_end is None:
            return False
        return self.outage_start <= now < self.outage_end

    def updated(self, changes: Mapping[str, Any]) -> FaultKnobs:
        """Return a copy with ``changes`` applied and validated as a whole.

        Raises
        ------
        pydantic.ValidationError
            A value is out of range, a field is unknown, or the outage window is inconsistent.
        """
        return FaultKnobs.model_validate({**self.model_dump(), **changes})


class ActionRequest(BaseModel):
    """API request body of ``POST /{action}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    token: Token
    workflow_id: NonEmpty
    step: NonEmpty
    input: dict[str, Any] = Field(default_factory=dict)
    original_token: Token | None = None


class Outcome(StrEnum):
    """How a call ended; ``TravelService.stats`` counts calls by outcome."""

    APPLIED = "applied"
    REPLAYED = "replayed"
    REJECTED = "rejected"
    ALREADY_COMPENSATED = "already_compensated"
    UNDONE = "undone"
    NOTHING_TO_UNDO = "nothing_to_undo"
    TRANSIENT = "transient"
    OUTAGE = "outage"
    THROTTLED = "throttled"
    BAD_REQUEST = "bad_request"
    NOT_FOUND = "not_found"


#: Largest ``manifest`` a forward action makes on request (bytes): the claim-check demo's MaxPayloadBytes.
MAX_DEMO_PAYLOAD_BYTES = 10_485_760


def demo_manifest(token: str, size: int) -> str:
    """The deterministic ``manifest`` of ``size`` bytes a forward action of ``token`` answers with (hex digits)."""
    seed = hashlib.sha256(token.encode()).hexdigest()
    return (seed * (size // len(seed) + 1))[:size]


def _with_demo_payloads(request: ActionRequest, answer: Answer) -> Answer:
    if answer.status != 200:
        return answer
    body = dict(answer.body)
    size = request.input.get("output_bytes")
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= MAX_DEMO_PAYLOAD_BYTES:
        body["manifest"] = demo_manifest(request.token, size)
    manifest = request.input.get("manifest")
    if isinstance(manifest, str):
        body["manifest_sha256"] = hashlib.sha256(manifest.encode()).hexdigest()
        body["manifest_bytes"] = len(manifest.encode())
    return Answer(answer.outcome, answer.status, body)


class Answer(NamedTuple):
    """A response of a service: how the call ended, the HTTP status and the JSON body."""

    outcome: Outcome
    status: int
    body: dict[str, Any]


# ---------------------------------------------------------------- the service's own count of its calls


class CallMeter:
    """What a service sees of its callers: calls at once, calls in every one-second window, and its quota.

    Thread-safe. ``admit`` is called as a call arrives (after the outage check) and ``release`` when an admitted
    call is answered. Every arrival counts in the one-second windows, throttled or not (it reached the service).
    """

    #: The window of ``busiest_second`` (seconds).
    WINDOW_SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._in_flight_peak = 0
        self._arrivals: deque[float] = deque()
        self._busiest = 0
        # GCRA's theoretical arrival time: when the rate's bucket would next be full with this call counted.
        self._tat: float | None = None

    def admit(self, knobs: FaultKnobs, now: float) -> str | None:
        """Count an arriving call; return why it is throttled, or None when it is admitted (``release`` it later)."""
        with self._lock:
            self._arrivals.append(now)
            while self._arrivals and self._arrivals[0] <= now - self.WINDOW_SECONDS:
                self._arrivals.popleft()
            self._busiest = max(self._busiest, len(self._arrivals))
            if knobs.quota_in_flight is not None and self._in_flight >= knobs.quota_in_flight:
                return f"allows {_calls(knobs.quota_in_flight)} at once"
            if knobs.quota_rate is not None:
                interval = 1.0 / knobs.quota_rate
                burst = knobs.quota_burst_calls
                tat = now if self._tat is None else max(self._tat, now)
                if tat - now > (burst - 1) * interval + knobs.quota_tolerance_ms / 1000.0:
                    return f"allows {_calls(knobs.quota_rate)} a second (burst {burst})"
                self._tat = tat + interval
            self._in_flight += 1
            self._in_flight_peak = max(self._in_flight_peak, self._in_flight)
            return None

    def release(self) -> None:
        """An admitted call was answered."""
        with self._lock:
            self._in_flight -= 1

    def counts(self) -> dict[str, int]:
        """``{"in_flight", "in_flight_peak", "busiest_second"}``: the calls being served now, the most ever served
        at once, and the most that arrived within one second."""
        with self._lock:
            return {
                "in_flight": self._in_flight,
                "in_flight_peak": self._in_flight_peak,
                "busiest_second": self._busiest,
            }


# ---------------------------------------------------------------- the service


class TravelService:
    """One sample remote service with an idempotency-token ledger and fault knobs.

    Parameters
    ----------
    name : str
        A key of ``SERVICES`` (``flights``, ``hotels`` or ``payments``).
    ledger : Ledger
        Where outcomes are stored by token. Services may share one ledger: keys are prefixed by ``name``.
    knobs : FaultKnobs
        Initial fault knobs.
    rng : random.Random
        Source of the fault draws. Seed it to replay a run.
    clock : Clock
        Source of time for latency, hangs and outage windows.
    sequence : Callable[[], int], optional
        Numbers the ledger records it writes (``LedgerRecord.sequence``); ``PROCESS_SEQUENCE`` by default, so the
        services of one process share one order.

    Raises
    ------
    ValueError
        ``name`` is not in ``SERVICES``.

    Notes
    -----
    Per request, after the outage check (no draw) and the latency: one draw for ``transient_error_rate``; then, for
    an action that is not a replay, one draw for ``rejection_rate`` (forward actions only) and one for ``hang_rate``.
    The number of draws depends only on the request kinds, so the same seed and calls give the same faults.
    """

    def __init__(
        self,
        name: str,
        ledger: Ledger,
        knobs: FaultKnobs,
        rng: Random,
        clock: Clock,
        *,
        sequence: Callable[[], int] = PROCESS_SEQUENCE,
    ) -> None:
        if name not in SERVICES:
            raise ValueError(f"unknown service {name!r}; expected one of {sorted(SERVICES)}")
        self.spec = SERVICES[name]
        self.name = name
        self._ledger = ledger
        self._knobs = knobs
        self._rng = rng
        # Compensation faults draw from a stream of their own: the main stream's draws stay as they were.
        self._compensation_rng = Random(f"compensation-faults:{name}")  # nosec B311 # seeded fault draws, replayable
        self._clock = clock
        self._sequence = sequence
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._effects: Counter[str] = Counter()
        self._compensations: Counter[str] = Counter()
        self._hangs = 0
        self._meter = CallMeter()

    # ------------------------------------------------------------ knobs

    @property
    def knobs(self) -> FaultKnobs:
        """The fault knobs in force."""
        return self._knobs

    def update_knobs(self, changes: Mapping[str, Any]) -> FaultKnobs:
        """Apply a partial update of the fault knobs and return the knobs in force.

        Parameters
        ----------
        changes : Mapping[str, Any]
            Field name -> new value; fields not named keep their value.

        Raises
        ------
        pydantic.ValidationError
            The resulting knobs are invalid; the knobs in force are unchanged.
        """
        with self._lock:
            self._knobs = self._knobs.updated(changes)
            return self._knobs

    def start_outage(self, seconds: float) -> FaultKnobs:
        """Start an outage now that lasts ``seconds`` seconds: window ``[now, now + seconds)``.

        Raises
        ------
        ValueError
            ``seconds`` is negative or not finite.
        """
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("outage seconds must be a finite number >= 0")
        now = self._clock.now()
        return self.update_knobs({"outage_start": now, "outage_end": now + seconds})

    # ------------------------------------------------------------ observations

    def effects(self) -> dict[str, int]:
        """Applied forward effects by token, counted by this process when applied.

        Each count must be 1: more is a double effect. On Lambda each instance counts only its own calls; the
        ledger is the durable record.
        """
        with self._lock:
            return dict(self._effects)

    def compensations(self) -> dict[str, int]:
        """Undone effects by the forward (original) token. Each count must be 1."""
        with self._lock:
            return dict(self._compensations)

    def active_effects(self) -> list[str]:
        """Tokens whose effect was applied and not undone, sorted (what a finished saga must leave consistent)."""
        with self._lock:
            return sorted(token for token in self._effects if token not in self._compensations)

    def history(self, workflow_id: str | None = None) -> list[LedgerRecord]:
        """This service's ledger records (of one workflow, or all), in the order they were written.

        An ``undo`` record is a compensation applied (its ``step``, ``original_token``, ``created_at`` and
        ``sequence`` say which effect was undone, when, and in which order); a ``response`` record with ``effect``
        is a forward effect applied. Records of services that share a sequence (``PROCESS_SEQUENCE``) can be
        merged and sorted by ``sequence`` to see the order across services.
        """
        prefix = f"{self.name}#"
        records = [
            record
            for key, record in self._ledger.records()
            if key.startswith(prefix) and (workflow_id is None or record.workflow_id == workflow_id)
        ]
        return sorted(records, key=lambda record: record.sequence)

    def stats(self) -> dict[str, Any]:
        """Call counts: ``{"calls": int, "by_outcome": {outcome: int}, "hangs": int}``, and what `CallMeter.counts`
        saw (``in_flight``, ``in_flight_peak``, ``busiest_second``)."""
        with self._lock:
            counted = {
                "calls": sum(self._outcomes.values()),
                "by_outcome": {o.value: self._outcomes[o.value] for o in Outcome},
                "hangs": self._hangs,
            }
        return {**counted, **self._meter.counts()}

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view: service, knobs, effects, compensations, active effects, tombstones, undone and stats.

        ``undone`` lists the compensations applied, in the order they were applied:
        ``{"original_token", "workflow_id", "step", "sequence", "applied_at"}`` (``applied_at`` in epoch seconds).
        """
        prefix = f"{self.name}#token#"
        tombstones = sorted(
            record.token
            for key, record in self._ledger.records()
            if key.startswith(prefix) and record.kind == "tombstone"
        )
        return {
            "service": self.name,
            "knobs": self.knobs.model_dump(),
            "effects": self.effects(),
            "compensations": self.compensations(),
            "active_effects": self.active_effects(),
            "tombstones": tombstones,
            "undone": [
                {
                    "original_token": record.original_token,
                    "workflow_id": record.workflow_id,
                    "step": record.step,
                    "sequence": record.sequence,
                    "applied_at": record.created_at,
                }
                for record in self.history()
                if record.kind == "undo"
            ],
            "stats": self.stats(),
        }

    # ------------------------------------------------------------ the request path

    def handle(self, action: str, headers: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        """Serve ``POST /{action}``.

        Parameters
        ----------
        action : str
            The path segment after the base URL, e.g. ``reserve``.
        headers : Mapping[str, str]
            Request headers; names are matched case-insensitively. ``Idempotency-Key`` must equal the body token.
        body : bytes
            The raw JSON body (UTF-8).

        Returns
        -------
        tuple[int, dict]
            HTTP status and JSON object, as listed in the module docstring. Never raises for a bad request: every
            failure, including ``LedgerUnavailableError``, becomes a status and an ``{"error", "message"}`` body.
        """
        try:
            outcome, status, answer = self._serve(action, headers, body)
        except TravelServiceError as error:
            outcome = {400: Outcome.BAD_REQUEST, 404: Outcome.NOT_FOUND}.get(error.status, Outcome.TRANSIENT)
            status, answer = error.to_response()
        with self._lock:
            self._outcomes[outcome.value] += 1
        logger.debug("%s %s -> %s %s", self.name, action, status, outcome.value)
        return status, answer

    def _serve(self, action: str, headers: Mapping[str, str], body: bytes) -> Answer:
        knobs = self._knobs
        # An outage refuses everything at the door, before latency and before routing, like a dead endpoint.
        if knobs.in_outage(self._clock.now()):
            return Answer(Outcome.OUTAGE, 503, {"error": "UNAVAILABLE", "message": f"{self.name} is in an outage"})
        refusal = self._meter.admit(knobs, self._clock.now())
        if refusal is not None:
            return Answer(
                Outcome.THROTTLED, 429, {"error": "THROTTLED", "message": f"{self.name} {refusal}: try again later"}
            )
        try:
            return self._serve_admitted(action, headers, body, knobs)
        finally:
            self._meter.release()

    def _serve_admitted(self, action: str, headers: Mapping[str, str], body: bytes, knobs: FaultKnobs) -> Answer:
        if knobs.latency_ms > 0:
            self._clock.sleep(knobs.latency_ms / 1000.0)
        request = self._parse(action, headers, body)
        if self._draw(knobs.transient_error_rate):
            return Answer(
                Outcome.TRANSIENT, 503, {"error": "UNAVAILABLE", "message": f"{self.name} failed transiently"}
            )
        if action == self.spec.action:
            return _with_demo_payloads(request, self._forward(request, knobs))
        with self._lock:
            compensation_fails = self._compensation_rng.random() < knobs.compensation_error_rate
        if compensation_fails:
            return Answer(
                Outcome.TRANSIENT, 503, {"error": "UNAVAILABLE", "message": f"{self.name} failed its compensation"}
            )
        return self._compensate(request, knobs)

    def _parse(self, action: str, headers: Mapping[str, str], body: bytes) -> ActionRequest:
        if action not in self.spec.actions:
            raise UnknownActionError(f"{self.name} has no action {action!r}; expected one of {list(self.spec.actions)}")
        try:
            request = ActionRequest.model_validate_json(body)
        except ValidationError as error:
            raise BadRequestError(_first_error(error)) from None
        key = next((value for name, value in headers.items() if name.lower() == IDEMPOTENCY_HEADER), None)
        if key is None:
            raise BadRequestError("missing Idempotency-Key header")
        if key != request.token:
            raise BadRequestError("Idempotency-Key header does not match the body token")
        compensating = action == self.spec.compensation
        if compensating and request.original_token is None:
            raise BadRequestError(f"{action} needs original_token: the token of the {self.spec.action} to undo")
        if not compensating and request.original_token is not None:
            raise BadRequestError(f"original_token is only valid on {self.spec.compensation}")
        if request.original_token == request.token:
            raise BadRequestError("a compensation needs a token of its own, distinct from original_token")
        return request

    def _draw(self, rate: float) -> bool:
        # Always draw, so the stream position depends on the calls only and not on which knobs are set.
        with self._lock:
            return self._rng.random() < rate

    def _key(self, token: str) -> str:
        return f"{self.name}#token#{token}"

    def _record(self, request: ActionRequest, action: str, token: str | None = None, **fields: Any) -> LedgerRecord:
        return LedgerRecord(
            service=self.name,
            action=action,
            token=request.token if token is None else token,
            workflow_id=request.workflow_id,
            step=request.step,
            created_at=self._clock.now(),
            sequence=self._sequence(),
            **fields,
        )

    def _settled(self, request: ActionRequest, action: str, existing: LedgerRecord) -> Answer:
        """Answer a request whose token already has an outcome in the ledger."""
        if existing.kind == "tombstone":
            if action == self.spec.action:
                return Answer(
                    Outcome.ALREADY_COMPENSATED,
                    409,
                    {"error": "ALREADY_COMPENSATED", "message": f"token {request.token} was compensated before it ran"},
                )
            raise TokenReusedError(f"token {request.token} is the forward token of an earlier compensation")
        if existing.action != action or existing.status is None or existing.body is None:
            raise TokenReusedError(f"token {request.token} was already used for {existing.action}")
        body = dict(existing.body)
        if existing.status == 200:
            body["replayed"] = True
        return Answer(Outcome.REPLAYED, existing.status, body)

    def _forward(self, request: ActionRequest, knobs: FaultKnobs) -> Answer:
        spec = self.spec
        existing = self._ledger.get(self._key(request.token))
        if existing is not None:
            return self._settled(request, spec.action, existing)
        rejected = self._draw(knobs.rejection_rate) or request.input.get("simulate") == "reject"
        hangs = self._draw(knobs.hang_rate)
        if rejected:
            rejection: dict[str, Any] = {"error": spec.rejection_code, "message": f"{spec.name} refused {spec.action}"}
            record = self._record(request, spec.action, kind="response", status=spec.rejection_status, body=rejection)
            existing = self._ledger.put_if_absent(self._key(request.token), record)
            if existing is not None:
                return self._settled(request, spec.action, existing)
            return Answer(Outcome.REJECTED, spec.rejection_status, rejection)
        if hangs:
            self._hang(knobs)
        body: dict[str, Any] = {
            "service": spec.name,
            "action": spec.action,
            "confirmation": confirmation_code(spec.name, request.token),
            "token": request.token,
            "replayed": False,
        }
        record = self._record(request, spec.action, kind="response", status=200, body=body, effect=True)
        # The put-if-absent *is* the effect: it races a duplicate request and an early compensation (tombstone)
        # for the same key, and only the winner's outcome ever exists.
        existing = self._ledger.put_if_absent(self._key(request.token), record)
        if existing is not None:
            return self._settled(request, spec.action, existing)
        with self._lock:
            self._effects[request.token] += 1
        return Answer(Outcome.APPLIED, 200, body)

    def _compensate(self, request: ActionRequest, knobs: FaultKnobs) -> Answer:
        spec = self.spec
        original = request.original_token
        if original is None:  # _parse refuses this already; the check narrows the type
            raise BadRequestError(f"{spec.compensation} needs original_token")
        existing = self._ledger.get(self._key(request.token))
        if existing is not None:
            return self._settled(request, spec.compensation, existing)
        if self._draw(knobs.hang_rate):
            self._hang(knobs)
        # Timeline: forward F(token X) and compensation C(original X) race for key token#X.
        #   C first: C's tombstone wins, F later finds it and answers ALREADY_COMPENSATED (never applies).
        #   F first: C finds F's record; if it is an effect, C undoes it once (key undo#X).
        tombstone = self._record(
            request, spec.action, token=original, kind="tombstone", compensation_token=request.token
        )
        forward = self._ledger.put_if_absent(self._key(original), tombstone)
        base: dict[str, Any] = {
            "service": spec.name,
            "action": spec.compensation,
            "token": request.token,
            "original_token": original,
        }
        if forward is not None and forward.action != spec.action:
            raise TokenReusedError(f"original_token {original} is not a {spec.action} token")
        if forward is None or not forward.effect:
            outcome, body = Outcome.NOTHING_TO_UNDO, {**base, "undone": False, "reason": "nothing_to_undo"}
        else:
            undo = self._record(
                request, spec.compensation, kind="undo", original_token=original, compensation_token=request.token
            )
            previous = self._ledger.put_if_absent(f"{self.name}#undo#{original}", undo)
            if previous is None:
                with self._lock:
                    self._compensations[original] += 1
            confirmation = (forward.body or {}).get("confirmation")
            outcome, body = Outcome.UNDONE, {**base, "undone": True, "confirmation": confirmation}
        body["replayed"] = False
        record = self._record(
            request, spec.compensation, kind="response", status=200, body=body, original_token=original
        )
        existing = self._ledger.put_if_absent(self._key(request.token), record)
        if existing is not None:
            return self._settled(request, spec.compensation, existing)
        return Answer(outcome, 200, body)

    def _hang(self, knobs: FaultKnobs) -> None:
        with self._lock:
            self._hangs += 1
        self._clock.sleep(knobs.hang_seconds)


def _calls(count: float) -> str:
    return f"{count:g} call" if count == 1 else f"{count:g} calls"


def confirmation_code(service: str, token: str) -> str:
    """Return the confirmation code of ``token`` at ``service``, e.g. ``FL-1A2B3C4D``.

    It is derived from the token (SHA-256), so a replay, a racing duplicate and a test all see the same code.

    Raises
    ------
    KeyError
        ``service`` is not in ``SERVICES``.
    """
    digest = hashlib.sha256(f"{service}:{token}".encode()).hexdigest()[:8].upper()
    return f"{SERVICES[service].confirmation_prefix}-{digest}"


def _first_error(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"{where}: {first['msg']}"


def faults_from_json(raw: str | None) -> dict[str, FaultKnobs]:
    """Parse ``{"flights": {...}, "hotels": {...}}`` into knobs for every service (missing ones get defaults).

    Parameters
    ----------
    raw : str or None
        JSON object keyed by service name; None or blank means no faults.

    Raises
    ------
    ValueError
        The JSON is malformed, names an unknown service, or holds invalid knobs.
    """
    knobs = {name: FaultKnobs() for name in SERVICES}
    if raw is None or not raw.strip():
        return knobs
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"fault knobs are not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ValueError("fault knobs must be a JSON object keyed by service name")
    unknown = sorted(set(parsed) - set(SERVICES))
    if unknown:
        raise ValueError(f"fault knobs name unknown services {unknown}")
    for name, value in parsed.items():
        knobs[name] = FaultKnobs.model_validate(value)
    return knobs
