"""Callback steps through the real API handler and the CLI on moto: the token works once, for its owner only."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.conftest import Deployed
from tests.integration.test_cli import cli
from tests.support.lambdas import ROOT

TRIP = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())


def trip_with_approval() -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP))
    body["definition"]["steps"].insert(1, {"name": "approval", "type": "callback", "timeout_seconds": 600})
    return body


def waiting_token(deployed: Deployed) -> tuple[str, str]:
    status, view = deployed.api("POST", "/workflows", trip_with_approval())
    assert status == 201
    deployed.pump()
    status, view = deployed.api("GET", f"/workflows/{view['workflow_id']}")
    [approval] = [s for s in view["steps"] if s["name"] == "approval"]
    assert (approval["type"], approval["status"]) == ("callback", "PROCESSING")
    return view["workflow_id"], approval["task_token"]


def test_an_answer_applies_once_the_same_answer_again_is_200_with_the_first_result_and_another_is_409(
    deployed: Deployed,
) -> None:
    # Given a trip waiting for its approval, answered once, that then completed
    wid, token = waiting_token(deployed)
    answer = {"status": "succeeded", "output": {"ok": True, "by": "ada"}}
    status, result = deployed.api("POST", f"/callbacks/{token}", answer)
    assert (status, result["step_status"], result["workflow_status"]) == (200, "COMPLETED", "RUNNING")
    deployed.pump()
    before = deployed.api("GET", f"/workflows/{wid}")[1]
    assert before["status"] == "COMPLETED"
    # When its caller, whose response was lost, sends the same answer again (keys in another order)
    reordered = {"output": {"by": "ada", "ok": True}, "status": "succeeded"}
    status, again = deployed.api("POST", f"/callbacks/{token}", reordered)
    # Then it is 200 with the first result, and nothing is written
    assert (status, again) == (200, result)
    assert deployed.api("GET", f"/workflows/{wid}")[1] == before
    # and a different answer for the same token is still 409
    for other in ({"status": "succeeded", "output": {"ok": False}}, {"status": "succeeded"}, {"status": "heartbeat"}):
        status, refused = deployed.api("POST", f"/callbacks/{token}", other)
        assert (status, refused["error"]) == (409, "CALLBACK_ALREADY_USED")


def test_another_owner_and_a_forged_token_get_404_and_change_nothing(deployed: Deployed) -> None:
    wid, token = waiting_token(deployed)
    status, body = deployed.api("POST", f"/callbacks/{token}", {"status": "succeeded"}, caller="client-b")
    assert (status, body["error"]) == (404, "CALLBACK_NOT_FOUND")
    # the refusal says how to answer (as the workflow's owner), in the same words for a forged token: no oracle
    assert body["message"] == (
        "no such task token for this caller: a task token is answered as the principal that started its workflow "
        "(its owner), with the token exactly as the callback step received it"
    )
    forged = token.rsplit("~", 1)[0] + "~" + "x" * 32
    assert deployed.api("POST", f"/callbacks/{forged}", {"status": "succeeded"}) == (404, body)
    assert deployed.api("POST", "/callbacks/nonsense", {"status": "succeeded"})[0] == 404
    status, body = deployed.api("POST", f"/callbacks/{token}", {"status": "maybe"})
    assert (status, body["error"]) == (422, "VALIDATION_ERROR")
    [approval] = [s for s in deployed.api("GET", f"/workflows/{wid}")[1]["steps"] if s["name"] == "approval"]
    assert approval["status"] == "PROCESSING"


def test_a_token_of_a_workflow_that_no_longer_waits_is_410(deployed: Deployed) -> None:
    wid, token = waiting_token(deployed)
    assert deployed.api("POST", f"/workflows/{wid}/cancel")[0] == 202
    status, body = deployed.api("POST", f"/callbacks/{token}", {"status": "succeeded"})
    assert (status, body["error"]) == (410, "CALLBACK_EXPIRED")


def test_approve_and_reject_through_the_cli(deployed: Deployed) -> None:
    wid, token = waiting_token(deployed)
    answered = cli(deployed, "approve", token, "--output", '{"approved_by": "ada"}', caller="client-a")
    assert (answered["step"], answered["step_status"]) == ("approval", "COMPLETED")
    deployed.pump()
    assert deployed.api("GET", f"/workflows/{wid}")[1]["status"] == "COMPLETED"
    wid, token = waiting_token(deployed)
    rejected = cli(deployed, "reject", token, "--reason", "over budget", caller="client-a")
    assert rejected["step_status"] == "FAILED"
    deployed.pump()
    view = deployed.api("GET", f"/workflows/{wid}")[1]
    assert (view["status"], view["reason"]) == ("COMPENSATED", "step approval failed: CALLBACK_FAILED")


def test_an_operator_approves_or_rejects_any_workflows_callback_audited_with_its_principal(deployed: Deployed) -> None:
    from tests.integration.test_ops_api import OPERATOR_ARN

    # Given two trips of client-a waiting for their approval
    wid, token = waiting_token(deployed)
    rejected_wid, rejected_token = waiting_token(deployed)
    # When the operator (not their owner) approves one, with an output
    approve = {"answer": "approve", "reason": "checked with the customer", "output": {"approved_by": "ada"}}
    status, result = deployed.ops("POST", f"/ops/callbacks/{token}", approve, headers={"Idempotency-Key": "ok-1"})
    assert (status, result["step"], result["step_status"]) == (200, "approval", "COMPLETED")
    # Then the answer and who gave it, with why, are in the history, written by the same write
    _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
    audits = [e for e in history["events"] if e["kind"] in ("operator_action", "callback_applied")]
    assert [(e["kind"], e.get("detail")) for e in audits] == [
        (
            "operator_action",
            {
                "action": "approve",
                "principal": OPERATOR_ARN,
                "reason": "checked with the customer",
                "id": "ok-1",
                "step": "approval",
            },
        ),
        ("callback_applied", None),
    ]
    # The same answer again (a double submit) is the first result and writes nothing; another is 409
    before = deployed.ops("GET", f"/ops/workflows/{wid}")[1]
    assert deployed.ops("POST", f"/ops/callbacks/{token}", approve, headers={"Idempotency-Key": "ok-2"}) == (
        200,
        result,
    )
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1] == before
    status, refused = deployed.ops("POST", f"/ops/callbacks/{token}", {**approve, "output": {"other": 1}})
    assert (status, refused["error"]) == (409, "CALLBACK_ALREADY_USED")
    deployed.pump()
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "COMPLETED"
    # A rejection fails the attempt with the code given and the reason as its message
    reject = {"answer": "reject", "reason": "fraud suspected", "code": "NOT_APPROVED"}
    status, result = deployed.ops("POST", f"/ops/callbacks/{rejected_token}", reject)
    assert (status, result["step_status"]) == (200, "FAILED")
    _, view = deployed.ops("GET", f"/ops/workflows/{rejected_wid}")
    [approval] = [s for s in view["steps"] if s["name"] == "approval"]
    assert approval["error"] == {"code": "CALLBACK_FAILED", "message": "fraud suspected", "cause": "NOT_APPROVED"}
    # Without a reason, or with a field of another answer: 422, nothing written
    for body in ({"answer": "approve"}, {"answer": "reject", "reason": "x", "code": "lower case"}):
        status, refused = deployed.ops("POST", f"/ops/callbacks/{rejected_token}", body)
        assert (status, refused["error"]) == (422, "VALIDATION_ERROR")


def test_the_cli_answers_as_an_operator_through_the_operators_route_with_a_reason(deployed: Deployed) -> None:
    wid, token = waiting_token(deployed)  # client-a's
    answered = cli(deployed, "approve", token, "--output", '{"ok": true}', "--reason", "approved on the phone")
    assert (answered["step"], answered["step_status"]) == ("approval", "COMPLETED")
    _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
    [audit] = [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]
    assert (audit["action"], audit["reason"], audit["step"]) == ("approve", "approved on the phone", "approval")
    wid, token = waiting_token(deployed)
    rejected = cli(deployed, "reject", token, "--reason", "over budget", "--code", "OVER_BUDGET")
    assert rejected["step_status"] == "FAILED"
    [approval] = [s for s in deployed.ops("GET", f"/ops/workflows/{wid}")[1]["steps"] if s["name"] == "approval"]
    assert approval["error"]["cause"] == "OVER_BUDGET"
