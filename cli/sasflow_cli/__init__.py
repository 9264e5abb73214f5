"""sasflow's operator CLI (``sasflow``): a client of the HTTP API, outside the Lambda layer.

Modules
-------
app
    The commands (typer).
client
    Signed JSON requests, safe retries, `ApiError`.
targets
    ``--url`` (local stack, local identities) or ``--stack`` (deployed: the stack's ``ApiUrl``, AWS credentials).
render
    Tables for people.
watch
    The ``watch`` loop (injected clock and sleep).
timeline
    Bars of every attempt from a workflow's history; PNG and self-contained HTML.
"""

from __future__ import annotations

__all__: list[str] = []
