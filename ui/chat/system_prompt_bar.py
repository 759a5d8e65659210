"""The system prompt of the open chat: a collapsible field above the transcript.

A prompt too long for the field (``long_text.fits_the_box``: an unbroken 400,000
characters took 4.7 s to lay out when the bar opened) is held beside it, whole, as the
message box holds a long paste (``HeldPrompt``): View… shows it a part at a time, and what
is typed in the field goes before it. A chat's prompt is kept whole, however long.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ui.chat.long_text import HeldText, fits_the_box

SUMMARY_CHARS = 90
_WORD = re.compile(rf"\S{{1,{SUMMARY_CHARS + 1}}}")  # a longer word ends the line


def summary(text: str) -> str:
    """One line for the collapsed bar: the prompt's first words, or "none"."""
    line = ""  # only as many words as the line shows: a prompt may be megabytes
    for word in _WORD.finditer(text):
        line = f"{line} {word.group()}" if line else word.group()
        if len(line) > SUMMARY_CHARS:
            break
    if not line:
        return "none"
    return line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"


class HeldPrompt(HeldText):
    """The part of a system prompt too long for the field: used after what is typed."""

    WHAT = "System prompt"
    USE = "it is used after what you type in the field"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("heldPrompt")
        for name, label in (("heldTextView", "View"), ("heldTextRemove", "Remove")):
            button = self.findChild(QPushButton, name)
            assert button is not None
            button.setAccessibleName(f"{label} the long system prompt")


class PromptEdit(QPlainTextEdit):
    """The field: a paste too long for it goes to ``long_paste`` instead."""

    long_paste: HeldPrompt | None = None

    def insertFromMimeData(self, source: QMimeData) -> None:  # Qt's name
        if self.long_paste is not None and source.hasText() and not fits_the_box(source.text()):
            self.long_paste.add(source.text())
            return
        super().insertFromMimeData(source)


class SystemPromptBar(QFrame):
    """Shows and edits the open chat's system prompt; sets the defaults for new chats.

    Collapsed, it is one line (the prompt's first words); expanded, an editor and
    the default buttons. Edits apply to the open chat from its next reply on.

    Signals:
        edited(str): the user changed the open chat's system prompt.
        globalDefaultRequested(str): use this text as the default for new chats.
        modelDefaultRequested(str): use this text as the loaded model's default.
        modelDefaultCleared(): forget the loaded model's default (the global one applies).
    """

    edited = Signal(str)
    globalDefaultRequested = Signal(str)
    modelDefaultRequested = Signal(str)
    modelDefaultCleared = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("systemPromptBar")
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.toggle = QToolButton(self)
        self.toggle.setObjectName("systemPromptToggle")
        self.toggle.setText("System prompt")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolTip("Show or edit this chat's system prompt (Chat → System prompt…)")
        self.toggle.setAccessibleName("Show the system prompt")
        self.toggle.toggled.connect(self._on_toggled)
        self.summary = QLabel("none", self)
        self.summary.setObjectName("systemPromptSummary")
        self.summary.setStyleSheet("color: palette(placeholder-text);")
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(self.toggle)
        head.addWidget(self.summary, 1)

        self.held = HeldPrompt(self)
        self.held.changed.connect(self._on_text_changed)
        self.editor = PromptEdit(self)
        self.editor.long_paste = self.held
        self.editor.setObjectName("systemPromptEdit")
        self.editor.setAccessibleName("System prompt of this chat")
        self.editor.setPlaceholderText(
            "Instructions the model reads before the conversation, e.g. “You are a concise "
            "assistant. Answer in English.” Used from the next reply on."
        )
        self.editor.setTabChangesFocus(True)
        self.editor.setMaximumHeight(110)
        self.editor.textChanged.connect(self._on_text_changed)
        self.hint = QLabel("", self)
        self.hint.setObjectName("systemPromptHint")
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet("color: palette(placeholder-text);")
        self.global_button = QPushButton("Use as default for new chats", self)
        self.global_button.setObjectName("systemPromptGlobalDefault")
        self.global_button.setToolTip("New chats start with this system prompt")
        self.global_button.clicked.connect(self._on_global)
        self.model_button = QPushButton("Use as default for this model", self)
        self.model_button.setObjectName("systemPromptModelDefault")
        self.model_button.setToolTip(
            "New chats with this model start with this system prompt (before the global default)"
        )
        self.model_button.clicked.connect(self._on_model)
        self.clear_button = QPushButton("Forget this model's default", self)
        self.clear_button.setObjectName("systemPromptClearModelDefault")
        self.clear_button.clicked.connect(self.modelDefaultCleared)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        for b in (self.global_button, self.model_button, self.clear_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        self.body = QWidget(self)
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.addWidget(self.held)
        body.addWidget(self.editor)
        body.addWidget(self.hint)
        body.addLayout(buttons)
        self.body.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.setSpacing(2)
        layout.addLayout(head)
        layout.addWidget(self.body)
        self._quiet = False
        self._where = ""
        self.set_model(None, False)

    # -- what the window tells it -------------------------------------------------------

    def show_prompt(self, text: str, where: str = "") -> None:
        """Show the open chat's prompt (no ``edited``); ``where`` says where it came from."""
        self._where = where
        if text != self.text():
            fits = fits_the_box(text)
            self._quiet = True
            try:
                self.held.hold("" if fits else text)
                self.editor.setPlainText(text if fits else "")
            finally:
                self._quiet = False
        self._update_summary()

    def set_model(self, name: str | None, has_default: bool) -> None:
        """The loaded model (None: none), and whether it has a default system prompt."""
        self.model_button.setEnabled(name is not None)
        self.model_button.setToolTip(
            f"New chats with {name} start with this system prompt (before the global default)"
            if name
            else "Load a model first"
        )
        self.clear_button.setVisible(has_default)

    def set_completion(self, on: bool) -> None:
        """Continue-the-text mode sends no system prompt: say so, and lock the editor."""
        self.editor.setReadOnly(on)
        self.held.setEnabled(not on)
        self.hint.setText(
            "Continue-the-text mode is on: the model continues your text, and no system "
            "prompt is sent."
            if on
            else ""
        )
        self.hint.setVisible(on)
        self._update_summary()

    def expand(self, focus: bool = True) -> None:
        self.toggle.setChecked(True)
        if focus:
            self.editor.setFocus()

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def text(self) -> str:
        """The prompt: what is typed in the field, then a long one held beside it."""
        typed, held = self.editor.toPlainText(), self.held.text
        return f"{typed}\n\n{held}" if typed and held else typed or held

    # -- internals --------------------------------------------------------------------------

    def _update_summary(self) -> None:
        prompt = self.text()
        text = summary(prompt)
        if self.editor.isReadOnly():
            text += " (not used in continue-the-text mode)"
        elif self._where:
            text += f"  · {self._where}"
        self.summary.setText(text)
        self.summary.setToolTip(prompt[:2000])

    def _on_toggled(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.toggle.setAccessibleName("Hide the system prompt" if on else "Show the system prompt")
        self.body.setVisible(on)

    def _on_text_changed(self) -> None:
        if self._quiet:
            return
        self._where = ""
        self._update_summary()
        self.edited.emit(self.text())

    def _on_global(self) -> None:
        self.globalDefaultRequested.emit(self.text())

    def _on_model(self) -> None:
        self.modelDefaultRequested.emit(self.text())
