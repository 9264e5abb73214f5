"""The sample services as real HTTP servers on 127.0.0.1 (fake clock, seeded rng)."""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sample_fakes import START, FakeClock, GatedClock

from http_server import RunningServer, serve, serve_all
from travel_services import FaultKnobs, InMemoryLedger, TravelService, confirmation_code

# Loopback servers: sockets stay enabled even where a tier disables them.
pytestmark = [pytest.mark.integration, pytest.mark.enable_socket]


def http(
    method: str, url: str, payload: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            assert error.headers["Content-Type"] == "application/json"
            return error.code, json.loads(error.read())


def act(
    server: RunningServer, action: str, token: str, original_token: str | None = None, **input_: Any
) -> tuple[int, dict[str, Any]]:
    body = {"token": token, "workflow_id": "wf", "step": "s", "input": input_, "original_token": original_token}
    headers = {"Content-Type": "application/json", "Idempotency-Key": token}
    return http("POST", f"{server.base_url}/{action}", body, headers)


@pytest.fixture
def flights(clock: FakeClock) -> Iterator[RunningServer]:
    server = serve(TravelService("flights", InMemoryLedger(), FaultKnobs(), random.Random(3), clock))
    yield server
    server.stop()


def test_server_serves_an_action_and_its_ledger(flights: RunningServer, uid: str) -> None:
    # Given a flights server on loopback
    assert flights.base_url == f"http://127.0.0.1:{flights.port}"

    # When a reservation is posted and replayed, and the ledger is read
    first = act(flights, "reserve", f"t-{uid}")
    second = act(flights, "reserve", f"t-{uid}")
    status, ledger = http("GET", f"{flights.base_url}/_ledger")

    # Then the contract's body comes back, and the ledger shows one effect
    assert first == (
        200,
        {
            "service": "flights",
            "action": "reserve",
            "confirmation": confirmation_code("flights", f"t-{uid}"),
            "token": f"t-{uid}",
            "replayed": False,
        },
    )
    assert second == (200, {**first[1], "replayed": True})
    assert status == 200
    assert ledger["effects"] == {f"t-{uid}": 1}
    assert ledger["active_effects"] == [f"t-{uid}"]
    assert ledger["stats"]["calls"] == 2
    assert ledger["knobs"] == FaultKnobs().model_dump()


def test_the_ledger_route_lists_each_compensation_with_when_and_in_which_order_it_was_applied(
    flights: RunningServer, clock: FakeClock, uid: str
) -> None:
    # Given two reservations over HTTP
    act(flights, "reserve", f"a-{uid}")
    act(flights, "reserve", f"b-{uid}")
    # When the second is cancelled 10 s later, then the first 5 s after that
    clock.advance(10)
    act(flights, "cancel_reservation", f"b-c-{uid}", original_token=f"b-{uid}")
    clock.advance(5)
    act(flights, "cancel_reservation", f"a-c-{uid}", original_token=f"a-{uid}")
    status, ledger = http("GET", f"{flights.base_url}/_ledger")
    # Then /_ledger lists both undos, b before a, at the times they were applied, numbered in that order
    assert status == 200
    undone = ledger["undone"]
    assert [(u["original_token"], u["applied_at"]) for u in undone] == [
        (f"b-{uid}", START + 10),
        (f"a-{uid}", START + 15),
    ]
    assert undone[0]["sequence"] < undone[1]["sequence"]
    assert {(u["workflow_id"], u["step"]) for u in undone} == {("wf", "s")}


def test_twenty_parallel_identical_requests_apply_exactly_one_effect(flights: RunningServer, uid: str) -> None:
    # Given a flights server
    token = f"t-{uid}"
    barrier = threading.Barrier(20)

    def reserve(_: int) -> tuple[int, dict[str, Any]]:
        barrier.wait()
        return act(flights, "reserve", token)

    # When 20 clients post the same token at once
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(reserve, range(20)))

    # Then all get 200, exactly one applied it, and the service counted one effect
    assert [status for status, _ in answers] == [200] * 20
    assert sorted(body["replayed"] for _, body in answers) == [False] + [True] * 19
    assert flights.service.effects() == {token: 1}


def test_put_faults_updates_part_of_the_knobs_and_refuses_bad_ones(flights: RunningServer, uid: str) -> None:
    # Given a flights server without faults
    # When rejection_rate is set to 1, then an invalid update is tried
    status, knobs = http("PUT", f"{flights.base_url}/_faults", {"rejection_rate": 1, "latency_ms": 5})
    bad = http("PUT", f"{flights.base_url}/_faults", {"transient_error_rate": 2})
    not_object = http("PUT", f"{flights.base_url}/_faults", [1])
    rejected = act(flights, "reserve", f"t-{uid}")

    # Then the valid update is in force, the invalid ones changed nothing, and reservations are refused
    assert (status, knobs) == (200, FaultKnobs(rejection_rate=1.0, latency_ms=5).model_dump())
    assert (bad[0], bad[1]["error"], not_object[0]) == (400, "BAD_REQUEST", 400)
    assert flights.service.knobs == FaultKnobs(rejection_rate=1.0, latency_ms=5)
    assert rejected == (409, {"error": "NO_SEATS", "message": "flights refused reserve"})
    # And GET /_faults reads the knobs in force
    assert http("GET", f"{flights.base_url}/_faults") == (200, knobs)


def test_post_outage_refuses_actions_until_the_window_ends(flights: RunningServer, clock: FakeClock, uid: str) -> None:
    # Given a flights server at epoch START
    # When a 30 s outage is started over HTTP
    status, knobs = http("POST", f"{flights.base_url}/_outage", {"seconds": 30})

    # Then actions get 503 until START + 30, while the admin routes still answer
    assert (status, knobs["outage_start"], knobs["outage_end"]) == (200, START, START + 30)
    assert act(flights, "reserve", f"t-{uid}")[0] == 503
    assert http("GET", f"{flights.base_url}/_ledger")[0] == 200
    clock.set(START + 30)
    assert act(flights, "reserve", f"t-{uid}")[0] == 200
    assert http("POST", f"{flights.base_url}/_outage", {"seconds": -1})[0] == 400


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("POST", "/book", 404, "UNKNOWN_ACTION"),
        ("POST", "/_nothing", 404, "NOT_FOUND"),
        ("POST", "/a/b", 404, "NOT_FOUND"),
        ("GET", "/reserve", 405, "METHOD_NOT_ALLOWED"),
        ("PUT", "/reserve", 405, "METHOD_NOT_ALLOWED"),
    ],
)
def test_unknown_routes_answer_json_errors(
    flights: RunningServer, method: str, path: str, status: int, error: str
) -> None:
    # Given a flights server / When an unknown route is called / Then it answers a JSON error
    payload = {"token": "t", "workflow_id": "w", "step": "s"} if method != "GET" else None
    answer = http(method, f"{flights.base_url}{path}", payload, {"Idempotency-Key": "t"})
    assert (answer[0], answer[1]["error"]) == (status, error)


def test_malformed_body_over_http_gets_400(flights: RunningServer) -> None:
    # Given a flights server / When a body that is not JSON is posted / Then 400
    status, body = http("POST", f"{flights.base_url}/reserve", raw=b"{oops", headers={"Idempotency-Key": "t"})
    assert (status, body["error"]) == (400, "BAD_REQUEST")


def test_late_action_over_http_is_refused_after_its_compensation(uid: str) -> None:
    # Given a hotels server whose book hangs on a gate the test controls
    clock = GatedClock()
    hotels = serve(TravelService("hotels", InMemoryLedger(), FaultKnobs(hang_rate=1), random.Random(0), clock))
    try:
        late: list[tuple[int, dict[str, Any]]] = []
        worker = threading.Thread(target=lambda: late.append(act(hotels, "book", f"b-{uid}")))
        worker.start()
        assert clock.entered.wait(timeout=30)

        # When the caller compensates while the booking hangs, then the hang ends
        http("PUT", f"{hotels.base_url}/_faults", {"hang_rate": 0})
        cancelled = act(hotels, "cancel_booking", f"c-{uid}", original_token=f"b-{uid}")
        clock.gate.set()
        worker.join(timeout=30)

        # Then the compensation had nothing to undo, and the late booking is refused and never applied
        assert (cancelled[0], cancelled[1]["undone"], cancelled[1]["reason"]) == (200, False, "nothing_to_undo")
        assert [(status, body["error"]) for status, body in late] == [(409, "ALREADY_COMPENSATED")]
        assert http("GET", f"{hotels.base_url}/_ledger")[1]["effects"] == {}
    finally:
        hotels.stop()


def test_stop_closes_the_port(clock: FakeClock) -> None:
    # Given a running server
    server = serve(TravelService("payments", InMemoryLedger(), FaultKnobs(), random.Random(0), clock))
    url = f"{server.base_url}/_ledger"
    assert http("GET", url)[0] == 200

    # When it is stopped (twice: stop is idempotent)
    server.stop()
    server.stop()

    # Then the port refuses connections
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::1", "example.com"])
def test_serve_refuses_non_loopback_hosts(clock: FakeClock, host: str) -> None:
    service = TravelService("flights", InMemoryLedger(), FaultKnobs(), random.Random(0), clock)
    with pytest.raises(ValueError, match="loopback only"):
        serve(service, host=host)


def test_serve_all_starts_three_services_with_their_knobs(clock: FakeClock, uid: str) -> None:
    # Given knobs that make payments decline every card
    servers = serve_all({"payments": FaultKnobs(rejection_rate=1)}, rng_seed=11, clock=clock)
    try:
        # When each service's forward action is called
        answers = {
            name: act(server, action, f"t-{uid}")
            for (name, server), action in zip(servers.items(), ["reserve", "book", "charge"], strict=True)
        }

        # Then flights and hotels confirm, payments declines, and each has its own port
        assert list(servers) == ["flights", "hotels", "payments"]
        assert len({server.port for server in servers.values()}) == 3
        assert answers == {
            "flights": (
                200,
                {
                    "service": "flights",
                    "action": "reserve",
                    "token": f"t-{uid}",
                    "replayed": False,
                    "confirmation": confirmation_code("flights", f"t-{uid}"),
                },
            ),
            "hotels": (
                200,
                {
                    "service": "hotels",
                    "action": "book",
                    "token": f"t-{uid}",
                    "replayed": False,
                    "confirmation": confirmation_code("hotels", f"t-{uid}"),
                },
            ),
            "payments": (422, {"error": "CARD_DECLINED", "message": "payments refused charge"}),
        }
    finally:
        for server in servers.values():
            server.stop()


def test_serve_all_refuses_unknown_services(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="unknown services"):
        serve_all({"trains": FaultKnobs()}, clock=clock)
