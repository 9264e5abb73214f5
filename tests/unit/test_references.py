"""References that find nothing: the step fails with MISSING_REFERENCE at its path, unless a default is given."""

from __future__ import annotations

import pytest

from sasflow.errors import MissingReferenceError
from sasflow.states import StepStatus, WorkflowStatus
from tests.support.pipeline import TRIP_INPUT, Pipeline, trip_definition


def test_a_first_step_whose_reference_finds_nothing_is_refused_at_the_start_naming_path_and_expression() -> None:
    # Given a trip started without the route its first step refers to
    p = Pipeline()
    without_route = {k: v for k, v in TRIP_INPUT.items() if k != "route"}
    # When it is started, Then the start is refused (the API's 422 MISSING_REFERENCE) and nothing is written
    with pytest.raises(MissingReferenceError) as refused:
        p.start(trip_definition(), without_route)
    assert (refused.value.path, refused.value.expression) == ("steps[reserve_flight].input.route", "input.route")
    assert p.store.writes == {}
    assert p.bus.sent == 0


def test_a_later_step_whose_reference_finds_nothing_fails_with_missing_reference_and_the_trip_unwinds() -> None:
    # Given a trip whose hotel step reads a field the flight's output does not have
    definition = trip_definition(book_hotel={"input": {"seat.$": "steps.reserve_flight.output.seat"}})
    p = Pipeline()
    wid = p.start(definition, TRIP_INPUT)
    # When the flight completes
    p.run_agent("flights")
    p.run_scheduler()
    # Then the hotel step failed with MISSING_REFERENCE, naming the path and the expression, and was never sent
    hotel = p.snapshot(wid).steps["book_hotel"]
    assert hotel.status is StepStatus.FAILED
    assert hotel.error == {
        "code": "MISSING_REFERENCE",
        "message": "steps[book_hotel].input.seat: 'steps.reserve_flight.output.seat' resolved to nothing "
        "(give a default to allow that)",
    }
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.workflow.reason == "step book_hotel failed: MISSING_REFERENCE"
    assert p.services["hotels"].calls == []
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]


def test_a_default_lets_the_step_run_with_it() -> None:
    definition = trip_definition(
        book_hotel={"input": {"seat.$": {"expression": "steps.reserve_flight.output.seat", "default": "any"}}}
    )
    p = Pipeline()
    wid = p.start(definition, TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    [request] = p.requests("hotels")
    assert (request.action, request.input) == ("book", {"seat": "any"})
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
