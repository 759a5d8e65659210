"""The models an OpenAI-compatible server offers: its ``/models`` list, the one picked
for a connection, and the ``ModelInfo`` this client shows for it."""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from app.engine.backend import Capabilities, ModelInfo
from app.remote.connection import Connection
from app.remote.http import ServerError, call, make_client, where
from app.remote.openai.wire import ServerModel, key_message, parse_models
from app.remote.server_link import fingerprint
from app.util.errors import ApiKeyRefused, ModelLoadError


def api_prefix(url: str) -> str:
    """The path to put before ``/models`` and ``/chat/completions``: ``/v1`` unless the
    connection URL already ends with it."""
    path = urlsplit(url.strip()).path.rstrip("/")
    return "" if path.endswith("/v1") else "/v1"


def list_models(connection: Connection, api_key: str = "") -> list[str]:
    """The ids of the models the server offers (for the connection dialog).

    Raises:
        ApiKeyRefused, ServerUnreachable, ServerError, LamplightError (a bad URL).
    """
    client = make_client(connection.url, api_key, connection.verify_tls)
    try:
        return [m.id for m in fetch_models(client, connection.url)]
    finally:
        client.close()


def fetch_models(client: Any, url: str, timeout: float = 30.0) -> list[ServerModel]:
    """The server's models, at least one.

    Raises:
        ApiKeyRefused, ServerUnreachable, ServerError.
    """
    try:
        data = call(client, "GET", api_prefix(url) + "/models", timeout=timeout)
    except ServerError as exc:
        if exc.status in (401, 403):
            raise ApiKeyRefused(key_message(exc)) from None
        if exc.status == 404:
            raise ServerError(
                404,
                f"The server at {where(url)} has no {api_prefix(url)}/models: it does not "
                "look like an OpenAI-compatible server (check the address).",
            ) from None
        raise
    models = parse_models(data)
    if not models:
        raise ServerError(0, f"The server at {where(url)} lists no models.")
    return models


def pick_model(models: list[ServerModel], wanted: str, connection: Connection) -> ServerModel:
    """The model named ``wanted`` ("" for the server's first).

    Raises:
        ModelLoadError: the server does not have it (the message lists the ones it has).
    """
    chosen = next((m for m in models if m.id == wanted), None) if wanted else models[0]
    if chosen is None:
        have = ", ".join(m.id for m in models[:20])
        more = f" and {len(models) - 20} more" if len(models) > 20 else ""
        raise ModelLoadError(
            f"Could not connect to {connection.name}: the server has no model "
            f"{wanted!r}. It has: {have}{more}."
        )
    return chosen


def model_info(
    chosen: ServerModel, connection: Connection, capabilities: Capabilities, t0: float
) -> ModelInfo:
    """What this client shows for the server's model ``chosen``, connected since ``t0``."""
    name = chosen.id
    if name.startswith("/") or name.lower().endswith(".gguf"):
        name = PurePosixPath(name.replace("\\", "/")).name or name
    notes: tuple[str, ...] = ()
    if chosen.n_ctx <= 0:
        notes = (
            "The server does not say this model's context size: a conversation that "
            "outgrows it ends with the server's error instead of dropping older messages.",
        )
    return ModelInfo(
        path=Path(chosen.id),
        name=name,
        architecture="",
        n_params=chosen.n_params,
        file_size=chosen.size,
        n_ctx=chosen.n_ctx,
        n_ctx_train=chosen.n_ctx_train or chosen.n_ctx,
        n_threads=0,
        n_gpu_layers=0,
        template="the server's",
        backend=f"OpenAI-compatible server at {where(connection.url)}",
        load_ms=(time.perf_counter() - t0) * 1000,
        notes=notes,
        capabilities=capabilities,
        server=connection.url,
        fingerprint=fingerprint(
            name, chosen.size, [connection.url, chosen.id, chosen.size, chosen.n_params]
        ),
        runtime={"openai": chosen.owned_by},
    )
