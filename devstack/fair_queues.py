"""SQS fair queues for moto: a quiet tenant's messages are not held behind a noisy tenant's backlog.

AWS's standard queues deliver a quiet tenant's messages first once another tenant is noisy (Amazon SQS Developer
Guide, "Amazon SQS fair queues" and "How Amazon SQS fair queues work"). moto 5 keeps ``MessageGroupId`` on a
standard queue's messages but delivers in arrival order. `install` makes moto's ``ReceiveMessage`` follow these
rules, in this process (``moto.mock_aws()`` and the local stack's moto server alike):

1. *Tenant.* A message's tenant is its ``MessageGroupId``; a message without one is a tenant of its own [GUIDE].
2. *Noisy.* AWS marks a tenant noisy when it has over 10 % of the queue's in-flight messages and at least 30 of its
   own, or over 10 % of the consumers' recent processing time [GUIDE]. Here a tenant is noisy when, of the messages
   the queue delivered in the last `WINDOW_SECONDS`, it had at least `NOISY_AT_LEAST` and over `NOISY_SHARE` of
   them [LOCAL: deliveries stand for both in-flight share and processing time; an event source mapping deletes
   what it processed before the next batch, so moto's in-flight count alone would never see one].
3. *Order.* A receive returns the quiet tenants' visible messages first, in arrival order, then the noisy tenants',
   the tenant with the fewest recent deliveries first [GUIDE: "consumer instances first receive messages from the
   noisy tenant with the fewest in-flight messages"], each in arrival order. With no noisy tenant the order is
   moto's, arrival order.
4. *Nothing else changes*: no message is dropped, delayed or throttled; a noisy tenant's messages are delivered
   whenever no quiet tenant's are visible [GUIDE]. FIFO queues are left alone (their groups are strict order).

Sources: [GUIDE] the Amazon SQS Developer Guide pages named above; [LOCAL] a choice of this emulator.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from moto.sqs import models as sqs_models
from moto.sqs.models import SQSBackend

#: Rule 2: what makes a tenant noisy (deliveries in the last window: at least this many, over this share).
WINDOW_SECONDS: Final = 60.0
NOISY_AT_LEAST: Final = 30
NOISY_SHARE: Final = 0.10

_MARK: Final = "_sasflow_fair_queue"
_LOCK = threading.Lock()


class Deliveries:
    """What one queue delivered lately: (time, tenant) of each message, the last `WINDOW_SECONDS`."""

    def __init__(self) -> None:
        self._recent: deque[tuple[float, str]] = deque()

    def note(self, now: float, tenants: Sequence[str]) -> None:
        """Record the tenants of the messages one receive returned at ``now``."""
        self._recent.extend((now, tenant) for tenant in tenants)

    def counts(self, now: float) -> Counter[str]:
        """Deliveries by tenant in the window before ``now``."""
        while self._recent and self._recent[0][0] <= now - WINDOW_SECONDS:
            self._recent.popleft()
        return Counter(tenant for _, tenant in self._recent)


def tenant_of(message: Any) -> str:
    """Rule 1: the message's group, or the message itself."""
    group = getattr(message, "group_id", None)
    return f"group:{group}" if group is not None else f"message:{message.id}"


def fair_order(messages: Sequence[Any], counts: Counter[str]) -> list[Any]:
    """Rule 3: ``messages`` (in arrival order) as a fair queue delivers them, given recent deliveries by tenant."""
    total = sum(counts.values())
    noisy = {t for t, n in counts.items() if n >= NOISY_AT_LEAST and n > NOISY_SHARE * total}
    if not noisy:
        return list(messages)

    def rank(item: tuple[int, Any]) -> tuple[int, int]:
        tenant = tenant_of(item[1])
        return (counts[tenant], item[0]) if tenant in noisy else (0, item[0])

    return [message for _, message in sorted(enumerate(messages), key=rank)]


def _fair_receive(original: Callable[..., Any]) -> Callable[..., Any]:
    """SQSBackend.receive_message that puts the queue's messages in fair order first and notes what it delivered."""

    @functools.wraps(original)
    def receive_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = self.queues.get(queue_name)
        if queue is None or queue.fifo_queue:
            return original(self, queue_name, *args, **kwargs)
        now = float(sqs_models.unix_time())  # type: ignore[attr-defined]  # moto's clock (the bench patches it)
        deliveries: Deliveries = queue.__dict__.setdefault(_MARK, Deliveries())
        queue._messages = fair_order(queue._messages, deliveries.counts(now))
        received = original(self, queue_name, *args, **kwargs)
        deliveries.note(now, [tenant_of(message) for message in received])
        return received

    setattr(receive_message, _MARK, True)
    return receive_message


def install() -> None:
    """Make moto's standard queues deliver as fair queues (rules 1-4), in this process. Idempotent, thread-safe."""
    with _LOCK:
        if not getattr(SQSBackend.receive_message, _MARK, False):
            SQSBackend.receive_message = _fair_receive(SQSBackend.receive_message)  # type: ignore[method-assign]
