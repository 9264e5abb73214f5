"""The operators' routes (OpsFunction) against moto and the sample services: find, read, act, redrive.

The scenarios of issue 11 that need no wall-clock time run here; those that wait for a circuit to close run on the
local stack (tests/system/test_local_stack_operations.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import quote

import boto3

from sasflow.messages import encode
from tests.integration.conftest import Deployed
from tests.support.fakes import stale_flight_request
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")
OPERATOR_ARN = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


def trip(**definition: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP))
    body["definition"].update(definition)
    return body


def held_at_payment(deployed: Deployed) -> str:
    """A trip under the hold policy whose payment is refused: HELD, the flight and the hotel done."""
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    status, started = deployed.api("POST", "/workflows", trip(on_failure="hold"))
    assert status == 201
    deployed.pump()
    return str(started["workflow_id"])


def test_a_held_workflow_is_found_read_and_retried_with_an_edited_input_to_completion(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    # It is listed among the HELD, from the attention index, with the counts
    status, page = deployed.ops("GET", "/ops/workflows", query="status=HELD")
    assert status == 200
    assert [(w["workflow_id"], w["status"], w["attention"]) for w in page["workflows"]] == [(wid, "HELD", "HELD")]
    assert page["source"] == "attention index"
    assert page["counts"]["HELD"] == 1
    # Its view shows the failed step with its error and times
    _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    charge = view["steps"][2]
    assert (charge["status"], charge["error"]["code"]) == ("FAILED", "CARD_DECLINED")
    assert charge["started_at"] <= charge["finished_at"]
    # When the operator retries the payment with an edited amount, once the service takes it again
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    status, after = deployed.ops(
        "POST",
        f"/ops/workflows/{wid}/retry",
        {"reason": "customer called, smaller amount", "step": "charge_card", "input": {"amount": 99}},
        headers={"Idempotency-Key": "retry-1"},
    )
    assert (status, after["status"]) == (200, "RUNNING")
    deployed.pump()
    # Then the trip completes, and its history holds the audited action
    _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert view["status"] == "COMPLETED"
    status, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
    assert status == 200
    [audit] = [e for e in history["events"] if e["kind"] == "operator_action"]
    assert audit["detail"] == {
        "action": "retry",
        "principal": OPERATOR_ARN,
        "reason": "customer called, smaller amount",
        "id": "retry-1",
        "step": "charge_card",
        "replaced_attempt": 1,
        "input_edited": True,
    }
    # The same request again (the CLI retrying) changes nothing
    status, again = deployed.ops(
        "POST",
        f"/ops/workflows/{wid}/retry",
        {"reason": "customer called, smaller amount", "step": "charge_card", "input": {"amount": 99}},
        headers={"Idempotency-Key": "retry-1"},
    )
    assert (status, again["status"], again["events"]) == (200, "COMPLETED", view["events"])


def test_an_action_that_does_not_apply_is_409_with_the_reason_and_an_unknown_one_422(deployed: Deployed) -> None:
    _, started = deployed.api("POST", "/workflows", TRIP)
    wid = started["workflow_id"]
    status, body = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "why not"})
    assert (status, body["error"]) == (409, "CONFLICT")
    assert body["message"] == "workflow is RUNNING: only a step of a HELD workflow can be retried or skipped"
    status, body = deployed.ops("POST", f"/ops/workflows/{wid}/reboot", {"reason": "x"})
    assert (status, body["error"]) == (422, "VALIDATION_ERROR")
    status, body = deployed.ops("POST", f"/ops/workflows/{wid}/pause", {})
    assert (status, body["details"][0]["loc"]) == (422, ["body", "reason"])


def test_a_skip_without_the_output_a_later_step_reads_is_422_naming_it_and_an_explicit_null_is_taken(
    deployed: Deployed,
) -> None:
    # Given a trip under the hold policy held at the flight, whose hotel reads the flight's confirmation
    deployed.remote["flights"].service.update_knobs({"rejection_rate": 1.0})
    status, started = deployed.api("POST", "/workflows", trip(on_failure="hold"))
    assert status == 201
    deployed.pump()
    wid = started["workflow_id"]
    _, before = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert before["status"] == "HELD"
    # When the operator skips the flight without an output
    status, body = deployed.ops("POST", f"/ops/workflows/{wid}/skip", {"reason": "booked by phone"})
    # Then it is 422 naming the reference that needs it, and nothing is written
    assert (status, body["error"]) == (422, "MISSING_REFERENCE")
    assert body["message"] == (
        "skipping step reserve_flight needs its output: steps[book_hotel].input.flight: "
        "'steps.reserve_flight.output.confirmation' reads it and has no default (give the output; an explicit null "
        "is allowed)"
    )
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1] == before
    # And an explicit null is an output given: the skip is taken (audited, with whether it is compensated)
    status, after = deployed.ops("POST", f"/ops/workflows/{wid}/skip", {"reason": "booked by phone", "output": None})
    assert status == 200
    assert {s["name"]: s["status"] for s in after["steps"]}["reserve_flight"] == "COMPLETED"
    _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
    [audit] = [e for e in history["events"] if e["kind"] == "operator_action"]
    assert (audit["detail"]["action"], audit["detail"]["compensated_on_unwind"]) == ("skip", True)


def test_the_client_reads_its_own_history_and_not_another_principals(deployed: Deployed) -> None:
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.pump()
    wid = started["workflow_id"]
    status, page = deployed.api("GET", f"/workflows/{wid}/history")
    assert status == 200
    kinds = [e["kind"] for e in page["events"]]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert kinds.count("dispatched") == kinds.count("reply_applied") == 3
    status, first = deployed.api("GET", f"/workflows/{wid}/history", query="limit=2")
    assert (len(first["events"]), first["next_cursor"]) == (2, "2")
    status, rest = deployed.api("GET", f"/workflows/{wid}/history", query="cursor=2")
    assert [e["seq"] for e in first["events"] + rest["events"]] == [e["seq"] for e in page["events"]]
    status, body = deployed.api("GET", f"/workflows/{wid}/history", caller="client-b")
    assert (status, body["error"]) == (404, "WORKFLOW_NOT_FOUND")
    status, body = deployed.api("GET", f"/workflows/{wid}/history", query="cursor=abc")
    assert (status, body["error"]) == (400, "INVALID_CURSOR")


def test_dead_letters_no_listing_can_read_are_listed_as_they_are_never_a_500(deployed: Deployed) -> None:
    """Found by a trial: one refused notification whose key was a number, or a body nested 3,000 levels deep, made
    the listing of their queue a 500 (and hid every message of it for the receive's 30 s)."""
    sqs = boto3.client("sqs")
    url = deployed.queue_url("TripUploadsTriggerDeadLetterQueue")

    def refused(key: object, reason: str) -> str:
        notification = {"Records": [{"s3": {"bucket": {"name": "b"}, "object": {"key": key}}}]}
        return json.dumps(
            {"refused": {"code": "MALFORMED_OCCURRENCE", "reason": reason}, "body": json.dumps(notification)}
        )

    deep = "[" * 3000 + "]" * 3000
    bodies = [
        refused(5, "not text"),
        refused("requests/%FF.json", "not UTF-8"),
        deep,
        json.dumps({"refused": {"code": "MALFORMED_OCCURRENCE", "reason": "too deep"}, "body": deep}),
    ]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    status, listing = deployed.ops("GET", "/ops/dead-letters", query="queue=TripUploadsTriggerDeadLetterQueue")
    assert status == 200, listing
    letters = listing["queues"][0]["messages"]
    assert sorted((letter["kind"], str(letter["reason"])) for letter in letters) == [
        ("trigger.refused", "MALFORMED_OCCURRENCE: too deep"),
        ("trigger.refused", "upload b/5: MALFORMED_OCCURRENCE: not text"),
        # as the notification has it, never U+FFFD
        ("trigger.refused", "upload b/requests/%FF.json: MALFORMED_OCCURRENCE: not UTF-8"),
        ("unreadable", "None"),
    ]


def test_a_stale_dead_letter_is_listed_and_redriven_and_changes_nothing(deployed: Deployed) -> None:
    # Given a completed trip, and a dead-lettered request of its first attempt of the flight
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.pump()
    wid = started["workflow_id"]
    _, done = deployed.ops("GET", f"/ops/workflows/{wid}")
    effects = dict(deployed.remote["flights"].service.effects())
    stale = stale_flight_request(wid, deployed.clock.now())
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=deployed.queue_url("FlightsDeadLetterQueue"), MessageBody=encode(stale))
    # When the operator lists the dead-letter queues, then that one
    status, listing = deployed.ops("GET", "/ops/dead-letters")
    assert status == 200
    depths = {q["queue"]: q["approximate_messages"] for q in listing["queues"]}
    assert depths["FlightsDeadLetterQueue"] == 1 and sum(depths.values()) == 1
    status, listing = deployed.ops("GET", "/ops/dead-letters", query="queue=FlightsDeadLetterQueue")
    [letter] = listing["queues"][0]["messages"]
    assert (letter["workflow_id"], letter["step"], letter["attempt"], letter["kind"]) == (
        wid,
        "reserve_flight",
        1,
        "step.request",
    )
    assert letter["age_seconds"] >= 0
    # and redrives it
    status, moved = deployed.ops(
        "POST", "/ops/dead-letters/redrive", {"queue": "FlightsDeadLetterQueue", "reason": "flights is back"}
    )
    assert (status, moved["queue"], moved["approximate_messages"]) == (202, "FlightsDeadLetterQueue", 1)
    assert deployed.depth("FlightsDeadLetterQueue") == 0
    assert deployed.depth("FlightsRequestQueue") == 1
    deployed.pump()
    # Then it was acknowledged: no remote call, the workflow unchanged
    assert dict(deployed.remote["flights"].service.effects()) == effects
    _, after = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert (after["status"], after["updated_at"], after["events"]) == ("COMPLETED", done["updated_at"], done["events"])
    assert deployed.depth("FlightsRequestQueue") == deployed.depth("ResponseQueue") == 0
    # An unknown queue is a 404
    status, body = deployed.ops("POST", "/ops/dead-letters/redrive", {"queue": "NoSuchQueue", "reason": "test"})
    assert (status, body["error"]) == (404, "QUEUE_NOT_FOUND")
    # And a redrive without a reason is refused before anything moves
    status, body = deployed.ops("POST", "/ops/dead-letters/redrive", {"queue": "FlightsDeadLetterQueue"})
    assert (status, body["error"]) == (422, "VALIDATION_ERROR")


def test_overdue_lists_what_the_supervisor_would_resend(deployed: Deployed) -> None:
    _, started = deployed.api("POST", "/workflows", TRIP)  # the flight request is never delivered
    status, body = deployed.ops("GET", "/ops/overdue")
    assert (status, body["overdue"]) == (200, [])
    deployed.clock.advance(30 + 31)  # past complete-by and the grace
    _, body = deployed.ops("GET", "/ops/overdue")
    assert [w["workflow_id"] for w in body["overdue"]] == [started["workflow_id"]]
    assert body["grace_seconds"] == 30


def _forged(state: dict[str, Any]) -> str:
    """A cursor in the finder's own format (base64url of its JSON) holding a key no listing produced."""
    return base64.urlsafe_b64encode(json.dumps(state).encode()).decode().rstrip("=")


def test_a_forged_listing_cursor_is_400_like_any_bad_cursor(deployed: Deployed) -> None:
    """Issue 19: valid base64 of a key the listing never produced reached DynamoDB as the ExclusiveStartKey, whose
    ValidationException answered 500. Each listing now checks the key's shape (its index's attributes and types, its
    own partition) before the query."""
    first, second = held_at_payment(deployed), held_at_payment(deployed)
    forged = {
        "status=HELD": {"k": {"pk": {"S": "WF#x"}}},  # attention index: the index's keys missing
        "status=RUNNING": {
            "s": 0,
            "k": {"pk": {"S": "WF#x"}, "sk": {"S": "#WF"}, "dl_shard": {"S": "01"}, "complete_by": {"N": "1"}},
        },  # another shard's key
        "status=COMPLETED": {"k": {"pk": {"N": "1"}, "sk": {"S": "#WF"}}},  # a key of the wrong type
        "status=PAUSED": {"k": "not a key"},
        "status=CANCELLING": {"s": "x", "k": None},
        # from an on-call trial: an empty state, or one of other names, paged from the start (200)
        "status=RUNNING&x=1": {},
        "status=HELD&y=1": {"a": 1},
        "status=COMPENSATION_FAILED": {"k": None},
        "status=COMPLETED&z=1": {"k": None, "s": 0, "extra": 1},
    }
    for query, state in forged.items():
        status, body = deployed.ops("GET", "/ops/workflows", query=f"{query}&cursor={_forged(state)}")
        assert (status, body["error"]) == (400, "INVALID_CURSOR"), (query, body)
    # and the cursors the API gives still page on, through each listing
    status, page = deployed.ops("GET", "/ops/workflows", query="status=HELD&limit=1")
    assert status == 200 and page["next_cursor"] is not None
    status, rest = deployed.ops("GET", "/ops/workflows", query=f"status=HELD&limit=1&cursor={page['next_cursor']}")
    assert status == 200
    assert sorted(w["workflow_id"] for w in page["workflows"] + rest["workflows"]) == sorted([first, second])


def test_overdue_is_sorted_oldest_first_across_shards_and_takes_older_than(deployed: Deployed) -> None:
    """Issue 19: the overdue listing came in shard order, so with a limit the oldest could be left off. It is
    sorted by complete-by across the deadline index's shards, and ``older_than`` keeps what is overdue by more."""
    ids = []
    for _ in range(8):  # their flight requests are never delivered; 10 s apart, so complete-by 10 s apart
        _, started = deployed.api("POST", "/workflows", TRIP)
        ids.append(started["workflow_id"])
        deployed.clock.advance(10)
    # the deadline index spreads them over more than one shard (else the order would prove nothing)
    items = {i["pk"]["S"][3:]: i for i in deployed.items() if i["sk"]["S"] == "#WF"}
    assert len({items[wid]["dl_shard"]["S"] for wid in ids}) > 1
    deployed.clock.advance(30 + 31)  # the last one is past its complete-by and the grace
    now = int(deployed.clock.now())
    _, body = deployed.ops("GET", "/ops/overdue")
    assert [w["workflow_id"] for w in body["overdue"]] == ids
    assert [w["complete_by"] for w in body["overdue"]] == sorted(w["complete_by"] for w in body["overdue"])
    _, body = deployed.ops("GET", "/ops/overdue", query="limit=3")
    assert [w["workflow_id"] for w in body["overdue"]] == ids[:3]
    # overdue by more than 100 s: complete-by before now - 100
    _, body = deployed.ops("GET", "/ops/overdue", query="older_than=100")
    expected = [w for w in ids if int(items[w]["complete_by"]["N"]) < now - 100]
    assert [w["workflow_id"] for w in body["overdue"]] == expected and 0 < len(expected) < len(ids)
    assert body["older_than_seconds"] == 100


def test_an_action_naming_a_step_the_workflow_does_not_have_is_422_no_such_step(deployed: Deployed) -> None:
    # From an on-call trial: `retry ID --step nosuch` answered INVALID_DEFINITION, which reads as a broken definition
    wid = held_at_payment(deployed)
    status, body = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "typo", "step": "nosuch"})
    assert (status, body["error"]) == (422, "NO_SUCH_STEP")
    assert body["message"] == "the workflow has no step 'nosuch'; its steps: reserve_flight, book_hotel, charge_card"
    status, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert (status, view["status"]) == (200, "HELD")  # nothing changed


def test_started_after_and_before_bound_the_listing_and_each_step_names_what_it_waits_for(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    status, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert status == 200
    created = view["created_at"]
    # Each step names the steps it waits for: a plain list is a chain
    assert [(s["name"], s["depends_on"]) for s in view["steps"]] == [
        ("reserve_flight", []),
        ("book_hotel", ["reserve_flight"]),
        ("charge_card", ["book_hotel"]),
    ]

    def listed(query: str) -> list[str]:
        status, page = deployed.ops("GET", "/ops/workflows", query=f"status=HELD&{query}")
        assert status == 200, page
        return [w["workflow_id"] for w in page["workflows"]]

    # Both bounds are strict: started after created - 1 and before created + 1 is this one; at created, neither
    assert listed(f"started_after={created - 1}") == [wid]
    assert listed(f"started_after={created}") == []
    assert listed(f"started_before={created + 1}") == [wid]
    assert listed(f"started_before={created}") == []
    assert listed(f"started_after={created - 1}&started_before={created + 1}") == [wid]


def test_the_listing_finds_by_version_owner_error_code_and_step_read_from_the_items(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    client_a = "arn:aws:iam::123456789012:user/client-a"

    def listed(query: str) -> tuple[list[str], list[str]]:
        status, page = deployed.ops("GET", "/ops/workflows", query=query)
        assert status == 200, page
        return [w["workflow_id"] for w in page["workflows"]], page["notes"]

    # The summary carries what only the item holds
    status, page = deployed.ops("GET", "/ops/workflows", query="status=HELD")
    [summary] = page["workflows"]
    assert page["counts"]["HELD"] == 1
    status, uncounted = deployed.ops("GET", "/ops/workflows", query="status=HELD&counts=false")
    assert uncounted["counts"] is None and uncounted["workflows"] == page["workflows"]  # a caller that has them
    assert (summary["owner"], summary["definition_version"], summary["error_codes"]) == (client_a, 1, ["CARD_DECLINED"])
    assert summary["error_steps"] == ["charge_card"]
    # Each filter keeps it when it matches and leaves it out, with a note, when it does not
    assert listed("status=HELD&error_code=CARD_DECLINED") == ([wid], [])
    assert listed("status=HELD&error_code=TIMEOUT") == (
        [],
        ["1 of this page's workflows do not match the filter: left out"],
    )
    assert listed("status=HELD&version=1&definition=trip-booking")[0] == [wid]
    assert listed("status=HELD&step=charge_card") == ([wid], [])
    assert listed("status=HELD&step=book_hotel") == (
        [],
        ["1 of this page's workflows do not match the filter: left out"],
    )
    # a filter the index answers leaves it out as a filter, never as the index's lag (found by a trial)
    assert listed("status=HELD&definition=another") == (
        [],
        ["1 of this page's workflows do not match the filter: left out"],
    )
    assert listed("status=HELD&version=2")[0] == []
    assert listed(f"status=HELD&owner={client_a}")[0] == [wid]
    assert listed("status=HELD&owner=arn:aws:iam::123456789012:user/client-b")[0] == []
    # A finished workflow is found by the same filters (the scan reads them from the item)
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    status, _ = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "card fixed", "step": "charge_card"})
    assert status == 200
    deployed.pump()
    assert listed("status=COMPLETED&error_code=CARD_DECLINED")[0] == []  # retried: its last error is gone
    assert listed("status=COMPLETED&step=charge_card")[0] == []
    assert listed("status=COMPLETED&version=1")[0] == [wid]
    status, bad = deployed.ops("GET", "/ops/workflows", query="version=0")
    assert status == 422 and bad["details"][0]["loc"] == ["query", "version"]


def test_finished_workflows_are_listed_limit_at_a_time_and_the_cursor_goes_through_every_one_once(
    deployed: Deployed,
) -> None:
    # Given seven completed workflows (found by a trial: `sasflow list --status COMPLETED --limit 5` answered all)
    started = {deployed.api("POST", "/workflows", TRIP)[1]["workflow_id"] for _ in range(7)}
    deployed.pump()
    # When they are listed three at a time
    pages: list[list[str]] = []
    cursor = ""
    while True:
        query = "status=COMPLETED&limit=3&counts=false" + (f"&cursor={quote(cursor)}" if cursor else "")
        status, page = deployed.ops("GET", "/ops/workflows", query=query)
        assert status == 200, page
        pages.append([w["workflow_id"] for w in page["workflows"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    # Then each page holds at most three, and the pages hold each of the seven once
    assert [len(p) for p in pages] == [3, 3, 1]
    listed = [wid for p in pages for wid in p]
    assert sorted(listed) == sorted(started)
