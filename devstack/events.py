"""EventBridge on the local stack: ``python -m devstack emit`` puts an event on a bus, and each enabled rule of the
template on that bus whose pattern matches it sends the event, as it is, to its target queues (an event trigger's
queue, ``devstack/triggers.py``).

The event is the envelope EventBridge delivers (``version``, ``id``, ``detail-type``, ``source``, ``account``,
``time``, ``region``, ``resources``, ``detail``); its ``id`` is drawn unless given, so the same event can be put twice
(as EventBridge's at-least-once delivery does). Patterns are matched by moto's EventBridge pattern matcher (prefix,
anything-but, numeric, exists and ``$or`` included), not by code of ours.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from devstack.template import EventRuleSpec

__all__ = ["LocalRule", "envelope", "matching_rules", "put_event"]


@dataclass(frozen=True)
class LocalRule:
    """A rule as the running local stack publishes it (its lock): what ``emit`` needs, without the template."""

    name: str
    bus: str
    pattern: dict[str, Any]
    enabled: bool
    queue_urls: tuple[str, ...]

    @classmethod
    def of(cls, spec: EventRuleSpec) -> LocalRule:
        return cls(spec.logical_id, spec.bus, spec.pattern, spec.enabled, spec.queue_urls)

    def document(self) -> dict[str, Any]:
        """The JSON form kept in the lock."""
        return {**asdict(self), "queue_urls": list(self.queue_urls)}

    @classmethod
    def from_document(cls, document: dict[str, Any]) -> LocalRule:
        return cls(
            str(document["name"]),
            str(document["bus"]),
            dict(document["pattern"]),
            bool(document["enabled"]),
            tuple(document["queue_urls"]),
        )


def envelope(
    source: str,
    detail_type: str,
    detail: dict[str, Any],
    *,
    region: str,
    account: str = "123456789012",
    event_id: str | None = None,
    time: datetime | None = None,
) -> dict[str, Any]:
    """The event as an EventBridge rule delivers it to a queue."""
    when = (time or datetime.now(UTC)).astimezone(UTC)
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": account,
        "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [],
        "detail": detail,
    }


def _matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    from moto.events.models import EventPattern

    return bool(EventPattern.load(json.dumps(pattern)).matches_event(event))  # type: ignore[arg-type]


def matching_rules(rules: Sequence[LocalRule], bus: str, event: dict[str, Any]) -> list[LocalRule]:
    """The enabled rules on ``bus`` whose pattern matches ``event``, in the template's order."""
    return [rule for rule in rules if rule.enabled and rule.bus == bus and _matches(rule.pattern, event)]


def put_event(sqs: Any, rules: Sequence[LocalRule], bus: str, event: dict[str, Any]) -> list[LocalRule]:
    """Put ``event`` on ``bus``: every matching rule sends it to its target queues. Returns the rules that matched."""
    matched = matching_rules(rules, bus, event)
    body = json.dumps(event, separators=(",", ":"))
    for rule in matched:
        for queue_url in rule.queue_urls:
            sqs.send_message(QueueUrl=queue_url, MessageBody=body)
    return matched
