"""Triggers' items on DynamoDB: one item per trigger in the state table (``pk = "TRIGGER#<name>"``, ``sk =
"#TRIGGER"``), beside the workflows the trigger starts: whether an operator paused it (who, when, why), the run that
holds its slot and the tick waiting for it (``overlap``), and its counts (``triggers.COUNTS``).

Every write touches only the item of its own trigger (the trigger function's role may update no other), counters
are ``ADD``s that need no condition, the slot moves by conditional writes only, and the item stays around 1 KB (a
waiting tick's message is its largest part).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..ports import Outgoing
from ..triggers import COUNTS, SlotTakenError, TriggerState, already_paused
from . import batch_get, condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

TRIGGER_PREFIX = "TRIGGER#"
TRIGGER_SORT_KEY = "#TRIGGER"
#: Rounds of BatchGetItem for one chunk of names before the unprocessed ones are read alone.
_BATCH_GET_ROUNDS = 5


def trigger_key(name: str) -> dict[str, Any]:
    """The key of a trigger's item."""
    return {"pk": {"S": f"{TRIGGER_PREFIX}{name}"}, "sk": {"S": TRIGGER_SORT_KEY}}


def _state(name: str, item: dict[str, Any] | None) -> TriggerState:
    item = item or {}

    def text(attr: str) -> str | None:
        value = item.get(attr)
        return value["S"] if value and "S" in value else None

    def number(attr: str) -> int | None:
        value = item.get(attr)
        return int(value["N"]) if value and "N" in value else None

    return TriggerState(
        name=name,
        paused_by=text("paused_by"),
        paused_at=number("paused_at"),
        pause_reason=text("pause_reason"),
        skipped=number("n_skipped") or 0,
        missed=number("n_missed") or 0,
        buffered=number("n_buffered") or 0,
        held=number("n_held") or 0,
        running=text("running"),
        running_since=number("running_since"),
        waiting=text("waiting"),
        waiting_queue=text("waiting_queue"),
    )


class DynamoDBTriggerStore:
    """``ports.TriggerStore`` over DynamoDB.

    Parameters
    ----------
    table_name:
        The state table (template.yaml ``StateTable``).
    client:
        A boto3 DynamoDB client, injected.
    """

    def __init__(self, table_name: str, client: DynamoDBClient | Any) -> None:
        self.table = table_name
        self.client = client

    def state(self, name: str, *, consistent: bool = False) -> TriggerState:
        """See ``ports.TriggerStore.state`` (eventually consistent by default: a pause takes effect within a second
        or so, for half a read unit a tick)."""
        item = self.client.get_item(TableName=self.table, Key=trigger_key(name), ConsistentRead=consistent).get("Item")
        return _state(name, item)

    def states(self, names: Sequence[str]) -> list[TriggerState]:
        """See ``ports.TriggerStore.states``: one BatchGetItem per 100 names, unprocessed keys asked again."""
        keys: list[Any] = [trigger_key(name) for name in names]
        items, left = batch_get(self.client, self.table, keys, rounds=_BATCH_GET_ROUNDS)
        for key in left:  # still unprocessed: read alone
            item = self.client.get_item(TableName=self.table, Key=key).get("Item")
            if item is not None:
                items.append(item)
        found = {item["pk"]["S"][len(TRIGGER_PREFIX) :]: item for item in items}
        return [_state(name, found.get(name)) for name in names]

    def pause(self, name: str, principal: str, reason: str, now: int) -> TriggerState:
        """See ``ports.TriggerStore.pause``: conditional on no other pause (the same one again is kept as it is)."""
        try:
            response = self.client.update_item(
                TableName=self.table,
                Key=trigger_key(name),
                UpdateExpression=(
                    "SET paused_by = :who, paused_at = if_not_exists(paused_at, :now), pause_reason = :why"
                ),
                ConditionExpression="attribute_not_exists(paused_by) OR (paused_by = :who AND pause_reason = :why)",
                ExpressionAttributeValues={":who": {"S": principal}, ":now": {"N": str(now)}, ":why": {"S": reason}},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            raise already_paused(self.state(name, consistent=True)) from None
        return _state(name, response.get("Attributes"))

    def resume(self, name: str) -> TriggerState:
        """See ``ports.TriggerStore.resume``."""
        response = self.client.update_item(
            TableName=self.table,
            Key=trigger_key(name),
            UpdateExpression="REMOVE paused_by, paused_at, pause_reason",
            ReturnValues="ALL_NEW",
        )
        return _state(name, response.get("Attributes"))

    def count(self, name: str, what: str) -> None:
        """See ``ports.TriggerStore.count`` (an ``ADD``: no condition, no read).

        Raises
        ------
        ValueError
            For a count a trigger does not keep.
        """
        if what not in COUNTS:
            raise ValueError(f"unknown trigger count {what!r}; one of {COUNTS}")
        self.client.update_item(
            TableName=self.table,
            Key=trigger_key(name),
            UpdateExpression=f"ADD n_{what} :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )

    def claim(self, name: str, workflow_id: str, now: int, *, expect: str | None, buffered: str | None) -> None:
        """See ``ports.TriggerStore.claim``: one conditional ``UpdateItem``."""
        values: dict[str, Any] = {":wf": {"S": workflow_id}, ":now": {"N": str(now)}}
        conditions = ["attribute_not_exists(running)" if expect is None else "running = :expect"]
        if expect is not None:
            values[":expect"] = {"S": expect}
        update = "SET running = :wf, running_since = :now"
        if buffered is not None:
            conditions.append("waiting = :body")
            values[":body"] = {"S": buffered}
            update += " REMOVE waiting, waiting_queue"
        try:
            self.client.update_item(
                TableName=self.table,
                Key=trigger_key(name),
                UpdateExpression=update,
                ConditionExpression=" AND ".join(conditions),
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            raise SlotTakenError(f"trigger {name}: its slot changed since it was read") from None

    def buffer(self, name: str, body: str, queue_url: str) -> bool:
        """See ``ports.TriggerStore.buffer``: conditional on no tick waiting."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=trigger_key(name),
                UpdateExpression="SET waiting = :body, waiting_queue = :queue ADD n_buffered :one",
                ConditionExpression="attribute_not_exists(waiting)",
                ExpressionAttributeValues={":body": {"S": body}, ":queue": {"S": queue_url}, ":one": {"N": "1"}},
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            return False
        return True

    def release(self, name: str, workflow_id: str) -> Outgoing | None:
        """See ``ports.TriggerStore.release``: conditional on ``workflow_id`` holding the slot, or nobody (a give-back
        made again answers the waiting tick again: its message may have been lost)."""
        try:
            response = self.client.update_item(
                TableName=self.table,
                Key=trigger_key(name),
                UpdateExpression="REMOVE running, running_since",
                ConditionExpression="attribute_exists(pk) AND (running = :wf OR attribute_not_exists(running))",
                ExpressionAttributeValues={":wf": {"S": workflow_id}},
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            return None
        state = _state(name, response.get("Attributes"))
        if state.waiting is None:
            return None
        return Outgoing(state.waiting_queue or "", state.waiting)
