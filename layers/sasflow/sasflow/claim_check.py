"""Claim-check: a payload above a threshold travels as a reference to an object in the payload bucket.

SQS carries at most 262,144 bytes per message and DynamoDB 400 KB per item, so a workflow input, a step's output or
a step's rendered input larger than ``threshold_bytes`` (template ``ClaimCheckThresholdBytes``, 32 KiB by default)
is written to the payload store and replaced, in the message and in the workflow's item, by a reference
(Enterprise Integration Patterns, "Claim Check")::

    {"$claim_check": {"key": "<workflow_id>/<sha256>", "bytes": 5242880, "sha256": "<hex>"}}

- **Where.** The API (``SchedulerService.start_workflow``) claim-checks the workflow input before the workflow is
  created; an agent claim-checks its own output before it replies (the reply could not carry it); the scheduler
  claim-checks a rendered input after the write that dispatches the step and before its request is sent (Rule 1:
  the object is durable before any message names it). An agent resolves its request's input before it calls the
  service, so HTTP and Python agents see the payload itself. The scheduler resolves a claim-checked input or output
  when an expression of a later step (an input, a condition, a compensation's input) may read it, through a
  bounded cache per Lambda sandbox (objects never change: their key is their content's hash).
- **Keys.** ``<workflow_id>/<sha256 of the compact JSON>``: owned by one workflow (a reference naming another
  workflow's key is refused), found by its prefix, written again identically by a resend.
- **Limit.** ``max_payload_bytes`` (``MaxPayloadBytes``, 10 MiB by default) bounds every payload: a larger start
  input is refused with 413, a larger output fails its step with ``OUTPUT_TOO_LARGE``, a larger rendered input
  fails its step with ``INPUT_TOO_LARGE``.
- **Retention.** An object belongs to a workflow or expires. One written before the workflow item that names it
  exists (a start's input, a map step's child's input, an agent's output) is tagged ``claim-check=pending``, which
  the bucket expires after a day; the scheduler re-stamps it live once the item holds its reference (after the
  create, or the write that applies the agent's reply, even a dropped one), so a crash between the two leaves
  nothing behind for ever, and the first write after a create re-stamps the input again (a crash after the create).
  Objects written once the item exists (rendered inputs, collected results) are tagged ``claim-check=live``, which
  no lifecycle rule expires. When a workflow becomes terminal, the scheduler re-stamps every object under its prefix
  ``terminal`` with a copy onto itself, so the object's age, which S3 lifecycle counts from creation, starts at the
  terminal write; the bucket's rule expires ``terminal`` objects after ``TerminalRetentionDays``, when DynamoDB's
  TTL may delete the workflow's item too (``expires_at``). A workflow an operator takes out of a terminal state is
  re-stamped ``live`` again. So a workflow that runs or is held for any time keeps its objects, and none outlives
  its item's retention by more than the lifecycle's own delay (S3 runs rules once a day). A map step's child takes
  its retention from its parent's end (``SchedulerService._settle_retention``): its objects stay live while its
  parent may still compensate it. Below the threshold nothing here makes a request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .cache import BoundedCache
from .errors import ClaimCheckMissingError, PayloadTooLargeError
from .limits import json_size
from .ports import Counter, PayloadStore, no_metrics
from .records import Snapshot

#: The one key of a reference object.
REFERENCE_KEY = "$claim_check"
#: Retention tags (``claim-check=<state>``): live objects never expire; terminal ones after TerminalRetentionDays;
#: pending ones (written before the workflow item that names them exists) after a day.
LIVE = "live"
TERMINAL = "terminal"
PENDING = "pending"
#: Defaults of the template parameters ClaimCheckThresholdBytes and MaxPayloadBytes (bytes).
DEFAULT_THRESHOLD_BYTES = 32_768
DEFAULT_MAX_PAYLOAD_BYTES = 10_485_760
#: Resolved payloads the scheduler keeps per sandbox (bytes of their JSON): a few 10 MB objects of a 256 MB function.
RESOLVED_CACHE_BYTES = 33_554_432


def encode_payload(value: Any) -> bytes:
    """``value`` as the bytes of its object: compact JSON, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def object_key(workflow_id: str, digest: str) -> str:
    """The key of a payload of ``workflow_id`` whose SHA-256 (hex) is ``digest``."""
    return f"{workflow_id}/{digest}"


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a claim-check reference (an object whose only key is ``$claim_check``)."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and isinstance(value.get(REFERENCE_KEY), dict)
        and isinstance(value[REFERENCE_KEY].get("key"), str)
    )


def reference_key(value: Any) -> str | None:
    """The object key a reference names, or None when ``value`` is not a reference."""
    return value[REFERENCE_KEY]["key"] if is_reference(value) else None


def uses_claim_check(snapshot: Snapshot) -> bool:
    """Whether ``snapshot``'s workflow may have objects in the payload store (so its end re-stamps them)."""
    workflow = snapshot.workflow
    if workflow.claim_checked or is_reference(workflow.input):
        return True
    return any(is_reference(r.output) or is_reference(r.comp_output) for r in snapshot.steps.values())


@dataclass(frozen=True)
class Upload:
    """An object to write: its key and bytes (the scheduler writes its uploads after the write that needs them)."""

    key: str
    body: bytes


class ClaimCheck:
    """Claim-checks payloads of the workflows into a ``PayloadStore``, and resolves references.

    Parameters
    ----------
    store:
        The payload store (the S3 bucket ``PAYLOAD_BUCKET``).
    threshold_bytes:
        A payload whose compact JSON is larger than this is claim-checked (bytes).
    max_payload_bytes:
        The largest payload accepted (bytes); a larger one raises ``PayloadTooLargeError``.
    cache_bytes:
        Resolved payloads kept (bytes of JSON, per sandbox); 0 keeps none (an agent: its functions may change what
        they are given).
    metrics:
        Counts ``ClaimCheckPuts``, ``ClaimCheckGets`` and ``ClaimCheckRestamps``.
    """

    def __init__(
        self,
        store: PayloadStore,
        *,
        threshold_bytes: int = DEFAULT_THRESHOLD_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        cache_bytes: int = RESOLVED_CACHE_BYTES,
        metrics: Counter = no_metrics,
    ) -> None:
        if not 0 < threshold_bytes < max_payload_bytes:
            raise ValueError("the claim-check threshold must be positive and below the largest payload")
        self.store = store
        self.threshold_bytes = threshold_bytes
        self.max_payload_bytes = max_payload_bytes
        self.metrics = metrics
        self._resolved: BoundedCache[str, Any] = BoundedCache(cache_bytes)

    def prepare(self, workflow_id: str, value: Any, *, what: str, force: bool = False) -> tuple[Any, Upload | None]:
        """``value``, or its reference and the upload that must be written before the reference is used.

        No request is made here: the caller writes the upload (``upload``) when it is safe to. ``force``
        claim-checks a value below the threshold too (an output that does not fit in a full workflow item).

        Raises
        ------
        PayloadTooLargeError
            When ``value`` is larger than ``max_payload_bytes``.
        """
        if is_reference(value):
            return value, None  # claim-checked already (an output passed on as a whole)
        size = json_size(value, self.max_payload_bytes, what=what)
        if size <= self.threshold_bytes and not force:
            return value, None
        body = encode_payload(value)
        if len(body) > self.max_payload_bytes:
            raise PayloadTooLargeError(what, len(body), self.max_payload_bytes)
        if len(body) <= self.threshold_bytes and not force:
            return value, None  # json_size counts an upper bound
        digest = hashlib.sha256(body).hexdigest()
        key = object_key(workflow_id, digest)
        self._resolved.put(key, value, len(body))
        reference = {REFERENCE_KEY: {"key": key, "bytes": len(body), "sha256": digest}}
        return reference, Upload(key, body)

    def upload(self, uploads: Iterable[Upload], *, state: str = LIVE) -> None:
        """Write ``uploads`` (one PUT each, tagged ``state``); a repeat of a key writes the same bytes again.

        ``LIVE`` when the workflow item that names them exists already; ``PENDING`` when it may not exist yet (the
        writer re-stamps them once it does, or they expire with the bucket's rule on pending objects).
        """
        for item in uploads:
            self.store.put(item.key, item.body, state)
            self.metrics("ClaimCheckPuts")

    def offload(self, workflow_id: str, value: Any, *, what: str, force: bool = False, state: str = LIVE) -> Any:
        """``value``, or its reference once its object is written tagged ``state`` (``prepare`` then ``upload``).

        Raises
        ------
        PayloadTooLargeError
            When ``value`` is larger than ``max_payload_bytes``.
        """
        result, pending = self.prepare(workflow_id, value, what=what, force=force)
        if pending is not None:
            self.upload([pending], state=state)
        return result

    def resolve(self, value: Any, workflow_id: str) -> Any:
        """The payload ``value`` refers to (``value`` itself when it is not a reference).

        Raises
        ------
        ClaimCheckMissingError
            When the object is missing, its bytes do not match the reference's SHA-256, or the reference names an
            object of another workflow than ``workflow_id``.
        """
        if not is_reference(value):
            return value
        claim = value[REFERENCE_KEY]
        key: str = claim["key"]
        if not key.startswith(f"{workflow_id}/"):
            raise ClaimCheckMissingError(key, f"not an object of workflow {workflow_id}")
        cached = self._resolved.get(key)
        if cached is not None:
            return cached
        body = self.store.get(key)
        self.metrics("ClaimCheckGets")
        if hashlib.sha256(body).hexdigest() != claim.get("sha256", key.rsplit("/", 1)[-1]):
            raise ClaimCheckMissingError(key, "its bytes do not match the reference's sha256")
        resolved = json.loads(body)
        self._resolved.put(key, resolved, len(body))
        return resolved

    def resolve_context(self, context: dict[str, Any], workflow_id: str) -> dict[str, Any]:
        """The JMESPath context of ``Snapshot.context`` with its claim-checked input and outputs resolved.

        Returns ``context`` itself when nothing in it is a reference (no request is made).

        Raises
        ------
        ClaimCheckMissingError
            As ``resolve``.
        """
        steps = context.get("steps", {})
        claimed = [name for name, step in steps.items() if is_reference(step.get("output"))]
        if not claimed and not is_reference(context.get("input")):
            return context
        resolved = dict(context)
        resolved["input"] = self.resolve(context.get("input"), workflow_id)
        resolved["steps"] = {
            name: ({**step, "output": self.resolve(step["output"], workflow_id)} if name in claimed else step)
            for name, step in steps.items()
        }
        return resolved

    def settle(self, workflow_id: str, state: str) -> int:
        """Re-stamp every object of ``workflow_id`` ``state`` (``TERMINAL`` when it ends, ``LIVE`` when an operator
        takes it out of a terminal state); return how many.

        One LIST, then one COPY per object (``PayloadStore.restamp``): the age the lifecycle rule counts restarts.
        """
        keys = self.store.keys(f"{workflow_id}/")
        for key in keys:
            try:
                self.store.restamp(key, state)
            except ClaimCheckMissingError:
                continue  # gone since the listing: nothing to keep
            self.metrics("ClaimCheckRestamps")
        return len(keys)
