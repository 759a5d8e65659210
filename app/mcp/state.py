"""Lamplight's own MCP switches, kept apart from the user's ``mcp.json``.

``mcp_state.json``: which servers and tools the user switched on or off, and which
servers the user allowed, each by the ``ServerConfig.server_id`` of what was shown (a
server edited since, or a consent of an older Lamplight, which named a hash of the
command alone, does not match: it asks again). Written atomically; a damaged file is
set aside as ``.bad`` and the state starts empty.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, reason, set_aside_note

log = logging.getLogger(__name__)

MAX_BYTES = 1 << 20


def read_object(path: Path, then: str) -> tuple[dict[str, Any], str]:
    """The JSON object in ``path`` ({} when missing), and a note when it was damaged
    (then it is set aside; ``then`` ends the note: what happens instead)."""
    try:
        data = read_json(path, MAX_BYTES, 8)
    except FileNotFoundError:
        return {}, ""
    except DataFileError as exc:
        if not exc.damaged:
            return {}, f"{path.name} {reason(exc)}; {then}."
        return {}, set_aside_note(path, reason(exc), then)
    if not isinstance(data, dict):
        return {}, set_aside_note(path, "does not hold a JSON object", then)
    return data, ""


class McpState:
    """Server and tool switches and command consents; thread-safe, saved at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        data, self.note = read_object(path, "the MCP switches start afresh")
        servers = data.get("servers")
        self._servers: dict[str, dict[str, Any]] = {}
        if isinstance(servers, dict):
            for name, entry in servers.items():
                if isinstance(entry, dict):
                    self._servers[name] = _clean_entry(entry)
        consent = data.get("consent")
        self._consent: dict[str, str] = {}
        if isinstance(consent, dict):
            self._consent = {k: v for k, v in consent.items() if isinstance(v, str)}

    def enabled(self, server: str, default: bool) -> bool:
        with self._lock:
            value = self._servers.get(server, {}).get("enabled")
        return value if isinstance(value, bool) else default

    def set_enabled(self, server: str, on: bool) -> None:
        with self._lock:
            self._servers.setdefault(server, {})["enabled"] = on
        self._save()

    def tool_enabled(self, server: str, tool: str) -> bool:
        with self._lock:
            return tool not in self._servers.get(server, {}).get("disabled_tools", [])

    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None:
        with self._lock:
            entry = self._servers.setdefault(server, {})
            off = [t for t in entry.get("disabled_tools", []) if t != tool]
            entry["disabled_tools"] = off if on else [*off, tool]
        self._save()

    def consented(self, server: str, server_id: str) -> bool:
        with self._lock:
            return bool(server_id) and self._consent.get(server) == server_id

    def consent(self, server: str, server_id: str) -> None:
        with self._lock:
            self._consent[server] = server_id
        self._save()

    def _save(self) -> None:
        with self._lock:
            data = {"servers": self._servers, "consent": self._consent}
            text = json.dumps(data, indent=2, ensure_ascii=False)
        try:
            atomic_write_text(self.path, text + "\n")
        except OSError:
            log.warning("could not save %s", self.path, exc_info=True)


def _clean_entry(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(entry.get("enabled"), bool):
        out["enabled"] = entry["enabled"]
    tools = entry.get("disabled_tools")
    if isinstance(tools, list):
        out["disabled_tools"] = [t for t in tools[:1024] if isinstance(t, str)]
    return out
