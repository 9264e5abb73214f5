"""Regressions found by fuzzing the API (tools/fuzz.py, schemathesis through the local stack).

Each request below was a 500 from the API function, or a response its OpenAPI document did not describe, before
sasflow.api refused it as a documented 4xx with an ``ErrorResponse`` body. Every refused request must also write
nothing and send nothing (DESIGN Rule 9).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from devstack.agents import agent_names
from devstack.identities import identity, request_context_authorizer
from sasflow.api_models import ErrorResponse
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")
ERROR_STATUSES = {"400", "403", "404", "409", "410", "413", "415", "422", "429"}


def post_raw(
    deployed: Deployed, body: bytes, content_type: str | None = "application/json", *, path: str = "/workflows"
) -> tuple[int, Any]:
    """POST ``path`` with exactly these bytes, as API Gateway sends them (base64 when not UTF-8 text)."""
    route = "POST /workflows" if path == "/workflows" else "POST /workflows/{workflow_id}/cancel"
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode(), True
    headers = {"content-type": content_type} if content_type is not None else {}
    event = {
        "version": "2.0",
        "routeKey": route,
        "rawPath": path,
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "local",
            "authorizer": request_context_authorizer(identity("client-a")),
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
            "requestId": f"fuzz-regression-{time.monotonic_ns()}",
            "routeKey": route,
            "stage": "$default",
            "timeEpoch": int(time.time() * 1000),
        },
        "body": text,
        "isBase64Encoded": encoded,
    }
    response = deployed.fn("ApiFunction").invoke(event)
    return response["statusCode"], json.loads(response.get("body") or "null")


def trip_with_input(value: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP))
    body["input"] = value
    return body


def nested(levels: int) -> Any:
    """A JSON object ``levels`` deep: {"a": {"a": ... {}}}."""
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def assert_refused(deployed: Deployed, status: int, body: Any, expected: tuple[int, str]) -> None:
    assert (status, body["error"]) == expected
    ErrorResponse.model_validate(body)  # the documented error body
    assert body["message"]
    assert deployed.items() == []
    assert deployed.depth("FlightsRequestQueue") == 0


# --------------------------------------------------------------------------------------------- request bodies
@pytest.mark.parametrize(
    ("case", "raw"),
    [
        ("invalid UTF-8", b'{"definition": "\xff\xfe"}'),
        ("UTF-16", json.dumps(TRIP).encode("utf-16")),
        ("control bytes", b"\x03\xff"),
    ],
)
def test_a_body_that_is_not_utf8_is_400_malformed_json_not_500(deployed: Deployed, case: str, raw: bytes) -> None:
    # Given bytes that are not UTF-8 (API Gateway passes them base64-encoded)
    # When they are POSTed as application/json
    status, body = post_raw(deployed, raw)
    # Then they are refused as malformed JSON (was: UnicodeDecodeError in powertools -> 500)
    assert_refused(deployed, status, body, (400, "MALFORMED_JSON"))


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data",  # no boundary: was a bare ValueError in powertools -> 500
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "text/plain",
        "application/xml",
        "application/problem+json",
    ],
)
def test_a_body_that_is_not_application_json_is_415_with_an_error_response(
    deployed: Deployed, content_type: str
) -> None:
    # Given the trip request sent with another media type
    status, body = post_raw(deployed, json.dumps(TRIP).encode(), content_type)
    # Then 415 with the documented ErrorResponse (was: 500, 422, or powertools' own {"statusCode": 415, ...})
    assert_refused(deployed, status, body, (415, "UNSUPPORTED_MEDIA_TYPE"))
    assert body["message"] == f"the request body must be application/json, not {content_type.split(';')[0]}"


@pytest.mark.parametrize("content_type", ["APPLICATION/JSON", "application/json; charset=utf-8", None])
def test_json_media_type_is_matched_case_insensitively_and_may_be_omitted(
    deployed: Deployed, content_type: str | None
) -> None:
    # Media types are case-insensitive (RFC 9110 section 8.3.1); powertools refused "APPLICATION/JSON" with 415.
    status, body = post_raw(deployed, json.dumps(TRIP).encode(), content_type)
    assert status == 201
    assert body["status"] == "RUNNING"


@pytest.mark.parametrize(
    ("case", "raw", "reason"),
    [
        ("NaN", '{"x": NaN}', "NaN is not a JSON value"),
        ("Infinity", '{"x": Infinity}', "Infinity is not a JSON value"),
        ("-Infinity", '{"x": -Infinity}', "-Infinity is not a JSON value"),
        ("float overflow", '{"x": 1e400}', "1e400 does not fit in a double"),
        ("lone surrogate", '{"x": "\\ud800"}', "a string is not valid Unicode (lone surrogate)"),
        ("lone surrogate key", '{"\\udfff": 1}', "a key is not valid Unicode (lone surrogate)"),
    ],
)
def test_input_that_is_not_strict_json_is_400_and_stores_nothing(
    deployed: Deployed, case: str, raw: str, reason: str
) -> None:
    # Given a workflow input Python's json reads but JSON (RFC 8259) has no value for
    text = json.dumps({"definition": TRIP["definition"]})[:-1] + f', "input": {raw}}}'
    # When it is POSTed
    status, body = post_raw(deployed, text.encode())
    # Then 400 (was: NaN/inf stored and shown back as null; a lone surrogate -> UnicodeEncodeError -> 500)
    assert_refused(deployed, status, body, (400, "MALFORMED_JSON"))
    assert body["details"][0]["msg"] == f"JSON decode error: {reason}"


def test_an_object_that_repeats_a_key_is_400_and_stores_nothing(deployed: Deployed) -> None:
    # Found by the security trial: {"amount": 1, "amount": 999999} was accepted, the last key winning; parsers differ
    # on which duplicate they keep, so a proxy and the API could read two different requests.
    text = json.dumps({"definition": TRIP["definition"]})[:-1] + ', "input": {"amount": 1, "amount": 999999}}'
    status, body = post_raw(deployed, text.encode())
    assert_refused(deployed, status, body, (400, "MALFORMED_JSON"))
    assert body["details"][0]["msg"] == "JSON decode error: duplicate key 'amount'"


def test_a_definition_version_too_large_for_a_dynamodb_number_is_422_not_500(deployed: Deployed) -> None:
    # Found by the security trial: a version of 10**38 failed boto3's number serialiser (decimal.Rounded) -> 500.
    trip = json.loads(json.dumps(TRIP))
    trip["definition"]["version"] = 10**38
    status, body = post_raw(deployed, json.dumps(trip).encode())
    assert_refused(deployed, status, body, (422, "VALIDATION_ERROR"))
    assert body["details"][0]["loc"] == ["body", "definition", "version"]


@pytest.mark.parametrize(
    ("content_type", "size", "expected"),
    [
        ("text/plain", 2_000_000, (415, "UNSUPPORTED_MEDIA_TYPE")),
        ("application/json", 2_000_000, (413, "PAYLOAD_TOO_LARGE")),
    ],
)
def test_a_body_on_a_route_that_takes_none_obeys_the_same_rules(
    deployed: Deployed, content_type: str, size: int, expected: tuple[int, str]
) -> None:
    # Found by the security trial: a cancel with 2 MB of text/plain was 202 (only routes with a body checked it).
    body_bytes = json.dumps({"pad": "x" * size}).encode()
    status, body = post_raw(
        deployed, body_bytes, content_type, path="/workflows/00000000-0000-4000-8000-000000000000/cancel"
    )
    assert_refused(deployed, status, body, expected)


def test_an_integer_beyond_pythons_digit_limit_is_400_not_500(deployed: Deployed) -> None:
    text = json.dumps({"definition": TRIP["definition"]})[:-1] + f', "input": {{"x": {"9" * 5000}}}}}'
    status, body = post_raw(deployed, text.encode())
    assert_refused(deployed, status, body, (400, "MALFORMED_JSON"))


def test_nesting_up_to_64_levels_is_accepted_and_deeper_is_400(deployed: Deployed) -> None:
    # Given inputs whose request bodies nest exactly 64 and 65 levels (the body is level 1, input level 2, its
    # "deep" level 3; the trip's own fields stay, for the steps' references)
    at_limit = trip_with_input({**TRIP["input"], "deep": nested(62)})
    over = trip_with_input({**TRIP["input"], "deep": nested(63)})
    # When both are POSTed
    over_status, over_body = post_raw(deployed, json.dumps(over).encode())
    # Then the deeper one is refused (was: pydantic's "Maximum serialization depth exceeded" -> 500 from ~300 levels)
    assert_refused(deployed, over_status, over_body, (400, "MALFORMED_JSON"))
    assert over_body["details"][0]["msg"] == "JSON decode error: nested deeper than 64 levels"
    status, body = post_raw(deployed, json.dumps(at_limit).encode())
    assert status == 201
    assert body["input"]["deep"] == nested(62)


def test_nesting_past_the_recursion_limit_is_400_not_500(deployed: Deployed) -> None:
    status, body = post_raw(deployed, b"[" * 5000 + b"]" * 5000)
    assert_refused(deployed, status, body, (400, "MALFORMED_JSON"))
    assert body["details"][0]["msg"] == "JSON decode error: nested deeper than 64 levels"


# --------------------------------------------------------------------------------------------- the document
def test_every_route_documents_every_error_status_with_the_error_response_schema(deployed: Deployed) -> None:
    status, spec = deployed.api("GET", "/openapi.json")
    assert status == 200
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            errors = {code: r for code, r in operation["responses"].items() if code.startswith(("4", "5"))}
            # 415 was missing (powertools' own 415 body was not an ErrorResponse either)
            assert set(errors) == ERROR_STATUSES, (method, path)
            for response in errors.values():
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}


def test_the_document_names_the_agents_of_this_deployment(deployed: Deployed) -> None:
    # A definition naming another agent is refused 422: the served document now says which agents exist.
    _, spec = deployed.api("GET", "/openapi.json")
    agent = spec["components"]["schemas"]["TaskStep"]["properties"]["agent"]
    assert agent["enum"] == sorted(agent_names())


def test_the_documented_example_request_starts_a_workflow(deployed: Deployed) -> None:
    # The examples phase of the fuzzing sends it; it must stay valid against this deployment.
    _, spec = deployed.api("GET", "/openapi.json")
    (example,) = spec["components"]["schemas"]["StartWorkflowRequest"]["examples"]
    status, body = deployed.api("POST", "/workflows", example)
    assert status == 201
    assert [s["name"] for s in body["steps"]] == ["reserve_flight", "book_hotel"]


# --------------------------------------------------------------------------------------------- definitions (issue 12)
def test_a_start_whose_first_step_reference_finds_nothing_is_422_missing_reference(deployed: Deployed) -> None:
    # Given the trip without the route its first step reads
    body = trip_with_input({"traveller": "Ada Lovelace", "amount": 420})
    # When it is started
    status, answer = post_raw(deployed, json.dumps(body).encode())
    # Then 422 MISSING_REFERENCE naming the path and the expression, and nothing is written or sent
    assert_refused(deployed, status, answer, (422, "MISSING_REFERENCE"))
    assert answer["message"] == (
        "steps[reserve_flight].input.route: 'input.route' resolved to nothing (give a default to allow that)"
    )


def test_a_definition_error_points_at_its_step_and_says_its_reason_once(deployed: Deployed) -> None:
    # Given the trip whose hotel step depends on itself, and whose payment lists the hotel twice
    body = json.loads(json.dumps(TRIP))
    body["definition"]["steps"][1]["depends_on"] = ["book_hotel"]
    body["definition"]["steps"][2]["depends_on"] = ["book_hotel", "book_hotel"]
    # When it is started
    status, answer = post_raw(deployed, json.dumps(body).encode())
    # Then 422 with one detail per problem, each at its step, each reason said once
    assert_refused(deployed, status, answer, (422, "VALIDATION_ERROR"))
    assert answer["details"] == [
        {
            "loc": ["body", "definition", "steps", "1"],
            "msg": "step 'book_hotel' depends on itself",
            "type": "invalid_step",
        },
        {
            "loc": ["body", "definition", "steps", "2"],
            "msg": "step 'charge_card' lists 'book_hotel' in depends_on twice",
            "type": "invalid_step",
        },
    ]


@pytest.mark.parametrize(
    ("first_step", "code"),
    [
        ({"when": "abs(input.traveller)"}, "CONDITION_NOT_EVALUATED"),
        ({"name": "hold", "type": "wait", "until": "input.traveller"}, "WAIT_NOT_EVALUATED"),
    ],
)
def test_a_first_step_that_cannot_be_evaluated_is_422_with_its_own_code(
    deployed: Deployed, first_step: dict[str, Any], code: str
) -> None:
    body = json.loads(json.dumps(TRIP))
    steps = body["definition"]["steps"]
    if first_step.get("type") == "wait":
        steps.insert(0, first_step)
    else:
        steps[0].update(first_step)
    status, answer = post_raw(deployed, json.dumps(body).encode())
    assert_refused(deployed, status, answer, (422, code))


@pytest.mark.parametrize("path", ["/workflows/parent-1%3A1%3A0/cancel", "/workflows/parent-1:1:0/cancel"])
def test_a_map_childs_id_is_routed_by_its_decoded_path_in_either_form(deployed: Deployed, path: str) -> None:
    # Given a map child's id (it holds ':'), sent percent-encoded as a client may, or decoded as API Gateway's HTTP
    # API passes rawPath to the function
    # When it is cancelled (no such workflow exists)
    status, body = post_raw(deployed, b"", path=path)
    # Then the path is decoded once: the id passes the id pattern and is looked up (404, not a 422 on "%3A")
    assert (status, body["error"]) == (404, "WORKFLOW_NOT_FOUND")
    assert "parent-1:1:0" in body["message"]


#: Ids that break the id rule, as a client sends them and API Gateway decodes them into the path parameter.
BAD_IDS = ["../x", "a\x00b", "\N{GRINNING FACE}", "%2e%2e%2fx", "%ff", "a b", "a'b", "x" * 65]


def workflow_routes() -> list[tuple[str, str]]:
    """Every route with a workflow id of both functions: (function, "METHOD /path/{workflow_id}...")."""
    from api_handler import app
    from ops_handler import app as ops_app
    from tests.integration.test_template_security import app_routes

    return sorted(
        (function, route)
        for function, resolver in (("ApiFunction", app), ("OpsFunction", ops_app))
        for route in app_routes(resolver)
        if "{workflow_id}" in route
    )


@pytest.mark.parametrize("bad_id", BAD_IDS, ids=lambda i: repr(i)[1:-1][:12])
def test_an_id_that_breaks_the_id_rule_is_422_naming_the_rule_on_every_route(deployed: Deployed, bad_id: str) -> None:
    # From a clean-clone trial: odd ids answered three ways (422, 404 "no such route", 403). As API Gateway hands an
    # event to the function: the route it matched, the id decoded in pathParameters and in the path.
    routes = workflow_routes()
    # get, history and cancel; the operators' get, history, actions, a map's children, a step's input, a payload
    assert len(routes) == 9
    others = {"action": "retry", "step": "charge_card", "digest": "0" * 64}
    for function, route in routes:
        method, template = route.split(" ", 1)
        parameters = {"workflow_id": bad_id, **{k: v for k, v in others.items() if f"{{{k}}}" in template}}
        path = template
        for name, value in parameters.items():
            path = path.replace(f"{{{name}}}", value)
        event = {
            "version": "2.0",
            "routeKey": route,
            "rawPath": path,
            "rawQueryString": "",
            "headers": {"content-type": "application/json"},
            "pathParameters": parameters,
            "requestContext": {
                "accountId": "123456789012",
                "apiId": "local",
                "authorizer": request_context_authorizer(
                    identity("operator" if function == "OpsFunction" else "client-a")
                ),
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
                "requestId": f"bad-id-{time.monotonic_ns()}",
                "routeKey": route,
                "stage": "$default",
                "timeEpoch": int(time.time() * 1000),
            },
            "body": "{}" if method == "POST" else None,
            "isBase64Encoded": False,
        }
        response = deployed.fn(function).invoke(event)
        body = json.loads(response["body"])
        assert (response["statusCode"], body["error"]) == (422, "VALIDATION_ERROR"), (route, body)
        [rule] = [d for d in body["details"] if d["loc"] == ["path", "workflow_id"]]
        assert "^[A-Za-z0-9_.:-]+$" in rule["msg"] or "at most 64 characters" in rule["msg"], (route, rule)
