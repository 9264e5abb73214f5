"""The shared circuit breaker: closed → open → half-open → closed, one prober at a time, clock injected."""

from __future__ import annotations

import threading

import pytest

from sasflow.breaker import BreakerState, CircuitBreaker
from sasflow.clock import ManualClock
from sasflow.errors import CircuitOpenError
from tests.support.fakes import InMemoryBreakerStore

START = 1_800_000_000.0


def breaker(store: InMemoryBreakerStore, clock: ManualClock) -> CircuitBreaker:
    return CircuitBreaker(
        "hotels", store, clock, failure_threshold=3, open_seconds=30, probe_seconds=10, cache_seconds=0
    )


def test_threshold_failures_open_then_cool_down_to_a_single_half_open_probe_that_closes_it() -> None:
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    a, b = breaker(store, clock), breaker(store, clock)
    for _ in range(3):
        a.before_call()
        a.on_failure()
    assert store.get("hotels").state is BreakerState.OPEN
    with pytest.raises(CircuitOpenError) as opened:
        b.before_call()
    assert opened.value.retry_at == int(START) + 30
    clock.advance(30)
    a.before_call()  # a becomes the prober
    assert store.get("hotels").state is BreakerState.HALF_OPEN
    with pytest.raises(CircuitOpenError) as probing:
        b.before_call()  # b must wait for the probe
    assert probing.value.retry_at == int(START) + 40
    a.on_success()
    assert store.get("hotels").state is BreakerState.CLOSED
    assert store.get("hotels").failures == 0
    b.before_call()  # closed again


def test_a_failed_probe_reopens_for_another_open_period() -> None:
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    a = breaker(store, clock)
    for _ in range(3):
        a.on_failure()
    clock.advance(30)
    a.before_call()
    a.on_failure()
    record = store.get("hotels")
    assert (record.state, record.open_until) == (BreakerState.OPEN, START + 60)


def test_a_probe_that_never_reports_back_expires_and_another_instance_takes_it() -> None:
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    a, b = breaker(store, clock), breaker(store, clock)
    for _ in range(3):
        a.on_failure()
    clock.advance(30)
    a.before_call()  # a probes, then its Lambda dies
    clock.advance(10)
    b.before_call()  # the probe lease expired: b probes
    assert store.get("hotels").probe_until == START + 50


def test_success_below_the_threshold_resets_the_count_and_writes_only_then() -> None:
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    a = breaker(store, clock)
    a.on_failure()
    a.on_failure()
    a.on_success()
    assert store.get("hotels").failures == 0
    a.on_failure()
    a.on_failure()
    assert store.get("hotels").state is BreakerState.CLOSED


def test_records_worked_on_at_once_send_one_half_open_probe_and_wait_for_it() -> None:
    # Given an instance whose breaker has cooled down, with two records in hand on two threads
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    instance = breaker(store, clock)
    for _ in range(3):
        instance.before_call()
        instance.on_failure()
    clock.advance(30)
    # When the first record's thread takes the probe
    instance.before_call()
    outcome: list[object] = []

    def second_record() -> None:
        try:
            instance.before_call()
            outcome.append("called")
        except CircuitOpenError as error:
            outcome.append(error.retry_at)

    thread = threading.Thread(target=second_record)
    thread.start()
    thread.join(5)
    # Then the second record waits for the probe's end instead of calling too
    assert outcome == [int(START) + 40]
    # And once the probe succeeded, it calls
    instance.on_success()
    outcome.clear()
    thread = threading.Thread(target=second_record)
    thread.start()
    thread.join(5)
    assert outcome == ["called"]
