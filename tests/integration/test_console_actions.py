"""The console's operator actions (issue 36) against the real API handlers on moto: the form, its preview, the
action sent once per Idempotency-Key, the API's refusals shown as they are, and forms not sent by the console's own
page refused. The same drill in chromium is tests/browser/test_console_chromium.py."""

from __future__ import annotations

import re
import threading
from html import unescape
from typing import Any
from urllib.parse import quote

import boto3
from werkzeug.test import Client, TestResponse

from sasflow.messages import encode
from sasflow_cli.console import Console
from tests.integration.conftest import Deployed
from tests.integration.test_callbacks_api import waiting_token
from tests.integration.test_console import HOST, PORT, console_of, page, signed_in, text_of
from tests.integration.test_ops_api import OPERATOR_ARN, held_at_payment, trip
from tests.support.fakes import stale_flight_request


def form_of(html: str) -> dict[str, str]:
    """The hidden fields and the text areas of a page's form, as a browser would send them."""
    fields = dict(re.findall(r'<input type="hidden" name="([a-z]+)" value="([^"]*)"', html))
    for name, text in re.findall(r'<textarea id="[a-z]+" name="([a-z]+)"[^>]*>(.*?)</textarea>', html, re.S):
        fields[name] = text
    return {name: unescape(value) for name, value in fields.items()}


def send(browser: Client, path: str, fields: dict[str, str], **headers: str) -> TestResponse:
    return browser.post(path, data=fields, headers={"Host": HOST, "Origin": f"http://{HOST}", **headers})


def previewed(browser: Client, path: str, fields: dict[str, str]) -> dict[str, str]:
    """The confirmation a person sends: the form previewed, then its preview's form (its fingerprint included)."""
    preview = send(browser, path, {**fields, "intent": "preview"})
    assert preview.status_code == 200, text_of(preview.get_data(as_text=True))
    return {**form_of(preview.get_data(as_text=True)), "intent": "confirm"}


def act_path(wid: str, action: str) -> str:
    return f"/workflows/{quote(wid, safe='')}/act/{action}"


def operator_actions(deployed: Deployed, wid: str) -> list[dict[str, Any]]:
    _, history = deployed.ops("GET", f"/ops/workflows/{wid}/history")
    return [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]


def test_a_held_workflow_is_retried_from_the_page_with_an_edited_input_after_a_preview(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    console = console_of(deployed)
    browser = signed_in(console)
    # The workflow's page offers what applies to a HELD workflow, and nothing else
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    offers = re.findall(r'<a class="button act-([a-z-]+)" href="([^"]+)">([^<]+)</a>', html)
    assert [(action, label) for action, _, label in offers] == [
        ("retry", "Retry charge_card"),
        ("skip", "Skip charge_card"),
        ("compensate", "Compensate now"),
        ("cancel", "Cancel"),
        ("pause", "Pause"),
    ]
    # The retry's form starts from the step's input as its attempts got it
    form = page(browser, offers[0][1].replace("&amp;", "&"))
    fields = form_of(form)
    assert fields["value"].replace(" ", "").replace("\n", "") == '{"amount":420,"currency":"EUR"}'
    assert fields["step"] == "charge_card" and fields["csrf"] == console.csrf
    assert re.fullmatch(r"console-[0-9a-f]{32}", fields["key"])
    # The preview says what it will do, with the edited input, and sends nothing
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    edited = {**fields, "value": '{"amount": 99, "currency": "EUR"}', "reason": "customer called", "intent": "preview"}
    preview = send(browser, act_path(wid, "retry"), edited)
    words = text_of(preview.get_data(as_text=True))
    assert preview.status_code == 200
    assert "Step charge_card runs again with a new budget of attempts, with the edited input below." in words
    assert "Input (edited)" in words and '"amount": 99' in words and "customer called" in words
    assert operator_actions(deployed, wid) == []
    # Confirmed: one action, then the workflow's page with what was done
    confirm = {**form_of(preview.get_data(as_text=True)), "intent": "confirm"}
    done = send(browser, act_path(wid, "retry"), confirm)
    assert done.status_code == 303
    assert done.headers["Location"] == f"/workflows/{quote(wid, safe='')}?done={fields['key']}"
    deployed.pump()
    after = text_of(page(browser, done.headers["Location"]))
    assert "Retry a failed step: charge_card: done at" in after and "the workflow was then RUNNING" in after
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "COMPLETED"
    assert operator_actions(deployed, wid) == [
        {
            "action": "retry",
            "principal": OPERATOR_ARN,
            "reason": "customer called",
            "id": fields["key"],
            "step": "charge_card",
            "replaced_attempt": 1,
            "input_edited": True,
        }
    ]
    _, charged = deployed.ops("GET", f"/ops/workflows/{wid}/steps/charge_card/input")
    assert (charged["input"], charged["edited"]) == ({"amount": 99, "currency": "EUR"}, True)


def test_a_form_sent_twice_or_at_once_from_two_clicks_acts_once(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    fields = form_of(page(browser, act_path(wid, "pause")))
    confirm = previewed(browser, act_path(wid, "pause"), {**fields, "reason": "partner outage"})
    # Two clicks at once (two requests in flight), then the browser's back and send again
    answers: list[TestResponse] = []
    threads = [
        threading.Thread(
            target=lambda: answers.append(send(signed_in(browser.application), act_path(wid, "pause"), confirm))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answers.append(send(browser, act_path(wid, "pause"), confirm))
    assert [a.status_code for a in answers] == [303, 303, 303]
    assert len({a.headers["Location"] for a in answers}) == 1
    assert [d["action"] for d in operator_actions(deployed, wid)] == ["pause"]
    # A new form (a new key) for the same action is the API's refusal, shown as it is, the form kept
    again = {**form_of(page(browser, act_path(wid, "pause"))), "reason": "twice on purpose", "intent": "confirm"}
    again["seen"] = confirm["seen"].replace("False", "True")  # previewed paused: the API is asked, and refuses
    refused = send(browser, act_path(wid, "pause"), again)
    words = text_of(refused.get_data(as_text=True))
    assert refused.status_code == 409
    assert "The API refused it (409) CONFLICT workflow is paused already" in words
    assert "twice on purpose" in words and "Nothing was changed by this refusal." in words
    assert [d["action"] for d in operator_actions(deployed, wid)] == ["pause"]


def test_a_form_not_sent_from_the_consoles_own_page_is_refused_and_changes_nothing(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    console = console_of(deployed)
    browser = signed_in(console)
    fields = {**form_of(page(browser, act_path(wid, "cancel"))), "reason": "forged", "intent": "confirm"}
    path = act_path(wid, "cancel")
    # Another origin (a page of another port of this machine is the same site: the browser sends the cookie)
    for origin in ("http://127.0.0.1:9999", "http://evil.example", "null"):
        refused = send(browser, path, fields, Origin=origin)
        assert refused.status_code == 403, origin
        assert "another origin" in text_of(refused.get_data(as_text=True))
    # The browser says another site sent it
    assert send(browser, path, fields, **{"Sec-Fetch-Site": "cross-site"}).status_code == 403
    # No CSRF token, or another session's
    for token in ("", "0" * 64, Console(console.client, "operator", PORT, session="another").csrf):
        refused = send(browser, path, {**fields, "csrf": token})
        assert refused.status_code == 403
        assert "no valid CSRF token of this session" in text_of(refused.get_data(as_text=True))
    # Without the session cookie at all
    assert Client(console).post(path, data=fields, headers={"Host": HOST}).status_code == 403
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "HELD"
    assert operator_actions(deployed, wid) == []
    # Only an action's address takes a form
    assert send(browser, "/dead-letters", fields).status_code == 405


def test_a_form_that_cannot_be_sent_comes_back_as_filled_in_with_why(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    fields = form_of(page(browser, act_path(wid, "retry") + "?step=charge_card"))
    # Not JSON: where and why, the text kept
    bad = send(
        browser, act_path(wid, "retry"), {**fields, "value": '{"amount": 99,}', "reason": "r", "intent": "preview"}
    )
    assert bad.status_code == 400
    words = text_of(bad.get_data(as_text=True))
    assert "the input is not JSON: Expecting property name enclosed in double quotes at line 1, column 15" in words
    assert form_of(bad.get_data(as_text=True))["value"] == '{"amount": 99,}'
    # Not an object, for an input
    array = send(browser, act_path(wid, "retry"), {**fields, "value": "[1]", "reason": "r", "intent": "preview"})
    assert "the input must be a JSON object ({...}), not list" in text_of(array.get_data(as_text=True))
    # No reason
    blank = send(browser, act_path(wid, "retry"), {**fields, "reason": "  ", "intent": "preview"})
    assert blank.status_code == 400 and "a reason is needed" in text_of(blank.get_data(as_text=True))
    # A skip without the output a later step reads: the API's 422 as it is (here charge_card is the last step, so a
    # skip of the flight of another trip shows it)
    deployed.remote["flights"].service.update_knobs({"rejection_rate": 1.0})
    _, started = deployed.api("POST", "/workflows", trip(on_failure="hold"))
    deployed.pump()
    flight = started["workflow_id"]
    skip = {**form_of(page(browser, act_path(flight, "skip") + "?step=reserve_flight")), "value": "", "reason": "phone"}
    preview = send(browser, act_path(flight, "skip"), {**skip, "intent": "preview"})
    assert "marked COMPLETED with no output (refused if a later step reads it)" in text_of(
        preview.get_data(as_text=True)
    )
    assert "The steps that wait for it run next: book_hotel." in text_of(preview.get_data(as_text=True))
    refused = send(browser, act_path(flight, "skip"), previewed(browser, act_path(flight, "skip"), skip))
    assert refused.status_code == 422
    assert "MISSING_REFERENCE skipping step reserve_flight needs its output" in text_of(refused.get_data(as_text=True))
    assert operator_actions(deployed, flight) == []
    # JSON null is an output given (the API takes it), not an empty field
    null = {**skip, "value": "null", "key": "console-null-output"}
    preview = send(browser, act_path(flight, "skip"), {**null, "intent": "preview"})
    assert "marked COMPLETED with the output below" in text_of(preview.get_data(as_text=True))
    assert (
        send(browser, act_path(flight, "skip"), previewed(browser, act_path(flight, "skip"), null)).status_code == 303
    )
    [audit] = operator_actions(deployed, flight)
    assert (audit["action"], audit["step"]) == ("skip", "reserve_flight")
    skipped = page(browser, f"/workflows/{quote(flight, safe='')}").split('id="step-reserve_flight"', 1)[1]
    assert "Output null" in text_of(skipped.split("</section>", 1)[0])  # the null it was given, shown


def test_compensate_and_cancel_say_what_they_undo_and_a_client_is_offered_no_operator_action(
    deployed: Deployed,
) -> None:
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    for action, first in (
        ("compensate", "The workflow unwinds now (HELD → COMPENSATING)"),
        ("cancel", "(HELD → CANCELLING)"),
    ):
        fields = {**form_of(page(browser, act_path(wid, action))), "reason": "r", "intent": "preview"}
        words = text_of(send(browser, act_path(wid, action), fields).get_data(as_text=True))
        assert first in words
        assert "the last started first and independent steps at once; now that is book_hotel, reserve_flight" in words
    # A client: the page offers no operator action, and an action's address says why
    status, started = deployed.api("POST", "/workflows", trip(on_failure="hold"), caller="client-a")
    assert status == 201
    deployed.pump()
    mine = signed_in(console_of(deployed, "client-a"))
    html = page(mine, f"/workflows/{quote(started['workflow_id'], safe='')}")
    assert 'class="button act-' not in html
    assert "Operator actions (retry, skip, compensate, pause, cancel...) are the operators'" in text_of(html)
    refused = text_of(page(mine, act_path(started["workflow_id"], "retry") + "?step=charge_card", 403))
    assert "Operators only" in refused and "client-a" in refused
    assert page(browser, act_path(wid, "reboot"), 404)


def test_a_callback_step_is_approved_or_rejected_from_the_page_audited_with_the_operator(deployed: Deployed) -> None:
    wid, _ = waiting_token(deployed)  # client-a's trip, waiting for its approval
    browser = signed_in(console_of(deployed))
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    labels = re.findall(r'<a class="button act-[a-z-]+" href="[^"]+">([^<]+)</a>', html)
    assert labels[:2] == ["Approve approval", "Reject approval"]
    fields = form_of(page(browser, act_path(wid, "approve") + "?step=approval"))
    assert fields["value"].replace(" ", "").replace("\n", "") == '{"approved":true}'
    fields = {**fields, "value": '{"approved_by": "ada"}', "reason": "budget confirmed"}
    preview = text_of(send(browser, act_path(wid, "approve"), {**fields, "intent": "preview"}).get_data(as_text=True))
    assert "The callback step approval is answered as approved: it completes with the output below." in preview
    assert "The steps that wait for it run next: book_hotel." in preview
    confirm = previewed(browser, act_path(wid, "approve"), fields)
    done = send(browser, act_path(wid, "approve"), confirm)
    assert done.status_code == 303
    again = send(browser, act_path(wid, "approve"), confirm)  # sent twice: acts once
    assert again.headers["Location"] == done.headers["Location"]
    [audit] = operator_actions(deployed, wid)
    assert (audit["action"], audit["principal"], audit["step"]) == ("approve", OPERATOR_ARN, "approval")
    deployed.pump()
    view = deployed.ops("GET", f"/ops/workflows/{wid}")[1]
    assert view["status"] == "COMPLETED"
    assert [s["output"] for s in view["steps"] if s["name"] == "approval"] == [{"approved_by": "ada"}]
    # Once answered, the page offers it no more, and a stale form says the step waits for no answer
    assert "Approve approval" not in page(browser, f"/workflows/{quote(wid, safe='')}")
    stale = {**form_of(page(browser, act_path(wid, "reject") + "?step=approval")), "reason": "late"}
    refused = send(browser, act_path(wid, "reject"), previewed(browser, act_path(wid, "reject"), stale))
    assert refused.status_code == 409
    words = text_of(refused.get_data(as_text=True))
    assert "Refused (409) NOT_WAITING step approval waits for no answer now (COMPLETED): nothing was sent" in words
    # A rejection with its code; a code that is not one comes back with why
    rejected_wid, _ = waiting_token(deployed)
    reject = {**form_of(page(browser, act_path(rejected_wid, "reject") + "?step=approval")), "reason": "fraud"}
    bad = send(browser, act_path(rejected_wid, "reject"), {**reject, "code": "not a code", "intent": "preview"})
    assert bad.status_code == 400 and "code 'not a code': capitals" in text_of(bad.get_data(as_text=True))
    reject["code"] = "FRAUD"
    preview = text_of(
        send(browser, act_path(rejected_wid, "reject"), {**reject, "intent": "preview"}).get_data(as_text=True)
    )
    assert "it fails at once with CALLBACK_FAILED (cause FRAUD, your reason as its message)" in preview
    assert "A rejection is final" in preview
    confirm = previewed(browser, act_path(rejected_wid, "reject"), reject)
    assert send(browser, act_path(rejected_wid, "reject"), confirm).status_code == 303
    [approval] = [
        s for s in deployed.ops("GET", f"/ops/workflows/{rejected_wid}")[1]["steps"] if s["name"] == "approval"
    ]
    assert approval["error"] == {"code": "CALLBACK_FAILED", "message": "fraud", "cause": "FRAUD"}


def test_a_dead_letter_queue_is_redriven_once_from_its_page_and_its_move_followed(deployed: Deployed) -> None:

    # Given a stale request of a completed trip in the flights' dead-letter queue
    _, started = deployed.api("POST", "/workflows", trip())
    deployed.pump()
    wid = started["workflow_id"]
    stale = stale_flight_request(wid, deployed.clock.now())
    boto3.client("sqs").send_message(QueueUrl=deployed.queue_url("FlightsDeadLetterQueue"), MessageBody=encode(stale))
    browser = signed_in(console_of(deployed))
    queue = page(browser, "/dead-letters/FlightsDeadLetterQueue")
    assert 'href="/dead-letters/FlightsDeadLetterQueue/redrive">Redrive FlightsDeadLetterQueue</a>' in queue
    path = "/dead-letters/FlightsDeadLetterQueue/redrive"
    fields = {**form_of(page(browser, path)), "reason": "flights is back"}
    # The preview says what will happen and moves nothing
    preview = text_of(send(browser, path, {**fields, "intent": "preview"}).get_data(as_text=True))
    assert (
        "SQS moves every message of FlightsDeadLetterQueue (1, approximately) back to the queue it came from" in preview
    )
    assert deployed.depth("FlightsDeadLetterQueue") == 1
    # Confirmed twice (a double click that got through): one move, then its progress
    first = send(browser, path, {**fields, "intent": "confirm"})
    second = send(browser, path, {**fields, "intent": "confirm"})
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    assert first.headers["Location"].startswith("/dead-letters/FlightsDeadLetterQueue/moves?done=console-")
    moves = text_of(page(browser, first.headers["Location"]))
    assert "Redrive of FlightsDeadLetterQueue: started at" in moves and "1 message(s) to move" in moves
    assert "COMPLETED 1" in moves  # the local move finishes within its call (devstack/moto_sqs.py)
    _, listing = deployed.ops("GET", "/ops/dead-letters", query="queue=FlightsDeadLetterQueue&limit=0")
    assert len(listing["queues"][0]["move_tasks"]) == 1  # one move task: the second send started none
    assert deployed.depth("FlightsDeadLetterQueue") == 0 and deployed.depth("FlightsRequestQueue") == 1
    # A redrive without a reason comes back with why; a forged one is refused
    blank = send(browser, path, {**fields, "reason": " ", "intent": "confirm"})
    assert blank.status_code == 400 and "a reason is needed" in text_of(blank.get_data(as_text=True))
    assert send(browser, path, {**fields, "csrf": "", "intent": "confirm"}).status_code == 403


def test_a_confirmation_of_a_preview_the_workflow_moved_on_from_is_not_sent_but_previewed_again(
    deployed: Deployed,
) -> None:
    # Given a HELD trip whose skip an operator previewed in one tab
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    fields = {**form_of(page(browser, act_path(wid, "skip") + "?step=charge_card")), "reason": "paid by phone"}
    confirm = previewed(browser, act_path(wid, "skip"), fields)
    # When another person retries the payment meanwhile (it fails again: HELD, on its second attempt)
    status, _ = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "other tab", "step": "charge_card"})
    assert status == 200
    deployed.pump()
    assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "HELD"
    # Then the first tab's confirmation is not sent: 409, and what the skip would do now is previewed again
    stale = send(browser, act_path(wid, "skip"), confirm)
    assert stale.status_code == 409
    words = text_of(stale.get_data(as_text=True))
    assert "Not sent: the workflow changed since your preview" in words
    assert [d["action"] for d in operator_actions(deployed, wid)] == ["retry"]
    # and confirmed again from the new preview, it is sent
    again = {**form_of(stale.get_data(as_text=True)), "intent": "confirm"}
    assert send(browser, act_path(wid, "skip"), again).status_code == 303
    assert [d["action"] for d in operator_actions(deployed, wid)] == ["retry", "skip"]
    # An action not offered for the workflow as it is says so on its form
    form = text_of(page(browser, act_path(wid, "retry-compensation") + "?step=charge_card"))
    assert "is not offered for this workflow as it is now" in form


def test_a_done_forms_key_is_not_reused_a_stale_form_is_flagged_and_a_huge_one_refused(deployed: Deployed) -> None:
    """Found by the re-trial: an edited form whose key was used answered the first action's outcome and sent
    nothing; a form opened before another person's retry previewed its own input as the edit; a form over 2 MiB
    was a bare 500 without the console's headers."""
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    opened = {**form_of(page(browser, act_path(wid, "retry") + "?step=charge_card")), "reason": "first"}
    confirm = previewed(browser, act_path(wid, "retry"), {**opened, "value": '{"amount": 11, "currency": "EUR"}'})
    assert send(browser, act_path(wid, "retry"), confirm).status_code == 303
    deployed.pump()  # refused again: HELD
    # The same form, edited and previewed again, is a new action with a new key: sent
    edited = {**confirm, "value": '{"amount": 22, "currency": "EUR"}', "reason": "second", "intent": "edit"}
    form = send(browser, act_path(wid, "retry"), edited)
    refilled = form_of(form.get_data(as_text=True))
    assert refilled["key"] != confirm["key"]
    second = previewed(browser, act_path(wid, "retry"), {**refilled, "value": edited["value"], "reason": "second"})
    assert send(browser, act_path(wid, "retry"), second).status_code == 303
    assert [d["reason"] for d in operator_actions(deployed, wid)] == ["first", "second"]
    deployed.pump()
    # A form opened before another person's retry says so on its preview
    stale_form = {**form_of(page(browser, act_path(wid, "retry") + "?step=charge_card")), "reason": "third"}
    status, _ = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "other tab", "step": "charge_card"})
    assert status == 200
    deployed.pump()
    preview = text_of(send(browser, act_path(wid, "retry"), {**stale_form, "intent": "preview"}).get_data(as_text=True))
    assert "The workflow changed since you opened this form" in preview
    # An action no longer offered is previewed without a Confirm button
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    status, _ = deployed.ops("POST", f"/ops/workflows/{wid}/retry", {"reason": "works now", "step": "charge_card"})
    deployed.pump()
    gone = send(browser, act_path(wid, "retry"), {**stale_form, "intent": "preview"}).get_data(as_text=True)
    assert "is not offered for this workflow as it is now (COMPLETED)" in text_of(gone)
    assert 'value="confirm"' not in gone
    # A form over 2 MiB: 413, the console's page with its headers
    huge = send(browser, act_path(wid, "retry"), {**stale_form, "value": "x" * (2 * 1024 * 1024 + 1)})
    assert huge.status_code == 413 and "Too large" in text_of(huge.get_data(as_text=True))
    assert "script-src 'self'" in huge.headers["Content-Security-Policy"]


def test_a_queued_workflow_is_found_by_status_and_cancelled_from_its_page(deployed: Deployed) -> None:
    # Given a trip limited to one running per tenant, queueing the rest, and a second queued (a trial found the page
    # offered only Pause, and the find form refused QUEUED)
    body = trip()
    body["definition"]["tenancy"] = {"max_running": 1, "tenant_key": "traveller", "over_limit": "queue"}
    deployed.api("POST", "/workflows", body, caller="client-a")
    _, queued = deployed.api("POST", "/workflows", body, caller="client-a")
    wid = queued["workflow_id"]
    browser = signed_in(console_of(deployed))

    # When the operator finds QUEUED workflows, opens it, and previews then confirms its cancel
    found = page(browser, "/?status=QUEUED")
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    labels = re.findall(r'<a class="button act-[a-z-]+" href="[^"]+">([^<]+)</a>', html)
    fields = {**form_of(page(browser, act_path(wid, "cancel"))), "reason": "customer withdrew"}
    preview = send(browser, act_path(wid, "cancel"), {**fields, "intent": "preview"}).get_data(as_text=True)
    send(browser, act_path(wid, "cancel"), previewed(browser, act_path(wid, "cancel"), fields))

    # Then it was listed, offered Cancel (and Pause), told it ends at once, and ended CANCELLED, audited
    assert wid in found and "table scan" in found
    assert labels == ["Cancel", "Pause"]
    assert "The workflow is cancelled at once (QUEUED → CANCELLED)" in text_of(preview)
    _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert view["status"] == "CANCELLED"
    assert [(a["action"], a["reason"]) for a in operator_actions(deployed, wid)] == [("cancel", "customer withdrew")]
