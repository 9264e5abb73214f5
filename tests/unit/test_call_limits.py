"""Call limits shared by an agent's instances (issue 38): the allocation of units, and one instance's limiter."""

from __future__ import annotations

import math
import random
import threading

import pytest

from sasflow.call_limits import CallLimiter, CallLimits, Lease, LimitsRecord, allocate
from sasflow.clock import ManualClock
from sasflow.errors import CallsLimitedError
from tests.support.fakes import InMemoryLimitsStore

T0 = 1_800_000_000.0
FIVE = CallLimits(max_in_flight=5)


def _allocate(record: LimitsRecord, holder: str, want: int, in_flight: int = 0, now: float = T0, limits=FIVE):
    return allocate(record, holder, want, in_flight, now, limits, lease_seconds=30.0, guard_seconds=1.0)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({}, "declare max_in_flight, rate or both"),
        ({"max_in_flight": 0}, "max_in_flight must be 1 to 1000"),
        ({"rate": 0.001}, "rate must be 0.01 to 10000"),
        ({"max_in_flight": 5, "burst": 5}, "declare rate with it"),
        ({"max_in_flight": 5, "rate": 10, "burst": 4}, "burst (4) must be at least max_in_flight (5)"),
    ],
)
def test_limits_refuse_what_cannot_hold(kwargs: dict[str, float], reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        CallLimits(**kwargs)  # type: ignore[arg-type]


def test_units_divide_the_rate_and_the_burst() -> None:
    both = CallLimits(max_in_flight=5, rate=10)
    assert (both.units, both.burst_calls, both.unit_rate, both.unit_burst) == (5, 10, 2.0, 2.0)
    rate_only = CallLimits(rate=2.5)
    assert (rate_only.units, rate_only.burst_calls, rate_only.unit_rate, rate_only.unit_burst) == (3, 3, 2.5 / 3, 1.0)
    assert FIVE.unit_rate == math.inf and FIVE.describe() == "5 in flight"
    assert both.describe() == "5 in flight, 10/s (burst 10)"


def test_a_holder_gets_what_nobody_else_holds() -> None:
    first, grant = _allocate(LimitsRecord(), "a", want=3)
    assert (grant.units, grant.until, first.version) == (3, T0 + 30.0, 1)
    second, grant = _allocate(first, "b", want=4)
    assert grant.units == 2  # fair would be 2 (5 x 4 / 7), and only 2 are free
    assert {name: lease.units for name, lease in second.leases.items()} == {"a": 3, "b": 2}


def test_a_waiting_holder_makes_the_others_shrink_to_their_share_when_they_renew() -> None:
    full, _ = _allocate(LimitsRecord(), "a", want=10)
    assert full.leases["a"].units == 5
    waiting, grant = _allocate(full, "b", want=10, now=T0 + 1)
    assert grant.units == 0 and waiting.leases["b"] == Lease(units=0, want=10, until=T0 + 1 + 25.0)
    assert grant.retry_at == T0 + 31.0  # a's lease could lapse then (b's limiter caps it at a renewal)
    renewed, grant = _allocate(waiting, "a", want=10, in_flight=1, now=T0 + 10)
    assert grant.units == 2  # floor(5 x 10 / 20)
    assert renewed.released_at == T0 + 10  # what a gave back earns tokens from now
    _, grant = _allocate(waiting, "a", want=10, in_flight=4, now=T0 + 10)
    assert grant.units == 4  # never fewer than its calls in flight
    _, grant = _allocate(renewed, "b", want=10, now=T0 + 11)
    assert grant.units == 3


def test_a_lapsed_lease_frees_its_units_and_they_bring_only_the_tokens_earned_since() -> None:
    limits = CallLimits(max_in_flight=5, rate=10)
    held, _ = _allocate(LimitsRecord(), "a", want=5, limits=limits)
    # a crashed: nobody renews its lease; b looks just before and just after it ends (plus the guard)
    _, grant = _allocate(held, "b", want=5, now=T0 + 30.5, limits=limits)
    assert grant.units == 0
    after, grant = _allocate(held, "b", want=5, now=T0 + 31.25, limits=limits)
    assert grant.units == 5 and "a" not in after.leases and after.released_at == T0 + 31.0
    assert grant.new_tokens == 0.0  # b's clock may be 2 s (twice the guard) ahead of the one that gave them back
    _, grant = _allocate(held, "b", want=5, now=T0 + 33.25, limits=limits)
    assert grant.new_tokens == pytest.approx(0.25 * 2.0 * 5)  # 0.25 s at 2 calls/s per unit, for 5 units
    _, grant = _allocate(LimitsRecord(), "a", want=5, limits=limits)
    assert grant.new_tokens == 10.0  # never handed over: a full burst


def test_a_holder_with_nothing_to_do_leaves_the_item() -> None:
    held, _ = _allocate(LimitsRecord(), "a", want=2)
    gone, grant = _allocate(held, "a", want=0, now=T0 + 10)
    assert grant.units == 0 and gone.leases == {} and gone.released_at == T0 + 10


def _limiter(store: InMemoryLimitsStore, clock: ManualClock, limits: CallLimits, name: str, **kwargs) -> CallLimiter:
    return CallLimiter("payments", limits, store, clock, holder=name, rng=random.Random(7), **kwargs)


def test_two_instances_never_hold_more_than_max_in_flight() -> None:
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    # (a record waits for a call of its own instance to end for 2 s of real time: 0.1 s here, where none ends)
    a = _limiter(store, clock, FIVE, "a", want_at_once=10, max_wait_seconds=0.1)
    b = _limiter(store, clock, FIVE, "b", want_at_once=10)
    permits = [a.acquire(1.0, T0 + 20) for _ in range(5)]
    assert a.units == 5 and store.writes == 1  # one write for the whole batch
    with pytest.raises(CallsLimitedError) as deferred:
        b.acquire(1.0, T0 + 20)
    assert "calls to payments are at their limit (5 in flight)" in str(deferred.value)
    assert T0 + 10 <= deferred.value.retry_at <= T0 + 16  # a renews within 10 s (spread by up to half)
    with pytest.raises(CallsLimitedError):
        a.acquire(1.0, T0 + 20)  # its own 5 are busy for longer than a record may wait
    for permit in permits:
        permit.release()
    clock.advance(10)
    a.expect(1)  # its next batch has one record
    a.acquire(1.0, T0 + 40).release()  # a renews: b waits for 10, a's peak was 6, so a keeps floor(5 x 6 / 16)
    assert a.units == 1
    clock.advance(1)
    b.acquire(1.0, T0 + 40).release()
    assert b.units == 4  # a has its share: b takes all that is free


def test_the_rate_holds_and_a_record_waits_for_its_token_within_its_wait() -> None:
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    limiter = _limiter(store, clock, CallLimits(rate=10), "a", want_at_once=10)
    started = []
    for _ in range(30):
        limiter.acquire(0.1, T0 + 60).release()
        started.append(clock.now())
    assert started[:10] == [T0] * 10  # the burst
    assert started[10] == pytest.approx(T0 + 0.1) and started[29] == pytest.approx(T0 + 2.0)
    slow = _limiter(InMemoryLimitsStore(), clock, CallLimits(rate=0.1, burst=1), "b")
    slow.acquire(0.1, clock.now() + 60).release()
    with pytest.raises(CallsLimitedError) as deferred:
        slow.acquire(0.1, clock.now() + 60)  # the next token is 10 s away: deferred, not waited for
    assert deferred.value.retry_at >= clock.now() + 2


def test_a_lease_that_cannot_cover_the_call_is_renewed_first() -> None:
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    limiter = _limiter(store, clock, FIVE, "a", lease_seconds=30.0, refresh_seconds=100.0)
    limiter.acquire(1.0, T0 + 60).release()
    clock.advance(27.5)
    limiter.acquire(5.0, T0 + 60).release()  # 27.5 + 5 would end after 30 - 1: a write first
    assert store.writes == 2 and store.records["payments"].leases["a"].until == T0 + 27.5 + 30.0


def test_an_instance_that_loses_every_write_defers_and_keeps_nothing_it_was_not_given() -> None:
    class Busy(InMemoryLimitsStore):
        def write(self, agent: str, expect_version: int, record: LimitsRecord) -> LimitsRecord | None:
            self.writes += 1
            return LimitsRecord(version=expect_version + 1)

    store, clock = Busy(), ManualClock(T0)
    limiter = _limiter(store, clock, FIVE, "a")
    with pytest.raises(CallsLimitedError):
        limiter.acquire(1.0, T0 + 60)
    assert store.writes == 3 and limiter.units == 0


def test_many_instances_keep_both_limits_over_every_window() -> None:
    """Instances come, work and crash at random; the calls in flight and per second, counted as a service would."""
    limits = CallLimits(max_in_flight=4, rate=6, burst=6)
    rng = random.Random(38)
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    # one thread plays every instance's calls: a record never waits for a call of its own instance to end
    instances = [
        _limiter(store, clock, limits, f"i{n}", want_at_once=rng.randint(1, 4), max_wait_seconds=0.0) for n in range(6)
    ]
    running: list[tuple[float, CallLimiter, object]] = []
    starts: list[float] = []
    deferrals = 0
    peak = 0
    for _ in range(3_000):
        clock.advance(rng.choice([0.0, 0.01, 0.05, 0.2, 1.0]))
        now = clock.now()
        for entry in [e for e in running if e[0] <= now]:
            running.remove(entry)
            entry[2].release()  # type: ignore[attr-defined]
        if rng.random() < 0.01:
            crashed = rng.choice(instances)  # its calls end, its lease is never renewed nor given back
            running = [e for e in running if e[1] is not crashed]
            instances[instances.index(crashed)] = _limiter(
                store, clock, limits, f"new{rng.random()}", max_wait_seconds=0.0
            )
            continue
        limiter = rng.choice(instances)
        duration = rng.choice([0.05, 0.3, 2.0])
        try:
            permit = limiter.acquire(duration, now + 30)
        except CallsLimitedError:
            deferrals += 1
            continue
        starts.append(clock.now())
        running.append((clock.now() + duration, limiter, permit))
        peak = max(peak, len(running))
    assert peak == limits.max_in_flight  # reached, never passed
    for i, start in enumerate(starts):  # every window from a call's start
        for width in (0.5, 1.0, 5.0):
            inside = sum(1 for s in starts[i:] if s < start + width)
            assert inside <= limits.burst_calls + limits.rate * width + 1e-9
    assert len(starts) > 800 and deferrals > 0


def test_a_batchs_threads_share_their_instances_units_and_wait_for_each_others_calls() -> None:
    # Given one instance limited to 5 calls at once, and ten records on ten threads (AGENT_CONCURRENCY 10)
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    limiter = _limiter(store, clock, FIVE, "a", want_at_once=10)
    running, peak, errors = 0, 0, []
    lock, five = threading.Lock(), threading.Barrier(5)

    def record() -> None:
        nonlocal running, peak
        try:
            with limiter.acquire(1.0, T0 + 60):
                with lock:
                    running += 1
                    peak = max(peak, running)
                five.wait(timeout=10)  # five calls at once: serial, or four at a time, would break the barrier
                with lock:
                    running -= 1
        except Exception as error:  # reported below, with the thread's failure
            errors.append(error)

    threads = [threading.Thread(target=record) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Then five call at once, the other five wait for their units (no deferral), and the batch cost one write
    assert (errors, peak, store.writes, limiter.calls_in_flight) == ([], 5, 1, 0)


def test_a_batch_of_records_handled_one_after_the_other_grows_to_the_batchs_units_at_once() -> None:
    # Given an instance that took one unit for a batch of one record, rate 10/s over 5 units (2/s each)
    store, clock = InMemoryLimitsStore(), ManualClock(T0)
    limiter = _limiter(store, clock, CallLimits(max_in_flight=5, rate=10), "a", want_at_once=10)
    limiter.expect(1)
    limiter.acquire(0.1, T0 + 60).release()
    assert (limiter.units, store.writes) == (1, 1)
    # When a batch of 10 starts and its records ask one at a time (none waits beside another: a runner that handles
    # them in turn, or calls that end at once)
    limiter.expect(10)
    started = []
    for _ in range(10):
        limiter.acquire(0.1, T0 + 60).release()
        started.append(clock.now() - T0)
    # Then the first record's write grows the lease to all 5 units (the batch's demand), once, and the ten calls
    # start within 0.1 s (the tokens of 5 units, 10/s), not over 4.5 s (one unit's 2/s)
    assert (limiter.units, store.writes) == (5, 2)
    assert started[:9] == [0.0] * 9 and started[9] == pytest.approx(0.1, abs=0.002)
