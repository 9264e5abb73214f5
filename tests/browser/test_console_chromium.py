"""The operators' console in a real browser: Debian's chromium, headless, driven by Playwright, on the local stack.

Chromium comes from the system (``make browser`` installs it with apt; ``.ci/run`` does), never from Playwright's
own download: ``SASFLOW_CHROMIUM`` names it, else ``chromium`` on the PATH. A machine without it fails here, saying
how to install it (a skipped browser test would hide that the page was never tried).

What is tried is the reading half of the on-call drill of docs/operate.md from the page alone: find a HELD workflow
from the list, open it, read the failed step's error and the workflow's input; a map's children; a dead letter
peeked; a step output holding markup stays text (no script runs); a request without the token, or naming another
host, is refused. Screenshots of every page at 1280x800 and 390x844 are written to ``SASFLOW_SCREENSHOTS`` (``make
screenshots`` points it at docs/assets/console) or a temporary folder, and their size checked.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all
from sasflow.messages import encode
from sasflow_cli.console import Console, ConsoleServer
from sasflow_cli.targets import build_client
from tests.support.fakes import stale_flight_request
from tests.support.lambdas import ROOT
from tests.system.test_roles_local import MAP

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("SASFLOW_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SIZES = {"wide": (1280, 800), "phone": (390, 844)}
XSS = {"note": "<script>document.title='pwned'</script>", "link": "javascript:alert(1)"}


@dataclass
class Drill:
    stack: LocalStack
    servers: dict[str, RunningServer]
    console: ConsoleServer
    client_a: SignedHttp
    operator: SignedHttp

    def start(self, request: dict[str, Any]) -> str:
        status, started = self.client_a.post("/workflows", request)
        assert status == 201, started
        return str(started["workflow_id"])

    def held_trip(self) -> str:
        """A trip whose payment is refused, under the hold policy: HELD once it has failed."""
        self.servers["payments"].service.update_knobs({"rejection_rate": 1.0})
        try:
            workflow_id = self.start(trip(on_failure="hold"))
            self.wait(workflow_id, lambda v: v["status"] == "HELD")
        finally:
            self.servers["payments"].service.update_knobs({"rejection_rate": 0.0})
        return workflow_id

    def wait(self, workflow_id: str, done: Callable[[dict[str, Any]], bool], seconds: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            _, view = self.operator.get(f"/ops/workflows/{quote(workflow_id, safe='')}")
            if done(view) or time.monotonic() > deadline:
                assert done(view), view
                return view  # type: ignore[no-any-return]
            time.sleep(0.2)


def trip(**definition: Any) -> dict[str, Any]:
    request: dict[str, Any] = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    request["definition"].update(definition)
    return request


@pytest.fixture(scope="module")
def drill() -> Iterator[Drill]:
    servers = serve_all(rng_seed=13)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(
            parameters=parameters,
            schedule_interval_seconds=0.5,
            max_workers_per_function=1,
            # a compensation that keeps failing uses up its attempts (COMPENSATION_FAILED) before the circuit opens
            extra_env={"BREAKER_FAILURE_THRESHOLD": "50"},
        ) as stack:
            client = build_client(url=stack.api_url, stack=None, caller="operator")
            console = ConsoleServer(lambda port: Console(client, "operator", port)).start()
            try:
                yield Drill(
                    stack, servers, console, SignedHttp(stack.api_url), SignedHttp(stack.api_url, caller="operator")
                )
            finally:
                console.stop()
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM, "no chromium on this machine: run `make browser` (apt install chromium), or set SASFLOW_CHROMIUM"
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox cannot start
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("SASFLOW_SCREENSHOTS")
    return Path(folder) if folder else tmp_path_factory.mktemp("screenshots")


def signed_in(browser: Browser, drill: Drill, size: str = "wide") -> Page:
    width, height = SIZES[size]
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(drill.console.url)
    assert urlsplit(page.url).query == ""  # the token is gone from the address bar
    return page


def screenshot(browser: Browser, drill: Drill, shots: Path, name: str, path: str) -> None:
    """The page at ``path`` at both sizes, each checked to be a PNG of that size."""
    for size, (width, height) in SIZES.items():
        page = signed_in(browser, drill, size)
        page.goto(drill.console.url.split("/?")[0] + path)
        file = shots / f"{name}-{size}.png"
        file.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(file))
        header = file.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (width, height)
        page.close()


def test_the_reading_drill_finds_a_held_workflow_and_reads_its_failed_step(
    drill: Drill, browser: Browser, shots: Path
) -> None:
    # Given a trip whose payment is refused, under the hold policy: HELD
    wid = drill.held_trip()
    page = signed_in(browser, drill)
    page.keyboard.press("Tab")  # the first stop skips the navigation
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    # When the operator finds it among those that need a person, with the keyboard alone
    held = page.locator("section", has=page.get_by_role("heading", name="Needs a person: HELD"))
    link = held.get_by_role("link", name=wid)
    expect(link).to_be_visible()
    link.focus()
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/workflows/{wid}")
    # Then the page names it, its status in words, and the failed step in the graph
    expect(page.get_by_role("heading", level=1)).to_have_text(wid)
    graph = page.get_by_role("img", name="Steps and their dependencies")
    expect(graph).to_contain_text("charge_card")
    expect(graph.locator("g.node.st-failed")).to_contain_text("FAILED")
    # And the failed step's error, beside the workflow's input
    step = page.locator("#step-charge_card")
    expect(step.get_by_role("heading", level=2)).to_contain_text("FAILED")
    expect(step.locator("pre.json").first).to_contain_text('"code": "CARD_DECLINED"')
    expect(step.locator("h3", has_text="Input").locator("xpath=following-sibling::pre[1]")).to_contain_text(
        '"amount": 420'
    )
    expect(page.locator("section", has=page.get_by_role("heading", name="Workflow input"))).to_contain_text(
        "Ada Lovelace"
    )
    # And the history says who held it, when
    expect(page.locator("table.history")).to_contain_text("held")
    # A HELD workflow's page does not refresh itself; every form control on the list has a label
    assert page.locator("main").get_attribute("data-refresh") is None
    page.goto(drill.console.url.split("/?")[0] + "/")
    unlabelled = page.evaluate(
        "Array.from(document.querySelectorAll('input, select, textarea'))"
        ".filter(e => e.type !== 'hidden' && e.labels.length === 0).map(e => e.name)"
    )
    assert unlabelled == []
    page.close()
    screenshot(browser, drill, shots, "workflows", "/")
    screenshot(browser, drill, shots, "workflow", f"/workflows/{quote(wid, safe='')}")


def test_a_map_step_shows_its_children_and_a_child_opens(drill: Drill, browser: Browser, shots: Path) -> None:
    wid = drill.start(MAP)
    view = drill.wait(wid, lambda v: v["status"] == "COMPLETED")
    children = view["steps"][0]["children"]
    page = signed_in(browser, drill)
    page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
    expect(page.get_by_role("img", name="Steps and their dependencies")).to_contain_text("map: 3/3 ended")
    # The children, filtered by status from the form, each a link
    page.get_by_role("link", name="all of them, by status").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Children of map step charge_all")
    page.get_by_label("Status").select_option("COMPLETED")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/children?status=COMPLETED")
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text(f"{children['id_prefix']}0")
    rows.first.get_by_role("link").click()
    page.wait_for_url(f"**/workflows/{quote(children['id_prefix'], safe='')}0")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"{children['id_prefix']}0")
    expect(page.locator("main")).to_contain_text("COMPLETED")
    page.close()
    screenshot(browser, drill, shots, "map-children", f"/workflows/{quote(wid, safe='')}/steps/charge_all/children")


def test_a_dead_letter_is_peeked_without_being_consumed(drill: Drill, browser: Browser, shots: Path) -> None:
    letter = stale_flight_request("wf-dead-letter", time.time(), attempt=2)
    sqs = drill.stack.client("sqs")
    sqs.send_message(QueueUrl=drill.stack.physical_ids["FlightsDeadLetterQueue"], MessageBody=encode(letter))
    page = signed_in(browser, drill)
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Dead letters").click()
    row = page.get_by_role("row", name="FlightsDeadLetterQueue")
    expect(row).to_contain_text("1")
    row.get_by_role("link").click()
    expect(page.locator("tbody")).to_contain_text("wf-dead-letter")
    expect(page.locator("tbody")).to_contain_text("reserve_flight")
    page.reload()  # peeked, not consumed: it is still there
    expect(page.locator("tbody")).to_contain_text("wf-dead-letter")
    page.close()
    screenshot(browser, drill, shots, "dead-letters", "/dead-letters/FlightsDeadLetterQueue")
    screenshot(browser, drill, shots, "definitions", "/definitions/trip-booking/1")


def test_markup_in_a_step_output_stays_text_and_runs_nothing(drill: Drill, browser: Browser) -> None:
    wid = drill.held_trip()
    status, _ = drill.operator.post(
        f"/ops/workflows/{quote(wid, safe='')}/skip",
        {"reason": "<img src=x onerror=document.title='pwned'>", "step": "charge_card", "output": XSS},
    )
    assert status == 200
    drill.wait(wid, lambda v: v["status"] == "COMPLETED")
    page = signed_in(browser, drill)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
    output = page.locator("#step-charge_card pre.json").first
    expect(output).to_contain_text("<script>document.title='pwned'</script>")  # shown as the text it is
    expect(output).to_contain_text("javascript:alert(1)")
    assert page.title() == f"{wid} · sasflow console"  # no script of the output ran
    assert page.locator("main script").count() == 0 and page.locator("main img").count() == 0
    assert page.locator("a[href^='javascript:']").count() == 0
    assert errors == []
    page.close()


def test_without_the_token_or_with_another_host_nothing_is_served(drill: Drill, browser: Browser) -> None:
    base = drill.console.url.split("/?")[0]
    page = browser.new_page()
    answer = page.goto(base + "/")
    assert answer is not None and answer.status == 403
    expect(page.get_by_role("heading", level=1)).to_have_text("Open the console with its token")
    answer = page.goto(base + "/?token=not-the-token")
    assert answer is not None and answer.status == 403
    page.close()
    # Another Host header (what a rebound DNS name sends) is refused, even with the right token
    port = urlsplit(base).port
    request = urllib.request.Request(drill.console.url, headers={"Host": f"rebound.example:{port}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)  # nosec B310 # loopback, the console under test
    assert refused.value.code == 403
    assert b"answers only at its loopback address" in refused.value.read()


def test_a_running_workflows_page_follows_it_to_its_end_without_a_reload(drill: Drill, browser: Browser) -> None:
    # Given a trip whose payment takes 4 s, open while it runs
    drill.servers["payments"].service.update_knobs({"latency_ms": 4000})
    try:
        wid = drill.start(trip())
        drill.wait(wid, lambda v: v["steps"][1]["status"] == "COMPLETED")
        page = signed_in(browser, drill)
        navigations: list[str] = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url))
        page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
        expect(page.locator("main")).to_have_attribute("data-refresh", "3")
        expect(page.locator("h1 + dl .status").first).to_have_text("RUNNING")
        page.locator("#step-book_hotel details summary").click()  # a section the operator opened
        # When it completes, the page says so by itself (the script fetches it again), and stops refreshing
        expect(page.locator("h1 + dl .status").first).to_have_text("COMPLETED", timeout=30_000)
        expect(page.locator("main")).not_to_have_attribute("data-refresh", "3")
        assert len(navigations) == 1  # no reload: the one navigation is the goto
        assert page.locator("#step-book_hotel details").get_attribute("open") is not None  # still open
        # and the keyboard's focus is where it was (the trial lost it to the page at every refresh)
        assert page.evaluate("document.activeElement.closest('section').id + ' ' + document.activeElement.tagName") == (
            "step-book_hotel SUMMARY"
        )
        page.close()
    finally:
        drill.servers["payments"].service.update_knobs({"latency_ms": 0})


def operator_actions(drill: Drill, workflow_id: str) -> list[dict[str, Any]]:
    _, history = drill.operator.get(f"/ops/workflows/{quote(workflow_id, safe='')}/history")
    return [e["detail"] for e in history["events"] if e["kind"] == "operator_action"]


def test_the_acting_drill_retries_a_held_workflow_with_an_edited_input_and_a_second_send_acts_once(
    drill: Drill, browser: Browser, shots: Path
) -> None:
    # Given a HELD trip, found from the list
    wid = drill.held_trip()
    page = signed_in(browser, drill)
    held = page.locator("section", has=page.get_by_role("heading", name="Needs a person: HELD"))
    held.get_by_role("link", name=wid).click()
    page.wait_for_url(f"**/workflows/{quote(wid, safe='')}")
    # When the operator retries the payment from its page
    page.get_by_role("link", name="Retry charge_card").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Retry charge_card")
    editor = page.locator("textarea#value")
    expect(editor).to_have_value(re.compile(r'"amount": 420'))
    # The JSON editor says where the text is not JSON, and the form is not sent until it is
    editor.fill('{"amount": 99, "currency": "EUR",}')
    expect(page.locator("#value-problem")).to_contain_text("Not JSON")
    page.locator("textarea#reason").fill("customer agreed to a smaller amount")
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Retry charge_card")  # still the form: not sent
    assert "What it will do" not in page.content()
    editor.fill('{"amount": 99, "currency": "EUR"}')
    expect(page.locator("#value-problem")).to_be_hidden()
    page.get_by_role("button", name="Preview").click()
    # The preview says what will happen, with the edited input, before anything is sent
    preview = page.locator("section.preview")
    expect(preview).to_contain_text("Step charge_card runs again with a new budget of attempts, with the edited input")
    expect(preview).to_contain_text('"amount": 99')
    screenshot_page(page, shots, "act-preview")
    assert operator_actions(drill, wid) == []
    drill.servers["payments"].service.update_knobs({"rejection_rate": 0.0})
    sent = page.evaluate(
        "Object.fromEntries(new FormData(document.querySelector('section.preview form')))"
    )  # the confirmation's fields, to send again as a second tab would
    action_url = page.url
    page.get_by_role("button", name="Confirm: Retry charge_card").dblclick()  # a double click
    # Then the workflow's page says what was done, and follows the workflow to COMPLETED by itself
    page.wait_for_url(re.compile(r".*/workflows/[^?]+\?done=console-[0-9a-f]{32}$"))
    expect(page.get_by_role("status")).to_contain_text("Retry a failed step: charge_card: done at")
    expect(page.locator("h1 + dl .status").first).to_have_text("COMPLETED", timeout=30_000)
    # And the same confirmation sent again (another tab, a resubmitted form) acts once: the same Idempotency-Key
    origin = drill.console.url.split("/?")[0]
    again = page.request.post(
        action_url, form={**sent, "intent": "confirm"}, headers={"Origin": origin}, max_redirects=0
    )
    assert again.status == 303 and again.headers["location"] == urlsplit(page.url).path + "?" + urlsplit(page.url).query
    [retry] = operator_actions(drill, wid)
    assert (retry["action"], retry["reason"], retry["step"]) == (
        "retry",
        "customer agreed to a smaller amount",
        "charge_card",
    )
    assert retry["principal"] == "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"
    page.close()


def screenshot_page(page: Page, shots: Path, name: str) -> None:
    file = shots / f"{name}-wide.png"
    file.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(file))
    assert file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_reload_keeps_the_form_being_filled_in_and_a_cancel_is_sent_once(drill: Drill, browser: Browser) -> None:
    # Given a trip whose payment takes 6 s: RUNNING while the operator fills in the cancel form
    drill.servers["payments"].service.update_knobs({"latency_ms": 6000})
    try:
        wid = drill.start(trip())
        page = signed_in(browser, drill)
        page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
        page.get_by_role("link", name="Cancel").click()
        page.wait_for_url("**/act/cancel*")
        page.wait_for_load_state("load")  # the page's script has run, as it has by the time a person types
        page.locator("textarea#reason").fill("the customer cancelled by phone")
        page.reload()  # a reload (or a crashed tab) gives the form back as it was filled in, and says so
        expect(page.locator("textarea#reason")).to_have_value("the customer cancelled by phone")
        expect(page.locator("p.restored")).to_contain_text("Restored what you typed earlier in this tab (not sent)")
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("section.preview")).to_contain_text("The workflow is cancelled (RUNNING → CANCELLING)")
        page.get_by_role("button", name="Confirm: Cancel").dblclick()  # a double click
        page.wait_for_url(re.compile(r".*\?done=console-"))
        expect(page.locator("h1 + dl .status").first).to_have_text("CANCELLED", timeout=30_000)
        assert [d["action"] for d in operator_actions(drill, wid)] == ["cancel"]
        page.close()
    finally:
        drill.servers["payments"].service.update_knobs({"latency_ms": 0})


def test_text_typed_before_the_pages_script_ran_is_kept_through_a_reload(drill: Drill, browser: Browser) -> None:
    # Given the cancel form of a HELD trip whose script is held back (a slow network): the operator types first
    wid = drill.held_trip()
    page = signed_in(browser, drill)
    held: list[Any] = []
    page.route("**/static/console.js", lambda route: held.append(route) if not held else route.continue_())
    page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}/act/cancel", wait_until="commit")
    page.locator("textarea#reason").fill("typed while the page was loading")  # no listener heard it
    page.wait_for_timeout(0)  # let the held request reach its handler
    assert len(held) == 1
    held[0].continue_()
    page.wait_for_load_state("load")
    # When the page is reloaded
    page.reload()
    # Then the text is given back, and the page says so
    expect(page.locator("textarea#reason")).to_have_value("typed while the page was loading")
    expect(page.locator("p.restored")).to_contain_text("Restored what you typed earlier in this tab (not sent)")
    assert operator_actions(drill, wid) == []
    page.close()


def test_a_forged_form_from_another_page_of_this_machine_is_refused(drill: Drill, browser: Browser) -> None:
    # Given an operator signed in, and a page of another port of 127.0.0.1 (the same site to a browser, so the
    # console's cookie goes with its requests) that sends a cancel form to the console as soon as it opens
    wid = drill.held_trip()
    target = drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}/act/cancel"
    evil = (
        f'<html><body><form id="f" method="post" action="{target}">'
        '<input name="reason" value="forged"><input name="intent" value="confirm"></form>'
        '<script>document.getElementById("f").submit()</script></body></html>'
    ).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(evil)

        def log_message(self, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = signed_in(browser, drill)
        with page.expect_response(lambda r: r.url == target) as answered:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        # Then the console refuses it, and the workflow is as it was
        assert answered.value.status == 403
        expect(page.get_by_role("heading", level=1)).to_have_text("Refused: not sent from this console's own page")
        expect(page.locator("main")).to_contain_text("another origin")
        assert drill.wait(wid, lambda v: True)["status"] == "HELD"
        assert operator_actions(drill, wid) == []
        page.close()
    finally:
        server.shutdown()


def act_from_the_page(page: Page, link: str, reason: str, confirm: str) -> None:
    """Open an action from the workflow's page, give the reason, preview it, and confirm it."""
    page.get_by_role("link", name=link).click()
    page.locator("textarea#reason").fill(reason)
    page.get_by_role("button", name="Preview").click()
    expect(page.get_by_role("heading", name="What it will do")).to_be_visible()
    page.get_by_role("button", name=confirm).click()
    page.wait_for_url(re.compile(r".*\?done=console-[0-9a-f]{32}$"))


def test_the_drill_approves_a_callback_and_redrives_a_dead_letter_watching_its_move(
    drill: Drill, browser: Browser, shots: Path
) -> None:
    # Given client-a's trip waiting for its approval
    request = trip()
    request["definition"]["steps"].insert(1, {"name": "approval", "type": "callback", "timeout_seconds": 600})
    wid = drill.start(request)
    drill.wait(wid, lambda v: v["steps"][1]["status"] == "PROCESSING")
    page = signed_in(browser, drill)
    page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
    assert page.locator("main").get_attribute("data-refresh") is None  # it waits for a person: the page stays still
    # When the operator approves it from the page, with an output
    page.get_by_role("link", name="Approve approval").click()
    page.locator("textarea#value").fill('{"approved_by": "on-call"}')
    page.locator("textarea#reason").fill("budget confirmed by phone")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("section.preview")).to_contain_text("The steps that wait for it run next: book_hotel.")
    page.get_by_role("button", name="Confirm: Approve approval").click()
    # Then the trip goes on to COMPLETED, and the history says who approved it and why
    expect(page.locator("h1 + dl .status").first).to_have_text("COMPLETED", timeout=30_000)
    [audit] = operator_actions(drill, wid)
    assert (audit["action"], audit["step"], audit["reason"]) == ("approve", "approval", "budget confirmed by phone")
    expect(page.locator("table.history")).to_contain_text("budget confirmed by phone")
    # And a dead letter is redriven from its queue's page, its move followed to its end
    letter = stale_flight_request(wid, time.time())
    sqs = drill.stack.client("sqs")
    dlq = drill.stack.physical_ids["FlightsDeadLetterQueue"]
    sqs.send_message(QueueUrl=dlq, MessageBody=encode(letter))
    page.goto(drill.console.url.split("/?")[0] + "/dead-letters/FlightsDeadLetterQueue")
    page.get_by_role("link", name="Redrive FlightsDeadLetterQueue").click()
    page.locator("textarea#reason").fill("flights is back")
    page.get_by_role("button", name="Preview").click()
    expect(page.locator("section.preview")).to_contain_text("back to the queue it came from")
    page.get_by_role("button", name="Confirm: redrive FlightsDeadLetterQueue").click()
    page.wait_for_url(re.compile(r".*/dead-letters/FlightsDeadLetterQueue/moves\?done=console-"))
    expect(page.get_by_role("status")).to_contain_text("Redrive of FlightsDeadLetterQueue: started at")
    expect(page.locator("tbody tr").first).to_contain_text("COMPLETED")
    screenshot_page(page, shots, "redrive-moves")
    depth = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])
    assert depth["Attributes"]["ApproximateNumberOfMessages"] == "0"
    page.close()


def test_a_batch_retries_every_held_trip_a_listing_found_from_its_dry_run_to_its_end(
    drill: Drill, browser: Browser, shots: Path
) -> None:
    # Given two trips of their own definition HELD at their payment
    payments = drill.servers["payments"].service
    payments.update_knobs({"rejection_rate": 1.0})
    try:
        ids = [drill.start(trip(name="trip-batch", on_failure="hold")) for _ in range(2)]
        for wid in ids:
            drill.wait(wid, lambda v: v["status"] == "HELD")
    finally:
        payments.update_knobs({"rejection_rate": 0.0})
    page = signed_in(browser, drill)
    page.goto(drill.console.url.split("/?")[0] + "/?status=HELD&definition=trip-batch")
    # When the operator acts on every workflow the listing found: a dry run, then the batch
    page.get_by_role("link", name="Act on every workflow this filter finds (a batch)").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Start a batch")
    expect(page.locator("input#definition")).to_have_value("trip-batch")
    page.locator("input#step").fill("charge_card")
    page.locator("textarea#reason").fill("payments are back")
    page.get_by_role("button", name="Dry run").click()
    expect(page.locator("section.preview")).to_contain_text("on each of the 2 workflow(s) found now: 2 HELD.")
    page.get_by_role("button", name="Confirm: start the batch").dblclick()  # a double click
    # Then its page follows it to its end, each trip done and COMPLETED
    page.wait_for_url(re.compile(r".*/batches/b-[0-9a-f]+\?done=console-[0-9a-f]{32}$"))
    expect(page.get_by_role("status")).to_contain_text("Batch: Retry a failed step: done at")
    expect(page.locator("dl.facts .status").first).to_have_text("COMPLETED", timeout=60_000)
    expect(page.locator("ul.counts")).to_contain_text("Done 2")
    for wid in ids:
        drill.wait(wid, lambda v: v["status"] == "COMPLETED")
        assert [a["action"] for a in operator_actions(drill, wid)] == ["retry"]
    screenshot_page(page, shots, "batch")
    page.goto(drill.console.url.split("/?")[0] + "/batches")
    expect(page.locator("tbody tr")).to_have_count(1)
    page.close()


def test_the_drill_retries_then_resolves_a_failed_compensation(drill: Drill, browser: Browser) -> None:
    flights, payments = drill.servers["flights"].service, drill.servers["payments"].service
    # Given a trip whose payment is declined, whose flight's compensation then fails every attempt
    request = trip()
    for step in request["definition"]["steps"]:
        step["compensation"]["timeout_seconds"] = 60
        step["compensation"]["retry"] = {"max_attempts": 2, "backoff_base_seconds": 0.5, "backoff_cap_seconds": 1}
    payments.update_knobs({"rejection_rate": 1.0, "latency_ms": 2000})
    try:
        wid = drill.start(request)
        drill.wait(wid, lambda v: v["steps"][0]["status"] == "COMPLETED")
        flights.update_knobs({"transient_error_rate": 1.0})
        drill.wait(wid, lambda v: v["status"] == "COMPENSATION_FAILED", seconds=90)
        # When the operator finds it among those that need a person and retries the compensation (still failing)
        page = signed_in(browser, drill)
        waiting = page.locator("section", has=page.get_by_role("heading", name="Needs a person: COMPENSATION_FAILED"))
        waiting.get_by_role("link", name=wid).click()
        act_from_the_page(
            page,
            "Retry the compensation of reserve_flight",
            "flights said it works again",
            "Confirm: Retry the compensation of reserve_flight",
        )
        expect(page.get_by_role("status")).to_contain_text("Retry a failed compensation: reserve_flight: done at")
        drill.wait(wid, lambda v: v["status"] == "COMPENSATION_FAILED" and v["steps"][0]["compensation_attempt"] == 4)
        # Then, once it failed again, resolves it by hand: the trip ends COMPENSATED
        page.goto(drill.console.url.split("/?")[0] + f"/workflows/{quote(wid, safe='')}")
        act_from_the_page(
            page,
            "Resolve the compensation of reserve_flight",
            "cancelled by phone with the airline",
            "Confirm: Resolve the compensation of reserve_flight",
        )
        expect(page.locator("h1 + dl .status").first).to_have_text("COMPENSATED", timeout=30_000)
        assert [(d["action"], d["step"]) for d in operator_actions(drill, wid)] == [
            ("retry-compensation", "reserve_flight"),
            ("resolve", "reserve_flight"),
        ]
        page.close()
    finally:
        flights.update_knobs({"transient_error_rate": 0.0})
        payments.update_knobs({"rejection_rate": 0.0, "latency_ms": 0})
