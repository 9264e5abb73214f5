"""The console's batches (issue 40) against the real API handlers on moto: a batch started from the listing's filter
after its dry run, once per form; its page follows its progress and lists what it touched; it is cancelled from its
page; a client is shown none of it, and a form not sent by the console's own page is refused."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

from tests.integration.conftest import Deployed
from tests.integration.test_batches_api import run_batches
from tests.integration.test_console import console_of, page, signed_in, text_of
from tests.integration.test_console_actions import form_of, operator_actions, send
from tests.integration.test_ops_api import OPERATOR_ARN, trip


def held(deployed: Deployed, n: int) -> list[str]:
    """``n`` trips under the hold policy whose payment is refused: HELD at charge_card."""
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    ids = []
    for _ in range(n):
        status, started = deployed.api("POST", "/workflows", trip(on_failure="hold"))
        assert status == 201
        ids.append(str(started["workflow_id"]))
    deployed.pump()
    return ids


def batch_form(html: str) -> dict[str, str]:
    """The batch form as a browser sends it: its hidden fields, inputs, selected options and text."""
    fields = form_of(html)
    for name, value in re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', html):
        fields[name] = unescape(value)
    for name, value in re.findall(r'<input id="[a-z_]+"(?: type="[a-z-]+")? name="([a-z_]+)" value="([^"]*)"', html):
        fields[name] = unescape(value)
    for name, options in re.findall(r'<select id="[a-z_]+" name="([a-z_]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', options)
        fields[name] = chosen.group(1) if chosen else ""
    return fields


def test_a_batch_is_started_from_the_listings_filter_after_its_dry_run_once_and_followed_to_its_end(
    deployed: Deployed,
) -> None:
    ids = held(deployed, 3)
    browser = signed_in(console_of(deployed))
    # The listing of the HELD offers a batch of what it found, with the same filter
    listing = page(browser, "/?status=HELD&definition=trip-booking")
    [link] = re.findall(r'<a class="button" href="(/batches/new\?[^"]+)">Act on every workflow', listing)
    assert unescape(link) == "/batches/new?status=HELD&definition=trip-booking"
    # Its form is filled in with the filter; the operator adds the step and the reason
    form = page(browser, unescape(link))
    fields = batch_form(form)
    assert (fields["action"], fields["status"], fields["definition"], fields["error_code"]) == (
        "retry",
        "HELD",
        "trip-booking",
        "",
    )
    assert re.fullmatch(r"console-[0-9a-f]{32}", fields["key"])
    fields.update(step="charge_card", reason="payments are back (INC-7)", max_per_second="100")
    # The dry run counts them and starts nothing
    preview = send(browser, "/batches/new", {**fields, "intent": "preview"})
    words = text_of(preview.get_data(as_text=True))
    assert preview.status_code == 200, words
    assert "Retry a failed step (step charge_card) on each of the 3 workflow(s) found now: 3 HELD." in words
    assert "100 workflows a second on average (each run acts on up to 30 seconds' worth, in pages of 25" in words
    assert deployed.ops("GET", "/ops/batches")[1]["batches"] == []
    # Confirmed twice (a double click that got through): one batch, and its page
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 0.0})
    confirm = {**batch_form(preview.get_data(as_text=True)), "intent": "confirm"}
    first = send(browser, "/batches/new", confirm)
    second = send(browser, "/batches/new", confirm)
    assert (first.status_code, second.status_code) == (303, 303)
    assert first.headers["Location"] == second.headers["Location"]
    [batch_id] = re.findall(r"^/batches/(b-[0-9a-f]+)\?done=console-[0-9a-f]{32}$", first.headers["Location"])
    [stored] = deployed.ops("GET", "/ops/batches")[1]["batches"]
    assert (stored["batch_id"], stored["principal"], stored["max_per_second"]) == (batch_id, OPERATOR_ARN, 100)
    running = page(browser, first.headers["Location"])
    assert "Batch: Retry a failed step: done at" in text_of(running)
    assert 'data-refresh="3"' in running and "Cancel the batch" in running
    # When its runs are done, its page says so and lists each workflow with its outcome
    assert run_batches(deployed) >= 1
    deployed.pump()
    ended = page(browser, f"/batches/{batch_id}")
    words = text_of(ended)
    assert "Status COMPLETED" in words and "Matched 3 Done 3 Refused 0 Failed 0" in words
    assert "data-refresh" not in ended and "Cancel the batch" not in ended
    # a cancel sent from a page opened while it ran is refused, and the page says why
    late = send(browser, f"/batches/{batch_id}/cancel", {**form_of(running), "reason": "too late"})
    assert late.status_code == 409
    assert f"batch {batch_id} COMPLETED already: nothing to cancel" in text_of(late.get_data(as_text=True))
    assert sorted(
        re.findall(r'<td><a href="/workflows/([^"]+)">[^<]+</a></td><td class="reason">done</td>', ended)
    ) == (sorted(ids))
    for wid in ids:
        [action] = operator_actions(deployed, wid)
        assert (action["action"], action["batch"], action["reason"]) == ("retry", batch_id, "payments are back (INC-7)")
        assert deployed.ops("GET", f"/ops/workflows/{wid}")[1]["status"] == "COMPLETED"
    # And the batches page lists it
    batches = text_of(page(browser, "/batches"))
    assert f"{batch_id} retry charge_card definition=trip-booking status=HELD COMPLETED 3 3 0 0" in batches


def test_a_batch_form_that_cannot_be_sent_says_why_and_a_running_batch_is_cancelled_from_its_page(
    deployed: Deployed,
) -> None:
    held(deployed, 2)
    browser = signed_in(console_of(deployed))
    fields = {**batch_form(page(browser, "/batches/new?status=HELD")), "reason": "give up"}
    # A filter without a status, a bad rate or output, comes back as filled in with why; nothing is started
    for wrong, why in (
        ({"status": "", "action": "compensate"}, "a status is needed"),
        ({"action": "compensate", "max_per_second": "0"}, "rate '0': a whole number, 1 or more"),
        ({"action": "compensate", "output": "{}"}, "only a skip gives an output"),
        ({"action": "skip", "step": "charge_card", "output": "{"}, "the output is not JSON"),
    ):
        answer = send(browser, "/batches/new", {**fields, **wrong, "intent": "preview"})
        assert answer.status_code == 400 and why in text_of(answer.get_data(as_text=True)), wrong
        assert 'name="reason" rows="2" maxlength="500" required>give up</textarea>' in answer.get_data(as_text=True)
    # The API's refusal is shown as it is (a status a batch cannot act on: a form not made by the page)
    refused = send(
        browser, "/batches/new", {**fields, "action": "compensate", "status": "COMPLETED", "intent": "preview"}
    )
    assert refused.status_code == 422
    assert "where.status" in text_of(refused.get_data(as_text=True))
    # A batch that compensates them, started, then cancelled from its page before it runs
    started = send(browser, "/batches/new", {**fields, "action": "compensate", "intent": "confirm"})
    assert started.status_code == 303
    batch_id = started.headers["Location"].split("/")[2].split("?")[0]
    cancel_form = form_of(page(browser, f"/batches/{batch_id}"))
    blank = send(browser, f"/batches/{batch_id}/cancel", {**cancel_form, "reason": " "})
    assert blank.status_code == 400 and "a reason is needed" in text_of(blank.get_data(as_text=True))
    assert send(browser, f"/batches/{batch_id}/cancel", {**cancel_form, "reason": "x", "csrf": ""}).status_code == 403
    cancelled = send(browser, f"/batches/{batch_id}/cancel", {**cancel_form, "reason": "wrong filter"})
    assert cancelled.status_code == 303
    words = text_of(page(browser, cancelled.headers["Location"]))
    assert "Cancel of the batch: done at" in words and "Status CANCELLED" in words
    assert f"Cancelled by {OPERATOR_ARN}: wrong filter" in words
    _, view = deployed.ops("GET", f"/ops/batches/{batch_id}")
    assert (view["status"], view["cancel_reason"]) == ("CANCELLED", "wrong filter")


def test_a_client_is_shown_no_batch_and_an_unknown_batch_is_a_404(deployed: Deployed) -> None:
    client = signed_in(console_of(deployed, caller="client-a"))
    for path in ("/batches", "/batches/new", "/batches/b-0123456789abcdef0123"):
        assert "Operators only" in text_of(page(client, path, 403))
    operator = signed_in(console_of(deployed))
    missing: Any = text_of(page(operator, "/batches/b-0123456789abcdef0123", 404))
    assert "BATCH_NOT_FOUND" in missing
