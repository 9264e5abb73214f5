"""Loopback HTTP servers for the sample remote services (the local stack and system tests).

Routes of one server (one service per server, so ``base_url`` plays the role of ``/sample/{service}`` on AWS):

==========  ==============  =======================================================================
method      path            what
==========  ==============  =======================================================================
``POST``    ``/{action}``   the wire contract of ``travel_services`` (``TravelService.handle``)
``GET``     ``/_ledger``    ``TravelService.snapshot()``: knobs, effects, compensations, stats
``GET``     ``/_faults``    the ``FaultKnobs`` in force
``PUT``     ``/_faults``    partial ``FaultKnobs`` update; answers the knobs in force (400 if invalid)
``POST``    ``/_outage``    ``{"seconds": N}``: outage ``[now, now + N)``; answers the knobs in force
==========  ==============  =======================================================================

The admin routes answer during an outage, so that a test can always end one. Servers bind loopback only.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from random import Random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from travel_services import SERVICES, Clock, FaultKnobs, InMemoryLedger, SystemClock, TravelService

logger = logging.getLogger(__name__)

#: Largest request body (bytes): a claim-checked 10 MiB input, resolved by its agent, and its envelope.
MAX_BODY_BYTES = 11 << 20
# serve_forever notices shutdown() between polls: 50 ms keeps stop() quick at a negligible idle cost.
SHUTDOWN_POLL_SECONDS = 0.05
ADMIN_PREFIX = "_"


def problems(error: ValueError) -> str:
    """One line per problem of a refused body: ``latency_ms: Input should be less than or equal to 60000 (got
    120000)``; a body that is not JSON says so."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}"
            + (f" (got {item['input']!r})" if item.get("type") != "missing" and "input" in item else "")
            for item in error.errors(include_url=False)
        )
    return str(error)


class OutageRequest(BaseModel):
    """API request body of ``POST /_outage``: the outage length in seconds."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(ge=0, le=86_400, allow_inf_nan=False)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A hanging request must not hold up stop(): handler threads are daemons and are not joined.
    block_on_close = False
    # 20+ simultaneous connects must not overflow the listen backlog (default 5), or clients wait for SYN retries.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], service: TravelService) -> None:
        super().__init__(address, _Handler)
        self.service = service

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that stopped waiting (its timeout fired during a hang) is normal here, not an error to print.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "sasflow-sample"

    def do_POST(self) -> None:
        path = self._path()
        if path == "_outage":
            self._outage()
        elif path.startswith(ADMIN_PREFIX) or "/" in path or not path:
            self._send(404, {"error": "NOT_FOUND", "message": f"no route POST {self.path}"})
        else:
            body = self._body()
            if body is not None:
                self._send(*self.server.service.handle(path, dict(self.headers.items()), body))

    def do_GET(self) -> None:
        if self._path() == "_ledger":
            self._send(200, self.server.service.snapshot())
        elif self._path() == "_faults":
            self._send(200, self.server.service.knobs.model_dump())
        else:
            self._not_allowed("GET")

    def do_PUT(self) -> None:
        if self._path() != "_faults":
            self._not_allowed("PUT")
            return
        body = self._body()
        if body is None:
            return
        try:
            changes = json.loads(body or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("fault knobs must be a JSON object")
            knobs = self.server.service.update_knobs(changes)
        except (ValueError, ValidationError) as error:  # JSONDecodeError and ValidationError are ValueErrors
            self._send(400, {"error": "BAD_REQUEST", "message": problems(error)})
            return
        self._send(200, knobs.model_dump())

    def _outage(self) -> None:
        body = self._body()
        if body is None:
            return
        try:
            request = OutageRequest.model_validate_json(body)
        except ValidationError as error:
            self._send(400, {"error": "BAD_REQUEST", "message": problems(error)})
            return
        self._send(200, self.server.service.start_outage(request.seconds).model_dump())

    def _path(self) -> str:
        return self.path.split("?", 1)[0].strip("/")

    def _body(self) -> bytes | None:
        """Read the body by Content-Length; None when an error answer was already sent."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY_BYTES:
            self._send(400, {"error": "BAD_REQUEST", "message": f"Content-Length must be 0..{MAX_BODY_BYTES}"})
            return None
        return self.rfile.read(length)

    def _not_allowed(self, method: str) -> None:
        self._send(405, {"error": "METHOD_NOT_ALLOWED", "message": f"no route {method} {self.path}"})

    def _send(self, status: int, body: Mapping[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.server.service.name, format % args)


@dataclass
class RunningServer:
    """A sample service listening on loopback in a daemon thread.

    Attributes
    ----------
    service : TravelService
        The service behind the server (its knobs and ledger can be driven directly too).
    base_url : str
        ``http://127.0.0.1:{port}``; actions are at ``{base_url}/{action}``.
    """

    service: TravelService
    base_url: str
    _server: _Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop accepting requests and close the listening socket. Idempotent; requests in flight are abandoned."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()


def serve(service: TravelService, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Start an HTTP server for ``service`` in a daemon thread.

    Parameters
    ----------
    service : TravelService
        The service to expose.
    host : str
        An IPv4 loopback address (``127.0.0.0/8``) or ``localhost``.
    port : int
        TCP port; 0 picks a free one (read it from ``RunningServer.base_url``).

    Returns
    -------
    RunningServer
        Already accepting connections; call ``stop()`` when done.

    Raises
    ------
    ValueError
        ``host`` is not a loopback address.
    OSError
        The port cannot be bound.
    """
    _require_loopback(host)
    server = _Server((host, port), service)
    bound_port = server.server_address[1]
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
        name=f"sample-{service.name}",
        daemon=True,
    )
    thread.start()
    return RunningServer(service=service, base_url=f"http://{host}:{bound_port}", _server=server, _thread=thread)


def serve_all(
    knobs_by_service: Mapping[str, FaultKnobs] | None = None,
    rng_seed: int = 0,
    clock: Clock | None = None,
    host: str = "127.0.0.1",
    ports: Mapping[str, int] | None = None,
) -> dict[str, RunningServer]:
    """Start flights, hotels and payments, each on its own port with its own in-memory ledger.

    Parameters
    ----------
    knobs_by_service : Mapping[str, FaultKnobs], optional
        Initial knobs by service name; services not named get ``FaultKnobs()`` (no faults).
    rng_seed : int
        Seed of the fault draws. Each service draws from its own ``Random(f"{rng_seed}:{name}")``, so the faults of
        one service do not depend on the traffic of another.
    clock : Clock, optional
        Shared clock; ``SystemClock()`` by default.
    host : str
        Loopback address to bind.
    ports : Mapping[str, int], optional
        Fixed ports by service name; 0 or missing picks a free port.

    Returns
    -------
    dict[str, RunningServer]
        Keyed by service name, in ``SERVICES`` order.

    Raises
    ------
    ValueError
        A knob or port names an unknown service, or ``host`` is not loopback.
    OSError
        A port cannot be bound (servers already started are stopped first).
    """
    knobs_by_service = dict(knobs_by_service or {})
    ports = dict(ports or {})
    unknown = sorted((set(knobs_by_service) | set(ports)) - set(SERVICES))
    if unknown:
        raise ValueError(f"unknown services {unknown}; expected some of {sorted(SERVICES)}")
    clock = clock or SystemClock()
    running: dict[str, RunningServer] = {}
    try:
        for name in SERVICES:
            service = TravelService(
                name,
                InMemoryLedger(),
                knobs_by_service.get(name, FaultKnobs()),
                Random(f"{rng_seed}:{name}"),  # nosec B311 # the demo services' seeded fault draws, replayable on purpose
                clock,
            )
            running[name] = serve(service, host=host, port=ports.get(name, 0))
    except BaseException:
        for server in running.values():
            server.stop()
        raise
    return running


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    # ThreadingHTTPServer is AF_INET, so IPv4 loopback is what can be bound.
    if address is None or address.version != 4 or not address.is_loopback:
        raise ValueError(f"sample services bind IPv4 loopback only, not {host!r}")
