"""Consent before a server is first used: a stdio server's full command line with its
folder, or an HTTP server's address, and what it is given (environment variables or
headers, with their values; secret-looking ones masked), as the host configured it.
Allowing names that configuration (``ServerStatus.server_id``): an edit asks again."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QPushButton, QVBoxLayout, QWidget

from app.mcp.tool_host import ServerStatus


def consent_text(status: ServerStatus) -> str:
    """The lines the user reads before allowing ``status``'s server."""
    if status.transport == "http":
        head = f"Tool server '{status.name}' wants to connect to:"
        rights = "It sees what the model sends its tools. Allow it only if you trust it."
    else:
        head = f"Tool server '{status.name}' wants to run this command:"
        rights = "It runs with your user's rights. Allow it only if you trust it."
    return "\n".join([head, _printable(status.command), *status.details, rights])


def _printable(text: str) -> str:
    # The config is untrusted: a line break in it must not pass for a line of ours.
    return "".join(c if c.isprintable() else "?" for c in text)


class ConsentPanel(QFrame):
    """What a server would run or connect to, and the button that allows it:
    ``allow(name, server_id)``."""

    def __init__(
        self,
        status: ServerStatus,
        allow: Callable[[str, str], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("mcpConsent")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        self.text = QLabel(consent_text(status), self)
        self.text.setTextFormat(Qt.TextFormat.PlainText)  # the config is untrusted
        self.text.setObjectName("mcpConsentText")
        self.text.setWordWrap(True)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.text)
        label = "Allow this server" if status.transport == "http" else "Allow this command to run"
        self.allow_button = QPushButton(label, self)
        self.allow_button.setObjectName("mcpAllow")
        self.allow_button.clicked.connect(lambda: allow(status.name, status.server_id))
        layout.addWidget(self.allow_button)


def notice_text(status: ServerStatus) -> str:
    """The window's note when the chat wanted tools from a server still waiting."""
    command = status.command if len(status.command) <= 200 else status.command[:200] + "…"
    wants = "to connect to" if status.transport == "http" else "to run"
    return (
        f"Tool server '{status.name}' wants {wants}: {_printable(command)} — review it under "
        "Tools → Tools (MCP servers)… before its tools can be used."
    )
