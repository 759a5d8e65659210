"""What the two server backends share: the connection and its clients, the model's
fingerprint, and the refusals of what only the in-process engine can do.

``LlamaServerBackend`` (``app.remote.llama_server.backend``) and ``OpenAIBackend``
(``app.remote.openai.backend``) derive from ``ServerBackend``; each adds its own
requests, capabilities and generation.
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


class ServerBackend:
    """The client side of one connection: its two clients, its model, its refusals.

    ``_client`` makes the JSON calls on kept-alive connections; ``_streams`` carries
    replies, a connection each (see ``app.remote.http``). A subclass sets
    ``draft_why_not``, the sentence that refuses a draft model.
    """

    draft_why_not = "a draft model runs with the in-process engine only"

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.connection = connection
        self._api_key = api_key
        self._limits = limits
        self._client: Any = None
        self._streams: Any = None
        self._info: ModelInfo | None = None

    # -- the Backend protocol's common part ------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    def hardware(self) -> HardwareInfo:
        return HardwareInfo(False, ())  # the model runs on the server

    @property
    def draft_info(self) -> DraftInfo | None:
        return None  # a draft the server was started with is the server's business

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Only "no draft" is accepted: this app cannot load a model on a server.

        Raises:
            DraftError.
        """
        if path:
            raise DraftError(f"Cannot use a draft model here: {self.draft_why_not}.")
        return None

    # -- clients -----------------------------------------------------------------------

    def _open_clients(self) -> tuple[Any, Any]:
        """A new pair of clients for the connection (the old ones stay until ``_use_clients``).

        Raises:
            ModelLoadError: the URL or TLS settings cannot be used.
        """
        conn = self.connection
        try:
            return make_clients(conn.url, self._api_key, conn.verify_tls)
        except LamplightError as exc:
            raise ModelLoadError(cannot_connect(conn, exc)) from None

    def _use_clients(self, client: Any, streams: Any) -> None:
        """Make ``client`` and ``streams`` the ones in use; close the old ones."""
        old = (self._client, self._streams)
        self._client, self._streams = client, streams
        for each in old:
            if each is not None:
                each.close()

    def _close_clients(self) -> None:
        for client in (self._client, self._streams):
            if client is not None:
                client.close()
        self._client = self._streams = None

    def _ping(self, probe: Callable[[Any], str]) -> str:
        """``probe``'s answer on the client in use (or a short-lived one); "" when ready,
        else why not, as does ``Backend.ping``."""
        try:
            with client_for(self._client, self.connection, self._api_key) as client:
                return probe(client)
        except LamplightError as exc:
            return str(exc)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        """One JSON call within ``Limits.call_s``.

        Raises:
            ServerUnreachable, ServerError, ApiKeyRefused.
        """
        if self._client is None:
            self._client = make_client(
                self.connection.url, self._api_key, self.connection.verify_tls
            )
        return call(self._client, method, path, body, timeout=self._limits.call_s)

    # -- model -------------------------------------------------------------------------

    def _fingerprint(self, name: str, size: int, ident: list[Any]) -> dict[str, Any]:
        """``ModelInfo.fingerprint`` of a server's model: no file to hash here, so a hash
        of what names it on this server (``ident``) stands for the file's."""
        digest = hashlib.sha256(json.dumps(ident).encode()).hexdigest()
        return {"name": name, "size": size, "sha256": "server:" + digest}

    def _require(self) -> ModelInfo:
        if self._info is None or self._client is None:
            raise NoModelLoaded("Not connected to the server: connect first.")
        return self._info
