"""Unit tests run with sockets disabled (pytest-socket): any network use, loopback included, fails the test.

Every test under tests/unit gets the ``disable_socket`` marker; pytest-socket then blocks ``socket.socket``
and name resolution from the start of the test's setup (module/session fixtures included) to its teardown.
moto's in-process ``mock_aws`` needs no socket. A unit test that truly needs one belongs in tests/integration
(``@pytest.mark.enable_socket`` exists as an escape hatch, but prefer moving the test).
"""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT_DIR in item.path.resolve().parents:
            item.add_marker(pytest.mark.disable_socket)
