"""``mcp.json``: the MCP servers the user configured, in Cursor / Claude Desktop format.

``{"mcpServers": {"name": {"command", "args", "env", "cwd"} | {"url", "headers"}}}``;
VS Code's top-level ``servers`` is read too, and ``"disabled": true`` / ``"type"``.
The file is the user's (pasted from elsewhere): it is read, never rewritten, except to
move secrets into the keyring (``move_secrets``). It is untrusted: bounded in size,
depth and string lengths; each bad server gives one problem line and the rest load.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.remote.keys import get_key, keyring_reason, set_key
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, parse_json, read_limited, reason

MAX_BYTES = 1 << 20
MAX_DEPTH = 12
MAX_SERVERS = 64
MAX_NAME = 64
MAX_STRING = 4096
MAX_ITEMS = 256  # args, env entries, headers
KEYRING = "${keyring}"
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "COOKIE")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class ServerConfig:
    """One configured server. ``env``/``headers`` values may be ``KEYRING`` (the
    secret is in the keyring under ``secret_id(name, key)``)."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""
    url: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    disabled: bool = False

    def display(self) -> str:
        """What runs (the command line, with its folder) or where it connects."""
        if self.transport == "http":
            return self.url
        line = " ".join(_quote(p) for p in (self.command, *self.args))
        return f"{line}  (in {self.cwd})" if self.cwd else line

    def server_id(self) -> str:
        """What the user allows: the command, its arguments, folder and environment, or
        the URL and headers. Consent and "always" rules are bound to it, never to the
        name alone, so a server edited in ``mcp.json`` asks again."""
        if self.transport == "http":
            what: list[Any] = ["http", self.url, sorted(self.headers)]
        else:
            what = ["stdio", self.command, list(self.args), self.cwd, sorted(self.env)]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]

    def identity(self) -> str:
        """Changes whenever anything about the server changes (a restart is due)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class McpConfig:
    """The servers that could be read, and one line per problem."""

    servers: tuple[ServerConfig, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)


def secret_id(server: str, key: str) -> str:
    """The keyring id of a secret env var or header of ``server``."""
    return f"mcp:{server}:{key}"


def is_secret(key: str, value: str) -> bool:
    """Whether an env var or header looks like it carries a secret."""
    if not value or value == KEYRING or value.startswith("${"):
        return False  # empty, already moved, or a reference (VS Code's ${input:...})
    upper = key.upper()
    return any(w in upper for w in _SECRET_WORDS) or value.lower().startswith(("bearer ", "basic "))


def shown_value(key: str, value: str) -> str:
    """An env var's or header's value as the consent shows it: printable, at most 200
    characters, and masked when its name (or a Bearer/Basic value) looks secret."""
    if value == KEYRING:
        return "(kept in the keyring)"
    upper = key.upper()
    if value and (
        any(w in upper for w in _SECRET_WORDS) or value.lower().startswith(("bearer ", "basic "))
    ):
        return "•••••••• (hidden)"
    text = "".join(c if c.isprintable() else "?" for c in value[:200])
    return text + ("…" if len(value) > 200 else "")


def resolved(server: str, pairs: tuple[tuple[str, str], ...]) -> tuple[dict[str, str], list[str]]:
    """``pairs`` with keyring placeholders replaced; problems for secrets not found."""
    out: dict[str, str] = {}
    missing: list[str] = []
    for key, value in pairs:
        if value == KEYRING:
            value = get_key(secret_id(server, key))
            if not value:
                missing.append(key)
        out[key] = value
    return out, missing


def load_config(path: Path) -> McpConfig:
    """Read ``path`` (a missing file: no servers, no problem)."""
    try:
        raw = read_limited(path, MAX_BYTES)
    except FileNotFoundError:
        return McpConfig()
    except DataFileError as exc:
        return McpConfig(problems=(f"{path.name} {reason(exc)}.",))
    return parse_config(raw, path.name)


def parse_config(raw: bytes | str, label: str = "mcp.json") -> McpConfig:
    """Parse the text of an ``mcp.json``; never raises."""
    try:
        data = parse_json(raw, MAX_DEPTH)
    except DataFileError as exc:
        return McpConfig(problems=(f"{label} {reason(exc)}.",))
    table, problems = _server_table(data, label)
    servers: list[ServerConfig] = []
    for name, entry in table:
        try:
            servers.append(_server(name, entry))
        except ValueError as exc:
            problems.append(f"Server {_shown(name)}: {exc}")
    return McpConfig(tuple(servers), tuple(problems))


def move_secrets(path: Path) -> list[str]:
    """Move secret-looking env/header values of ``path`` into the keyring and rewrite
    the file with ``KEYRING`` in their place. Returns notes for the user; when the
    keyring cannot keep them the file is left as it is (a note says so)."""
    try:
        data = parse_json(read_limited(path, MAX_BYTES), MAX_DEPTH)
    except (FileNotFoundError, DataFileError):
        return []  # load_config reports it
    found = list(_secret_slots(data))
    if not found:
        return []
    if why := keyring_reason():
        return [f"{path.name} has secrets in it; they stay in the file, as {why}."]
    for server, key, holder in found:
        set_key(secret_id(server, key), holder[key])
    if why := keyring_reason():
        return [f"The secrets in {path.name} stay in the file, as {why}."]
    for _server, key, holder in found:
        holder[key] = KEYRING
    try:
        atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    except OSError as exc:
        return [f"{path.name} could not be rewritten without its secrets: {exc.strerror or exc}"]
    names = ", ".join(sorted({f"{s}.{k}" for s, k, _ in found}))
    return [f"Moved {len(found)} secret(s) from {path.name} into the keyring ({names})."]


def _secret_slots(data: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(server, key, the dict holding the value) of each secret in a parsed file."""
    slots: list[tuple[str, str, dict[str, Any]]] = []
    table, _ = _server_table(data, "")
    for name, entry in table:
        if not isinstance(entry, dict) or not _NAME_OK.match(name):
            continue
        for part in ("env", "headers"):
            holder = entry.get(part)
            if not isinstance(holder, dict):
                continue
            for key, value in holder.items():
                if isinstance(value, str) and len(value) <= MAX_STRING and is_secret(key, value):
                    slots.append((name, key, holder))
    return slots


_NAME_OK = re.compile(r"^[^\x00-\x1f\x7f]{1,64}$")


def _server_table(data: Any, label: str) -> tuple[list[tuple[str, Any]], list[str]]:
    if not isinstance(data, dict):
        return [], [f'{label} must hold a JSON object with an "mcpServers" object in it.']
    table: list[tuple[str, Any]] = []
    problems: list[str] = []
    for key in ("mcpServers", "servers"):
        section = data.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            problems.append(f'{label}: "{key}" must be an object of servers by name.')
            continue
        table.extend(section.items())
    if not table and not problems and "mcpServers" not in data and "servers" not in data:
        problems.append(f'{label} has no "mcpServers" object.')
    if len(table) > MAX_SERVERS:
        problems.append(f"{label}: only the first {MAX_SERVERS} servers are used.")
        table = table[:MAX_SERVERS]
    seen: set[str] = set()
    unique: list[tuple[str, Any]] = []
    for name, entry in table:
        if name in seen:
            problems.append(f"Server {_shown(name)} is configured twice; the first is used.")
            continue
        seen.add(name)
        unique.append((name, entry))
    return unique, problems


def _server(name: str, entry: Any) -> ServerConfig:
    """One server entry. Raises ValueError with a sentence for the user."""
    if not _NAME_OK.match(name) or not name.strip():
        raise ValueError("the name must be 1 to 64 printable characters.")
    if not isinstance(entry, dict):
        raise ValueError('must be an object with "command" or "url".')
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ValueError('"disabled" must be true or false.')
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp"):
        if kind == "sse":
            raise ValueError("uses the old SSE transport; only streamable HTTP is supported.")
        raise ValueError(f'unknown "type" {_shown(kind)}.')
    has_url = "url" in entry or "serverUrl" in entry
    if kind == "stdio" or (kind is None and not has_url):
        return _stdio(name, entry, disabled)
    return _http(name, entry, disabled)


def _stdio(name: str, entry: Mapping[str, Any], disabled: bool) -> ServerConfig:
    command = _string(entry.get("command", ""), '"command"')
    if not command.strip():
        raise ValueError('has neither a "command" nor a "url".')
    args = entry.get("args", [])
    if not isinstance(args, list) or len(args) > MAX_ITEMS:
        raise ValueError(f'"args" must be a list of at most {MAX_ITEMS} strings.')
    cwd = entry.get("cwd", "")
    env = _pairs(entry.get("env", {}), '"env"', _ENV_NAME)
    return ServerConfig(
        name=name,
        transport="stdio",
        command=command,
        args=tuple(_string(a, 'each of "args"') for a in args),
        env=env,
        cwd=_string(cwd, '"cwd"') if cwd else "",
        disabled=disabled,
    )


def _http(name: str, entry: Mapping[str, Any], disabled: bool) -> ServerConfig:
    url = _string(entry.get("url", entry.get("serverUrl")), '"url"').strip()
    if not re.match(r"^https?://[^\s/?#]+", url, re.IGNORECASE):
        raise ValueError('"url" must be an http:// or https:// address.')
    headers = _pairs(entry.get("headers", {}), '"headers"', _HEADER_NAME)
    for key, value in headers:
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ValueError(f"the header {key} has a line break or control character in it.")
    return ServerConfig(name=name, transport="http", url=url, headers=headers, disabled=disabled)


def _pairs(value: Any, what: str, key_rule: re.Pattern[str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or len(value) > MAX_ITEMS:
        raise ValueError(f"{what} must be an object of at most {MAX_ITEMS} names and strings.")
    out: list[tuple[str, str]] = []
    for key, item in value.items():
        if not key_rule.match(key):
            raise ValueError(f"{what} has a name that cannot be used: {_shown(key)}.")
        out.append((key, _string(item, f"{what}.{key}")))
    return tuple(out)


def _string(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{what} must be a string.")
    text = str(value)
    if len(text) > MAX_STRING:
        raise ValueError(f"{what} is longer than {MAX_STRING} characters.")
    if "\x00" in text:
        raise ValueError(f"{what} has a NUL character in it.")
    return text


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)[:40]
    text = "".join(c if c.isprintable() else "?" for c in text)
    return repr(text[:40] + ("…" if len(text) > 40 else ""))


def _quote(part: str) -> str:
    return f'"{part}"' if not part or any(c.isspace() for c in part) else part
