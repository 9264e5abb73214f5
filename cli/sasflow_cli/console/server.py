"""``sasflow console``: the operators' web page, served on 127.0.0.1 and signed on the server (issues 35, 36).

The console is a WSGI application (Werkzeug routing, Jinja2 templates, all in this package: nothing is fetched from
the internet and nothing is built). Every page is one or a few calls to the HTTP API through the CLI's own
`SasflowClient`, signed with the operator's credentials in this process: the browser never holds a credential, and
nothing new is deployed.

Safe on loopback:

- **Bound to 127.0.0.1** (`serve`), on a port of its own.
- **A token.** `serve` prints ``http://127.0.0.1:<port>/?token=<random>`` (as Jupyter does). The first request
  with the token gets a session cookie (``HttpOnly``, ``SameSite=Strict``) and is redirected to the same page
  without the token in its address; every other request needs the cookie and is refused with 403 without it.
- **The Host header** must name the loopback address and the console's port (``127.0.0.1``, ``localhost`` or
  ``[::1]``): a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) is refused with 403.
- **Escaped.** Every value from a workflow (ids, names, inputs, outputs, errors, reasons) reaches the page through
  Jinja2's autoescape or `html.escape`; links to other pages are built from URL-quoted ids, never from a value.
- **Headers.** A Content-Security-Policy allows scripts and styles from the console itself only (no inline
  script, no inline style), no framing, forms only to itself; ``no-store``, ``nosniff``, a referrer to itself only.
- **Forms act only from the console's own pages** (`Console._forged`): each carries a CSRF token bound to the
  session, and a form from another ``Origin`` (another site, or another port of this machine, which a browser
  counts as the same site) is refused with 403. Each action is sent once by its form's Idempotency-Key
  (`Console._send`), after a preview of what it will do (``actions.py``).
- **What the credentials may do.** A client identity reads its own workflows by id through the clients' routes;
  the operator pages (the lists, dead letters) say why they are not shown. A 403 or 404 from the API is shown with
  its message and what it means.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from werkzeug.exceptions import HTTPException, NotFound, RequestEntityTooLarge
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from ..client import ApiError, SasflowClient
from ..render import ATTENTION_KINDS, dollars, when
from ..timeline import COLOURS
from ..timeline import svg as timeline_svg
from ..timeline import timeline as build_timeline
from . import graph
from .actions import ACTIONS, NOT_GIVEN, TERMINAL, fingerprint, offered, preview

__all__ = ["COOKIE", "SECURITY_HEADERS", "Console", "ConsoleServer"]

#: The session cookie's name, followed by the console's port: a browser keeps cookies by host, not by port, so two
#: consoles (an operator's and a client's) would otherwise end each other's session.
COOKIE = "sasflow_console"
#: Sent with every answer.
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with the console's own forms
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATUSES = (
    "RUNNING",
    "COMPENSATING",
    "CANCELLING",
    "HELD",
    "COMPENSATION_FAILED",
    "PAUSED",
    "QUEUED",
    "COMPLETED",
    "COMPENSATED",
    "CANCELLED",
)
#: A workflow in these statuses moves by itself: its page refreshes itself.
MOVING = ("RUNNING", "COMPENSATING", "CANCELLING")
#: Workflows per page of a listing.
PAGE = 50
#: A JSON value longer than this is cut on the page (the whole of it is one click away, as a download).
SHOWN_CHARS = 20_000
#: What a step shows of its view, as JSON.
SHOWN_KEYS = ("output", "error", "compensation_output", "compensation_error")
#: Step types that take an input (``GET /ops/workflows/{id}/steps/{step}/input``).
INPUT_STEPS = ("task", "callback")
#: Seconds between refreshes of a page whose workflow still runs.
REFRESH_SECONDS = 3
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: An Idempotency-Key the API takes (``types.IdempotencyKey``).
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: A rejection's error code (``ops_api.OperatorCallbackRequest``).
ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
#: Actions whose outcome the console keeps (the newest), so a form sent again is answered with the first outcome.
KEPT_OUTCOMES = 1000
#: The largest form the console reads (a retry's edited input; the API refuses a body over its own limit).
MAX_FORM_BYTES = 2 * 1024 * 1024


class _Request(Request):
    max_content_length = MAX_FORM_BYTES
    max_form_memory_size = MAX_FORM_BYTES


@dataclass(frozen=True)
class Outcome:
    """What an action sent from the console did: kept by its Idempotency-Key (`Console.outcomes`). ``subject`` is the
    workflow acted on (or ``queue:<name>``, a redrive), ``status`` where it was then (or the move task's handle)."""

    subject: str
    action: str
    step: str | None
    label: str
    status: str
    paused: bool
    at: int


def _epoch(text: str | None) -> int | None:
    """A ``datetime-local`` field's value (UTC) as epoch seconds; None when empty."""
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())
    except ValueError:
        raise UsageError(f"{text!r} is not a date and time (YYYY-MM-DDTHH:MM, UTC)") from None


def _positive(text: str | None, name: str) -> int | None:
    """A whole number field (None when empty)."""
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{name} {text!r}: a whole number, 1 or more")
    return int(text)


def _compact(value: Any) -> str:
    """One line of JSON, characters as they are (the page escapes them; ``tojson`` would show ``\u003c``)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def _cut(text: str) -> tuple[str, bool]:
    return (text[:SHOWN_CHARS], True) if len(text) > SHOWN_CHARS else (text, False)


def _claim(value: Any) -> dict[str, Any] | None:
    """A claim-check reference's digest and size (``claim_check.py``), or None when ``value`` is not one."""
    if not (isinstance(value, dict) and len(value) == 1 and isinstance(value.get("$claim_check"), dict)):
        return None
    claim = value["$claim_check"]
    digest = claim.get("sha256") or str(claim.get("key", "")).rsplit("/", 1)[-1]
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        return None
    return {"sha256": digest, "bytes": claim.get("bytes")}


def _shown(value: Any) -> dict[str, Any]:
    """How a JSON value is shown: its text (cut at `SHOWN_CHARS`), or the claim-check reference it is."""
    claim = _claim(value)
    if claim is not None:
        return {"claim": claim}
    text, cut = _cut(_pretty(value))
    return {"text": text, "cut": cut}


def _download(value: Any, name: str) -> Response:
    """``value`` as a JSON file to save (its name made safe for any file system)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return Response(
        json.dumps(value, indent=2, ensure_ascii=False),
        content_type="application/json; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{safe}"'},
    )


def _moves_by_itself(view: Mapping[str, Any]) -> bool:
    """Whether the workflow moves without a person: running, not paused, and not only waiting for a callback's
    answer (a page that waits for a person stays still while it is read: its focus and selection are kept)."""
    if view["status"] not in MOVING or view.get("paused"):
        return False
    in_flight = [s for s in view["steps"] if s["status"] == "PROCESSING"]
    return view["status"] != "RUNNING" or not in_flight or any(s.get("type") != "callback" for s in in_flight)


def _status_css(status: Any) -> str:
    return "st-" + str(status or "pending").lower().replace("_", "-")


def _path(*segments: Any) -> str:
    return "/" + "/".join(quote(str(s), safe="") for s in segments)


def _no_constant(name: str) -> Any:
    raise ValueError(name)


class UsageError(Exception):
    """A filter that cannot be used: shown on the page beside the form (400)."""


def _json_value(text: str, what: str, *, an_object: bool) -> Any:
    """The JSON an action's form carries, or a `UsageError` saying where and why it is not JSON (the API's JSON: no
    NaN or Infinity, and no number too large for a double, which Python would read as one)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
        json.dumps(value, allow_nan=False)
    except json.JSONDecodeError as error:
        raise UsageError(f"the {what} is not JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None
    except ValueError:
        raise UsageError(f"the {what} holds a number JSON cannot carry (NaN, Infinity, or one too large)") from None
    if an_object and not isinstance(value, dict):
        raise UsageError(f"the {what} must be a JSON object ({{...}}), not {type(value).__name__}")
    return value


@dataclass
class Console:
    """The console's WSGI application.

    Parameters
    ----------
    client:
        Signs and sends the API calls (the CLI's client for ``--url`` or ``--stack``).
    identity:
        Who signs, as the header says (``operator``, ``client-a``, a stack's name).
    port:
        The port it is served on: the Host header must name it.
    token:
        The secret of the printed URL (random when not given).
    """

    client: SasflowClient
    identity: str
    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    session: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def __post_init__(self) -> None:
        #: The CSRF token of every form: bound to the session (a new run of the console, a new session, a new token).
        self.csrf = hmac.new(self.session.encode(), b"sasflow-console-csrf", hashlib.sha256).hexdigest()
        self.outcomes: OrderedDict[str, Outcome] = OrderedDict()
        self._guard = threading.Lock()
        self._sending: dict[str, threading.Lock] = {}
        self.env = Environment(
            loader=PackageLoader("sasflow_cli.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(time=when, pretty=_pretty, compact=_compact, status_css=_status_css, dollars=dollars)
        self.env.globals.update(path=_path, identity=self.identity, operator=self.operator, statuses=STATUSES)
        self.routes = Map(
            [
                Rule("/", endpoint="workflows"),
                Rule("/workflows/<path:workflow_id>/steps/<step>/output.json", endpoint="step_output"),
                Rule("/workflows/<path:workflow_id>/steps/<step>/children", endpoint="map_children"),
                Rule("/workflows/<path:workflow_id>/steps/<step>/input", endpoint="step_input"),
                Rule("/workflows/<path:workflow_id>/steps/<step>/input.json", endpoint="step_input_json"),
                Rule("/workflows/<path:workflow_id>/payloads/<digest>.json", endpoint="payload_json"),
                Rule("/workflows/<path:workflow_id>/payloads/<digest>", endpoint="payload"),
                Rule("/workflows/<path:workflow_id>/act/<action>", endpoint="act", methods=["GET", "POST"]),
                Rule("/workflows/<path:workflow_id>", endpoint="workflow"),
                Rule("/dead-letters", endpoint="dead_letters"),
                Rule("/dead-letters/<queue>/redrive", endpoint="redrive", methods=["GET", "POST"]),
                Rule("/dead-letters/<queue>/moves", endpoint="moves"),
                Rule("/dead-letters/<queue>", endpoint="dead_letter_queue"),
                Rule("/batches", endpoint="batches"),
                Rule("/batches/new", endpoint="batch_new", methods=["GET", "POST"]),
                Rule("/batches/<batch_id>/cancel", endpoint="batch_cancel", methods=["POST"]),
                Rule("/batches/<batch_id>", endpoint="batch"),
                Rule("/definitions", endpoint="definitions"),
                Rule("/definitions/<name>", endpoint="definition"),
                Rule("/definitions/<name>/<int:version>", endpoint="definition_version"),
                Rule("/static/<file>", endpoint="static"),
                Rule("/favicon.ico", endpoint="favicon"),
            ],
            strict_slashes=False,
        )

    @property
    def cookie(self) -> str:
        return f"{COOKIE}_{self.port}"

    @property
    def operator(self) -> bool:
        return self.client.routes.operator

    @property
    def url(self) -> str:
        """The URL to open: the only one that carries the token."""
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = _Request(environ)
        response = self.respond(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
        return response(environ, start_response)

    def respond(self, request: Request) -> Response:
        if not self._host_allowed(request.host):
            return self._refusal(
                403,
                "This console answers only at its loopback address",
                f"the request named the host {request.host!r}; open the URL that sasflow console printed "
                f"(http://127.0.0.1:{self.port}/...). A page of another site that resolves to 127.0.0.1 is refused.",
                bare=True,
            )
        adapter = self.routes.bind_to_environ(request.environ)
        try:
            endpoint, values = adapter.match()
        except NotFound:
            return self._refusal(404, "No such page", f"{request.path} is not a page of this console", bare=True)
        except HTTPException as error:
            return error.get_response(request.environ)
        if endpoint == "static":
            return self._static(values["file"])
        if endpoint == "favicon":
            return Response(status=204)  # none: a browser asks for one on every page
        token = request.args.get("token")
        if token is not None:
            if not hmac.compare_digest(token.encode(), self.token.encode()):
                why = "open the URL that sasflow console printed, token included"
                return self._refusal(403, "Wrong token", why, bare=True)
            rest = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
            response = Response(status=303, headers={"Location": request.path + (f"?{rest}" if rest else "")})
            response.set_cookie(self.cookie, self.session, httponly=True, samesite="Strict", path="/")
            return response
        if not hmac.compare_digest(request.cookies.get(self.cookie, "").encode(), self.session.encode()):
            return self._refusal(
                403,
                "Open the console with its token",
                "this browser has no session of this console: open the URL that sasflow console printed, with its "
                "?token=..., once; the console then keeps a cookie. A new run of sasflow console has a new token.",
                bare=True,
            )
        if request.method not in ("GET", "HEAD"):
            if endpoint not in ACTING:
                return self._refusal(405, "Not a form", f"{request.path} is read, never sent to")
            try:
                request.form  # noqa: B018 # read now: a form over MAX_FORM_BYTES is refused here, with its page
            except RequestEntityTooLarge:
                why = (
                    f"the console takes a form of up to {MAX_FORM_BYTES // (1024 * 1024)} MiB; an input this large "
                    "belongs in the payload bucket (a claim-check), not in an edited retry"
                )
                return self._refusal(413, "Too large", why)
            forged = self._forged(request)
            if forged:
                return self._refusal(403, "Refused: not sent from this console's own page", forged)
        try:
            page: Response = getattr(self, f"page_{endpoint}")(request, **values)
        except ApiError as error:
            return self._api_refusal(error)
        except UsageError as error:
            return self._refusal(400, "This filter cannot be used", str(error))
        return page

    def _host_allowed(self, host: str) -> bool:
        return host in {f"{name}:{self.port}" for name in LOOPBACK_HOSTS}

    def _forged(self, request: Request) -> str:
        """Why a form sent to the console is not its own (empty when it is): another origin sent it, or it lacks the
        session's CSRF token. A page of another site, or of another port of this machine (which a browser counts as
        the same site, and sends the cookie to), has neither the origin nor the token."""
        origin = request.headers.get("Origin")
        if origin is not None and origin not in {f"http://{name}:{self.port}" for name in LOOPBACK_HOSTS}:
            return f"the form came from {origin!r}, another origin: only the console's own pages may act"
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            return "the browser says the form came from another site: only the console's own pages may act"
        token = request.form.get("csrf", "")
        if not hmac.compare_digest(token.encode(), self.csrf.encode()):
            return (
                "the form has no valid CSRF token of this session: reload the page and send it again (a form of an "
                "earlier run of sasflow console is not valid in this one)"
            )
        return ""

    # ------------------------------------------------------------------ answers
    def _html(self, template: str, http_status: int = 200, **context: Any) -> Response:
        body = self.env.get_template(template).render(**context)
        return Response(body, status=http_status, content_type="text/html; charset=utf-8")

    def _refusal(self, status: int, title: str, message: str, *, bare: bool = False) -> Response:
        """An error page; ``bare`` (no session yet) shows no navigation and not who signs."""
        return self._html("error.html", status, title=title, message=message, code=str(status), bare=bare)

    def _api_refusal(self, error: ApiError) -> Response:
        if error.status == 0:
            return self._refusal(502, "The API did not answer", error.message)
        if error.status == 403:
            why = (
                f"signed as {self.identity}, the API refused the call: {error.message}. The operator pages need an "
                "operator's credentials (locally --as operator; on AWS a role granted execute-api:Invoke on /ops)."
            )
            return self._html("error.html", 403, title="Not allowed", message=why, code=error.code)
        if error.status == 404 and not self.operator:
            why = (
                f"{error.message}. Signed as {self.identity} (a client), you see only the workflows you started; an "
                "operator sees every workflow."
            )
            return self._html("error.html", 404, title="Not found", message=why, code=error.code)
        title = "Not found" if error.status == 404 else "The API refused the call"
        return self._html(
            "error.html", error.status, title=title, message=error.message, code=error.code, details=error.details
        )

    def _static(self, file: str) -> Response:
        types = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
        suffix = file[file.rfind(".") :] if "." in file else ""
        resource = resources.files("sasflow_cli.console").joinpath("static", file)
        if suffix not in types or "/" in file or not resource.is_file():
            return self._refusal(404, "No such file", f"{file} is not a file of this console", bare=True)
        response = Response(resource.read_bytes(), content_type=types[suffix])
        return response

    # ------------------------------------------------------------------ pages
    def page_workflows(self, request: Request) -> Response:
        args = request.args
        wanted = args.get("id", "").strip()
        if wanted:
            return Response(status=303, headers={"Location": _path("workflows", wanted)})
        if not self.operator:
            return self._html("workflows_client.html", workflow_id="")
        try:
            return self._workflows(args)
        except UsageError as error:
            return self._find_again(args, str(error), 400)
        except ApiError as error:
            if error.status not in (400, 404, 422):
                raise
            problems = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in error.details)
            return self._find_again(
                args, f"{error.code}: {error.message}" + (f" ({problems})" if problems else ""), error.status
            )

    def _find_again(self, args: Any, problem: str, http_status: int) -> Response:
        """The find form as it was filled in, with why the API or the console could not use it."""
        empty: dict[str, Any] = {"workflows": [], "next_cursor": None, "source": "", "notes": []}
        return self._html(
            "workflows.html",
            http_status,
            args=args,
            problem=problem,
            counts={},
            waiting=[],
            listing=empty,
            filtered=True,
            next_url=None,
            page_size=PAGE,
        )

    def _workflows(self, args: Any) -> Response:
        status = args.get("status") or None
        if status is not None and status not in STATUSES:
            raise UsageError(f"status {status!r}: one of {', '.join(STATUSES)}")
        filters: dict[str, Any] = {
            "status": status,
            "definition": args.get("definition") or None,
            "trigger": args.get("trigger") or None,
            "version": _positive(args.get("version"), "version"),
            "owner": args.get("owner") or None,
            "error_code": args.get("error_code") or None,
            "step": args.get("step") or None,
            "started_after": _epoch(args.get("started_after")),
            "started_before": _epoch(args.get("started_before")),
        }
        filtered = any(value is not None for value in filters.values())
        cursor = args.get("cursor") or None
        waiting: list[tuple[str, list[dict[str, Any]]]] = []
        if not filtered and cursor is None:
            for kind in ATTENTION_KINDS:  # the ones that need a person first
                [first] = self.client.list_pages(status=kind, limit=PAGE, counts=False)  # the listing counts
                waiting.append((kind, first["workflows"]))
        [listing] = self.client.list_pages(**filters, cursor=cursor, limit=PAGE)
        counts = listing.get("counts") or {}
        next_query = {k: v for k, v in args.items() if k != "cursor" and v}
        following = listing["next_cursor"]
        next_url = "/?" + urlencode({**next_query, "cursor": following}) if following else None
        acts = status is not None and status not in TERMINAL and listing["workflows"]
        return self._html(
            "workflows.html",
            args=args,
            counts=counts,
            waiting=waiting,
            listing=listing,
            filtered=filtered,
            next_url=next_url,
            batch_url="/batches/new?" + urlencode(next_query) if acts else None,
            page_size=PAGE,
        )

    def page_workflow(self, request: Request, workflow_id: str) -> Response:
        view = self.client.get(workflow_id)
        done = self.outcomes.get(request.args.get("done", ""))
        history = self.client.history(workflow_id)
        events = history["events"]
        line = build_timeline(events, view)
        steps = []
        for step in view["steps"]:
            shown = {key: _shown(step[key]) for key in SHOWN_KEYS if step.get(key) is not None}
            if step["status"] == "COMPLETED" and "output" not in shown:
                shown["output"] = _shown(None)  # its output is JSON null (an operator's skip may give it): said so
            attempts = [e for e in events if e.get("step") == step["name"] and e.get("attempt") is not None]
            takes_input = step.get("type") in INPUT_STEPS and step.get("attempt", 0) > 0  # dispatched at least once
            if takes_input and self.operator and step.get("error"):
                shown["input"] = self._step_input(workflow_id, step["name"])  # beside the error it led to
            steps.append({"view": step, "shown": shown, "events": attempts, "takes_input": takes_input})
        return self._html(
            "workflow.html",
            view=view,
            steps=steps,
            graph=graph.layout(view["steps"]),
            box=(graph.BOX_WIDTH, graph.BOX_HEIGHT),
            events=events,
            timeline=Markup(timeline_svg(line)) if line.bars or line.markers else None,  # nosec B704 # escaped
            colours=COLOURS,
            workflow_input=_shown(view["input"]),
            refresh=REFRESH_SECONDS if _moves_by_itself(view) else None,
            actor=_actor,
            offers=offered(view) if self.operator else [],
            done=done if done is not None and done.subject == workflow_id else None,
        )

    # ------------------------------------------------------------------ acting
    def page_act(self, request: Request, workflow_id: str, action: str) -> Response:
        """An action's form (GET), its preview, the form again to edit, or the action sent (POST ``intent``)."""
        spec = ACTIONS.get(action)
        if spec is None:
            return self._refusal(404, "No such action", f"{action!r}: one of {', '.join(ACTIONS)}")
        if not self.operator:
            return self._operators_only("operator actions")
        form = request.form
        step = (form.get("step") if request.method == "POST" else request.args.get("step")) or None
        if spec.step in ("failed", "callback") and not step:
            return self._refusal(400, "Which step?", f"{action} needs a step: open it from the workflow's page")
        view = self.client.get(workflow_id)
        key = form.get("key") or _new_key()
        if not KEY_PATTERN.fullmatch(key):
            return self._refusal(400, "Not an Idempotency-Key", "open the action again from the workflow's page")
        if key in self.outcomes and form.get("intent") != "confirm":
            key = _new_key()  # a form whose action was done, edited and previewed again: a new action, a new key
        before, unread = self._before(workflow_id, action, step)
        offer = next((o for o in offered(view) if o.action == action and o.step == step), None)
        seen_now = fingerprint(action, view, step)
        context: dict[str, Any] = {
            "view": view,
            "spec": spec,
            "step": step,
            "key": key,
            "csrf": self.csrf,
            "reason": form.get("reason", ""),
            "text": form.get("value", "" if before is None else _pretty(before)),
            "code": form.get("code", "REJECTED"),
            "unread": unread,
            "label": offer.label if offer else spec.title,
            "offered": offer is not None,
            "seen": seen_now,
            "opened": form.get("opened") or seen_now,
        }
        if request.method != "POST" or form.get("intent") == "edit":
            return self._html("act.html", stage="form", **context)
        try:
            reason = context["reason"].strip()
            if not reason:
                raise UsageError("a reason is needed: it is written to the workflow's history with your principal")
            given = context["text"].strip()
            # an empty field gives nothing (NOT_GIVEN); JSON null is a value given (a skip's or an approval's output)
            value = _json_value(given, spec.value, an_object=action == "retry") if spec.value and given else NOT_GIVEN
            if spec.code and not ERROR_CODE.fullmatch(context["code"]):
                raise UsageError(f"code {context['code']!r}: capitals, digits and _, starting with a capital")
        except UsageError as error:
            return self._html("act.html", 400, stage="form", problem={"message": str(error)}, **context)
        given_value = value is not NOT_GIVEN
        edited = action == "retry" and given_value and value != before
        if form.get("intent") == "confirm":
            with self._lock(key):  # a send of this form in flight (another click) ends first
                if self._kept(key, workflow_id, action, step) is not None:
                    return self._done(workflow_id, key)  # sent already (a double click, a resubmitted form)
        # sent without a preview's fingerprint (a form of its own): previewed first, as any other
        seen = form.get("seen")
        changed = form.get("intent") == "confirm" and seen is not None and seen != context["seen"]
        if form.get("intent") != "confirm" or seen is None or changed:
            # a confirmation of a preview the workflow has moved on from (another tab acted, a new attempt of a
            # callback began) is not sent: what it would do now is previewed again, to be confirmed again
            said = preview(action, view, step, value, edited, code=context["code"])
            return self._html(
                "act.html",
                409 if changed else 200,
                stage="preview",
                said=said,
                value=value,
                given=given_value,
                edited=edited,
                changed=changed,
                moved_since_opened=context["opened"] != context["seen"],
                **context,
            )
        sent = value if (edited or (action in ("skip", "approve") and given_value)) else NOT_GIVEN
        label = spec.title if step is None else f"{spec.title}: {step}"
        try:
            self._once(
                key,
                workflow_id,
                action,
                step,
                label,
                lambda: self._act(view, action, step, reason, sent, key, context["code"]),
            )
        except ApiError as error:
            problem = _problem(error)
            return self._html("act.html", error.status or 502, stage="form", problem=problem, **context)
        return self._done(workflow_id, key)

    def _done(self, workflow_id: str, key: str) -> Response:
        """To the workflow's page, which says what the action of ``key`` did."""
        return Response(
            status=303, headers={"Location": _path("workflows", workflow_id) + "?" + urlencode({"done": key})}
        )

    def _before(self, workflow_id: str, action: str, step: str | None) -> tuple[Any, str]:
        """What the form's JSON starts from (a retry: the step's input as its attempts got it; a skip: ``{}``), or
        None with why the input could not be read (the retry then keeps the input as it is unless one is given)."""
        if action == "skip":
            return {}, ""
        if action == "approve":
            return {"approved": True}, ""
        if action != "retry" or not step:
            return None, ""
        try:
            return self.client.step_input(workflow_id, step)["input"], ""
        except ApiError as error:
            return None, f"{error.code}: {error.message}"

    def _act(
        self, view: Mapping[str, Any], action: str, step: str | None, reason: str, value: Any, key: str, code: str
    ) -> tuple[str, bool]:
        """Send one action to the API: a callback's answer to ``POST /ops/callbacks/{token}`` (the token of the step
        as the page read it), any other to ``POST /ops/workflows/{id}/{action}``. The workflow's status after it,
        and whether it is paused."""
        workflow_id = view["workflow_id"]
        if action in ("approve", "reject"):
            found = next((s for s in view["steps"] if s["name"] == step), None)
            token = found.get("task_token") if found else None
            if not token:
                now = found["status"] if found else "not a step of this workflow"
                raise ApiError(
                    409,
                    "NOT_WAITING",
                    f"step {step} waits for no answer now ({now}): nothing was sent",
                    source="console",
                )
            result = self.client.answer_callback(
                token,
                action,
                reason=reason,
                idempotency_key=key,
                output=None if value is NOT_GIVEN else value,
                code=code,
            )
            return str(result["workflow_status"]), bool(view.get("paused"))
        after = self.client.act(
            workflow_id,
            action,
            reason=reason,
            idempotency_key=key,
            step=step,
            step_input=value if action == "retry" and value is not NOT_GIVEN else None,
            **({"output": value} if action == "skip" and value is not NOT_GIVEN else {}),
        )
        return str(after["status"]), bool(after.get("paused"))

    def _lock(self, key: str) -> threading.Lock:
        """The lock held while the action of ``key`` is sent."""
        with self._guard:
            return self._sending.setdefault(key, threading.Lock())

    def _kept(self, key: str, subject: str, action: str, step: str | None) -> Outcome | None:
        """The outcome of the action of ``key``, if it was done (on ``subject``, ``action`` and ``step``)."""
        kept = self.outcomes.get(key)
        return kept if kept is not None and (kept.subject, kept.action, kept.step) == (subject, action, step) else None

    def _once(
        self, key: str, subject: str, action: str, step: str | None, label: str, call: Callable[[], tuple[str, bool]]
    ) -> Outcome:
        """Make ``call`` once per Idempotency-Key: a form sent again (a double click, a resubmitted form, a second
        tab) waits for the first and gets its outcome; the API dedupes by the key as well (a redrive, which SQS
        cannot dedupe, only here)."""
        with self._lock(key):
            kept = self._kept(key, subject, action, step)
            if kept is not None:
                return kept
            status, paused = call()
            outcome = Outcome(subject, action, step, label, status, paused, int(time.time()))
            with self._guard:
                self.outcomes[key] = outcome
                while len(self.outcomes) > KEPT_OUTCOMES:
                    old, _ = self.outcomes.popitem(last=False)
                    self._sending.pop(old, None)
            return outcome

    def _step_input(self, workflow_id: str, step: str) -> dict[str, Any]:
        """A step's input as `_shown` gives it, or why the API did not give it."""
        try:
            answer = self.client.step_input(workflow_id, step)
        except ApiError as error:
            return {"refused": f"{error.code}: {error.message}"}
        return {**_shown(answer["input"]), "edited": answer["edited"]}

    def page_step_output(self, request: Request, workflow_id: str, step: str) -> Response:
        view = self.client.get(workflow_id)
        found = [s for s in view["steps"] if s["name"] == step]
        if not found:
            return self._refusal(404, "No such step", f"workflow {workflow_id} has no step {step!r}")
        return _download(found[0].get("output"), f"{workflow_id}-{step}-output.json")

    def page_step_input(self, request: Request, workflow_id: str, step: str) -> Response:
        if not self.operator:
            return self._operators_only("step inputs")
        answer = self.client.step_input(workflow_id, step)
        what = "edited by an operator with a retry" if answer["edited"] else "rendered now from the workflow"
        return self._value_page(
            f"Input of step {step}",
            workflow_id,
            f"What its attempts get: {what}; {answer['bytes']:,} bytes as JSON.",
            answer["input"],
            _path("workflows", workflow_id, "steps", step, "input.json"),
        )

    def page_step_input_json(self, request: Request, workflow_id: str, step: str) -> Response:
        if not self.operator:
            return self._operators_only("step inputs")
        return _download(self.client.step_input(workflow_id, step)["input"], f"{workflow_id}-{step}-input.json")

    def page_payload(self, request: Request, workflow_id: str, digest: str) -> Response:
        if not self.operator:
            return self._operators_only("claim-checked payloads")
        answer = self.client.payload(workflow_id, digest)
        return self._value_page(
            "Claim-checked payload",
            workflow_id,
            f"Object {answer['key']} of the payload bucket: {answer['bytes']:,} bytes.",
            answer["payload"],
            _path("workflows", workflow_id, "payloads", f"{digest}.json"),
        )

    def page_payload_json(self, request: Request, workflow_id: str, digest: str) -> Response:
        if not self.operator:
            return self._operators_only("claim-checked payloads")
        return _download(self.client.payload(workflow_id, digest)["payload"], f"{workflow_id}-{digest[:12]}.json")

    def _value_page(self, title: str, workflow_id: str, about: str, value: Any, download: str) -> Response:
        text, cut = _cut(_pretty(value))
        return self._html(
            "value.html",
            title=title,
            workflow_id=workflow_id,
            about=about,
            shown={"text": text, "cut": cut},
            download=download,
        )

    def page_map_children(self, request: Request, workflow_id: str, step: str) -> Response:
        if not self.operator:
            return self._operators_only("listings of a map step's children")
        status = request.args.get("status") or None
        if status is not None and status not in STATUSES:
            raise UsageError(f"status {status!r}: one of {', '.join(STATUSES)}")
        cursor = request.args.get("cursor") or None
        found = self.client.map_children(workflow_id, step, status=status, cursor=cursor, limit=PAGE)
        following = found.get("next_cursor")
        next_url = None
        if following:
            query = {k: v for k, v in {"status": status, "cursor": following}.items() if v}
            next_url = _path("workflows", workflow_id, "steps", step, "children") + "?" + urlencode(query)
        return self._html("map_children.html", found=found, wanted=status, next_url=next_url)

    def page_dead_letters(self, request: Request) -> Response:
        if not self.operator:
            return self._operators_only("dead-letter queues")
        listing = self.client.dead_letters()
        return self._html("dead_letters.html", queues=listing["queues"])

    def page_dead_letter_queue(self, request: Request, queue: str) -> Response:
        if not self.operator:
            return self._operators_only("dead-letter queues")
        listing = self.client.dead_letters(queue, limit=50)
        [found] = listing["queues"]
        moving = any(task.get("status") == "RUNNING" for task in found.get("move_tasks") or [])
        return self._html("dead_letter_queue.html", queue=found, messages=found.get("messages") or [], moving=moving)

    def page_redrive(self, request: Request, queue: str) -> Response:
        """A redrive's form (GET), its preview, or the move started once (POST ``intent``), then its progress."""
        if not self.operator:
            return self._operators_only("dead-letter queues")
        [found] = self.client.dead_letters(queue, limit=0)["queues"]  # its depth and moves: no message received
        form = request.form
        key = form.get("key") or _new_key()
        if not KEY_PATTERN.fullmatch(key):
            return self._refusal(400, "Not an Idempotency-Key", "open the redrive again from the queue's page")
        context: dict[str, Any] = {"queue": found, "key": key, "csrf": self.csrf, "reason": form.get("reason", "")}
        if request.method != "POST" or form.get("intent") == "edit":
            return self._html("redrive.html", stage="form", **context)
        reason = context["reason"].strip()
        if not reason:
            problem: dict[str, Any] = {
                "message": "a reason is needed: it is the ops function's audit line, with your principal"
            }
            return self._html("redrive.html", 400, stage="form", problem=problem, **context)
        if form.get("intent") != "confirm":
            return self._html("redrive.html", stage="preview", **context)

        def move() -> tuple[str, bool]:
            started = self.client.redrive(queue, reason=reason)
            return f"{started['approximate_messages']} message(s) to move", False

        try:
            self._once(key, f"queue:{queue}", "redrive", None, f"Redrive of {queue}", move)
        except ApiError as error:
            problem = _problem(error)
            return self._html("redrive.html", error.status or 502, stage="form", problem=problem, **context)
        moves = _path("dead-letters", queue, "moves") + "?" + urlencode({"done": key})
        return Response(status=303, headers={"Location": moves})

    def page_moves(self, request: Request, queue: str) -> Response:
        """A queue's message move tasks (a redrive's progress), read without receiving a message; the page refreshes
        itself while one runs."""
        if not self.operator:
            return self._operators_only("dead-letter queues")
        [found] = self.client.dead_letters(queue, limit=0)["queues"]
        tasks = found.get("move_tasks") or []
        done = self.outcomes.get(request.args.get("done", ""))
        running = any(task.get("status") == "RUNNING" for task in tasks)
        return self._html(
            "moves.html",
            queue=found,
            tasks=tasks,
            done=done if done is not None and done.subject == f"queue:{queue}" else None,
            refresh=REFRESH_SECONDS if running else None,
        )

    # ------------------------------------------------------------------ batches
    def page_batches(self, request: Request) -> Response:
        """The batches, newest first, each with its progress."""
        if not self.operator:
            return self._operators_only("batches")
        cursor = request.args.get("cursor") or None
        listing = self.client.batches(limit=PAGE, cursor=cursor)
        following = listing.get("next_cursor")
        next_url = "/batches?" + urlencode({"cursor": following}) if following else None
        running = any(b["status"] == "RUNNING" for b in listing["batches"])
        return self._html(
            "batches.html",
            batches=listing["batches"],
            next_url=next_url,
            refresh=REFRESH_SECONDS if running else None,
        )

    def page_batch(self, request: Request, batch_id: str, problem: dict[str, Any] | None = None) -> Response:
        """A batch: its filter, who started it and why, its progress (refreshed while it runs), what it touched, and
        a form that cancels it."""
        if not self.operator:
            return self._operators_only("batches")
        batch = self.client.batch(batch_id)
        cursor = request.args.get("cursor") or None
        touched = self.client.batch_workflows(batch_id, cursor=cursor, limit=PAGE)
        following = touched.get("next_cursor")
        next_url = _path("batches", batch_id) + "?" + urlencode({"cursor": following}) if following else None
        done = self.outcomes.get(request.args.get("done", ""))
        return self._html(
            "batch.html",
            (problem.get("status") or 400) if problem else 200,
            batch=batch,
            workflows=touched["workflows"],
            next_url=next_url,
            done=done if done is not None and _about_batch(done, batch_id) else None,
            refresh=REFRESH_SECONDS if batch["status"] == "RUNNING" and not problem else None,
            csrf=self.csrf,
            key=request.form.get("key") or _new_key(),
            reason=request.form.get("reason", ""),
            problem=problem,
        )

    def page_batch_new(self, request: Request) -> Response:
        """A batch's form (GET, its filter given by the query: the listing's "act on all these"), its dry run (POST
        ``intent=preview``: what it would touch, counted), or the batch started once (``intent=confirm``)."""
        if not self.operator:
            return self._operators_only("batches")
        given = request.form if request.method == "POST" else request.args
        key = request.form.get("key") or _new_key()
        if not KEY_PATTERN.fullmatch(key):
            return self._refusal(400, "Not an Idempotency-Key", "open the batch's form again from the batches page")
        fields = {name: given.get(name, "").strip() for name in BATCH_FIELDS}
        if request.method != "POST":  # from a listing: its step filter is the batch's (and, by default, its step)
            fields["where_step"] = fields["step"]
        fields["action"] = fields["action"] or "retry"
        context: dict[str, Any] = {"fields": fields, "key": key, "csrf": self.csrf, "actions": BATCH_ACTIONS}
        if request.method != "POST" or request.form.get("intent") == "edit":
            return self._html("batch_new.html", stage="form", **context)
        try:
            action, where, step, rate, output = _batch_request(fields)
        except UsageError as error:
            problem: dict[str, Any] = {"message": str(error), "status": 400, "console": True}
            return self._html("batch_new.html", 400, stage="form", problem=problem, **context)
        reason = fields["reason"]
        start: dict[str, Any] = {
            "reason": reason,
            "idempotency_key": key,
            "step": step,
            "max_per_second": rate,
            **output,
        }
        if request.form.get("intent") != "confirm":
            try:
                seen = self.client.start_batch(action, where, **start, dry_run=True)
            except ApiError as error:
                return self._html(
                    "batch_new.html", error.status or 502, stage="form", problem=_problem(error), **context
                )
            return self._html("batch_new.html", stage="preview", seen=seen, **context)

        def begin() -> tuple[str, bool]:
            return str(self.client.start_batch(action, where, **start)["batch_id"]), False

        try:
            started = self._once(key, "batches:new", action, step, f"Batch: {ACTIONS[action].title}", begin)
        except ApiError as error:
            return self._html("batch_new.html", error.status or 502, stage="form", problem=_problem(error), **context)
        return Response(
            status=303, headers={"Location": _path("batches", started.status) + "?" + urlencode({"done": key})}
        )

    def page_batch_cancel(self, request: Request, batch_id: str) -> Response:
        """Cancel a batch from its page, once per form (its Idempotency-Key): it claims no more workflows."""
        if not self.operator:
            return self._operators_only("batches")
        key = request.form.get("key", "")
        if not KEY_PATTERN.fullmatch(key):
            return self._refusal(400, "Not an Idempotency-Key", "open the batch's page again and cancel from there")
        reason = request.form.get("reason", "").strip()
        if not reason:
            problem = {"message": "a reason is needed: it is written to the batch with your principal", "console": True}
            return self.page_batch(request, batch_id, problem={**problem, "status": 400})

        def stop() -> tuple[str, bool]:
            return str(self.client.cancel_batch(batch_id, reason=reason)["status"]), False

        try:
            self._once(key, f"batch:{batch_id}", "cancel", None, "Cancel of the batch", stop)
        except ApiError as error:
            return self.page_batch(request, batch_id, problem=_problem(error))
        return Response(status=303, headers={"Location": _path("batches", batch_id) + "?" + urlencode({"done": key})})

    def page_definitions(self, request: Request) -> Response:
        listing = self.client.definitions()
        return self._html("definitions.html", definitions=listing["definitions"])

    def page_definition(self, request: Request, name: str) -> Response:
        try:
            listing = self.client.definitions(name)
        except ApiError as error:
            if error.status != 404:
                raise
            why = (
                f"no definition {name!r} is registered. A workflow started with its definition inline (in the start "
                "request) runs on a definition that is not: its steps and their dependencies are on the workflow's "
                "own page."
            )
            return self._html("error.html", 404, title="Not registered", message=why, code=error.code)
        return self._html("definition.html", name=name, listing=listing)

    def page_definition_version(self, request: Request, name: str, version: int) -> Response:
        definition = self.client.request("GET", _path("definitions", name, "versions", version))
        shown = []
        previous: list[str] = []
        for step in definition.get("steps", []):  # without depends_on a step waits for the previous one
            depends = step.get("depends_on")
            shown.append({**step, "status": "PENDING", "depends_on": previous if depends is None else depends})
            previous = [step["name"]]
        text, _ = _cut(_pretty(definition))
        return self._html(
            "definition_version.html",
            name=name,
            version=version,
            text=text,
            graph=graph.layout(shown),
            box=(graph.BOX_WIDTH, graph.BOX_HEIGHT),
        )

    def _operators_only(self, what: str) -> Response:
        why = (
            f"the {what} are the operators' (/ops routes): signed as {self.identity}, a client, this console shows "
            "only the workflows you started, by id. Start it --as operator (or with an operator's credentials)."
        )
        return self._html("error.html", 403, title="Operators only", message=why, code="OPERATORS_ONLY")


def _problem(error: ApiError) -> dict[str, Any]:
    """The API's refusal (or the console's own, ``source``) as a form shows it above itself (macros.html
    ``refusal``)."""
    return {
        "code": error.code,
        "message": error.message,
        "details": error.details,
        "status": error.status,
        "console": error.source == "console",
    }


def _about_batch(outcome: Outcome, batch_id: str) -> bool:
    """Whether ``outcome`` is of the batch ``batch_id``: its start (``status`` holds the batch id) or its cancel."""
    return outcome.subject == f"batch:{batch_id}" or (outcome.subject == "batches:new" and outcome.status == batch_id)


def _batch_request(fields: Mapping[str, str]) -> tuple[str, dict[str, Any], str | None, int | None, dict[str, Any]]:
    """A batch's form as ``POST /ops/batches`` takes it: the action, the filter, the step, the rate and a skip's
    output (``{"output": ...}``, or ``{}``: none).

    Raises
    ------
    UsageError
        A field the console can tell is wrong (the API checks the rest, and its refusal is shown as it is).
    """
    action = fields["action"]
    if action not in BATCH_ACTIONS:
        raise UsageError(f"action {action!r}: one of {', '.join(BATCH_ACTIONS)}")
    if not fields["status"]:
        raise UsageError("a status is needed: the batch acts on the workflows of one status (e.g. HELD)")
    if not fields["reason"]:
        raise UsageError("a reason is needed: it is written to the history of every workflow the batch acts on")
    where: dict[str, Any] = {
        "status": fields["status"],
        "definition": fields["definition"] or None,
        "version": _positive(fields["version"], "version"),
        "error_code": fields["error_code"] or None,
        "step": fields["where_step"] or None,
        "trigger": fields["trigger"] or None,
        "owner": fields["owner"] or None,
        "started_after": _epoch(fields["started_after"]),
        "started_before": _epoch(fields["started_before"]),
    }
    step = fields["step"] or None  # none: the filter's failed step, else each workflow's only one (the API's rule)
    output: dict[str, Any] = {}
    if fields["output"]:
        if action != "skip":
            raise UsageError(f"only a skip gives an output: empty the output for a {action}")
        output = {"output": _json_value(fields["output"], "output", an_object=False)}
    kept = {k: v for k, v in where.items() if v is not None}
    return action, kept, step, _positive(fields["max_per_second"], "rate"), output


def _new_key() -> str:
    return f"console-{secrets.token_hex(16)}"


#: A batch's actions: every operator action but a callback's answer (one step's, given by hand).
BATCH_ACTIONS: Mapping[str, Any] = {name: a for name, a in ACTIONS.items() if name not in ("approve", "reject")}
#: A batch's form: the action, the listing's filters, the step, the reason and the rate.
BATCH_FIELDS = (
    "action",
    "status",
    "definition",
    "version",
    "error_code",
    "where_step",
    "trigger",
    "owner",
    "started_after",
    "started_before",
    "step",
    "reason",
    "max_per_second",
    "output",
)
#: The endpoints a form is sent to (every other one is read only).
ACTING = frozenset({"act", "redrive", "batch_new", "batch_cancel"})


def _actor(event: Mapping[str, Any]) -> str:
    """Who made an event: the principal of an operator action or a start, else the engine's part that wrote it."""
    detail = event.get("detail") or {}
    if isinstance(detail, Mapping) and detail.get("principal"):
        return str(detail["principal"])
    kind = str(event.get("kind", ""))
    if kind in ("resent", "compensation_resent", "timed_out", "compensation_timed_out"):
        return "supervisor"
    if kind.endswith("reply_applied"):
        return "agent (reply)"
    return "scheduler"


class ConsoleServer:
    """The console served on 127.0.0.1: bound to ``port`` (0: any free one) first, then the console is built for
    the port bound (its Host check names it). `serve_forever` for ``sasflow console``; `start` runs it in a
    thread (``make up``, the browser tests) until `stop`."""

    def __init__(self, console_factory: Callable[[int], Console], port: int = 0) -> None:
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            """No access log: the first request's line would print the token to the terminal."""

            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                return None

        self._late = _Late()
        self._server = make_server("127.0.0.1", port, self._late, threaded=True, request_handler=Quiet)
        self.console = console_factory(self._server.port)
        self._late.console = self.console
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.console.url

    def serve_forever(self) -> None:
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()

    def start(self) -> ConsoleServer:
        self._thread = threading.Thread(target=self.serve_forever, name="sasflow-console", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)


class _Late:
    """The WSGI application of a server bound before the console knows its port."""

    console: Console | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        assert self.console is not None  # nosec B101 # set before the server serves
        return self.console(environ, start_response)
