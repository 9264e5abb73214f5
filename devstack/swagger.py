"""Swagger UI on the local stack (``/swagger``): one page for the clients' and the operators' routes. Local only.

The deployed API serves two OpenAPI documents, each from its own function: ``GET /openapi.json`` (the clients'
routes, ``sasflow.api``) and ``GET /ops/openapi.json`` (the operators', ``sasflow.ops_api``). The page fetches
both from the running functions (as the local operator), merges them (`merge_documents`) and renders them with
powertools' Swagger UI, exactly what ``APIGatewayHttpResolver.enable_swagger`` serves: with no
``swagger_base_url`` the Swagger UI bundle and stylesheet that ship inside aws-lambda-powertools
(``event_handler/openapi/swagger_ui``) are inlined into the page, so it works offline and loads nothing else.

The page and ``/swagger?format=json`` (the merged document) need no signature. Neither does "Try it out": the
document's servers are ``/swagger/as/<identity>``, a prefix under which the emulator takes a request as signed by
that local identity (a browser cannot sign SigV4), and then applies the identity's policy and the route as usual.
Both exist only when the local stack is started with ``swagger=True`` (``make up``); template.yaml has neither.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from devstack import identities

__all__ = ["SWAGGER_PATH", "TRY_PREFIX", "SwaggerPages", "merge_documents", "swagger_html"]

logger = logging.getLogger(__name__)

SWAGGER_PATH: Final = "/swagger"
#: ``/swagger/as/<identity>/<route>``: a request taken as signed by that local identity.
TRY_PREFIX: Final = "/swagger/as/"
#: The documents merged into the page, in order (the first one's info wins).
DOCUMENT_PATHS: Final = ("/openapi.json", "/ops/openapi.json")
#: The names of the loopback address a Host header may give (with the stack's port).
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")


def merge_documents(documents: Sequence[Mapping[str, Any]], *, servers: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """One OpenAPI document with the paths and component schemas of all ``documents``.

    Parameters
    ----------
    documents
        OpenAPI 3 documents; the first one's ``openapi`` version and ``info`` are kept.
    servers
        The ``servers`` of the merged document.

    Raises
    ------
    ValueError
        Two documents declare the same path, or the same schema name with different schemas.
    """
    if not documents:
        raise ValueError("no document to merge")
    merged: dict[str, Any] = {
        "openapi": documents[0].get("openapi", "3.1.0"),
        "info": {
            **copy.deepcopy(documents[0].get("info", {})),
            "title": "sasflow (clients' and operators' routes, local stack)",
        },
        "servers": [dict(server) for server in servers],
        "paths": {},
        "components": {"schemas": {}},
    }
    for document in documents:
        for path, item in document.get("paths", {}).items():
            if path in merged["paths"]:
                raise ValueError(f"path {path} is in two documents")
            merged["paths"][path] = copy.deepcopy(item)
        for name, schema in document.get("components", {}).get("schemas", {}).items():
            known = merged["components"]["schemas"].get(name)
            if known is not None and known != schema:
                raise ValueError(f"schema {name} differs between the documents")
            merged["components"]["schemas"][name] = copy.deepcopy(schema)
    return merged


def swagger_html(document: Mapping[str, Any]) -> str:
    """The Swagger UI page of ``document``, assets inlined (powertools' own, as ``enable_swagger`` without
    ``swagger_base_url``): no request leaves the page but the API calls of "Try it out"."""
    from aws_lambda_powertools.event_handler.openapi import swagger_ui
    from aws_lambda_powertools.event_handler.openapi.swagger_ui import generate_swagger_html

    assets = Path(swagger_ui.__file__).parent
    js = (assets / "swagger-ui-bundle.min.js").read_text(encoding="utf-8")
    css = (assets / "swagger-ui.min.css").read_text(encoding="utf-8")
    # As powertools escapes it: "</" inside the inlined JSON must not close the <script> element.
    spec = json.dumps(document, indent=2).replace("</", "<\\/")
    return str(generate_swagger_html(spec, js, css, "", None, False))


class SwaggerPages:
    """Serves ``/swagger`` and ``/swagger?format=json``, and reads ``/swagger/as/<identity>`` prefixes.

    Parameters
    ----------
    fetch
        Returns the JSON document the API serves at a path (``/openapi.json``, ``/ops/openapi.json``), read from
        its function as the local operator.
    """

    def __init__(self, fetch: Callable[[str], Mapping[str, Any]]) -> None:
        self.fetch = fetch

    def document(self) -> dict[str, Any]:
        """The merged document of both APIs, with one server per local identity."""
        servers = [
            {"url": f"{TRY_PREFIX}{who.name}", "description": f"local stack, requests taken as signed by {who.name}"}
            for who in sorted(identities.IDENTITIES.values(), key=lambda who: who.name != "operator")
        ]
        return merge_documents([self.fetch(path) for path in DOCUMENT_PATHS], servers=servers)

    def page(self, method: str, raw_path: str, raw_query: str) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """The response to ``GET /swagger[?format=json]``; None for any other request."""
        if method not in ("GET", "HEAD") or raw_path.rstrip("/") != SWAGGER_PATH:
            return None
        try:
            document = self.document()
        except Exception as error:  # the page reports it; the stack goes on
            logger.warning("swagger: the OpenAPI documents could not be read: %s", error)
            body = json.dumps({"message": f"the OpenAPI documents could not be read: {error}"}).encode()
            return 502, [("content-type", "application/json")], body
        if "format=json" in raw_query.split("&"):
            return 200, [("content-type", "application/json")], json.dumps(document).encode()
        page = swagger_html(document).encode()
        return 200, [("content-type", "text/html; charset=utf-8"), ("cache-control", "no-store")], page

    @staticmethod
    def ours(raw_path: str) -> bool:
        """Whether ``raw_path`` is the page or under its unsigned "Try it out" prefix."""
        return raw_path.rstrip("/") == SWAGGER_PATH or raw_path.startswith(TRY_PREFIX)

    @staticmethod
    def refusal(headers: Mapping[str, str], port: int) -> str | None:
        """Why a request to the page or its prefix is refused, or None: it must name the loopback address and this
        port as its Host, and come from no other origin. The prefix acts unsigned as any local identity, so a page
        of another site (a DNS name rebound to 127.0.0.1, or a cross-site request) must not reach it."""
        allowed = {f"{name}:{port}" for name in LOOPBACK_HOSTS}
        host = headers.get("Host") or headers.get("host") or ""
        if host not in allowed:
            return f"Host {host!r} is not this stack's loopback address (127.0.0.1:{port})"
        origin = headers.get("Origin") or headers.get("origin")
        if origin is not None and origin.removeprefix("http://") not in allowed:
            return f"Origin {origin!r} is another site's"
        return None

    @staticmethod
    def taken_as(raw_path: str) -> tuple[identities.Identity, str] | None:
        """``(identity, route path)`` for ``/swagger/as/<identity>/<path>``; None for any other path."""
        if not raw_path.startswith(TRY_PREFIX):
            return None
        name, _, rest = raw_path[len(TRY_PREFIX) :].partition("/")
        try:
            who = identities.identity(name)
        except KeyError:
            return None
        return who, "/" + rest
