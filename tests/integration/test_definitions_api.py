"""Definitions registered by name and version, through the real API handler on moto."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.conftest import Deployed
from tests.support.lambdas import ROOT

TRIP = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())


def definition(version: int = 1, **changes: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP["definition"]))
    body.update(name="trip", version=version, **changes)
    return body


def test_a_version_is_immutable_the_same_body_is_200_and_another_409(deployed: Deployed) -> None:
    status, view = deployed.api("PUT", "/definitions/trip/versions/1", definition())
    assert (status, view["name"], view["version"]) == (201, "trip", 1)
    assert view["published_by"] == "arn:aws:iam::123456789012:user/client-a"
    status, again = deployed.api("PUT", "/definitions/trip/versions/1", definition())
    assert (status, again["content_id"]) == (200, view["content_id"])
    status, body = deployed.api("PUT", "/definitions/trip/versions/1", definition(on_failure="hold"))
    assert (status, body["error"]) == (409, "DEFINITION_VERSION_EXISTS")
    assert "versions are immutable" in body["message"]


def test_the_path_and_the_body_must_agree_and_the_agents_must_exist(deployed: Deployed) -> None:
    status, body = deployed.api("PUT", "/definitions/trip/versions/2", definition(version=1))
    assert (status, body["error"]) == (422, "INVALID_DEFINITION")
    bad = definition()
    bad["steps"][0]["agent"] = "trains"
    status, body = deployed.api("PUT", "/definitions/trip/versions/1", bad)
    assert (status, body["error"]) == (422, "INVALID_DEFINITION")
    assert deployed.api("GET", "/definitions/trip")[0] == 404


def test_a_name_belongs_to_its_first_publisher(deployed: Deployed) -> None:
    assert deployed.api("PUT", "/definitions/trip/versions/1", definition())[0] == 201
    status, body = deployed.api("PUT", "/definitions/trip/versions/2", definition(version=2), caller="client-b")
    assert (status, body["error"]) == (409, "DEFINITION_NAME_TAKEN")
    assert body["message"] == (
        "the definition name 'trip' belongs to another principal: publish its versions as the principal that first "
        "published it, or publish under another name"
    )


def test_a_start_by_name_runs_the_latest_or_the_named_version_and_stays_pinned(deployed: Deployed) -> None:
    # Given versions 1 and 2 (2 holds under failure)
    deployed.api("PUT", "/definitions/trip/versions/1", definition())
    deployed.api("PUT", "/definitions/trip/versions/2", definition(version=2, on_failure="hold"))
    # When trips start by name (the latest) and by version 1
    status, latest = deployed.api("POST", "/workflows", {"definition": {"name": "trip"}, "input": TRIP["input"]})
    assert (status, latest["definition_version"]) == (201, 2)
    status, first = deployed.api(
        "POST", "/workflows", {"definition": {"name": "trip", "version": 1}, "input": TRIP["input"]}
    )
    assert (status, first["definition_version"]) == (201, 1)
    # and a version 3 is published while they run
    deployed.api("PUT", "/definitions/trip/versions/3", definition(version=3))
    deployed.pump()
    # Then each ran the version it started with
    assert deployed.api("GET", f"/workflows/{latest['workflow_id']}")[1]["definition_version"] == 2
    assert deployed.api("GET", f"/workflows/{first['workflow_id']}")[1]["status"] == "COMPLETED"
    # and the listings show the names and their versions
    status, names = deployed.api("GET", "/definitions")
    assert [(d["name"], d["latest_version"]) for d in names["definitions"]] == [("trip", 3)]
    status, versions = deployed.api("GET", "/definitions/trip")
    assert [v["version"] for v in versions["versions"]] == [1, 2, 3]
    status, body = deployed.api("GET", "/definitions/trip/versions/2")
    assert (status, body["on_failure"]) == (200, "hold")


def test_a_start_naming_an_unregistered_definition_is_422_and_writes_nothing(deployed: Deployed) -> None:
    status, body = deployed.api("POST", "/workflows", {"definition": {"name": "nope"}, "input": {}})
    assert (status, body["error"]) == (422, "DEFINITION_NOT_FOUND")
    assert deployed.items() == []


def test_definitions_push_publishes_the_files_once_and_a_start_names_them(deployed: Deployed) -> None:
    from tests.integration.test_cli import cli

    pushed = cli(deployed, "definitions", "push", str(ROOT / "definitions"), caller="client-a")["published"]
    assert [(p["name"], p["version"]) for p in pushed] == [("order-fulfilment", 1), ("trip-booking", 1)]
    again = cli(deployed, "definitions", "push", str(ROOT / "definitions"), caller="client-a")["published"]
    assert [p["content_id"] for p in again] == [p["content_id"] for p in pushed]
    listed = cli(deployed, "definitions", "list", caller="client-a")
    assert [d["name"] for d in listed["definitions"]] == ["order-fulfilment", "trip-booking"]
    status, view = deployed.api("POST", "/workflows", {"definition": {"name": "trip-booking"}, "input": TRIP["input"]})
    assert (status, view["definition_name"], view["definition_version"]) == (201, "trip-booking", 1)


def test_definitions_push_tries_every_file_and_names_the_refused_ones(deployed: Deployed, tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from sasflow_cli.app import CliState, app
    from sasflow_cli.client import SasflowClient
    from tests.integration.test_cli import DeployedTransport

    (tmp_path / "a.json").write_text(json.dumps(definition()))
    (tmp_path / "b.json").write_text("{not json")
    (tmp_path / "c.json").write_text(json.dumps(definition(version=1, on_failure="hold")))  # a changed v1
    two_problems = {**definition(), "name": "trip-two"}
    two_problems["steps"][1]["name"] = two_problems["steps"][0]["name"]
    two_problems["steps"][2]["depends_on"] = ["nowhere"]
    (tmp_path / "d.json").write_text(json.dumps(two_problems))
    deployed.fn("ApiFunction")
    client = SasflowClient(
        "http://deployed.test", lambda m, u, b, h: dict(h), transport=DeployedTransport(deployed, "client-a")
    )
    result = CliRunner().invoke(app, ["definitions", "push", str(tmp_path)], obj=CliState(client_=client))
    assert result.exit_code == 1
    assert (
        f"{tmp_path / 'b.json'}: NOT_A_DEFINITION: file {tmp_path / 'b.json'}: not JSON: line 1 column 2: "
        "Expecting property name enclosed in double quotes"
    ) in result.stderr
    assert f"{tmp_path / 'c.json'}: DEFINITION_VERSION_EXISTS" in result.stderr
    # every problem of a refused definition is named, as start names them
    assert (
        f"{tmp_path / 'd.json'}: VALIDATION_ERROR: the request does not match the schema\n"
        "  body.steps.1: step name 'reserve_flight' is used twice\n"
        "  body.steps.2: step 'charge_card' depends on unknown step 'nowhere'\n"
    ) in result.stderr
    assert [v["version"] for v in deployed.api("GET", "/definitions/trip")[1]["versions"]] == [1]
