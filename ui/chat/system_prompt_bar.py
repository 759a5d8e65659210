"""The system prompt of the open chat: a collapsible field above the transcript."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
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

SUMMARY_CHARS = 90


def summary(text: str) -> str:
    """One line for the collapsed bar: the prompt's first words, or "none"."""
    line = " ".join(text.split())
    if not line:
        return "none"
    return line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"


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

        self.editor = QPlainTextEdit(self)
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
        if text != self.editor.toPlainText():
            self._quiet = True
            try:
                self.editor.setPlainText(text)
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
        return self.editor.toPlainText()

    # -- internals --------------------------------------------------------------------------

    def _update_summary(self) -> None:
        text = summary(self.editor.toPlainText())
        if self.editor.isReadOnly():
            text += " (not used in continue-the-text mode)"
        elif self._where:
            text += f"  · {self._where}"
        self.summary.setText(text)
        self.summary.setToolTip(self.editor.toPlainText()[:2000])

    def _on_toggled(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.toggle.setAccessibleName("Hide the system prompt" if on else "Show the system prompt")
        self.body.setVisible(on)

    def _on_text_changed(self) -> None:
        if self._quiet:
            return
        self._where = ""
        self._update_summary()
        self.edited.emit(self.editor.toPlainText())

    def _on_global(self) -> None:
        self.globalDefaultRequested.emit(self.editor.toPlainText())

    def _on_model(self) -> None:
        self.modelDefaultRequested.emit(self.editor.toPlainText())
