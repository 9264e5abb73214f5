"""Batches of operator actions through the operators' routes (OpsFunction) and the batch runner (BatchFunction),
against moto and the sample services, each function under its own role (an AWS call its role does not allow fails
the test).
"""

from __future__ import annotations

import json
from typing import Any

import boto3

from devstack.iam.guard import clear_refusals
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")
OPERATOR_ARN = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


def held_at_payment(deployed: Deployed, n: int) -> list[str]:
    """``n`` trips under the hold policy whose payment is refused: HELD, the flight and the hotel done."""
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    ids = []
    for i in range(n):
        body = json.loads(json.dumps(TRIP))
        body["definition"]["on_failure"] = "hold"
        body["input"]["traveller"] = f"traveller {i}"
        status, started = deployed.api("POST", "/workflows", body)
        assert status == 201
        ids.append(str(started["workflow_id"]))
    deployed.pump()
    return ids


def run_batches(deployed: Deployed, rounds: int = 20) -> int:
    """Deliver the batch queue's messages to BatchFunction (delays ignored: the test's clock does not wait) until
    it is empty; return the runs."""
    driver = deployed.driver("BatchFunction")
    runs = 0
    for _ in range(rounds):
        sqs = boto3.client("sqs")
        url = deployed.queue_url("BatchQueue")
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=0).get("Messages", [])
        if not messages and deployed.depth("BatchQueue") == 0:
            return runs
        if not messages:  # a delayed message: make it visible now
            _release_delayed(url)
            continue
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"], VisibilityTimeout=0)
        assert driver.deliver() is not None
        runs += 1
    raise AssertionError("the batch queue did not drain")


def _release_delayed(url: str) -> None:
    from moto.backends import get_backend

    queue = next(q for q in get_backend("sqs")["123456789012"]["us-east-1"].queues.values() if q.url == url)
    for message in queue._messages:
        message.delayed_until = 0


def test_a_dry_run_counts_then_a_batch_retries_every_held_workflow_once_to_completion(deployed: Deployed) -> None:
    ids = held_at_payment(deployed, 5)
    where = {"status": "HELD", "definition": TRIP["definition"]["name"]}
    # The dry run counts what the batch would act on, and writes nothing
    status, seen = deployed.ops(
        "POST", "/ops/batches", {"action": "retry", "where": where, "reason": "payments are back", "dry_run": True}
    )
    assert status == 200
    assert (seen["matched"], seen["by_status"], sorted(seen["sample"]), seen["truncated"]) == (
        5,
        {"HELD": 5},
        sorted(ids),
        False,
    )
    assert deployed.depth("BatchQueue") == 0
    # When the operator starts it, once the service takes payments again
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    request = {"action": "retry", "where": where, "reason": "payments are back", "step": "charge_card"}
    status, batch = deployed.ops("POST", "/ops/batches", request, headers={"Idempotency-Key": "incident-7"})
    assert status == 202
    assert (batch["status"], batch["principal"], batch["counts"]["matched"]) == ("RUNNING", OPERATOR_ARN, 0)
    # The same request again (the CLI retrying) is the same batch
    status, again = deployed.ops("POST", "/ops/batches", request, headers={"Idempotency-Key": "incident-7"})
    assert (status, again["batch_id"]) == (200, batch["batch_id"])
    run_batches(deployed)
    deployed.pump()
    # Then every trip completed, each retried once by the batch, named in its history
    _, done = deployed.ops("GET", f"/ops/batches/{batch['batch_id']}")
    assert done["status"] == "COMPLETED"
    assert done["counts"] == {"matched": 5, "done": 5, "refused": 0, "failed": 0}
    for wid in ids:
        _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
        assert view["status"] == "COMPLETED"
        _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
        actions = [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]
        assert [(a["action"], a["batch"], a["replaced_attempt"]) for a in actions] == [("retry", batch["batch_id"], 1)]
    # and the batch lists what it touched, with what became of each
    _, touched = deployed.ops("GET", f"/ops/batches/{batch['batch_id']}/workflows")
    assert sorted(w["workflow_id"] for w in touched["workflows"]) == sorted(ids)
    assert {w["outcome"] for w in touched["workflows"]} == {"done"}
    _, listing = deployed.ops("GET", "/ops/batches")
    assert [b["batch_id"] for b in listing["batches"]] == [batch["batch_id"]]


def test_a_batch_is_cancelled_and_an_unknown_one_is_a_404(deployed: Deployed) -> None:
    held_at_payment(deployed, 2)
    request: dict[str, Any] = {"action": "compensate", "where": {"status": "HELD"}, "reason": "give up"}
    _, batch = deployed.ops("POST", "/ops/batches", request)
    status, stopped = deployed.ops("POST", f"/ops/batches/{batch['batch_id']}/cancel", {"reason": "wrong filter"})
    assert (status, stopped["status"], stopped["cancelled_by"]) == (200, "CANCELLED", OPERATOR_ARN)
    run_batches(deployed)
    _, after = deployed.ops("GET", f"/ops/batches/{batch['batch_id']}")
    assert (after["status"], after["counts"]["matched"]) == ("CANCELLED", 0)
    status, missing = deployed.ops("GET", "/ops/batches/b-00000000000000000000")
    assert (status, missing["error"]) == (404, "BATCH_NOT_FOUND")
    # A batch acts on workflows in flight or waiting: an ended status is refused, naming the field
    status, refused = deployed.ops("POST", "/ops/batches", {**request, "where": {"status": "COMPLETED"}})
    assert (status, refused["error"]) == (422, "VALIDATION_ERROR")
    assert [d["loc"] for d in refused["details"]] == [["body", "where", "status"]]
    assert clear_refusals() == []


def test_the_cli_acts_on_a_fleet_with_where_counts_first_and_lists_what_the_batch_touched(deployed: Deployed) -> None:
    from tests.integration.test_cli import cli

    ids = held_at_payment(deployed, 3)
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    where = ["--where", "status=held", "--where", f"definition={TRIP['definition']['name']}"]
    seen = cli(deployed, "retry", *where, "--reason", "payments are back", "--dry-run")
    assert (seen["matched"], seen["by_status"]) == (3, {"HELD": 3})
    assert deployed.depth("BatchQueue") == 0
    batch = cli(deployed, "retry", *where, "--step", "charge_card", "--reason", "payments are back", "--rate", "10")
    assert (batch["action"], batch["where"]["status"], batch["max_per_second"]) == ("retry", "HELD", 10)
    run_batches(deployed)
    deployed.pump()
    got = cli(deployed, "batches", "get", batch["batch_id"])
    assert (got["status"], got["counts"]["done"]) == ("COMPLETED", 3)
    touched = cli(deployed, "list", "--batch", batch["batch_id"])
    assert sorted((w["workflow_id"], w["outcome"]) for w in touched["workflows"]) == sorted((w, "done") for w in ids)
    assert [b["batch_id"] for b in cli(deployed, "batches", "list")["batches"]] == [batch["batch_id"]]
    # A finished batch cannot be cancelled: 409, named
    from typer.testing import CliRunner

    from sasflow_cli.app import app

    result = CliRunner().invoke(app, ["retry", "wf-1", *where, "--reason", "x"])
    assert result.exit_code != 0
    assert "give a workflow's ID or --where" in result.output
    result = CliRunner().invoke(app, ["retry", "--where", "definition=x", "--reason", "x"])
    assert "--where needs a status" in result.output
    result = CliRunner().invoke(app, ["cancel", "--where", "status=completed", "--reason", "x"])
    assert result.exit_code != 0 and "those workflows have ended, no action applies to them" in result.output


def test_a_skip_batch_gives_each_workflows_step_its_output_and_only_a_skip_takes_one(deployed: Deployed) -> None:
    from tests.integration.test_cli import cli

    # Given trips HELD at their payment, the step after which reads nothing of it, and one more whose ends differ
    ids = held_at_payment(deployed, 2)
    where = {"status": "HELD", "definition": TRIP["definition"]["name"]}
    # An output with another action than a skip is refused, naming the field; nothing starts
    request = {"action": "retry", "where": where, "reason": "paid by bank transfer", "output": {"paid": "transfer"}}
    status, refused = deployed.ops("POST", "/ops/batches", request)
    assert (status, refused["error"]) == (422, "VALIDATION_ERROR")
    assert "only a skip takes one" in json.dumps(refused["details"])
    assert deployed.ops("GET", "/ops/batches")[1]["batches"] == []
    # When the operator skips every payment with the output the bank transfer gave (the CLI: --output with --where)
    output = {"receipt": "transfer-7", "amount": 420}
    batch = cli(
        deployed,
        "skip",
        "--where",
        "status=HELD",
        "--where",
        f"definition={TRIP['definition']['name']}",
        "--step",
        "charge_card",
        "--output",
        json.dumps(output),
        "--reason",
        "paid by bank transfer",
    )
    assert (batch["action"], batch["gives_output"], batch["output"]) == ("skip", True, output)
    run_batches(deployed)
    deployed.pump()
    # Then each trip completed with that output as its charge's, and the skip in its history names the batch
    for wid in ids:
        _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
        assert view["status"] == "COMPLETED"
        assert [s["output"] for s in view["steps"] if s["name"] == "charge_card"] == [output]
        _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
        actions = [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]
        assert [(a["action"], a["batch"]) for a in actions] == [("skip", batch["batch_id"])]
    _, stored = deployed.ops("GET", f"/ops/batches/{batch['batch_id']}")
    assert (stored["counts"]["done"], stored["output"]) == (2, output)


def test_a_batch_filtered_by_its_failed_step_acts_on_that_step_and_finds_no_other(deployed: Deployed) -> None:
    ids = held_at_payment(deployed, 2)
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    # The dry run of another step finds none of them (their failed step is charge_card)
    other = {"action": "retry", "where": {"status": "HELD", "step": "book_hotel"}, "reason": "r", "dry_run": True}
    status, seen = deployed.ops("POST", "/ops/batches", other)
    assert (status, seen["matched"], seen["where"]) == (200, 0, {"status": "HELD", "step": "book_hotel"})
    # and a dry run of all HELD with another step says how many the action would refuse (a trial's wrong --step)
    wrong = {"action": "retry", "where": {"status": "HELD"}, "step": "reserve_flight", "reason": "r", "dry_run": True}
    status, seen = deployed.ops("POST", "/ops/batches", wrong)
    assert (status, seen["matched"], seen["step"], seen["step_not_failed"]) == (200, 2, "reserve_flight", 2)
    right = {**wrong, "step": "charge_card"}
    assert deployed.ops("POST", "/ops/batches", right)[1]["step_not_failed"] == 0
    # A retry filtered by the failed step, without a step of its own, retries that step
    request = {"action": "retry", "where": {"status": "HELD", "step": "charge_card"}, "reason": "payments are back"}
    status, batch = deployed.ops("POST", "/ops/batches", request)
    assert (status, batch["step"], batch["where"]) == (202, "charge_card", {"status": "HELD", "step": "charge_card"})
    run_batches(deployed)
    deployed.pump()
    for wid in ids:
        assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "COMPLETED"
    _, done = deployed.ops("GET", f"/ops/batches/{batch['batch_id']}")
    assert done["counts"] == {"matched": 2, "done": 2, "refused": 0, "failed": 0}
