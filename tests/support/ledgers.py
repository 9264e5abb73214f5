"""What the sample services' ledgers say happened to one workflow, across the three services, in order."""

from __future__ import annotations

from collections.abc import Mapping

from http_server import RunningServer


def ledger_order(servers: Mapping[str, RunningServer], workflow_id: str) -> list[tuple[str, str, str]]:
    """The effects applied and undone for ``workflow_id``, in the order the services wrote them.

    Returns ``(service, "effect" | "undo", step)`` triples. The servers must run in this process, so that their
    records share one sequence (``travel_services.PROCESS_SEQUENCE``) and sort into one order.
    """
    records = sorted(
        (record for server in servers.values() for record in server.service.history(workflow_id)),
        key=lambda record: record.sequence,
    )
    return [
        (record.service, "effect" if record.kind == "response" else "undo", record.step)
        for record in records
        if record.kind == "undo" or (record.kind == "response" and record.effect)
    ]
