"""File → Import conversation…: the list of what the imported chat would use on this
computer (its documents, collections, draft model, tool settings), with Attach and
Don't attach. Nothing on it is used unless the user picks Attach
(``app.chat.import_review``)."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QListWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat.import_review import HeldBack

INTRO = (
    "This conversation asks to use the following on your computer. Its documents would "
    "be read and sent with your next messages, to a remote server too when you use one. "
    "Attach them only if you trust where the file came from."
)


class ImportReview(QDialog):
    """Lists what an import held back (``lines``); accepted (Attach) or rejected (Don't
    attach, the default)."""

    def __init__(
        self,
        lines: Sequence[str],
        parent: QWidget | None = None,
        title: str = "Imported conversation",
        intro_text: str = INTRO,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("importReviewDialog")
        self.setWindowTitle(title)
        intro = QLabel(intro_text, self)
        intro.setWordWrap(True)
        self.list = QListWidget(self)
        self.list.setObjectName("importReviewList")
        self.list.addItems(list(lines))
        self.buttons = QDialogButtonBox(self)
        self.attach_button = self.buttons.addButton(
            "Attach", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.skip_button = self.buttons.addButton(
            "Don't attach", QDialogButtonBox.ButtonRole.RejectRole
        )
        self.skip_button.setDefault(True)
        self.skip_button.setFocus()
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.list)
        layout.addWidget(self.buttons)
        self.resize(560, 320)


def confirm_held(held: HeldBack, parent: QWidget | None) -> bool:
    """Ask whether the imported chat may use ``held``; True for Attach."""
    return confirm_lines(held.lines(), "Imported conversation", INTRO, parent)


def confirm_lines(lines: Sequence[str], title: str, intro: str, parent: QWidget | None) -> bool:
    """Ask whether an import may use what ``lines`` list; True for Attach."""
    dialog = ImportReview(lines, parent, title, intro)
    try:
        return dialog.exec() == QDialog.DialogCode.Accepted
    finally:
        dialog.deleteLater()
