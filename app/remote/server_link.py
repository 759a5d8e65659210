"""What the two server backends share, as parts they hold rather than a base class: the
connection and its clients (``ServerLink``), the model's fingerprint, and the refusals
of what only the in-process engine can do.

``LlamaServerBackend`` (``app.remote.llama_server.backend``) and ``OpenAIBackend``
(``app.remote.openai.backend``) each own a ``ServerLink`` and their model's ``ModelInfo``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.engine.backend import DraftInfo, ModelInfo
from app.engine.native.hardware import HardwareInfo
from app.remote.connection import Connection
from app.remote.http import (
    DEFAULT_LIMITS,
    Limits,
    call,
    cannot_connect,
    client_for,
    make_client,
    make_clients,
)
from app.util.errors import DraftError, LamplightError, ModelLoadError, NoModelLoaded

ON_SERVER = HardwareInfo(False, ())  # the model runs on the server


class ServerLink:
    """The client side of one connection: its two clients.

    ``client`` makes the JSON calls on kept-alive connections; ``streams`` carries
    replies, a connection each (see ``app.remote.http``).
    """

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.connection = connection
        self.api_key = api_key
        self.limits = limits
        self._client: Any = None
        self._streams: Any = None

    @property
    def client(self) -> Any:
        return self._client

    @property
    def streams(self) -> Any:
        return self._streams

    @property
    def connected(self) -> bool:
        return self._client is not None

    def open(self) -> tuple[Any, Any]:
        """A new pair of clients for the connection (the old ones stay until ``use``).

        Raises:
            ModelLoadError: the URL or TLS settings cannot be used.
        """
        conn = self.connection
        try:
            return make_clients(conn.url, self.api_key, conn.verify_tls)
        except LamplightError as exc:
            raise ModelLoadError(cannot_connect(conn, exc)) from None

    def use(self, client: Any, streams: Any) -> None:
        """Make ``client`` and ``streams`` the ones in use; close the old ones."""
        old = (self._client, self._streams)
        self._client, self._streams = client, streams
        for each in old:
            if each is not None:
                each.close()

    def close(self) -> None:
        for client in (self._client, self._streams):
            if client is not None:
                client.close()
        self._client = self._streams = None

    def ping(self, probe: Callable[[Any], str]) -> str:
        """``probe``'s answer on the client in use (or a short-lived one); "" when ready,
        else why not, as does ``Backend.ping``."""
        try:
            with client_for(self._client, self.connection, self.api_key) as client:
                return probe(client)
        except LamplightError as exc:
            return str(exc)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One JSON call within ``Limits.call_s``.

        Raises:
            ServerUnreachable, ServerError, ApiKeyRefused.
        """
        if self._client is None:
            self._client = make_client(
                self.connection.url, self.api_key, self.connection.verify_tls
            )
        return call(self._client, method, path, body, timeout=self.limits.call_s)


def fingerprint(name: str, size: int, ident: list[Any]) -> dict[str, Any]:
    """``ModelInfo.fingerprint`` of a server's model: no file to hash here, so a hash
    of what names it on this server (``ident``) stands for the file's."""
    digest = hashlib.sha256(json.dumps(ident).encode()).hexdigest()
    return {"name": name, "size": size, "sha256": "server:" + digest}


def require(info: ModelInfo | None, link: ServerLink) -> ModelInfo:
    """The model in use.

    Raises:
        NoModelLoaded: not connected.
    """
    if info is None or not link.connected:
        raise NoModelLoaded("Not connected to the server: connect first.")
    return info


def refuse_draft(path: str | Path | None, why_not: str) -> DraftInfo | None:
    """``Backend.set_draft`` on a server: only "no draft" is accepted, since this app
    cannot load a model on a server (``why_not`` says so).

    Raises:
        DraftError.
    """
    if path:
        raise DraftError(f"Cannot use a draft model here: {why_not}.")
    return None
