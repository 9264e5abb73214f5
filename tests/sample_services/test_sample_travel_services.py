"""Unit tests of the sample remote services' logic (no sockets, no AWS): fake clock, seeded rng."""

from __future__ import annotations

import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import ValidationError
from sample_fakes import START, FakeClock, GatedClock, outcomes

from travel_services import (
    PROCESS_SEQUENCE,
    SERVICES,
    FaultKnobs,
    InMemoryLedger,
    LedgerRecord,
    SequenceCounter,
    TravelService,
    confirmation_code,
    faults_from_json,
)

pytestmark = pytest.mark.unit


def body(
    token: str, *, workflow_id: str = "wf-1", step: str = "s1", original_token: str | None = None, **input_: Any
) -> bytes:
    return json.dumps(
        {"token": token, "workflow_id": workflow_id, "step": step, "input": input_, "original_token": original_token}
    ).encode()


def call(service: TravelService, action: str, token: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", "Idempotency-Key": token}
    return service.handle(action, headers, body(token, **kwargs))


# ---------------------------------------------------------------- idempotency


def test_three_identical_calls_apply_one_effect_and_replay_twice(make_service: Any, uid: str) -> None:
    # Given a flights service without faults
    flights = make_service("flights")
    token = f"tok-{uid}"

    # When the same reserve is sent three times
    answers = [call(flights, "reserve", token) for _ in range(3)]

    # Then one effect exists, and calls 2 and 3 return the stored response marked replayed
    expected = {
        "service": "flights",
        "action": "reserve",
        "confirmation": confirmation_code("flights", token),
        "token": token,
    }
    assert answers == [
        (200, {**expected, "replayed": False}),
        (200, {**expected, "replayed": True}),
        (200, {**expected, "replayed": True}),
    ]
    assert flights.effects() == {token: 1}
    assert flights.stats() == {
        "calls": 3,
        "by_outcome": outcomes(applied=1, replayed=2),
        "hangs": 0,
        "in_flight": 0,
        "in_flight_peak": 1,
        "busiest_second": 3,
    }


def test_confirmation_code_is_prefix_and_eight_upper_hex_derived_from_the_token() -> None:
    # Given / When the codes of one token at each service
    codes = {name: confirmation_code(name, "abc") for name in SERVICES}

    # Then each has the service's prefix and 8 hex digits, and the same input gives the same code
    assert {name: code[:3] for name, code in codes.items()} == {"flights": "FL-", "hotels": "HT-", "payments": "PY-"}
    assert all(len(code) == 11 and all(c in "0123456789ABCDEF" for c in code[3:]) for code in codes.values())
    assert confirmation_code("flights", "abc") == codes["flights"]
    assert codes["flights"] != confirmation_code("flights", "abd")


@pytest.mark.parametrize(("name", "action"), [("flights", "reserve"), ("hotels", "book"), ("payments", "charge")])
def test_each_service_applies_its_forward_action(make_service: Any, uid: str, name: str, action: str) -> None:
    # Given a service
    service = make_service(name)

    # When its forward action is called
    status, answer = call(service, action, f"t-{uid}")

    # Then it answers 200 with its own name, action and confirmation
    assert status == 200
    assert (answer["service"], answer["action"], answer["confirmation"]) == (
        name,
        action,
        confirmation_code(name, f"t-{uid}"),
    )
    assert service.effects() == {f"t-{uid}": 1}


def test_twenty_concurrent_identical_calls_apply_exactly_one_effect(make_service: Any, uid: str) -> None:
    # Given a payments service
    payments = make_service("payments")
    token = f"pay-{uid}"

    # When 20 threads charge with the same token at once
    barrier = threading.Barrier(20)

    def charge() -> tuple[int, dict[str, Any]]:
        barrier.wait()
        return call(payments, "charge", token)

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(lambda _: charge(), range(20)))

    # Then exactly one call applied the effect and 19 replayed it
    assert payments.effects() == {token: 1}
    assert [status for status, _ in answers] == [200] * 20
    assert sorted(answer["replayed"] for _, answer in answers) == [False] + [True] * 19
    assert {answer["confirmation"] for _, answer in answers} == {confirmation_code("payments", token)}


# ---------------------------------------------------------------- compensation


def test_compensation_after_effect_undoes_it_once(make_service: Any, uid: str) -> None:
    # Given a reserved flight
    flights = make_service("flights")
    forward, undo, other = f"f-{uid}", f"c-{uid}", f"c2-{uid}"
    call(flights, "reserve", forward)

    # When it is cancelled, the cancel is replayed, and a second cancel token targets the same reservation
    first = call(flights, "cancel_reservation", undo, original_token=forward)
    again = call(flights, "cancel_reservation", undo, original_token=forward)
    second = call(flights, "cancel_reservation", other, original_token=forward)

    # Then the effect is undone exactly once and every answer says undone
    expected = {
        "service": "flights",
        "action": "cancel_reservation",
        "token": undo,
        "original_token": forward,
        "undone": True,
        "confirmation": confirmation_code("flights", forward),
    }
    assert first == (200, {**expected, "replayed": False})
    assert again == (200, {**expected, "replayed": True})
    assert second == (200, {**expected, "token": other, "replayed": False})
    assert flights.compensations() == {forward: 1}
    assert flights.effects() == {forward: 1}
    assert flights.active_effects() == []


def test_compensation_before_effect_leaves_a_tombstone_and_the_late_action_is_refused(
    make_service: Any, uid: str
) -> None:
    # Given a hotels service that never saw the booking
    hotels = make_service("hotels")
    forward, undo = f"f-{uid}", f"c-{uid}"

    # When the cancel arrives first and the booking arrives late, twice
    cancelled = call(hotels, "cancel_booking", undo, original_token=forward)
    late = call(hotels, "book", forward)
    late_again = call(hotels, "book", forward)

    # Then nothing was undone, the late booking is refused both times, and no effect exists
    assert cancelled == (
        200,
        {
            "service": "hotels",
            "action": "cancel_booking",
            "token": undo,
            "original_token": forward,
            "undone": False,
            "reason": "nothing_to_undo",
            "replayed": False,
        },
    )
    assert late[0] == 409 and late[1]["error"] == "ALREADY_COMPENSATED"
    assert late_again == late
    assert hotels.effects() == {}
    assert hotels.compensations() == {}
    assert hotels.snapshot()["tombstones"] == [forward]
    assert hotels.stats()["by_outcome"] == outcomes(nothing_to_undo=1, already_compensated=2)


def test_compensation_of_a_rejected_action_has_nothing_to_undo(make_service: Any, uid: str) -> None:
    # Given a declined charge
    payments = make_service("payments")
    forward = f"f-{uid}"
    assert call(payments, "charge", forward, simulate="reject")[0] == 422

    # When it is refunded
    status, answer = call(payments, "refund", f"r-{uid}", original_token=forward)

    # Then there was nothing to undo and the charge replays its rejection
    assert (status, answer["undone"], answer["reason"]) == (200, False, "nothing_to_undo")
    assert call(payments, "charge", forward)[1] == {"error": "CARD_DECLINED", "message": "payments refused charge"}
    assert payments.effects() == {}


def test_hung_action_that_finishes_after_its_compensation_never_takes_effect(uid: str) -> None:
    # Given a flights service whose reserve hangs on a gate the test controls
    clock = GatedClock()
    flights = TravelService(
        "flights", InMemoryLedger(), FaultKnobs(hang_rate=1.0, hang_seconds=45), random.Random(1), clock
    )
    forward = f"f-{uid}"
    result: list[tuple[int, dict[str, Any]]] = []
    worker = threading.Thread(target=lambda: result.append(call(flights, "reserve", forward)))
    worker.start()
    assert clock.entered.wait(timeout=30)

    # When the caller gives up and compensates while the reserve still hangs, then the hang ends
    flights.update_knobs({"hang_rate": 0.0})
    cancelled = call(flights, "cancel_reservation", f"c-{uid}", original_token=forward)
    clock.gate.set()
    worker.join(timeout=30)

    # Then the compensation found nothing, and the late reserve was refused instead of applied
    assert cancelled[1]["undone"] is False
    assert result == [
        (409, {"error": "ALREADY_COMPENSATED", "message": f"token {forward} was compensated before it ran"})
    ]
    assert flights.effects() == {}
    assert clock.now() == START + 45


def test_twenty_concurrent_compensations_undo_once(make_service: Any, uid: str) -> None:
    # Given a booked hotel
    hotels = make_service("hotels")
    forward = f"f-{uid}"
    call(hotels, "book", forward)

    # When 20 threads send 20 distinct cancel tokens for it at once
    barrier = threading.Barrier(20)

    def cancel(i: int) -> tuple[int, dict[str, Any]]:
        barrier.wait()
        return call(hotels, "cancel_booking", f"c{i}-{uid}", original_token=forward)

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(cancel, range(20)))

    # Then all say undone, and the booking was undone exactly once
    assert [(status, answer["undone"]) for status, answer in answers] == [(200, True)] * 20
    assert hotels.compensations() == {forward: 1}


# ---------------------------------------------------------------- history: the order effects were applied and undone


def test_history_tells_the_order_of_compensations_across_services_sharing_a_sequence(
    clock: FakeClock, uid: str
) -> None:
    # Given flights and hotels numbering their records from one counter, a flight then a hotel booked for a saga
    counter = SequenceCounter()
    flights, hotels = (
        TravelService(name, InMemoryLedger(), FaultKnobs(), random.Random(0), clock, sequence=counter)
        for name in ("flights", "hotels")
    )
    saga = f"wf-{uid}"
    call(flights, "reserve", f"fl-{uid}", workflow_id=saga, step="reserve_flight")  # record 1
    clock.advance(1)
    call(hotels, "book", f"ht-{uid}", workflow_id=saga, step="book_hotel")  # record 2
    call(hotels, "book", f"other-{uid}", workflow_id=f"other-{uid}", step="book_hotel")  # record 3: another saga

    # When the saga is undone hotel first (tombstone try 4, undo 5, response 6), then flight (7, 8, 9)
    clock.advance(1)
    call(hotels, "cancel_booking", f"ht-c-{uid}", workflow_id=saga, step="book_hotel", original_token=f"ht-{uid}")
    clock.advance(1)
    call(
        flights,
        "cancel_reservation",
        f"fl-c-{uid}",
        workflow_id=saga,
        step="reserve_flight",
        original_token=f"fl-{uid}",
    )

    # Then the saga's records of both services, merged by sequence, show each effect and then each undo in order
    merged = sorted(flights.history(saga) + hotels.history(saga), key=lambda record: record.sequence)
    assert [
        (r.service, r.kind, r.step, r.sequence, r.created_at) for r in merged if r.kind != "response" or r.effect
    ] == [
        ("flights", "response", "reserve_flight", 1, START),
        ("hotels", "response", "book_hotel", 2, START + 1),
        ("hotels", "undo", "book_hotel", 5, START + 2),
        ("flights", "undo", "reserve_flight", 8, START + 3),
    ]
    assert [r.sequence for r in hotels.history(saga)] == [2, 5, 6]  # the other saga's record 3 is not there
    assert [r.sequence for r in hotels.history()] == [2, 3, 5, 6]
    # And the ledger snapshot lists the undo with when and in which order it was applied
    assert hotels.snapshot()["undone"] == [
        {
            "original_token": f"ht-{uid}",
            "workflow_id": saga,
            "step": "book_hotel",
            "sequence": 5,
            "applied_at": START + 2,
        }
    ]


def test_services_built_without_a_counter_share_the_process_sequence(clock: FakeClock, uid: str) -> None:
    # Given two services built with the default counter, and the next number the process counter gives
    flights = TravelService("flights", InMemoryLedger(), FaultKnobs(), random.Random(0), clock)
    payments = TravelService("payments", InMemoryLedger(), FaultKnobs(), random.Random(0), clock)
    before = PROCESS_SEQUENCE()
    # When each applies one effect
    call(flights, "reserve", f"fl-{uid}")
    call(payments, "charge", f"py-{uid}")
    # Then their records carry the next two numbers of that counter, in the order they were written
    assert [r.sequence for r in flights.history() + payments.history()] == [before + 1, before + 2]


def test_a_sequence_counter_hands_out_distinct_increasing_numbers_to_concurrent_callers() -> None:
    # Given a counter starting at 10
    counter = SequenceCounter(10)
    barrier = threading.Barrier(8)

    def draw(_: int) -> list[int]:
        barrier.wait()
        return [counter() for _ in range(100)]

    # When 8 threads draw 100 numbers each at once
    with ThreadPoolExecutor(max_workers=8) as pool:
        drawn = list(pool.map(draw, range(8)))

    # Then the 800 numbers are exactly 10..809, and each thread saw its own numbers increase
    assert sorted(n for numbers in drawn for n in numbers) == list(range(10, 810))
    assert all(numbers == sorted(numbers) for numbers in drawn)


# ---------------------------------------------------------------- business rejection


@pytest.mark.parametrize(
    ("name", "action", "status", "code"),
    [
        ("flights", "reserve", 409, "NO_SEATS"),
        ("hotels", "book", 409, "NO_ROOMS"),
        ("payments", "charge", 422, "CARD_DECLINED"),
    ],
)
def test_simulate_reject_gives_the_business_rejection_and_stores_it(
    make_service: Any, uid: str, name: str, action: str, status: int, code: str
) -> None:
    # Given a service
    service = make_service(name)
    token = f"t-{uid}"

    # When the forward action asks to be rejected, then is sent again without the flag
    first = call(service, action, token, simulate="reject")
    replay = call(service, action, token)

    # Then it is rejected with the service's code, and the replay returns the same rejection
    assert first == (status, {"error": code, "message": f"{name} refused {action}"})
    assert replay == first
    assert service.effects() == {}
    assert service.stats()["by_outcome"] == outcomes(rejected=1, replayed=1)


def test_rejection_rate_one_rejects_every_new_action_but_not_replays(make_service: Any, uid: str) -> None:
    # Given a reservation made before the knob was turned
    flights = make_service("flights")
    call(flights, "reserve", f"old-{uid}")
    flights.update_knobs({"rejection_rate": 1.0})

    # When a new reservation and a replay of the old one arrive
    new = call(flights, "reserve", f"new-{uid}")
    old = call(flights, "reserve", f"old-{uid}")

    # Then the new one is refused and the old one still replays its success
    assert new == (409, {"error": "NO_SEATS", "message": "flights refused reserve"})
    assert (old[0], old[1]["replayed"]) == (200, True)


def test_compensation_error_rate_one_fails_every_compensation_and_no_forward_action(
    make_service: Any, uid: str
) -> None:
    # Given a reservation, then flights failing every compensation (a drill's COMPENSATION_FAILED)
    flights = make_service("flights")
    assert call(flights, "reserve", f"f-{uid}")[0] == 200
    flights.update_knobs({"compensation_error_rate": 1.0})
    # When a new reservation is made and the first one is cancelled, twice
    new = call(flights, "reserve", f"g-{uid}")
    cancel = call(flights, "cancel_reservation", f"c-{uid}", original_token=f"f-{uid}")
    again = call(flights, "cancel_reservation", f"c-{uid}", original_token=f"f-{uid}")
    # Then the reservation goes through, each cancellation is a 503 that undid nothing
    assert new[0] == 200
    assert cancel == again == (503, {"error": "UNAVAILABLE", "message": "flights failed its compensation"})
    assert flights.compensations() == {}
    # And once the knob is back to 0, the cancellation undoes the reservation once
    flights.update_knobs({"compensation_error_rate": 0.0})
    assert call(flights, "cancel_reservation", f"c-{uid}", original_token=f"f-{uid}")[1]["undone"] is True
    assert flights.compensations() == {f"f-{uid}": 1}


# ---------------------------------------------------------------- transient errors, latency, hangs


def test_transient_error_applies_nothing_and_a_retry_succeeds(make_service: Any, uid: str) -> None:
    # Given a payments service that always fails transiently
    payments = make_service("payments", transient_error_rate=1.0)
    token = f"t-{uid}"

    # When a charge is sent, then sent again once the service recovers
    failed = call(payments, "charge", token)
    payments.update_knobs({"transient_error_rate": 0.0})
    retried = call(payments, "charge", token)

    # Then the first answer is 503 with nothing applied, and the retry applies the effect once
    assert failed == (503, {"error": "UNAVAILABLE", "message": "payments failed transiently"})
    assert (retried[0], retried[1]["replayed"]) == (200, False)
    assert payments.effects() == {token: 1}


def test_seeded_transient_errors_replay_exactly(clock: FakeClock, uid: str) -> None:
    # Given two services with the same seed and transient_error_rate 0.5
    def run() -> list[int]:
        service = TravelService(
            "flights", InMemoryLedger(), FaultKnobs(transient_error_rate=0.5), random.Random(42), clock
        )
        return [call(service, "reserve", f"t{i}-{uid}")[0] for i in range(12)]

    # When each receives the same 12 reservations
    first, second = run(), run()

    # Then both see the same statuses: the documented draw order over Random(42), i.e. one transient draw per
    # request, plus a rejection draw and a hang draw for each request that gets past it
    model = random.Random(42)
    expected = []
    for _ in range(12):
        if model.random() < 0.5:
            expected.append(503)
        else:
            model.random(), model.random()
            expected.append(200)
    assert first == second == expected == [200, 503, 200, 503, 503, 503, 503, 200, 200, 200, 200, 503]


def test_latency_advances_the_clock_by_the_fixed_delay(make_service: Any, clock: FakeClock, uid: str) -> None:
    # Given a hotels service with 250 ms of latency
    hotels = make_service("hotels", latency_ms=250)

    # When two requests are served
    call(hotels, "book", f"a-{uid}")
    call(hotels, "book", f"a-{uid}")

    # Then each slept 0.25 s
    assert clock.slept == [0.25, 0.25]
    assert clock.now() == START + 0.5


def test_hang_applies_the_effect_after_hang_seconds(make_service: Any, clock: FakeClock, uid: str) -> None:
    # Given a flights service that always hangs for 45 s
    flights = make_service("flights", hang_rate=1.0, hang_seconds=45)

    # When a reservation is made and replayed
    status, answer = call(flights, "reserve", f"t-{uid}")
    replay = call(flights, "reserve", f"t-{uid}")

    # Then the effect is applied after 45 s, the replay does not hang, and one hang is counted
    assert (status, answer["replayed"]) == (200, False)
    assert replay[1]["replayed"] is True
    assert clock.slept == [45.0]
    assert flights.effects() == {f"t-{uid}": 1}
    assert flights.stats()["hangs"] == 1


def test_hang_on_a_compensation_undoes_after_hang_seconds(make_service: Any, clock: FakeClock, uid: str) -> None:
    # Given a charge, then payments starts hanging every action for 12.5 s
    payments = make_service("payments")
    call(payments, "charge", f"t-{uid}")
    payments.update_knobs({"hang_rate": 1.0, "hang_seconds": 12.5})

    # When the charge is refunded
    status, answer = call(payments, "refund", f"r-{uid}", original_token=f"t-{uid}")

    # Then the refund lands after the hang
    assert (status, answer["undone"]) == (200, True)
    assert clock.slept == [12.5]
    assert payments.compensations() == {f"t-{uid}": 1}


# ---------------------------------------------------------------- outage window


def test_outage_window_is_closed_at_start_and_open_at_end(make_service: Any, clock: FakeClock, uid: str) -> None:
    # Given a payments service with an outage of 30 s starting now (epoch 1_700_000_000)
    payments = make_service("payments")
    knobs = payments.start_outage(30)
    assert (knobs.outage_start, knobs.outage_end) == (START, START + 30)

    # When requests arrive at the start, just before the end, at the end
    at_start = call(payments, "charge", f"a-{uid}")
    clock.set(START + 29.999)
    before_end = call(payments, "charge", f"a-{uid}")
    clock.set(START + 30)
    at_end = call(payments, "charge", f"a-{uid}")

    # Then the first two are 503 and nothing applied, and at the end the charge applies
    assert at_start == (503, {"error": "UNAVAILABLE", "message": "payments is in an outage"})
    assert before_end == at_start
    assert (at_end[0], at_end[1]["replayed"]) == (200, False)
    assert payments.stats()["by_outcome"] == outcomes(outage=2, applied=1)


def test_outage_in_the_future_does_not_refuse_requests_before_it(make_service: Any, clock: FakeClock, uid: str) -> None:
    # Given an outage window [START + 10, START + 20)
    flights = make_service("flights", outage_start=START + 10, outage_end=START + 20)

    # When requests arrive just before it, in it, and at its end
    clock.set(START + 9.999)
    before = call(flights, "reserve", f"a-{uid}")[0]
    clock.set(START + 10)
    during = call(flights, "reserve", f"b-{uid}")[0]
    clock.set(START + 20)
    after = call(flights, "reserve", f"b-{uid}")[0]

    # Then only the one in the window is refused
    assert (before, during, after) == (200, 503, 200)


def test_outage_refuses_compensations_and_unknown_actions_too(make_service: Any, uid: str) -> None:
    # Given a service in an outage
    hotels = make_service("hotels")
    hotels.start_outage(60)

    # When a compensation and an unknown action arrive
    undo = call(hotels, "cancel_booking", f"c-{uid}", original_token=f"f-{uid}")
    unknown = hotels.handle("teleport", {}, b"")

    # Then both get 503: the whole service is down
    assert (undo[0], unknown[0]) == (503, 503)


# ---------------------------------------------------------------- 400 and 404


@pytest.mark.parametrize(
    ("headers", "raw", "message_start"),
    [
        ({"Idempotency-Key": "t"}, b"not json", "body: Invalid JSON"),
        ({"Idempotency-Key": "t"}, b"[1, 2]", "body: Input should be an object"),
        ({"Idempotency-Key": "t"}, b'{"workflow_id": "w", "step": "s"}', "token: Field required"),
        ({"Idempotency-Key": ""}, b'{"token": "", "workflow_id": "w", "step": "s"}', "token: String should have"),
        ({"Idempotency-Key": "t"}, b'{"token": "t", "workflow_id": "w", "step": "s", "extra": 1}', "extra: Extra"),
        ({}, b'{"token": "t", "workflow_id": "w", "step": "s"}', "missing Idempotency-Key header"),
        ({"Idempotency-Key": "u"}, b'{"token": "t", "workflow_id": "w", "step": "s"}', "Idempotency-Key header does"),
        (
            {"idempotency-key": "t"},
            b'{"token": "t", "workflow_id": "w", "step": "s", "original_token": "x"}',
            "original_token is only valid",
        ),
    ],
)
def test_malformed_requests_get_400_and_change_nothing(
    make_service: Any, headers: dict[str, str], raw: bytes, message_start: str
) -> None:
    # Given a flights service
    flights = make_service("flights")

    # When a malformed reserve arrives
    status, answer = flights.handle("reserve", headers, raw)

    # Then it gets 400 BAD_REQUEST naming the problem, and nothing is applied
    assert (status, answer["error"]) == (400, "BAD_REQUEST")
    assert answer["message"].startswith(message_start), answer["message"]
    assert flights.effects() == {}
    assert flights.stats()["by_outcome"] == outcomes(bad_request=1)


def test_compensation_without_original_token_or_reusing_it_gets_400(make_service: Any, uid: str) -> None:
    # Given a flights service
    flights = make_service("flights")

    # When cancels arrive without an original token, and with the original token as their own token
    missing = call(flights, "cancel_reservation", f"c-{uid}")
    same = call(flights, "cancel_reservation", f"c-{uid}", original_token=f"c-{uid}")

    # Then both are refused as bad requests
    assert (missing[0], missing[1]["error"]) == (400, "BAD_REQUEST")
    assert same == (
        400,
        {"error": "BAD_REQUEST", "message": "a compensation needs a token of its own, distinct from original_token"},
    )


def test_a_token_used_by_one_action_is_refused_for_the_other(make_service: Any, uid: str) -> None:
    # Given a reservation with token T
    flights = make_service("flights")
    call(flights, "reserve", f"t-{uid}")

    # When T is reused as a cancel token, and a cancel names a cancel token as its original
    reused = call(flights, "cancel_reservation", f"t-{uid}", original_token=f"x-{uid}")
    call(flights, "cancel_reservation", f"c-{uid}", original_token=f"t-{uid}")
    wrong_original = call(flights, "cancel_reservation", f"d-{uid}", original_token=f"c-{uid}")

    # Then both are refused with TOKEN_REUSED and the reservation stays undone once
    assert (reused[0], reused[1]["error"]) == (400, "TOKEN_REUSED")
    assert (wrong_original[0], wrong_original[1]["error"]) == (400, "TOKEN_REUSED")
    assert flights.compensations() == {f"t-{uid}": 1}


def test_unknown_action_gets_404(make_service: Any, uid: str) -> None:
    # Given a flights service
    flights = make_service("flights")

    # When another service's action is called on it
    status, answer = call(flights, "book", f"t-{uid}")

    # Then it answers 404 and lists its actions
    assert (status, answer) == (
        404,
        {
            "error": "UNKNOWN_ACTION",
            "message": "flights has no action 'book'; expected one of ['reserve', 'cancel_reservation']",
        },
    )
    assert flights.stats()["by_outcome"] == outcomes(not_found=1)


def test_unknown_service_name_is_refused(clock: FakeClock) -> None:
    # Given / When / Then a service outside the catalogue cannot be built
    with pytest.raises(ValueError, match="unknown service 'trains'"):
        TravelService("trains", InMemoryLedger(), FaultKnobs(), random.Random(0), clock)


# ---------------------------------------------------------------- knobs


@pytest.mark.parametrize(
    "bad",
    [
        {"transient_error_rate": 1.5},
        {"rejection_rate": -0.1},
        {"hang_rate": float("nan")},
        {"latency_ms": -1},
        {"hang_seconds": 3601},
        {"outage_start": START},
        {"outage_start": START + 10, "outage_end": START},
        {"typo_rate": 0.1},
    ],
)
def test_invalid_knobs_are_refused_and_the_knobs_in_force_stay(make_service: Any, bad: dict[str, Any]) -> None:
    # Given a service with a 0.2 transient error rate
    service = make_service("flights", transient_error_rate=0.2)

    # When an invalid partial update is applied
    with pytest.raises(ValidationError):
        service.update_knobs(bad)

    # Then the knobs are unchanged
    assert service.knobs == FaultKnobs(transient_error_rate=0.2)


def test_partial_update_keeps_the_other_knobs(make_service: Any) -> None:
    # Given a service with latency and a rejection rate
    service = make_service("hotels", latency_ms=100, rejection_rate=0.3)

    # When only the hang knobs change
    knobs = service.update_knobs({"hang_rate": 0.5, "hang_seconds": 90})

    # Then the other knobs keep their values
    assert knobs == FaultKnobs(latency_ms=100, rejection_rate=0.3, hang_rate=0.5, hang_seconds=90)


def test_faults_from_json_fills_defaults_and_refuses_unknown_services() -> None:
    # Given / When knobs for payments only
    knobs = faults_from_json('{"payments": {"rejection_rate": 1}}')

    # Then payments has them and the others have none; unknown names and bad JSON are refused
    assert knobs == {"flights": FaultKnobs(), "hotels": FaultKnobs(), "payments": FaultKnobs(rejection_rate=1.0)}
    assert faults_from_json(None) == faults_from_json("  ") == {name: FaultKnobs() for name in SERVICES}
    with pytest.raises(ValueError, match="unknown services"):
        faults_from_json('{"trains": {}}')
    with pytest.raises(ValueError, match="not JSON"):
        faults_from_json("{")


# ---------------------------------------------------------------- the service's own count, and its quota


def test_a_call_over_the_in_flight_quota_is_throttled_and_counted_while_the_others_are_served(uid: str) -> None:
    # Given a hotels service that serves 2 calls at once, whose latency waits on a gate the test opens
    clock = GatedClock()
    hotels = TravelService(
        "hotels", InMemoryLedger(), FaultKnobs(latency_ms=100, quota_in_flight=2), random.Random(1), clock
    )
    answers: list[tuple[int, dict[str, Any]]] = []
    workers = [threading.Thread(target=lambda n=n: answers.append(call(hotels, "book", f"b{n}-{uid}"))) for n in (1, 2)]
    for worker in workers:
        worker.start()
    while hotels.stats()["in_flight"] < 2:  # both admitted and waiting on the gate (real threads, no clock time)
        threading.Event().wait(0.01)

    # When a third call arrives while both are served, then the gate opens and one more call comes
    third = call(hotels, "book", f"b3-{uid}")
    clock.gate.set()
    for worker in workers:
        worker.join(timeout=30)
    fourth = call(hotels, "book", f"b4-{uid}")

    # Then the third was throttled with nothing applied, the others applied, and the meter saw 2 at once at most
    assert third == (429, {"error": "THROTTLED", "message": "hotels allows 2 calls at once: try again later"})
    assert sorted(status for status, _ in answers) == [200, 200] and fourth[0] == 200
    assert sorted(hotels.effects()) == sorted(f"b{n}-{uid}" for n in (1, 2, 4))
    stats = hotels.stats()
    assert stats["by_outcome"] == outcomes(applied=3, throttled=1)
    assert (stats["in_flight"], stats["in_flight_peak"]) == (0, 2)


def test_the_rate_quota_is_a_token_bucket_with_a_tolerance_for_early_arrivals(
    make_service: Any, clock: FakeClock, uid: str
) -> None:
    # Given a service allowing 10 calls a second with a burst of 3 and 50 ms of tolerance
    flights = make_service("flights", quota_rate=10, quota_burst=3)
    statuses: list[int] = []

    # When 4 calls come at once (the bucket holds 3), then calls 70, 120, 30 and 50 ms apart: a full bucket passes a
    # call at most 0.2 s ahead of the rate's schedule, the tolerance 50 ms more
    for n, advance in enumerate([0, 0, 0, 0, 0.07, 0.12, 0.03, 0.05]):
        clock.advance(advance)
        statuses.append(call(flights, "reserve", f"r{n}-{uid}")[0])

    # Then the 4th was throttled (0.3 s ahead), the 70 ms one passed 30 ms early, the next 10 ms early, the 30 ms one
    # came 80 ms early (throttled, the schedule unmoved) and the last 30 ms early
    assert statuses == [200, 200, 200, 429, 200, 200, 429, 200]
    stats = flights.stats()
    assert stats["by_outcome"] == outcomes(applied=6, throttled=2)
    assert stats["busiest_second"] == 8


def test_the_busiest_second_counts_arrivals_in_any_one_second_window(
    make_service: Any, clock: FakeClock, uid: str
) -> None:
    # Given a service without a quota
    payments = make_service("payments")

    # When 3 calls arrive within 0.9 s, then 2 more 1 s after the last one
    for n, advance in enumerate([0, 0.4, 0.5, 1.0, 0]):
        clock.advance(advance)
        call(payments, "charge", f"c{n}-{uid}")

    # Then the busiest one-second window held 3 calls (a window is half-open: a call 1 s later starts a new one)
    assert payments.stats()["busiest_second"] == 3


def test_a_burst_quota_needs_a_rate_quota() -> None:
    with pytest.raises(ValidationError, match="set quota_rate with it"):
        FaultKnobs(quota_burst=5)
    assert FaultKnobs(quota_rate=2.5).quota_burst_calls == 3


def test_start_outage_refuses_negative_seconds(make_service: Any) -> None:
    with pytest.raises(ValueError, match="finite number"):
        make_service("flights").start_outage(-1)


# ---------------------------------------------------------------- ledger


def test_in_memory_ledger_put_if_absent_has_one_winner_among_50_threads() -> None:
    # Given an empty ledger and 50 different records for one key
    ledger = InMemoryLedger()
    records = [
        LedgerRecord(
            kind="response",
            service="flights",
            action="reserve",
            token=f"t{i}",
            workflow_id="w",
            step="s",
            created_at=START,
        )
        for i in range(50)
    ]
    barrier = threading.Barrier(50)

    def put(record: LedgerRecord) -> LedgerRecord | None:
        barrier.wait()
        return ledger.put_if_absent("k", record)

    # When 50 threads put at once
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(put, records))

    # Then exactly one stored, and the 49 others got the winner back
    winners = [record for record, result in zip(records, results, strict=True) if result is None]
    assert len(winners) == 1
    assert [result for result in results if result is not None] == [winners[0]] * 49
    assert ledger.get("k") == winners[0]
    assert ledger.records() == [("k", winners[0])]
