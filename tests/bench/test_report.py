"""bench.report: a row's ratio and whether its target is met, on each side of every target the bench uses."""

from __future__ import annotations

import pytest

from bench import cold_start, cost, sweep, throughput
from bench.report import Row


def test_the_targets_are_the_ones_the_docs_report() -> None:
    # Given / When the bench's targets / Then they are those of docs/bench.md's table
    assert (cost.COST_TARGETS, cost.DURABLE_TARGETS, cost.REQUEST_TARGET) == (
        {"S1": 0.17, "S2": 0.20, "S6": 0.17},
        {"S1": 0.50},
        1.25,
    )
    assert (sweep.RATIO_TARGET, throughput.TARGET_RATIO, cold_start.TARGET_RATIO) == (1.05, 0.5, 1.3)


@pytest.mark.parametrize(
    ("ours", "anchor", "at_most", "ratio", "met"),
    [
        (19, 100, 0.2, 0.19, True),  # cost per step against Step Functions
        (20, 100, 0.2, 0.20, True),  # at the target: "at most" includes it
        (21, 100, 0.2, 0.21, False),
        (124, 100, 1.25, 1.24, True),  # requests per step against the minimum
        (126, 100, 1.25, 1.26, False),
        (21, 20, 1.05, 1.05, True),  # sweep: index items read per overdue step
        (22, 20, 1.05, 1.10, False),
        (0.129, 0.1, 1.3, 1.29, True),  # cold start: import seconds against the baseline
        (0.131, 0.1, 1.3, 1.31, False),
    ],
)
def test_an_at_most_target_is_met_at_or_below_it(
    ours: float, anchor: float, at_most: float, ratio: float, met: bool
) -> None:
    # Given a figure and its anchor / When the row is made with an "at most" target
    row = Row.compare("m", ours, anchor, at_most=at_most)
    # Then the ratio is ours / anchor and the verdict is known from which side of the target it lies
    assert row.ratio == pytest.approx(ratio)
    assert (row.target, row.met) == (f"<= {at_most:g}", met)
    assert row.cells()[-1] == ("yes" if met else "**no**")


@pytest.mark.parametrize(
    ("ours", "anchor", "ratio", "met"),
    [(26, 52, 0.5, True), (27, 52, 27 / 52, True), (25, 52, 25 / 52, False), (0, 52, 0.0, False)],
)
def test_an_at_least_target_is_met_at_or_above_it(ours: float, anchor: float, ratio: float, met: bool) -> None:
    # Given steps/s against the ceiling / When the row is made with the throughput target (at least 0.5)
    row = Row.compare("steps/s", ours, anchor, at_least=0.5)
    # Then it is met at 0.5 and above only
    assert row.ratio == pytest.approx(ratio)
    assert (row.target, row.met) == (">= 0.5", met)


def test_a_row_without_a_target_has_no_verdict() -> None:
    row = Row.compare("m", 3, 2)
    assert (row.ratio, row.target, row.met) == (1.5, "", None)
    assert row.cells() == ["m", "3.00", "2.00", "1.500", "", ""]
