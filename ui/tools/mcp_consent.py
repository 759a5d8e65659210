"""Consent before a stdio server's command first runs: the full command line, its
folder and the names (never the values) of the environment it is given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QPushButton, QVBoxLayout, QWidget

from app.mcp.config import load_config
from app.mcp.tool_host import ServerStatus


@dataclass(frozen=True)
class RunDetails:
    """What the config says about how a server runs, beside its command line."""

    cwd: str = ""
    env_names: tuple[str, ...] = ()


def run_details(config_path: Path, name: str) -> RunDetails:
    """``cwd`` and the ``env`` names of server ``name`` in the config (empty when the
    config cannot be read: the command line alone is still shown)."""
    for server in load_config(config_path).servers:
        if server.name == name:
            return RunDetails(server.cwd, tuple(sorted(k for k, _ in server.env)))
    return RunDetails()


def consent_text(status: ServerStatus, details: RunDetails) -> str:
    """The lines the user reads before allowing ``status``'s command to run."""
    lines = [f"Tool server '{status.name}' wants to run this command:", status.command]
    if details.cwd and f"(in {details.cwd})" not in status.command:
        lines.append(f"in the folder: {details.cwd}")
    if details.env_names:
        lines.append("with these environment variables: " + ", ".join(details.env_names))
    lines.append("It runs with your user's rights. Allow it only if you trust it.")
    return "\n".join(lines)


class ConsentPanel(QFrame):
    """The command a server would run, and ``Allow this command to run``."""

    def __init__(
        self,
        status: ServerStatus,
        details: RunDetails,
        allow: Callable[[str], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("mcpConsent")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        self.text = QLabel(consent_text(status, details), self)
        self.text.setTextFormat(Qt.TextFormat.PlainText)  # the config is untrusted
        self.text.setObjectName("mcpConsentText")
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.text)
        self.allow_button = QPushButton("Allow this command to run", self)
        self.allow_button.setObjectName("mcpAllow")
        self.allow_button.clicked.connect(lambda: allow(status.name))
        layout.addWidget(self.allow_button)


def notice_text(status: ServerStatus) -> str:
    """The window's note when the chat wanted tools from a server still waiting."""
    command = status.command if len(status.command) <= 200 else status.command[:200] + "…"
    return (
        f"Tool server '{status.name}' wants to run: {command} — review it under "
        "Tools → Tools (MCP servers)… before its tools can be used."
    )
