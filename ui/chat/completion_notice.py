"""A one-line notice above the transcript for a text-completion (base) model, with its
mode switch."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QWidget,
)


def notice_text(name: str, completion: bool) -> str:
    """The banner's one line for model ``name`` in either mode (rich text)."""
    head = f"{html.escape(name)} is a text-completion model"
    if completion:
        return f"{head}: <b>Continue-the-text mode</b> is on."
    return f"{head}: in chat turns it may repeat the question."


def notice_details(completion: bool) -> str:
    """The whole explanation, for the banner's tooltip (plain text)."""
    head = "A base model with no chat template, made to continue text rather than to answer."
    if completion:
        return (
            f"{head} Continue-the-text mode is on: write the beginning of a text (a story, "
            "a list, a letter) and the model writes on from there."
        )
    return (
        f"{head} In chat turns it tends to repeat the question. Continue-the-text mode "
        "sends your text as it is, and the model continues it."
    )


class CompletionNotice(QFrame):
    """Says plainly that the loaded model is a text-completion model; switches the mode.

    Not modal, and one line (two in a narrow window), so the conversation keeps the room:
    the whole explanation is its tooltip. The user can close it until the next model load.

    Signals:
        modeRequested(bool): continue-the-text mode on (True) or chat turns (False).
    """

    modeRequested = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("completionNotice")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Text-completion model notice")
        self.label = QLabel(self)
        self.label.setObjectName("completionNoticeText")
        self.label.setTextFormat(Qt.TextFormat.RichText)
        # Short enough for one line beside the transcript; wrapped, never cut, when narrower.
        self.label.setWordWrap(True)
        small = self.label.font()
        if small.pointSizeF() > 0:  # a note beside the chat, not a heading
            small.setPointSizeF(small.pointSizeF() * 0.9)
            self.label.setFont(small)
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.button = QPushButton(self)
        self.button.setObjectName("completionModeButton")
        self.button.clicked.connect(self._on_clicked)
        self.close_button = QToolButton(self)
        self.close_button.setObjectName("completionNoticeClose")
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Hide this note (Model → Chat template… switches the mode)")
        self.close_button.setAccessibleName("Hide the text-completion note")
        self.close_button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 1, 2, 1)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignVCenter)
        self.completion = False
        self.hide()

    def show_for(self, name: str, completion: bool) -> None:
        """Show the notice for base model ``name`` in the given mode."""
        self.completion = completion
        self.label.setText(notice_text(name, completion))
        self.setToolTip(f"{name}: {notice_details(completion)}")
        self.setAccessibleDescription(notice_details(completion))
        self.button.setText("Use chat turns instead" if completion else "Continue the text")
        self.button.setToolTip(
            "Wrap messages in the model's chat turns (it was not trained for them)"
            if completion
            else "Send your text as it is and let the model continue it"
        )
        self.button.setAccessibleName(self.button.text())
        self.show()

    def _on_clicked(self) -> None:
        self.modeRequested.emit(not self.completion)
