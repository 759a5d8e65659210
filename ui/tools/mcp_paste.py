"""Paste config…: servers copied from LM Studio, Claude Desktop, Cursor or VS Code,
checked and merged into ``mcp.json`` (atomically; a name already used differently is
refused, by name)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.mcp import config
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, parse_json, read_limited, reason

MAX_PASTE = 256 * 1024  # characters: a config is a few hundred
SERVER_KEYS = ("mcpServers", "servers")  # Cursor/Claude/LM Studio; VS Code


class PasteError(ValueError):
    """The pasted text cannot be added; the message says why, for the user."""


def _load(text: str) -> Any:
    try:
        return parse_json(text, config.MAX_DEPTH)
    except DataFileError as exc:
        # A fragment like ``"name": {...}`` as copied out of a larger file.
        if text.lstrip().startswith('"'):
            try:
                return parse_json("{" + text.strip().rstrip(",") + "}", config.MAX_DEPTH)
            except DataFileError:
                pass
        raise PasteError(f"This is not usable JSON: it {reason(exc)}.") from None


def parse_servers(text: str) -> dict[str, dict[str, Any]]:
    """The servers in pasted ``text`` (a whole config, its ``mcpServers`` object, or one
    ``"name": {...}`` entry), each checked by the config's own parser."""
    if len(text) > MAX_PASTE:
        raise PasteError(f"The text is too long ({len(text)} characters; at most {MAX_PASTE}).")
    data = _load(text)
    if not isinstance(data, dict):
        raise PasteError('Expected a JSON object with an "mcpServers" entry.')
    servers = next((data[k] for k in SERVER_KEYS if k in data), data)
    if not isinstance(servers, dict) or not servers:
        raise PasteError('No servers found: expected "mcpServers": {"name": {...}}.')
    checked = config.parse_config(json.dumps({"mcpServers": servers}), "The pasted config")
    if checked.problems:
        raise PasteError("\n".join(checked.problems))
    return {str(k): dict(v) for k, v in servers.items()}


def read_config(path: Path) -> dict[str, Any]:
    """``mcp.json`` as an object (``{"mcpServers": {}}`` when absent)."""
    try:
        data = parse_json(read_limited(path, config.MAX_BYTES), config.MAX_DEPTH)
    except FileNotFoundError:
        return {"mcpServers": {}}
    except DataFileError as exc:
        raise PasteError(f"{path.name} {reason(exc)}; fix it first (Open mcp.json).") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise PasteError(f'{path.name} has no "mcpServers" object; fix it first.')
    data.setdefault("mcpServers", {})
    return data


def merge(path: Path, servers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Add ``servers`` to the config at ``path``; returns the names added (one already
    there with the same definition is skipped). Nothing is written on a conflict."""
    data = read_config(path)
    have: dict[str, Any] = data["mcpServers"]
    clash = [n for n, entry in servers.items() if n in have and have[n] != entry]
    if clash:
        raise PasteError(
            "Already in mcp.json with a different definition: "
            + ", ".join(clash)
            + ". Rename them in the pasted text, or edit mcp.json."
        )
    added = [n for n in servers if n not in have]
    if len(have) + len(added) > config.MAX_SERVERS:
        raise PasteError(f"mcp.json would have more than {config.MAX_SERVERS} servers.")
    if added:
        have.update({n: dict(servers[n]) for n in added})
        atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return added


class PasteDialog(QDialog):
    """A box to paste a config into; ``Add`` merges it (``added`` gets the names added and
    notes), or says what is wrong."""

    def __init__(
        self,
        config_path: Path,
        added: Callable[[list[str], list[str]], None],
        parent: QWidget | None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("mcpPasteDialog")
        self.setWindowTitle("Paste an MCP config")
        self._path = config_path
        self._added = added
        layout = QVBoxLayout(self)
        hint = QLabel(
            "Paste the MCP server config from LM Studio, Claude Desktop, Cursor or VS Code "
            "(the whole file, or the servers in it). The servers are added to mcp.json; "
            "each asks before its command first runs."
        )
        hint.setWordWrap(True)
        layout.addWidget(hint)
        self.editor = QPlainTextEdit(self)
        self.editor.setObjectName("mcpPasteText")
        self.editor.setPlaceholderText('{"mcpServers": {"name": {"command": "…", "args": []}}}')
        layout.addWidget(self.editor)
        self.error = QLabel(self)
        self.error.setTextFormat(Qt.TextFormat.PlainText)  # it quotes the pasted text
        self.error.setObjectName("mcpPasteError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c62828")
        self.error.hide()
        layout.addWidget(self.error)
        buttons = QDialogButtonBox(self)
        self.add_button = buttons.addButton("Add servers", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self._on_add)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(560, 380)

    def _on_add(self) -> None:
        try:
            added = merge(self._path, parse_servers(self.editor.toPlainText()))
        except (PasteError, OSError) as exc:
            self.error.setText(str(exc))
            self.error.show()
            return
        self.accept()
        # Secrets pasted into env/headers go to the keyring at once.
        self._added(added, config.move_secrets(self._path) if added else [])
