"""The operators' web console (``sasflow console``): `server.Console` and its templates and static files."""

from .server import Console, ConsoleServer

__all__ = ["Console", "ConsoleServer"]
