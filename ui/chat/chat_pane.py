"""The chat column: transcript, message box, Send/Stop and the edit banner."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QResizeEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ui.chat.long_text import HeldText, fits_the_box
from ui.chat.transcript import TranscriptView

FLUSH_INTERVAL_MS = 40  # streamed text reaches the view at most 25 times a second
TICK_MS = 250  # the live thinking line's clock and count change at most 4 times a second
MIN_TEXT_WIDTH = 40  # pixels of message box beside its corner button worth a scroll bar


class ChatInput(QPlainTextEdit):
    """Enter sends; Shift+Enter inserts a line break.

    Signals:
        submitted(): the user pressed Enter.
    """

    submitted = Signal()
    # Set by the image attachments: takes the pictures of a paste (True: nothing to paste).
    mime_hook: Callable[[QMimeData], bool] | None = None
    # Set by the chat pane: takes a paste too long for the box (``ui.chat.long_text``).
    long_paste: Callable[[str], None] | None = None

    def insertFromMimeData(self, source: QMimeData) -> None:  # Qt's name
        if self.mime_hook is not None and self.mime_hook(source):
            return
        if self.long_paste is not None and source.hasText():
            text = source.text()
            if not fits_the_box(text):
                self.long_paste(text)
                return
        super().insertFromMimeData(source)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # Qt's name
        return source.hasImage() or source.hasUrls() or super().canInsertFromMimeData(source)

    _corner: QWidget | None = None

    def set_corner(self, widget: QWidget) -> None:
        """Show ``widget`` (a small button) in the box's bottom-right corner, the text kept
        clear of it: the window's minimum size stays what it was."""
        widget.setParent(self)
        self._corner = widget
        self.setViewportMargins(0, 0, widget.sizeHint().width() + 4, 0)
        self._place_corner()
        widget.show()

    def resizeEvent(self, event: QResizeEvent) -> None:  # Qt's name
        super().resizeEvent(event)
        self._place_corner()
        # Squeezed beside the corner to a sliver, the text's scroll bar would come and go
        # without end (shown: no room for a line; hidden: room again): no bar then.
        room = self.width() - self.viewportMargins().right() - 2 * self.frameWidth()
        policy = (
            Qt.ScrollBarPolicy.ScrollBarAlwaysOff
            if room < MIN_TEXT_WIDTH
            else Qt.ScrollBarPolicy.ScrollBarAsNeeded
        )
        if self.verticalScrollBarPolicy() != policy:
            self.setVerticalScrollBarPolicy(policy)

    def _place_corner(self) -> None:
        if self._corner is not None:
            hint = self._corner.sizeHint()
            frame = self.frameWidth()
            self._corner.setGeometry(
                self.width() - hint.width() - frame - 2,
                self.height() - hint.height() - frame - 2,
                hint.width(),
                hint.height(),
            )

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ChatPane(QWidget):
    """Shows the conversation and takes the next message; streamed text is batched.

    Thinking text streams into the transcript's thinking block; while it does, "Stop
    thinking" shows beside Stop (``set_thinking_control`` says whether the engine can).

    A paste too long for the message box is held above it (``held``) and sent after
    what is typed.

    Signals:
        textChanged(): the message to send changed (typed, or a long paste held or let go).
        flushed(int): streamed answer text reached the view; the reply's token count so far.
        thoughtsFlushed(int): streamed thinking reached the view; its token count so far.
        thinkingChanged(bool): the reply began (True) or ended (False) its thinking.
    """

    textChanged = Signal()
    flushed = Signal(int)
    thoughtsFlushed = Signal(int)
    thinkingChanged = Signal(bool)

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
        self.stop_thinking_button = QPushButton("Stop thinking", self)
        self.stop_thinking_button.setObjectName("stopThinkingButton")
        self.stop_thinking_button.setAccessibleName("Stop thinking and answer")
        self.stop_thinking_button.hide()
        self.thinking = False  # the streaming reply is in its thinking
        self._thinking_why_not = ""
        self.set_thinking_control(True)
        self.edit_banner = QLabel(self)
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setStyleSheet("color: palette(highlight);")
        self.edit_banner.hide()
        self.held = HeldText(self)
        self.held.changed.connect(self.textChanged)
        self.chat_input.long_paste = self.held.add
        self.chat_input.textChanged.connect(self.textChanged)

        # The column beside the input box; ``add_tool`` puts more there (the Think button).
        self.buttons = buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.stop_thinking_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.chat_input, 1)
        row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.held)
        layout.addLayout(row)

        self._pending: list[str] = []
        self._pending_thoughts: list[str] = []
        self.reply_tokens = 0
        self.thought_tokens = 0
        self._ticked = 0.0
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush)

    def add_tool(self, widget: QWidget) -> None:
        """Put ``widget`` in the column of buttons beside the input box, under Stop."""
        self.buttons.insertWidget(self.buttons.count() - 1, widget)

    def has_text(self) -> bool:
        return bool(self.held.text) or bool(self.chat_input.toPlainText().strip())

    def text(self) -> str:
        """The message: what is typed, then a long paste held beside the box."""
        typed, held = self.chat_input.toPlainText().strip(), self.held.text.strip()
        return f"{typed}\n\n{held}" if typed and held else typed or held

    def clear_text(self) -> None:
        self.chat_input.clear()
        self.held.clear()

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
            self.clear_text()
            if fits_the_box(text):
                self.chat_input.setPlainText(text)
            else:
                self.held.add(text)
        self.chat_input.setFocus()

    # -- streaming -----------------------------------------------------------------------

    def set_thinking_control(self, can: bool, why_not: str = "") -> None:
        """Whether the engine in use can end a thinking block itself (``why_not``: why not)."""
        self._thinking_why_not = "" if can else why_not or "This engine cannot end thinking."
        self.stop_thinking_button.setToolTip(
            "End the thinking now; the model answers (Ctrl+Shift+.)"
            if can
            else f"Not here: {self._thinking_why_not}"
        )
        self.stop_thinking_button.setEnabled(can and self.thinking)

    @property
    def can_stop_thinking(self) -> bool:
        return self.thinking and not self._thinking_why_not

    def begin_stream(self) -> None:
        self._pending.clear()
        self._pending_thoughts.clear()
        self.reply_tokens = 0
        self.thought_tokens = 0
        self._set_thinking(False)
        self._flush_timer.start()

    def add_tokens(self, text: str) -> None:
        self._pending.append(text)
        self.reply_tokens += 1

    def add_thoughts(self, text: str) -> None:
        """A piece of the reply's thinking (before the answer)."""
        self._pending_thoughts.append(text)
        self.thought_tokens += 1
        if not self.thinking and not self.reply_tokens:
            self._set_thinking(True)

    def end_stream(self) -> None:
        self._flush_timer.stop()
        self._pending.clear()
        self._pending_thoughts.clear()
        self._set_thinking(False)

    def _set_thinking(self, on: bool) -> None:
        if on == self.thinking:
            return
        self.thinking = on
        self.stop_thinking_button.setVisible(on)
        self.stop_thinking_button.setEnabled(on and not self._thinking_why_not)
        self.thinkingChanged.emit(on)

    def _on_flush(self) -> None:
        if self._pending_thoughts:
            self.transcript.append_thinking("".join(self._pending_thoughts), self.thought_tokens)
            self._pending_thoughts.clear()
            self.thoughtsFlushed.emit(self.thought_tokens)
        now = time.monotonic()
        if self.thinking and now - self._ticked >= TICK_MS / 1000:
            self._ticked = now
            self.transcript.tick_thinking()
        if not self._pending:
            return
        self._set_thinking(False)
        self.transcript.append_stream("".join(self._pending))
        self._pending.clear()
        self.flushed.emit(self.reply_tokens)
