"""The sample inventory agent: a Python agent (``sasflow.python_agent.AgentApp``) on DynamoDB, with no HTTP.

Stock is one item per SKU in ``INVENTORY_TABLE`` (``pk = sku#<sku>``, ``stock``, starting at ``INITIAL_STOCK`` when the
SKU is first seen). A reservation is one item keyed by the step's idempotency token (``pk = reservation#<token>``),
written in the same transaction that takes its quantity from the stock, so a repeated call with the same token is a
no-op that returns the reservation made, even after the agent's idempotency record has expired. Releasing deletes the
reservation and gives its quantity back in one transaction; releasing what was never reserved is answered as such
(nothing to undo).
"""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.exceptions import ClientError

from sasflow.python_agent import ActionRequest, AgentApp, BusinessRejection, TransientError

app = AgentApp("inventory")
_client: Any = None


def dynamodb() -> Any:
    """The DynamoDB client, created on first use (after the endpoint or moto is set up)."""
    global _client
    if _client is None:
        _client = boto3.client("dynamodb")
    return _client


def _table() -> str:
    return os.environ["INVENTORY_TABLE"]


def _initial_stock() -> int:
    return int(os.environ.get("INITIAL_STOCK", "100"))


def _reservation(token: str) -> dict[str, Any] | None:
    found = (
        dynamodb()
        .get_item(TableName=_table(), Key={"pk": {"S": f"reservation#{token}"}}, ConsistentRead=True)
        .get("Item")
    )
    if found is None:
        return None
    return {"reservation": token, "sku": found["sku"]["S"], "quantity": int(found["quantity"]["N"])}


@app.action("reserve_stock")
def reserve_stock(request: ActionRequest) -> dict[str, Any]:
    """Take ``input.quantity`` of ``input.sku`` from the stock; refused ``OUT_OF_STOCK`` when there is not enough.

    Returns ``{"reservation": <token>, "sku", "quantity"}``.
    """
    sku, quantity = str(request.input.get("sku", "")), request.input.get("quantity")
    if not sku or not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
        raise BusinessRejection("INVALID_ORDER", "sku (a string) and quantity (an integer >= 1) are required")
    done = _reservation(request.token)
    if done is not None:
        return done  # the same step again: its reservation stands
    try:
        dynamodb().transact_write_items(
            TransactItems=[
                {
                    "Put": {
                        "TableName": _table(),
                        "Item": {
                            "pk": {"S": f"reservation#{request.token}"},
                            "sku": {"S": sku},
                            "quantity": {"N": str(quantity)},
                            "workflow_id": {"S": request.workflow_id},
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {
                    "Update": {
                        "TableName": _table(),
                        "Key": {"pk": {"S": f"sku#{sku}"}},
                        "UpdateExpression": "SET stock = if_not_exists(stock, :initial) - :q",
                        "ConditionExpression": "attribute_not_exists(stock) AND :initial >= :q OR stock >= :q",
                        "ExpressionAttributeValues": {
                            ":q": {"N": str(quantity)},
                            ":initial": {"N": str(_initial_stock())},
                        },
                    }
                },
            ],
        )
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code == "TransactionCanceledException":
            reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
            if reasons[:1] == ["ConditionalCheckFailed"]:
                done = _reservation(request.token)  # a concurrent copy of this very step made it
                if done is not None:
                    return done
            if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
                raise BusinessRejection("OUT_OF_STOCK", f"not {quantity} of {sku} in stock") from exc
        raise TransientError(f"DynamoDB: {code}", outcome_unknown=code != "TransactionCanceledException") from exc
    return {"reservation": request.token, "sku": sku, "quantity": quantity}


@app.compensation("reserve_stock")
def release_stock(request: ActionRequest) -> dict[str, Any]:
    """Give back the reservation made under ``original_token`` (the forward action's token)."""
    token = request.original_token or ""
    reservation = _reservation(token)
    if reservation is None:
        return {"released": False, "nothing_to_undo": True}
    try:
        dynamodb().transact_write_items(
            TransactItems=[
                {
                    "Delete": {
                        "TableName": _table(),
                        "Key": {"pk": {"S": f"reservation#{token}"}},
                        "ConditionExpression": "attribute_exists(pk)",
                    }
                },
                {
                    "Update": {
                        "TableName": _table(),
                        "Key": {"pk": {"S": f"sku#{reservation['sku']}"}},
                        "UpdateExpression": "ADD stock :q",
                        "ExpressionAttributeValues": {":q": {"N": str(reservation["quantity"])}},
                    }
                },
            ]
        )
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code == "TransactionCanceledException":
            return {"released": True, **reservation}  # released by a concurrent copy of this compensation
        raise TransientError(f"DynamoDB: {code}", outcome_unknown=True) from exc
    return {"released": True, **reservation}


def stock(sku: str) -> int:
    """The stock of ``sku`` now (``INITIAL_STOCK`` when it was never reserved)."""
    found = dynamodb().get_item(TableName=_table(), Key={"pk": {"S": f"sku#{sku}"}}, ConsistentRead=True).get("Item")
    return _initial_stock() if found is None else int(found["stock"]["N"])


handler = app.handler
