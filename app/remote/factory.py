"""The ``Backend`` for a saved connection."""

from __future__ import annotations

from app.engine.backend import Backend
from app.remote.connection import Connection
from app.util.errors import LamplightError


def backend_for(connection: Connection, api_key: str = "") -> Backend:
    """A not-yet-connected backend for ``connection`` (``load`` connects it).

    Raises:
        LamplightError: an unknown kind of server.
    """
    if connection.kind == "llama-server":
        from app.remote.llama_server.backend import LlamaServerBackend

        return LlamaServerBackend(connection, api_key)
    if connection.kind == "openai":
        from app.remote.openai.backend import OpenAIBackend

        return OpenAIBackend(connection, api_key)
    raise LamplightError(f"Unknown kind of server: {connection.kind!r}.")
