"""Fakes with real behaviour: a remote service with an idempotency-token ledger, shared breaker state in memory,
and a powertools persistence layer in memory (so unit tests run the real ``idempotent_function`` offline)."""

from __future__ import annotations

import copy
import itertools
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from sasflow.breaker import BreakerRecord, BreakerState
from sasflow.call_limits import LimitsRecord
from sasflow.clock import Clock
from sasflow.errors import RemoteRejectedError, RemoteTransientError
from sasflow.messages import StepRequest

#: Numbers every call of every FakeRemoteService of the process, so calls to different services can be ordered.
_CALL_ORDER = itertools.count(1)


@dataclass
class FakeRemoteService:
    """A remote service that applies each token's effect at most once and records every call.

    ``script`` maps an action to a list of scripted answers consumed one per call: ``"ok"``, ``"503"``,
    ``"reject"``, ``"timeout"`` (the effect happens, the caller sees a read timeout) or ``"slow:<seconds>"``
    (advance the clock, then succeed). When a script is empty the answer is ``default``. ``order`` holds, for each
    entry of ``calls``, its place among the calls of every fake service of the process (see ``calls_in_order``).
    """

    name: str
    clock: Clock
    default: str = "ok"
    script: dict[str, list[str]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    effects: Counter[str] = field(default_factory=Counter)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        with self._lock:
            self.calls.append((request.action, request.token))
            self.order.append(next(_CALL_ORDER))
            queue = self.script.get(request.action) or []
            answer = queue.pop(0) if queue else self.default
        if answer.startswith("slow:"):
            self.clock.sleep(float(answer.split(":", 1)[1]))
            answer = "ok"
        if answer == "503":
            raise RemoteTransientError("503 UNAVAILABLE", status=503)
        if answer == "reject":
            raise RemoteRejectedError("NO_SEATS", "sold out", 409)
        result = self._apply(request)
        if answer == "timeout":
            self.clock.sleep(timeout_seconds)
            raise RemoteTransientError("read timeout", outcome_unknown=True)
        return result

    def _apply(self, request: StepRequest) -> dict[str, Any]:
        with self._lock:
            if request.token not in self.results:
                self.effects[request.token] += 1
                self.results[request.token] = {
                    "service": self.name,
                    "action": request.action,
                    "confirmation": f"{self.name[:2].upper()}-{request.token[:8]}",
                    "undoes": request.original_token,
                }
            return dict(self.results[request.token])

    def actions(self) -> list[str]:
        """The actions called, in order (one entry per call)."""
        return [action for action, _ in self.calls]


def calls_in_order(services: Iterable[FakeRemoteService]) -> list[tuple[str, str]]:
    """Every call the services received, merged in the order they arrived: ``(service name, action)``."""
    stamped = [
        (stamp, service.name, action)
        for service in services
        for stamp, (action, _) in zip(service.order, service.calls, strict=True)
    ]
    return [(name, action) for _, name, action in sorted(stamped)]


class InMemoryBreakerStore:
    """``BreakerStore`` in memory, shared by every runtime of one test (like the DynamoDB item)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: dict[str, BreakerRecord] = {}

    def get(self, agent: str) -> BreakerRecord:
        with self._lock:
            return self.records.get(agent, BreakerRecord())

    def record_failure(self, agent: str) -> int:
        with self._lock:
            current = self.records.get(agent, BreakerRecord())
            self.records[agent] = BreakerRecord(
                current.state, current.failures + 1, current.open_until, current.probe_until
            )
            return current.failures + 1

    def transition(self, agent: str, expect: BreakerRecord, new: BreakerRecord) -> bool:
        with self._lock:
            current = self.records.get(agent, BreakerRecord())
            if (current.state, current.open_until, current.probe_until) != (
                expect.state,
                expect.open_until,
                expect.probe_until,
            ):
                return False
            self.records[agent] = BreakerRecord(new.state, current.failures, new.open_until, new.probe_until)
            return True

    def reset(self, agent: str) -> None:
        with self._lock:
            self.records[agent] = BreakerRecord(BreakerState.CLOSED, 0, 0.0, 0.0)


class InMemoryPersistenceLayer(BasePersistenceLayer):
    """A powertools idempotency persistence layer in memory, with the DynamoDB layer's put condition."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.records: dict[str, DataRecord] = {}

    def _get_record(self, idempotency_key: str) -> DataRecord:
        with self._lock:
            record = self.records.get(idempotency_key)
        if record is None:
            raise IdempotencyItemNotFoundError
        return copy.copy(record)

    def _put_record(self, data_record: DataRecord) -> None:
        # Read the time the way powertools does, so a patched clock (simulation.world.powertools_on_clock) applies.
        from aws_lambda_powertools.utilities.idempotency.persistence import base as persistence_base

        now = persistence_base.dt.datetime.now()
        with self._lock:
            existing = self.records.get(data_record.idempotency_key)
            if existing is not None:
                expired = existing.expiry_timestamp is not None and existing.expiry_timestamp < int(now.timestamp())
                in_progress_expired = (
                    existing.status == "INPROGRESS"
                    and existing.in_progress_expiry_timestamp is not None
                    and existing.in_progress_expiry_timestamp < int(now.timestamp() * 1000)
                )
                if not (expired or in_progress_expired):
                    raise IdempotencyItemAlreadyExistsError(old_data_record=copy.copy(existing))
            self.records[data_record.idempotency_key] = copy.copy(data_record)

    def _update_record(self, data_record: DataRecord) -> None:
        with self._lock:
            self.records[data_record.idempotency_key] = copy.copy(data_record)

    def _delete_record(self, data_record: DataRecord) -> None:
        with self._lock:
            self.records.pop(data_record.idempotency_key, None)


def stale_flight_request(workflow_id: str, now: float, attempt: int = 1) -> StepRequest:
    """A dead letter as a redrive finds one: the flights' request of an attempt whose complete-by passed a minute
    before ``now`` (a stale request: answered without calling the service once its workflow moved on)."""
    return StepRequest(
        workflow_id=workflow_id,
        step="reserve_flight",
        phase="action",  # type: ignore[arg-type]
        agent="flights",
        action="reserve",
        attempt=attempt,
        complete_by=int(now) - 60,
        token="0" * 32,
        input={"traveller": "Ada Lovelace"},
    )


class InMemoryLimitsStore:
    """``LimitsStore`` in memory, shared by every limiter of one test (like the DynamoDB item); counts its writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: dict[str, LimitsRecord] = {}
        self.writes = 0
        self.lost = 0

    def read(self, agent: str) -> LimitsRecord:
        with self._lock:
            return self.records.get(agent, LimitsRecord())

    def write(self, agent: str, expect_version: int, record: LimitsRecord) -> LimitsRecord | None:
        with self._lock:
            self.writes += 1
            current = self.records.get(agent, LimitsRecord())
            if current.version != expect_version:
                self.lost += 1
                return current
            self.records[agent] = record
            return None
