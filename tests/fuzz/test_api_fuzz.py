"""A small, bounded round of the API fuzzing of `make fuzz` (tools/fuzz.py), inside `make test`.

schemathesis loads /openapi.json from the local stack and sends generated requests, valid and invalid, to every
operation through the emulated HTTP API; every response must be a non-5xx that the document describes (status,
content type, headers, body schema), and every schema-invalid request a documented 4xx. Bounded by examples per
operation and a time budget, so it stays under a minute with the stack's start; `make fuzz` runs 2,000+ cases.
"""

from __future__ import annotations

import pytest

from tools.fuzz import local_api, run_schemathesis, summary

pytestmark = pytest.mark.system

SEED = 20261129
MAX_TIME_SECONDS = 25


def test_fuzzing_the_local_api_finds_no_server_error_and_no_response_that_breaks_the_document() -> None:
    # Given the local stack (template on loopback) with the sample services behind its agents
    with local_api() as api_url:
        # When schemathesis fuzzes every operation of the served OpenAPI document, bounded in examples and time
        result = run_schemathesis(api_url, max_examples=10, max_time=MAX_TIME_SECONDS, seed=SEED)
    # Then no check failed and nothing errored
    assert result.ok, f"{summary(result)}\n{result.output}"
    assert result.cases >= 5, summary(result)  # it ran (about 100 cases on an idle machine; few under heavy load)
