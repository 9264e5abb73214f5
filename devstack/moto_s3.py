"""S3 event notifications for moto as S3 sends them: with the object's version id and a sequencer.

moto 5.2.5 sends an upload's notification to SQS (``moto.s3.notifications``) without ``versionId`` or
``sequencer``, which S3 puts in every record of ``ObjectCreated`` events ("Event message structure" in the Amazon S3
User Guide: ``versionId`` when the bucket is versioning-enabled; ``sequencer``, a string representation of a
hexadecimal value that orders the events of one key, in every PUT and DELETE). An s3 trigger names its occurrence by
the key and version id (or ETag and sequencer), so the local stack must send them. `install` wraps moto's record
builder in this process (``mock_aws`` and the moto server `devstack.stack.LocalStack` runs in a thread of it), once.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

__all__ = ["install"]

_lock = threading.Lock()
_counter = itertools.count()


def _sequencer() -> str:
    """A hexadecimal text that grows with every event of this process, as S3's does for the events of a key (its
    length fixed, so that a later one also sorts later as text)."""
    with _lock:
        return f"{time.time_ns() // 1000:014X}{next(_counter) % 65536:04X}"


def install() -> None:
    """Make moto's S3 notifications carry ``versionId`` (versioned buckets) and ``sequencer``; again does nothing."""
    from moto.s3 import notifications

    if getattr(notifications._get_s3_event, "sasflow_faithful", False):
        return
    original = notifications._get_s3_event

    def faithful(event_name: str, bucket: Any, key: Any, notification_id: str) -> dict[str, Any]:
        event: dict[str, Any] = original(event_name, bucket, key, notification_id)
        found = event["Records"][0]["s3"]["object"]
        if bucket.is_versioned and key.version_id:
            found["versionId"] = key.version_id
        found["sequencer"] = _sequencer()
        return event

    faithful.sasflow_faithful = True  # type: ignore[attr-defined]
    notifications._get_s3_event = faithful
