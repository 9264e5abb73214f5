"""The fault knobs of a running ``make up``'s sample services, from another terminal (``python -m devstack faults``).

``make up`` serves flights, hotels and payments on loopback and writes their URLs to its lock file
(`devstack.uplock`); this module reads and sets their knobs through the services' own admin routes
(``GET``/``PUT /_faults``, ``POST /_outage``, see ``functions/sample_services/http_server.py``). A knob set here is in
force at once for every agent's next call: the services run in the ``make up`` process, one instance each.

The knobs (``travel_services.FaultKnobs``): ``outage`` (every call answered 503 for a time), ``transient_error_rate``
(a share of calls answered 503), ``latency_ms`` (added to every call), ``hang_rate`` and ``hang_seconds`` (a call that
applies its effect only after the caller has given up), ``rejection_rate`` (a share of forward actions refused, a
business answer that fails the step at once), ``compensation_error_rate`` (a share of compensations answered 503,
forward actions untouched: a workflow that unwinds ends ``COMPENSATION_FAILED``).

Beside the knobs, ``send_poison_message`` puts a poison message (JSON that is no step request) on an agent's request
queue, through the stack's moto endpoint: the agent fails it on every receive and makes it visible again at once, so
its redrive policy moves it to the dead-letter queue after ``maxReceiveCount`` receives, within seconds.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import urllib3
from rich.table import Table

__all__ = [
    "POISON_BODY",
    "FaultsError",
    "KnobChanges",
    "ServiceKnobs",
    "apply",
    "knobs_table",
    "parse_duration",
    "read_knobs",
    "send_poison_message",
]

#: Every knob at rest: what ``--reset`` puts back (``FaultKnobs()``'s defaults).
NO_FAULTS: Final[dict[str, Any]] = {
    "latency_ms": 0.0,
    "transient_error_rate": 0.0,
    "rejection_rate": 0.0,
    "hang_rate": 0.0,
    "hang_seconds": 30.0,
    "compensation_error_rate": 0.0,
    "outage_start": None,
    "outage_end": None,
    "quota_in_flight": None,
    "quota_rate": None,
    "quota_burst": None,
    "quota_tolerance_ms": 50.0,
}
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_TIMEOUT: Final = urllib3.Timeout(connect=2.0, read=10.0)
#: The body of a drill's poison message: JSON, but no step request (no workflow, step, phase, agent or action).
POISON_BODY: Final = json.dumps({"drill": "a poison message from `python -m devstack faults --poison-message`"})


class FaultsError(RuntimeError):
    """A service could not be reached or refused the change (its message says which and why)."""


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit, ``500ms``, ``60s``, ``60``, ``2m``, ``1h``.

    Raises
    ------
    ValueError
        Not a non-negative number with one of the units ms, s, m, h.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"expected a duration like 500ms, 60s, 2m or 1h, got {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class KnobChanges:
    """What one command changes; None leaves a knob as it is.

    Attributes
    ----------
    outage_seconds
        Start an outage now that lasts this long (seconds); 0 ends the outage in force.
    knobs
        Other knobs by their ``FaultKnobs`` field name (``latency_ms``, ``transient_error_rate``, ...).
    reset
        Put every knob back to no faults first (the outage included).
    """

    outage_seconds: float | None = None
    knobs: Mapping[str, float] | None = None
    reset: bool = False

    @property
    def empty(self) -> bool:
        """Whether nothing is changed (the command only shows the knobs)."""
        return self.outage_seconds is None and not self.knobs and not self.reset


@dataclass(frozen=True)
class ServiceKnobs:
    """One service's knobs as it answered them, and where it listens."""

    service: str
    base_url: str
    knobs: dict[str, Any]


def _call(http: urllib3.PoolManager, method: str, url: str, body: Any = None) -> dict[str, Any]:
    try:
        response = http.request(
            method,
            url,
            body=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            timeout=_TIMEOUT,
            retries=False,
        )
    except urllib3.exceptions.HTTPError as error:
        raise FaultsError(f"{url} did not answer ({type(error).__name__}); is `make up` still running?") from None
    try:
        answer = json.loads(response.data or b"null")
    except ValueError:
        answer = None
    if response.status != 200 or not isinstance(answer, dict):
        message = answer.get("message") if isinstance(answer, dict) else response.data[:200].decode(errors="replace")
        raise FaultsError(f"{method} {url}: {response.status} {message}")
    return answer


def read_knobs(services: Mapping[str, str], http: urllib3.PoolManager | None = None) -> list[ServiceKnobs]:
    """The knobs in force of each service (``name -> base URL``), in the order given.

    Raises
    ------
    FaultsError
        A service did not answer.
    """
    http = http or urllib3.PoolManager()
    return [ServiceKnobs(name, url, _call(http, "GET", f"{url}/_faults")) for name, url in services.items()]


def apply(
    services: Mapping[str, str], changes: KnobChanges, http: urllib3.PoolManager | None = None
) -> list[ServiceKnobs]:
    """Apply ``changes`` to each service (``name -> base URL``) and return the knobs then in force.

    The reset comes first, then the knobs, then the outage, so ``--reset --outage 60s`` leaves only the outage.

    Raises
    ------
    FaultsError
        A service did not answer or refused a value (the services before it keep their change).
    """
    http = http or urllib3.PoolManager()
    result = []
    for name, url in services.items():
        knobs: dict[str, Any] | None = None
        if changes.reset:
            knobs = _call(http, "PUT", f"{url}/_faults", NO_FAULTS)
        if changes.knobs:
            knobs = _call(http, "PUT", f"{url}/_faults", dict(changes.knobs))
        if changes.outage_seconds is not None:
            knobs = _call(http, "POST", f"{url}/_outage", {"seconds": changes.outage_seconds})
        result.append(ServiceKnobs(name, url, knobs if knobs is not None else _call(http, "GET", f"{url}/_faults")))
    return result


def send_poison_message(endpoint_url: str, region: str, queue_url: str) -> str:
    """Send ``POISON_BODY`` to ``queue_url`` on the local stack's moto endpoint; return its SQS message id.

    Raises
    ------
    FaultsError
        The endpoint did not answer or refused the send.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from devstack import _aws

    try:
        sent = _aws.client("sqs", region=region, endpoint_url=endpoint_url).send_message(
            QueueUrl=queue_url, MessageBody=POISON_BODY
        )
    except (BotoCoreError, ClientError) as error:
        raise FaultsError(f"the poison message was not sent to {queue_url}: {error}") from None
    return str(sent["MessageId"])


def _outage_text(knobs: Mapping[str, Any], now: float) -> str:
    start, end = knobs.get("outage_start"), knobs.get("outage_end")
    if start is None or end is None or end <= now:
        return "-"
    until = datetime.fromtimestamp(end, UTC).strftime("%H:%M:%SZ")
    return f"until {until} ({end - now:.0f}s)" if start <= now else f"in {start - now:.0f}s, until {until}"


def _rate(value: float) -> str:
    return f"{value:.0%}" if value else "-"


def knobs_table(rows: list[ServiceKnobs], now: float | None = None) -> Table:
    """A rich table of the knobs, one row per service (``now``: epoch seconds, for the outage's time left)."""
    now = time.time() if now is None else now
    table = Table(title="fault knobs of the sample services", title_justify="left")
    for column in ("service", "outage", "5xx", "latency", "hangs", "rejects", "comp 5xx", "quota"):
        table.add_column(column, no_wrap=column in {"service", "outage", "hangs"})
    for row in rows:
        knobs = row.knobs
        hangs = f"{knobs['hang_rate']:.0%} x {knobs['hang_seconds']:g}s" if knobs.get("hang_rate") else "-"
        table.add_row(
            row.service,
            _outage_text(knobs, now),
            _rate(knobs.get("transient_error_rate", 0.0)),
            f"{knobs['latency_ms']:g}ms" if knobs.get("latency_ms") else "-",
            hangs,
            _rate(knobs.get("rejection_rate", 0.0)),
            _rate(knobs.get("compensation_error_rate", 0.0)),
            describe_quota(knobs) or "-",
        )
    return table


def describe_quota(knobs: Mapping[str, Any]) -> str:
    """A service's quota knobs as ``5 at once, 10/s (burst 10)`` (empty without a quota)."""
    parts = []
    if knobs.get("quota_in_flight") is not None:
        parts.append(f"{knobs['quota_in_flight']} at once")
    if knobs.get("quota_rate") is not None:
        burst = knobs.get("quota_burst") or max(1, math.ceil(knobs["quota_rate"]))
        parts.append(f"{knobs['quota_rate']:g}/s (burst {burst})")
    return ", ".join(parts)
