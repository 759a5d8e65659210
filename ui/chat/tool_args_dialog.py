"""Edit a tool call's arguments before it runs: a monospace editor, checked before it closes."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from ui.chat.tool_card import parse_arguments, pretty_arguments


class ToolArgsDialog(QDialog):
    """The arguments of one call, as JSON, and "Run with these arguments".

    ``submit(text)`` is asked when the user runs the call: "" when it was taken, else
    why not (the dialog stays open and shows it). Text that is not a JSON object is
    refused here first, with the reason, and ``submit`` is not asked.
    """

    def __init__(
        self,
        tool: str,
        server: str,
        arguments: str,
        submit: Callable[[str], str],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("toolArgsDialog")
        self.setWindowTitle(f"Arguments for {tool}")
        self.resize(560, 420)
        self._submit = submit
        where = f" (server {server})" if server else ""
        intro = QLabel(
            f"Arguments for <b>{_escape(tool)}</b>{_escape(where)}, as a JSON object. "
            "The call runs once with them."
        )
        intro.setWordWrap(True)
        self.editor = QPlainTextEdit(pretty_arguments(arguments))
        self.editor.setObjectName("toolArgsEditor")
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setAccessibleName("Tool call arguments (JSON)")
        self.editor.setTabChangesFocus(True)  # keyboard users can still reach the buttons
        intro.setBuddy(self.editor)
        self.error = QLabel()
        self.error.setObjectName("toolArgsError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #d1242f;")
        self.error.setAccessibleName("Why the arguments were refused")
        self.error.hide()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.run_button = buttons.addButton(
            "Run with these arguments", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.run_button.setDefault(True)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self.editor.setFocus()

    def refuse(self, why: str) -> None:
        self.error.setText(why)
        self.error.show()
        self.editor.setFocus()

    def accept(self) -> None:  # Qt's name
        """Close only when the arguments are a JSON object the session took."""
        text = self.editor.toPlainText()
        _, why = parse_arguments(text)
        if not why:
            why = self._submit(text)
        if why:
            self.refuse(why)
            return
        super().accept()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
