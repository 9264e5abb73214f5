"""The price list of a deployment's region (issue 44: "prices come from one table, the bench's, with a parameter for
the region"): template parameter PriceRegion, SASFLOW_PRICE_REGION in every function's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.template import load_template
from sasflow import prices
from sasflow.api_models import CostView
from sasflow.cost import Tally
from sasflow.prices import PRICE_LISTS, PRICE_REGION_VARIABLE, price_list

ROOT = Path(__file__).resolve().parents[2]
ONE_TRIP = Tally(wru=12, rru=1.5, sqs=5.25, invocations=2.5, mb_ms=9_420, log_bytes=920, api=1)


def test_the_us_east_1_list_is_the_benchs_and_prices_a_tally_as_the_module_does() -> None:
    listed = price_list("us-east-1")
    assert listed.LAMBDA_PER_GB_SECOND == prices.LAMBDA_PER_GB_SECOND
    assert listed.DYNAMODB_PER_WRU == prices.DYNAMODB_PER_WRU == 0.625e-6
    assert ONE_TRIP.dollars(listed) == pytest.approx(ONE_TRIP.dollars(prices))
    assert listed.label == f"us-east-1, read {prices.PRICES_READ_ON}"


def test_the_region_comes_from_the_parameter_then_the_functions_region(monkeypatch: pytest.MonkeyPatch) -> None:
    other = next(region for region in PRICE_LISTS if region != "us-east-1")
    monkeypatch.setenv("AWS_REGION", other)
    monkeypatch.setenv(PRICE_REGION_VARIABLE, "")
    assert price_list().label.startswith(f"{other}, read")  # PriceRegion empty: the deployment's own region
    monkeypatch.setenv(PRICE_REGION_VARIABLE, "us-east-1")
    assert price_list().REGION == "us-east-1"  # PriceRegion set: its list, wherever the stack runs


def test_a_region_without_a_list_is_priced_at_us_east_1s_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRICE_REGION_VARIABLE, "")
    monkeypatch.setenv("AWS_REGION", "eu-south-2")
    view = CostView.of(ONE_TRIP)
    assert view.prices == f"us-east-1 (no price list for eu-south-2), read {prices.PRICES_READ_ON}"
    assert view.dollars == pytest.approx(ONE_TRIP.dollars(prices))


def test_each_listed_region_prices_the_same_tally_by_its_own_list(monkeypatch: pytest.MonkeyPatch) -> None:
    for region, listed in PRICE_LISTS.items():
        monkeypatch.setenv(PRICE_REGION_VARIABLE, region)
        view = CostView.of(ONE_TRIP)
        assert view.prices == listed.label and listed.ASKED_FOR == ""
        by_line = {line.name: line.dollars for line in view.lines}
        assert by_line["DynamoDB writes"] == pytest.approx(12 * listed.DYNAMODB_PER_WRU)
        assert by_line["CloudWatch Logs"] == pytest.approx(920 * listed.CLOUDWATCH_LOGS_PER_BYTE)
        assert view.dollars == pytest.approx(ONE_TRIP.dollars(listed))


def test_the_template_offers_every_listed_region_and_gives_every_function_the_choice() -> None:
    template = load_template(ROOT / "template.yaml")
    parameter = template["Parameters"]["PriceRegion"]
    assert parameter["Default"] == ""
    assert sorted(parameter["AllowedValues"]) == sorted(["", *PRICE_LISTS])
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables[PRICE_REGION_VARIABLE] == {"Ref": "PriceRegion"}


def test_frankfurt_prices_a_trip_above_virginia_by_its_dynamodb_logs_and_api_prices() -> None:
    virginia, frankfurt = ONE_TRIP.dollars(price_list("us-east-1")), ONE_TRIP.dollars(price_list("eu-central-1"))
    extra = 12 * (0.7625 - 0.625) / 1e6 + 1.5 * (0.1525 - 0.125) / 1e6 + 920 * (0.63 - 0.50) / 1e9 + 0.20 / 1e6
    assert frankfurt - virginia == pytest.approx(extra)
