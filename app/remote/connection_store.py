"""The saved server connections and which one is in use, in ``connections.json``.

The file holds no secret: API keys live in the OS keyring (``app.remote.keys``),
and an address with a user name or password in it (``https://user:pw@host``)
is refused, so nothing the user types as a credential ends up in clear text.

It is read like every other data file (``app.util.datafiles``): bounded size and
depth, regular files only. A file that cannot be used as a whole (not JSON, not
an object, no list of connections) is set aside as ``connections.json.bad`` and
the list starts empty. A file with some bad entries is repaired: entries that
cannot be used (no name, an unknown kind, a bad address) are left out, fields
that can be mended (slot, model, TLS flag, id) take their defaults, one note per
change; the original is kept as ``.bad`` and the repaired list written in its
place. Reading never raises for what is in the file.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.remote.connection import KIND_LABELS, KINDS, Connection
from app.remote.http import (
    ServerError,
    call,
    check_url,
    make_client,
    where,
)
from app.util.atomic import atomic_write_text
from app.util.datafiles import (
    DataFileError,
    clean_text,
    os_reason,
    read_json,
    repair_on_disk,
    set_aside_note,
)
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

FILE_NAME = "connections.json"
FORMAT = 1
MAX_BYTES = 1 << 20  # a hundred connections take a few kB
# The file nests 3 levels ({"connections": [{"name": ...}]}). The cap is far above that so
# that one entry with a nested value in a field is left out alone instead of costing the
# whole file (the fuzz test found that with a cap of 4); nothing here recurses into values.
MAX_DEPTH = 32
MAX_CONNECTIONS = 200
NAME_CHARS = 80
URL_CHARS = 2048
MODEL_CHARS = 512
MAX_SLOT = 1023  # llama-server --parallel; far above what one machine serves
PROBE_TIMEOUT_S = 10.0
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class BadConnection(LamplightError):
    """A connection that cannot be saved; ``field`` names the input that is wrong."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def new_id() -> str:
    """A fresh connection id (also the user name of its API key in the keyring)."""
    return secrets.token_hex(8)


def make_connection(
    *,
    id: str,
    name: str,
    kind: str,
    url: str,
    model: str = "",
    verify_tls: bool = True,
    slot: int = 0,
) -> Connection:
    """A checked ``Connection``: name and address trimmed, the address normalised.

    Raises:
        BadConnection: a value cannot be used; ``field`` says which
            (``id``, ``name``, ``kind``, ``url``, ``model``, ``slot``).
    """
    if not isinstance(id, str) or not _ID.fullmatch(id):
        raise BadConnection("id", "The connection id must be 1-64 letters, digits, - or _.")
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        raise BadConnection("name", "Give the connection a name.")
    if len(name) > NAME_CHARS:
        raise BadConnection("name", f"The name is longer than {NAME_CHARS} characters.")
    if _CONTROL.search(name):
        raise BadConnection("name", "The name has a line break or another control character.")
    if kind not in KINDS:
        raise BadConnection("kind", f"Unknown server kind {str(kind)[:40]!r}.")
    url = check_address(url)
    if not isinstance(model, str) or len(model) > MODEL_CHARS or _CONTROL.search(model):
        raise BadConnection(
            "model", f"The model name must be text of at most {MODEL_CHARS} characters."
        )
    if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot <= MAX_SLOT:
        raise BadConnection("slot", f"The slot must be a number from 0 to {MAX_SLOT}.")
    if not isinstance(verify_tls, bool):
        raise BadConnection("verify_tls", "verify_tls must be true or false.")
    return Connection(
        id=id,
        name=clean_text(name),
        kind=kind,
        url=url,
        model=clean_text(model.strip()),
        verify_tls=verify_tls,
        slot=slot,
    )


def check_address(url: Any) -> str:
    """A server address Lamplight can use and store: http(s), a host, no credentials.

    Raises:
        BadConnection: with ``field`` "url" and a sentence saying what is wrong.
    """
    if not isinstance(url, str) or not url.strip():
        raise BadConnection("url", "Enter the server's address, like http://127.0.0.1:8080.")
    text: str = url.strip()
    if len(text) > URL_CHARS:
        raise BadConnection("url", f"The address is longer than {URL_CHARS} characters.")
    if _CONTROL.search(text) or any(c.isspace() for c in text):
        raise BadConnection("url", "The address has spaces or control characters in it.")
    try:
        text = check_url(text)
        parts = urlsplit(text)
    except LamplightError as exc:
        raise BadConnection("url", str(exc)) from None
    except ValueError as exc:  # urlsplit: "Invalid IPv6 URL", NFKC-changed host names
        raise BadConnection("url", f"The server address cannot be read ({exc}).") from None
    if parts.username is not None or parts.password is not None:
        raise BadConnection(
            "url",
            "Leave the user name and password out of the address; put the key in the "
            "API key field, which is kept in the system keyring.",
        )
    return text


# -- the file --------------------------------------------------------------------------


@dataclass
class Loaded:
    """What ``load_connections`` found: the usable connections, the active id
    ("" = this computer) and one line per thing that was wrong with the file."""

    connections: list[Connection] = field(default_factory=list)
    active: str = ""
    notes: list[str] = field(default_factory=list)


def to_json(connections: Iterable[Connection], active: str) -> str:
    """The file's text. Holds no API key (a ``Connection`` has none)."""
    data = {
        "format": FORMAT,
        "active": active,
        "connections": [
            {
                "id": c.id,
                "name": c.name,
                "kind": c.kind,
                "url": c.url,
                "model": c.model,
                "verify_tls": c.verify_tls,
                "slot": c.slot,
            }
            for c in connections
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def save_connections(path: Path, connections: Iterable[Connection], active: str) -> None:
    """Write the list atomically.

    Raises:
        OSError: it could not be written.
    """
    atomic_write_text(path, to_json(connections, active))


def parse_connections(data: Any) -> Loaded:
    """The usable connections in a parsed file, with a note per left-out or mended value.

    Raises:
        DataFileError: ``data`` has no list of connections at all (nothing to keep).
    """
    if not isinstance(data, dict):
        raise DataFileError("is not a JSON object")
    items = data.get("connections")
    if not isinstance(items, list):
        raise DataFileError("has no list of connections")
    out = Loaded()
    fmt = data.get("format")
    if fmt is not None and fmt != FORMAT:
        out.notes.append(f"the file format {_short(fmt)} is not {FORMAT}; read as {FORMAT}.")
    if len(items) > MAX_CONNECTIONS:
        out.notes.append(f"only the first {MAX_CONNECTIONS} of {len(items)} connections are kept.")
    seen: set[str] = set()
    for n, item in enumerate(items[:MAX_CONNECTIONS], 1):
        conn = _entry(n, item, seen, out.notes)
        if conn is not None:
            seen.add(conn.id)
            out.connections.append(conn)
    active = data.get("active", "")
    if active is None or active == "":
        active = ""
    elif not isinstance(active, str) or active not in seen:
        out.notes.append(
            f"the connection in use ({_short(active)}) is not in the list; this computer is used."
        )
        active = ""
    out.active = active
    return out


def load_connections(path: Path) -> Loaded:
    """Read ``path``; never raises for what is in it (see the module docstring)."""
    try:
        data = read_json(path, MAX_BYTES, MAX_DEPTH)
        loaded = parse_connections(data)
    except FileNotFoundError:
        return Loaded()
    except DataFileError as exc:
        note = set_aside_note(path, str(exc), "the list of servers starts empty")
        log.warning("%s", note)
        return Loaded(notes=[note])
    if not loaded.notes:
        return loaded
    notes = repair_on_disk(
        path, loaded.notes, lambda: save_connections(path, loaded.connections, loaded.active)
    )
    for note in notes:
        log.warning("%s", note)
    loaded.notes = notes
    return loaded


def _entry(n: int, item: Any, seen: set[str], notes: list[str]) -> Connection | None:
    """Entry ``n`` as a ``Connection``, mended where it can be, or None (with a note)."""
    if not isinstance(item, dict):
        notes.append(f"connection {n} is not an object; it was left out.")
        return None
    label = item.get("name")
    label = f"connection {n} ({_short(label)})" if isinstance(label, str) else f"connection {n}"
    fields: dict[str, Any] = {
        "id": item.get("id"),
        "name": item.get("name"),
        "kind": item.get("kind"),
        "url": item.get("url"),
        "model": item.get("model", ""),
        "verify_tls": item.get("verify_tls", True),
        "slot": item.get("slot", 0),
    }
    if isinstance(fields["id"], str) and fields["id"] in seen:
        notes.append(
            f"{label} had the id of an earlier one; it got a new id (enter its key again)."
        )
        fields["id"] = new_id()
    mendable = {"id": new_id(), "model": "", "verify_tls": True, "slot": 0}
    for _ in range(len(mendable) + 1):
        try:
            return make_connection(**fields)
        except BadConnection as exc:
            if exc.field not in mendable:
                notes.append(f"{label} was left out: {exc}")
                return None
            if exc.field == "verify_tls":
                notes.append(f"{label}: certificate checks were switched back on.")
            elif exc.field == "id":
                notes.append(f"{label}: its id was not usable; it got a new one.")
            else:
                notes.append(f"{label}: its {exc.field} was not usable; using the default.")
            fields[exc.field] = mendable.pop(exc.field)
    return None  # pragma: no cover - every mendable field is mended once at most


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


class ConnectionStore:
    """The connections file in memory; every change is written at once.

    ``notes`` holds what was wrong with the file when it was read (for the
    start-up notices). Changes that cannot be written raise ``LamplightError``
    and leave the list as it was on disk.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        loaded = load_connections(path)
        self._connections = loaded.connections
        self.active = loaded.active
        self.notes = loaded.notes

    @classmethod
    def in_dir(cls, root: Path) -> ConnectionStore:
        """The store in data directory ``root``."""
        return cls(root / FILE_NAME)

    @property
    def connections(self) -> list[Connection]:
        return list(self._connections)

    def get(self, conn_id: str) -> Connection | None:
        return next((c for c in self._connections if c.id == conn_id), None)

    @property
    def active_connection(self) -> Connection | None:
        """The connection in use, or None for this computer."""
        return self.get(self.active) if self.active else None

    def put(self, connection: Connection) -> None:
        """Add ``connection``, or replace the one with its id (keeping its place).

        Raises:
            LamplightError: the list could not be saved.
        """
        new = [connection if c.id == connection.id else c for c in self._connections]
        if self.get(connection.id) is None:
            if len(new) >= MAX_CONNECTIONS:
                raise LamplightError(f"There can be at most {MAX_CONNECTIONS} connections.")
            new.append(connection)
        self._write(new, self.active)

    def remove(self, conn_id: str) -> None:
        """Remove a connection and forget its API key.

        Raises:
            LamplightError: the list could not be saved.
        """
        from app.remote import keys

        new = [c for c in self._connections if c.id != conn_id]
        self._write(new, "" if self.active == conn_id else self.active)
        keys.delete_key(conn_id)

    def set_active(self, conn_id: str) -> None:
        """Remember which connection is in use ("" = this computer).

        Raises:
            LamplightError: the id is not in the list, or it could not be saved.
        """
        if conn_id and self.get(conn_id) is None:
            raise LamplightError("That connection is no longer in the list.")
        self._write(self._connections, conn_id)

    def _write(self, connections: list[Connection], active: str) -> None:
        try:
            save_connections(self.path, connections, active)
        except OSError as exc:
            raise LamplightError(
                f"The list of servers could not be saved ({os_reason(exc)})."
            ) from exc
        self._connections = list(connections)
        self.active = active


# -- testing a connection (any thread; no Qt) --------------------------------------------


@dataclass(frozen=True)
class Probe:
    """What a server said when tested: ``ok``, a line for the user, the models it
    offers and the one to pick."""

    ok: bool
    message: str
    models: tuple[str, ...] = ()
    model: str = ""


def probe(connection: Connection, api_key: str = "", client: Any = None) -> Probe:
    """Ask the server who it is; never raises for what the server does.

    ``client`` (from ``make_client``) lets a caller on another thread close it to
    cut the request short; by default one is made and closed here.
    """
    own = client is None
    if own:
        try:
            client = make_client(connection.url, api_key, connection.verify_tls)
        except LamplightError as exc:
            return Probe(False, str(exc))
    try:
        if connection.kind == "llama-server":
            return _probe_llama_server(client, connection)
        return _probe_openai(client, connection)
    except LamplightError as exc:  # ServerUnreachable, ServerError, a refused key
        return Probe(False, str(exc))
    except Exception as exc:  # a closed client or a transport oddity: report, never crash
        log.debug("probe failed", exc_info=True)
        return Probe(False, f"Cannot reach the server at {where(connection.url)}: {exc}")
    finally:
        if own:
            client.close()


def _probe_llama_server(client: Any, connection: Connection) -> Probe:
    try:
        call(client, "GET", "/health", timeout=PROBE_TIMEOUT_S)
    except ServerError as exc:
        if exc.status != 503:
            raise
        return Probe(False, f"The server at {where(connection.url)} is still loading its model.")
    props = call(client, "GET", "/props", timeout=PROBE_TIMEOUT_S)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(props, dict) or not isinstance(settings, dict):
        return Probe(
            False,
            f"The server at {where(connection.url)} answers but does not look like a "
            "llama.cpp server (no /props). Choose OpenAI-compatible instead.",
        )
    path = str(props.get("model_path") or props.get("model_alias") or "")
    model = clean_text(path.replace("\\", "/").rsplit("/", 1)[-1])[:MODEL_CHARS] or "model"
    build = clean_text(str(props.get("build_info") or "").strip())[:60]
    n_ctx = settings.get("n_ctx")
    ctx = f" (context {n_ctx})" if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else ""
    server = f"llama-server {build}" if build else "llama-server"
    return Probe(True, f"Connected: {server} with {model}{ctx}.", (model,), model)


def _probe_openai(client: Any, connection: Connection) -> Probe:
    # The OpenAI-compatible backend's reading of the list (``/v1`` already in the address,
    # the context fields of each server), on this probe's client so that closing the
    # dialog cuts it short (``list_models`` makes a client of its own).
    from app.remote.openai.models import api_prefix
    from app.remote.openai.wire import parse_models

    path = api_prefix(connection.url) + "/models"
    try:
        data = call(client, "GET", path, timeout=PROBE_TIMEOUT_S)
    except ServerError as exc:
        if exc.status in (401, 403):
            text = str(exc).rstrip()
            text = text if text.endswith((".", "!", "?")) else text + "."
            raise ServerError(exc.status, f"{text} Check the API key.") from None
        if exc.status == 404:
            raise ServerError(
                404,
                f"The server at {where(connection.url)} has no {path}: it does not look "
                "like an OpenAI-compatible server (check the address).",
            ) from None
        raise
    models: list[str] = []
    n_ctx: dict[str, int] = {}
    for entry in parse_models(data):
        name = clean_text(entry.id.strip())
        if name and len(name) <= MODEL_CHARS and not _CONTROL.search(name) and name not in models:
            models.append(name)
            n_ctx[name] = entry.n_ctx
    if not models:
        return Probe(False, f"The server at {where(connection.url)} answers but lists no models.")
    model = connection.model if connection.model in models else models[0]
    what = f"{len(models)} models" if len(models) != 1 else models[0]
    ctx = f" (context {n_ctx[model]})" if len(models) == 1 and n_ctx.get(model) else ""
    return Probe(
        True,
        f"Connected: {KIND_LABELS['openai']} server at {where(connection.url)} with {what}{ctx}.",
        tuple(models),
        model,
    )
