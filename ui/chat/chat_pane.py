"""The chat column: transcript, message box, Send/Stop and the edit banner."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ui.chat.transcript import TranscriptView

FLUSH_INTERVAL_MS = 40  # streamed text reaches the view at most 25 times a second


class ChatInput(QPlainTextEdit):
    """Enter sends; Shift+Enter inserts a line break.

    Signals:
        submitted(): the user pressed Enter.
    """

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ChatPane(QWidget):
    """Shows the conversation and takes the next message; streamed text is batched.

    Signals:
        flushed(int): streamed text reached the view; the reply's token count so far.
    """

    flushed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.transcript = TranscriptView(self)
        self.transcript.setAccessibleName("Conversation")
        self.transcript.setAccessibleDescription("The messages of the open chat")
        self.chat_input = ChatInput(self)
        self.chat_input.setObjectName("chatInput")
        self.chat_input.setAccessibleName("Message")
        self.chat_input.setAccessibleDescription("Enter sends, Shift+Enter adds a line")
        self.chat_input.setPlaceholderText(
            "Message the model…  (Enter sends, Shift+Enter: new line)"
        )
        self.chat_input.setMaximumHeight(120)
        self.send_button = QPushButton("Send", self)
        self.send_button.setObjectName("sendButton")
        self.send_button.setDefault(True)
        self.send_button.setAccessibleName("Send message")
        self.send_button.setToolTip("Send the message (Enter)")
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.setAccessibleName("Stop the reply")
        self.edit_banner = QLabel(self)
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setStyleSheet("color: palette(highlight);")
        self.edit_banner.hide()

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.chat_input, 1)
        row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.edit_banner)
        layout.addLayout(row)

        self._pending: list[str] = []
        self.reply_tokens = 0
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush)

    def has_text(self) -> bool:
        return bool(self.chat_input.toPlainText().strip())

    def text(self) -> str:
        return self.chat_input.toPlainText().strip()

    def clear_text(self) -> None:
        self.chat_input.clear()

    def show_edit(self, index: int | None, text: str = "") -> None:
        if index is None:
            self.edit_banner.hide()
            return
        self.edit_banner.setText(
            f"Editing message {index + 1}: sending replaces it and the messages after it. "
            "Esc cancels."
        )
        self.edit_banner.show()
        if text:
            self.chat_input.setPlainText(text)
        self.chat_input.setFocus()

    # -- streaming -----------------------------------------------------------------------

    def begin_stream(self) -> None:
        self._pending.clear()
        self.reply_tokens = 0
        self._flush_timer.start()

    def add_tokens(self, text: str) -> None:
        self._pending.append(text)
        self.reply_tokens += 1

    def end_stream(self) -> None:
        self._flush_timer.stop()
        self._pending.clear()

    def _on_flush(self) -> None:
        if not self._pending:
            return
        self.transcript.append_stream("".join(self._pending))
        self._pending.clear()
        self.flushed.emit(self.reply_tokens)
