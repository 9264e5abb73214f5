"""The operators' console (``sasflow console``) against the real API handlers on moto.

The console's client sends its calls through `DeployedTransport` (the API and operators' functions invoked
in-process, as the CLI's tests do) and the pages are requested with Werkzeug's test client, so every page is the
console's own rendering of the API's answers. The browser tests (tests/browser) drive chromium against the local
stack over HTTP.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
from collections.abc import Iterator
from html import unescape
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from werkzeug.test import Client, TestResponse

from sasflow_cli.client import SasflowClient
from sasflow_cli.console import Console, ConsoleServer
from sasflow_cli.console.server import COOKIE
from tests.integration.conftest import Deployed
from tests.integration.test_cli import DeployedTransport
from tests.integration.test_ops_api import held_at_payment, trip

PORT = 8765
HOST = f"127.0.0.1:{PORT}"
XSS_OUTPUT = {"note": "<script>alert('out')</script>", "link": "javascript:alert(1)"}
XSS_REASON = "<img src=x onerror=alert(2)>"


def console_of(deployed: Deployed, caller: str = "operator") -> Console:
    for function in ("ApiFunction", "OpsFunction"):
        deployed.fn(function)
    client = SasflowClient(
        "http://deployed.test",
        lambda m, u, b, h: dict(h),
        transport=DeployedTransport(deployed, caller),
        operator=caller == "operator",
    )
    return Console(client, caller, PORT, token="the-token", session="the-session")


def signed_in(console: Console) -> Client:
    """A browser that opened the printed URL: it holds the session cookie."""
    browser = Client(console)
    first = browser.get("/?token=the-token", headers={"Host": HOST})
    assert first.status_code == 303 and first.headers["Location"] == "/"
    return browser


def page(browser: Client, path: str, status: int = 200) -> str:
    answer = browser.get(path, headers={"Host": HOST})
    assert answer.status_code == status, answer.get_data(as_text=True)
    return answer.get_data(as_text=True)


def text_of(html: str) -> str:
    """The page's words, tags dropped and whitespace folded (what a person reads)."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html))).strip()


@pytest.fixture
def operator_console(deployed: Deployed) -> Iterator[Console]:
    yield console_of(deployed)


def test_the_token_becomes_a_strict_http_only_cookie_and_nothing_is_served_without_it(deployed: Deployed) -> None:
    console = console_of(deployed)
    browser = Client(console)
    # Without the token or the cookie: refused, saying what to open
    refused = browser.get("/", headers={"Host": HOST})
    assert refused.status_code == 403
    assert "Open the console with its token" in refused.get_data(as_text=True)
    assert "signed as" not in refused.get_data(as_text=True)  # no session: not even who signs
    # A wrong token: refused, and no cookie
    wrong = browser.get("/?token=guess", headers={"Host": HOST})
    assert (wrong.status_code, wrong.headers.get("Set-Cookie")) == (403, None)
    # The printed URL's token: a cookie, HttpOnly and SameSite=Strict, and a redirect that drops the token
    first = browser.get("/definitions?token=the-token", headers={"Host": HOST})
    assert (first.status_code, first.headers["Location"]) == (303, "/definitions")
    cookie = first.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}_{PORT}=the-session;")  # one cookie per console: named by its port
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "the-token" not in cookie
    # The token's page keeps the rest of its address (a link to a filtered list works once)
    kept = Client(console).get("/?status=HELD&token=the-token", headers={"Host": HOST})
    assert (kept.status_code, kept.headers["Location"]) == (303, "/?status=HELD")
    assert page(browser, "/definitions").count("<h1>Definitions</h1>") == 1
    # Another session value is no session
    browser.set_cookie(f"{COOKIE}_{PORT}", "forged", domain="127.0.0.1")
    assert browser.get("/definitions", headers={"Host": HOST}).status_code == 403


@pytest.mark.parametrize(
    "host", ["evil.example", f"evil.example:{PORT}", f"127.0.0.1:{PORT + 1}", "127.0.0.2:8765", f"10.0.0.1:{PORT}"]
)
def test_a_request_naming_another_host_is_refused_even_with_the_session(deployed: Deployed, host: str) -> None:
    browser = signed_in(console_of(deployed))
    answer = browser.get("/", headers={"Host": host})
    assert answer.status_code == 403
    assert "answers only at its loopback address" in answer.get_data(as_text=True)
    # the loopback names with the console's port are served (a browser keeps a cookie per host name)
    for name in ("127.0.0.1", "localhost", "[::1]"):
        headers = {"Host": f"{name}:{PORT}", "Cookie": f"{COOKIE}_{PORT}=the-session"}
        assert Client(browser.application, use_cookies=False).get("/definitions", headers=headers).status_code == 200


def test_every_answer_carries_a_policy_without_inline_script_or_style(deployed: Deployed) -> None:
    browser = signed_in(console_of(deployed))
    for path in ("/", "/definitions", "/static/console.css", "/nope", "/workflows/not-there"):
        answer = browser.get(path, headers={"Host": HOST})
        policy = answer.headers["Content-Security-Policy"]
        assert "script-src 'self';" in policy and "style-src 'self';" in policy
        assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Referrer-Policy"] == "same-origin"
        assert answer.headers["Cache-Control"] == "no-store"
    # and the pages hold no inline script or style attribute
    html = page(browser, "/")
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/console.js" defer>']
    assert " style=" not in html
    # the console only reads: a POST is refused
    assert browser.post("/", headers={"Host": HOST}).status_code == 405


def test_a_held_workflow_is_found_first_and_its_failed_step_read(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    listing = page(browser, "/")
    # The workflows page: counts by status, and the HELD one first, in the "needs a person" table, linked
    needs = listing.split('id="wait-HELD"', 1)[1].split("</section>", 1)[0]
    link = f'href="/workflows/{quote(wid, safe="")}"'
    assert link in needs
    # with what it has cost so far, as the CLI's listing shows it
    assert "Cost so far</th>" in needs and re.search(r'<td class="num">\$0\.0000\d+</td>\s*</tr>', needs)
    assert re.search(r'class="status st-held">HELD</span> <b>1</b>', listing)
    assert "No workflow is COMPENSATION_FAILED, PAUSED: none of those needs a person." in text_of(listing)
    assert 'id="wait-PAUSED"' not in listing  # an empty kind is one line, not an empty table
    # The workflow page: status as a word, each step in the graph with its status word, the failed step's error
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    words = text_of(html)
    assert f"{wid} Status HELD" in words
    boxes = re.findall(r'<g class="node (st-[a-z-]+)">\s*<title>([^<]+)</title>', html)
    assert boxes == [
        ("st-completed", "reserve_flight: COMPLETED"),
        ("st-completed", "book_hotel: COMPLETED"),
        ("st-failed", "charge_card: FAILED"),
    ]
    assert len(re.findall(r'<line class="edge"', html)) == 2  # a chain: flight -> hotel -> payment
    payment = html.split('id="step-charge_card"', 1)[1].split("</section>", 1)[0]
    assert "Error" in text_of(payment) and '"code": "CARD_DECLINED"' in text_of(payment)
    assert "Waits for" in payment and "book_hotel" in payment
    # What its work has cost so far (the tally on its item), with a line per service that cost anything
    cost = html.split('id="cost-h"', 1)[1].split("</section>", 1)[0]
    assert re.search(r"Cost so far</h2>\s*<p>\$0\.0000\d+ at us-east-1, read 2026-11-29 list prices", cost)
    assert re.search(r"<td>DynamoDB writes</td><td>\d+ WRU</td>", cost) and "<td>SQS</td>" in cost
    assert "<td>S3</td>" not in cost  # nothing claim-checked: no line of nothing
    # The history, with its times and actors, ends with the hold
    assert "held" in words and "scheduler" in words
    assert "data-refresh" not in html  # HELD waits for a person: the page stays still while they read it


def test_values_from_a_workflow_are_text_never_markup(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    status, _ = deployed.ops(
        "POST",
        f"/ops/workflows/{wid}/skip",
        {"reason": XSS_REASON, "step": "charge_card", "output": XSS_OUTPUT},
    )
    assert status == 200
    deployed.pump()
    html = page(signed_in(console_of(deployed)), f"/workflows/{quote(wid, safe='')}")
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#39;out&#39;)&lt;/script&gt;" in html  # the output, shown as text
    assert 'href="javascript:' not in html and "javascript:alert(1)" in html  # text, never a link
    assert "&#34;reason&#34;: &#34;&lt;img src=x onerror=alert(2)&gt;&#34;" in html  # the reason, as text


def test_a_client_sees_its_own_workflow_and_is_told_why_not_the_rest(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", trip(), caller="client-a")
    assert status == 201
    wid = started["workflow_id"]
    deployed.pump()
    mine = signed_in(console_of(deployed, "client-a"))
    assert "COMPLETED" in text_of(page(mine, f"/workflows/{quote(wid, safe='')}"))
    assert "the listings are the operators'" in text_of(page(mine, "/"))
    assert 'href="/dead-letters"' not in page(mine, "/")  # no operator pages offered
    refused = text_of(page(mine, "/dead-letters", 403))
    assert "Operators only" in refused and "client-a" in refused
    theirs = signed_in(console_of(deployed, "client-b"))
    other = text_of(page(theirs, f"/workflows/{quote(wid, safe='')}", 404))
    assert "you see only the workflows you started" in other


def test_a_workflow_page_names_the_tenant_whose_limit_it_counts_in(deployed: Deployed) -> None:
    body = trip()
    body["definition"]["tenancy"] = {"max_running": 2, "tenant_key": "traveller"}
    status, started = deployed.api("POST", "/workflows", body, caller="client-a")
    assert status == 201
    mine = signed_in(console_of(deployed, "client-a"))
    shown = text_of(page(mine, f"/workflows/{quote(started['workflow_id'], safe='')}"))
    assert f"Tenant key#{body['input']['traveller']} (a slot of its definition's tenancy.max_running)" in shown


def test_a_queued_workflow_page_says_it_waits_in_its_tenants_queue_with_its_ticket(deployed: Deployed) -> None:
    body = trip()
    body["definition"]["tenancy"] = {"max_running": 1, "tenant_key": "traveller", "over_limit": "queue"}
    deployed.api("POST", "/workflows", body, caller="client-a")
    status, queued = deployed.api("POST", "/workflows", body, caller="client-a")
    assert (status, queued["status"]) == (201, "QUEUED")
    mine = signed_in(console_of(deployed, "client-a"))
    shown = text_of(page(mine, f"/workflows/{quote(queued['workflow_id'], safe='')}"))
    tenant = f"key#{body['input']['traveller']}"
    waiting = "waiting in its tenant's queue for a slot of its definition's tenancy.max_running"
    assert f"Tenant {tenant} ({waiting})" in shown
    assert "Queue ticket 1 (the tenant's queue starts its workflows in ticket order)" in shown
    assert "QUEUED" in shown


def test_the_find_form_filters_by_status_definition_and_start_and_opens_an_id(deployed: Deployed) -> None:
    wid = held_at_payment(deployed)
    browser = signed_in(console_of(deployed))
    opened = browser.get(f"/?id={quote(wid, safe='')}", headers={"Host": HOST})
    assert (opened.status_code, opened.headers["Location"]) == (303, f"/workflows/{quote(wid, safe='')}")
    held = page(browser, "/?status=HELD&definition=trip-booking&started_after=2000-01-01T00:00")
    assert wid in held and "attention index" in held
    assert wid not in page(browser, "/?status=HELD&started_before=2000-01-01T00:00")
    assert wid not in page(browser, "/?status=HELD&definition=another")
    # what only the item holds: the version, the owner, the codes of the steps' last errors
    found = page(
        browser, "/?status=HELD&version=1&error_code=CARD_DECLINED&owner=arn:aws:iam::123456789012:user/client-a"
    )
    assert wid in found and "trip-booking v1" in text_of(found) and "CARD_DECLINED" in text_of(found)
    assert wid not in page(browser, "/?status=HELD&error_code=TIMEOUT")
    assert wid not in page(browser, "/?status=HELD&version=2")
    assert "version '0': a whole number, 1 or more" in text_of(page(browser, "/?version=0", 400))
    kept = page(browser, "/?definition=trip-booking&started_after=yesterday", 400)
    assert "This filter cannot be used: 'yesterday' is not a date and time" in text_of(kept)
    assert 'name="definition" value="trip-booking"' in kept  # the form as it was filled in, to correct
    unknown = page(browser, "/?trigger=no-such-trigger&definition=trip-booking", 404)
    assert "This filter cannot be used: TRIGGER_NOT_FOUND" in text_of(unknown)
    assert 'name="trigger" value="no-such-trigger"' in unknown and 'name="definition" value="trip-booking"' in unknown
    assert "status 'DONE': one of RUNNING" in text_of(page(browser, "/?status=DONE", 400))


def test_dead_letters_are_peeked_and_definitions_drawn(deployed: Deployed) -> None:
    browser = signed_in(console_of(deployed))
    queues = page(browser, "/dead-letters")
    assert 'href="/dead-letters/ResponseDeadLetterQueue"' in queues
    peek = text_of(page(browser, "/dead-letters/ResponseDeadLetterQueue"))
    assert "ResponseDeadLetterQueue" in peek and "No message seen." in peek
    unknown = text_of(page(browser, "/dead-letters/NoSuchQueue", 404))
    assert "NoSuchQueue" in unknown
    # a registered definition: its versions, and a version's graph
    definition = {**trip()["definition"], "name": "trips", "version": 1}
    status, _ = deployed.api("PUT", "/definitions/trips/versions/1", definition, caller="client-a")
    assert status == 201, _
    assert 'href="/definitions/trips/1"' in page(browser, "/definitions")
    drawn = page(browser, "/definitions/trips/1")
    assert len(re.findall(r'<g class="node st-defined">', drawn)) == 3
    assert len(re.findall(r'<line class="edge"', drawn)) == 2


def test_an_unreachable_api_is_a_page_that_says_so() -> None:
    def down(method: str, url: str, body: bytes, headers: Any) -> tuple[int, bytes]:
        raise ConnectionRefusedError("connection refused")

    client = SasflowClient("http://127.0.0.1:9", lambda m, u, b, h: dict(h), transport=down, sleep=lambda _: None)
    browser = signed_in(Console(client, "operator", PORT, token="the-token", session="the-session"))
    answer: TestResponse = browser.get("/", headers={"Host": HOST})
    assert answer.status_code == 502
    assert "is the stack up?" in answer.get_data(as_text=True)


def test_a_map_steps_children_are_listed_by_status_a_page_at_a_time(deployed: Deployed) -> None:
    # Given a map of 105 children (two reads of 100), of which items 3 and 101 are refused, within its tolerance
    child = {
        "name": "charge-one",
        "steps": [
            {
                "name": "charge",
                "agent": "payments",
                "action": "charge",
                "input": {
                    "amount.$": "input.item.amount",
                    "simulate.$": {"expression": "input.item.simulate", "default": None},
                },
            }
        ],
    }
    items = [{"amount": 5, **({"simulate": "reject"} if i in (3, 101) else {})} for i in range(105)]
    request = {
        "definition": {
            "name": "charge-orders",
            "steps": [
                {
                    "name": "charge_all",
                    "type": "map",
                    "items": "input.items",
                    "tolerated_failure": 2,
                    "definition": child,
                }
            ],
        },
        "input": {"items": items},
    }
    status, started = deployed.api("POST", "/workflows", request)
    assert status == 201
    wid = started["workflow_id"]
    deployed.pump(rounds=400)
    status, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert view["status"] == "COMPLETED" and view["steps"][0]["children"]["failed"] == 2
    children = f"/ops/workflows/{quote(wid, safe='')}/steps/charge_all/children"
    # The API: the refused ones by their status, in item order, a page of one at a time
    status, first = deployed.ops("GET", children, query="status=COMPENSATED&limit=1")
    assert status == 200, first
    assert [(c["index"], c["workflow_id"], c["status"]) for c in first["children"]] == [
        (3, f"{wid}:0:3", "COMPENSATED")
    ]
    assert (first["total"], first["started"], first["next_cursor"], first["examined"]) == (105, 105, "4", 100)
    _, second = deployed.ops("GET", children, query="status=COMPENSATED&limit=1&cursor=4")
    assert [c["index"] for c in second["children"]] == [101] and second["next_cursor"] == "102"
    _, last = deployed.ops("GET", children, query="status=COMPENSATED&limit=1&cursor=102")
    assert (last["children"], last["next_cursor"], last["examined"]) == ([], None, 3)
    _, every = deployed.ops("GET", children, query="limit=200")
    assert [c["index"] for c in every["children"]] == list(range(105)) and every["next_cursor"] is None
    # A step that is not a map, or no such step: 404 naming the map steps
    status, refused = deployed.ops("GET", f"/ops/workflows/{quote(wid, safe='')}/steps/charge/children")
    assert (status, refused["error"]) == (404, "STEP_NOT_FOUND")
    assert refused["message"] == f"workflow {wid} has no map step 'charge'; its map steps: charge_all"
    # The console: the workflow page links to the children, whose page filters them by status
    browser = signed_in(console_of(deployed))
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    link = f"/workflows/{quote(wid, safe='')}/steps/charge_all/children"
    assert f'href="{link}"' in html and "map: 105/105 ended, 2 failed" in html
    compensated = page(browser, f"{link}?status=COMPENSATED")
    rows = re.findall(r'<td>(\d+)</td>\s*<td><a href="([^"]+)">', compensated)
    assert rows == [
        ("3", f"/workflows/{quote(wid + ':0:3', safe='')}"),
        ("101", f"/workflows/{quote(wid + ':0:101', safe='')}"),
    ]
    assert "Next page" not in compensated
    child_page = text_of(page(browser, rows[0][1]))
    assert f"{wid}:0:3 Status COMPENSATED" in child_page
    assert "None COMPLETED among" not in text_of(page(browser, f"{link}?status=COMPLETED"))
    assert "None HELD among the children read (105)." in text_of(page(browser, f"{link}?status=HELD"))


def test_a_step_output_downloads_whole_as_json(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", trip())
    assert status == 201
    deployed.pump()
    wid = started["workflow_id"]
    browser = signed_in(console_of(deployed))
    answer = browser.get(f"/workflows/{quote(wid, safe='')}/steps/book_hotel/output.json", headers={"Host": HOST})
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    assert answer.headers["Content-Disposition"] == f'attachment; filename="{wid}-book_hotel-output.json"'
    _, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert answer.json == view["steps"][1]["output"]
    missing = browser.get(f"/workflows/{quote(wid, safe='')}/steps/nope/output.json", headers={"Host": HOST})
    assert missing.status_code == 404


def test_a_steps_input_is_rendered_on_demand_and_a_claim_checked_payload_fetched(deployed: Deployed) -> None:
    # Given a trip whose input is claim-checked (over 32 KiB) and whose flight is refused, held for a person
    deployed.remote["flights"].service.update_knobs({"rejection_rate": 1.0})
    request = trip(on_failure="hold")
    request["input"]["notes"] = "n" * 40_000
    status, started = deployed.api("POST", "/workflows", request)
    assert status == 201, started
    wid = started["workflow_id"]
    deployed.pump()
    status, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert (view["status"], [s["status"] for s in view["steps"]]) == ("HELD", ["FAILED", "PENDING", "PENDING"])
    reference = view["input"]["$claim_check"]
    # The API: the failed step's input, rendered from the claim-checked input; a step not dispatched is a 409
    status, shown = deployed.ops("GET", f"/ops/workflows/{wid}/steps/reserve_flight/input")
    assert status == 200, shown
    assert (shown["input"], shown["edited"]) == ({"traveller": "Ada Lovelace", "route": "LHR-JFK"}, False)
    assert shown["bytes"] == len(json.dumps(shown["input"], separators=(",", ":")))
    status, refused = deployed.ops("GET", f"/ops/workflows/{wid}/steps/book_hotel/input")
    assert (status, refused["error"]) == (409, "STEP_NOT_DISPATCHED")
    status, refused = deployed.ops("GET", f"/ops/workflows/{wid}/steps/nope/input")
    assert (status, refused["error"]) == (404, "STEP_NOT_FOUND")
    assert refused["message"].endswith("those that do: reserve_flight, book_hotel, charge_card")
    # And the claim-checked input itself, by its digest; a digest of nothing is a 404
    status, payload = deployed.ops("GET", f"/ops/workflows/{wid}/payloads/{reference['sha256']}")
    assert status == 200, payload
    assert payload["payload"]["notes"] == "n" * 40_000 and payload["bytes"] == reference["bytes"]
    assert payload["key"] == f"{wid}/{reference['sha256']}"
    status, missing = deployed.ops("GET", f"/ops/workflows/{wid}/payloads/{'0' * 64}")
    assert (status, missing["error"]) == (404, "PAYLOAD_NOT_FOUND")
    # The console: the failed step's input beside its error; the claim-checked input one click away
    browser = signed_in(console_of(deployed))
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    flight = html.split('id="step-reserve_flight"', 1)[1].split("</section>", 1)[0]
    assert "<h3>Input</h3>" in flight and "&#34;route&#34;: &#34;LHR-JFK&#34;" in flight
    shown_link = f"/workflows/{quote(wid, safe='')}/payloads/{reference['sha256']}"
    assert f"Claim-checked payload of {reference['bytes']:,} bytes" in text_of(html) and f'href="{shown_link}"' in html
    assert "n" * 100 not in html  # the 40,000 characters are not on the workflow's page
    full = text_of(page(browser, shown_link))
    assert f"Object {wid}/{reference['sha256']} of the payload bucket: {reference['bytes']:,} bytes." in full
    assert '"notes": "' + "n" * 100 in full
    download = browser.get(shown_link + ".json", headers={"Host": HOST})
    assert download.status_code == 200 and download.json["notes"] == "n" * 40_000
    # And once retried with an edited input, the input shown is the operator's, said to be edited
    deployed.remote["flights"].service.update_knobs({"rejection_rate": 0.0})
    edited = {"traveller": "Ada King", "route": "LHR-JFK"}
    status, _ = deployed.ops(
        "POST", f"/ops/workflows/{wid}/retry", {"reason": "typo", "step": "reserve_flight", "input": edited}
    )
    assert status == 200
    status, shown = deployed.ops("GET", f"/ops/workflows/{wid}/steps/reserve_flight/input")
    assert (shown["input"], shown["edited"]) == (edited, True)
    on_demand = text_of(page(browser, f"/workflows/{quote(wid, safe='')}/steps/reserve_flight/input"))
    assert "What its attempts get: edited by an operator with a retry" in on_demand and "Ada King" in on_demand


def test_a_step_its_when_skipped_has_no_input_and_an_inline_definition_says_where_its_steps_are(
    deployed: Deployed,
) -> None:
    request = trip()
    request["definition"]["steps"][1]["when"] = "input.nights > `5`"  # 3 nights: the hotel is skipped
    status, started = deployed.api("POST", "/workflows", request)
    assert status == 201
    deployed.pump()
    wid = started["workflow_id"]
    status, view = deployed.ops("GET", f"/ops/workflows/{wid}")
    assert [s["status"] for s in view["steps"]] == ["COMPLETED", "SKIPPED", "COMPLETED"]
    status, refused = deployed.ops("GET", f"/ops/workflows/{wid}/steps/book_hotel/input")
    assert (status, refused["error"]) == (409, "STEP_NOT_DISPATCHED")
    assert "was never dispatched (it is pending, or its when skipped it)" in refused["message"]
    browser = signed_in(console_of(deployed))
    html = page(browser, f"/workflows/{quote(wid, safe='')}")
    assert "Input of reserve_flight" in html and "Input of book_hotel" not in html
    # The definition was given inline: its page says so instead of a bare 404
    inline = text_of(page(browser, "/definitions/trip-booking", 404))
    assert "Not registered" in inline and "its steps and their dependencies are on the workflow's own page" in inline
    assert browser.get("/favicon.ico", headers={"Host": HOST}).status_code == 204


def test_the_served_console_logs_no_request_line_so_the_token_stays_off_the_terminal(
    deployed: Deployed, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    console = console_of(deployed)
    server = ConsoleServer(lambda port: Console(console.client, "operator", port, token="the-token")).start()
    try:
        split = urlsplit(server.url)
        connection = http.client.HTTPConnection("127.0.0.1", split.port, timeout=10)
        connection.request("GET", f"/?{split.query}")
        answer = connection.getresponse()
        assert answer.status == 303 and answer.getheader("Set-Cookie", "").startswith(f"{COOKIE}_{split.port}=")
        connection.close()
    finally:
        server.stop()
    captured = capfd.readouterr()
    assert "the-token" not in captured.out + captured.err + caplog.text
