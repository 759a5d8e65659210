"""Attach → Collection…: pick a saved collection of documents, save the conversation's
documents as one, rename or delete one. The collections are ``DocumentLibrary.collections``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.util.errors import DocumentError

if TYPE_CHECKING:
    from app.documents.collections import Collections


class CollectionsDialog(QDialog):
    """The saved collections; ``chosen`` is the one to use once accepted."""

    def __init__(
        self, collections: Collections, current: Sequence[str], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("collectionsDialog")
        self.setWindowTitle("Collections")
        self.collections = collections
        self.current = list(current)  # the conversation's documents
        self.chosen = ""
        self.list = QListWidget(self)
        self.list.itemDoubleClicked.connect(lambda _item: self.accept_selected())
        self.list.currentRowChanged.connect(lambda _row: self._follow())
        self.note = QLabel(self)
        self.note.setWordWrap(True)
        self.save_button = QPushButton("Save these documents as a collection…", self)
        self.save_button.setEnabled(bool(self.current))
        self.save_button.setToolTip(
            "Save the documents this conversation uses under a name, to use them in others"
            if self.current
            else "This conversation has no documents to save."
        )
        self.rename_button = QPushButton("Rename…", self)
        self.delete_button = QPushButton("Delete", self)
        self.save_button.clicked.connect(self.ask_save)
        self.rename_button.clicked.connect(self.ask_rename)
        self.delete_button.clicked.connect(self.ask_delete)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setText("Use in this conversation")
        self.buttons.accepted.connect(self.accept_selected)
        self.buttons.rejected.connect(self.reject)
        side = QHBoxLayout()
        side.addWidget(self.rename_button)
        side.addWidget(self.delete_button)
        side.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Saved collections of documents:", self))
        layout.addWidget(self.list)
        layout.addLayout(side)
        layout.addWidget(self.save_button)
        layout.addWidget(self.note)
        layout.addWidget(self.buttons)
        self.reload()

    def reload(self, select: str = "") -> None:
        self.list.clear()
        names = self.collections.names()
        for name in names:
            n = len(self.collections.paths(name))
            self.list.addItem(f"{name}  ({n} document{'s' if n != 1 else ''})")
        if names:
            self.list.setCurrentRow(names.index(select) if select in names else 0)
        self.note.setText("" if names else "No collections yet.")
        self._follow()

    def selected(self) -> str:
        row = self.list.currentRow()
        names = self.collections.names()
        return names[row] if 0 <= row < len(names) else ""

    def _follow(self) -> None:
        has = bool(self.selected())
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(has)

    def accept_selected(self) -> None:
        self.chosen = self.selected()
        if self.chosen:
            self.accept()

    def ask_save(self) -> None:
        name, ok = QInputDialog.getText(self, "Save as a collection", "Name of the collection:")
        if ok and self._do(lambda: self.collections.save(name.strip(), self.current)):
            self.reload(name.strip())

    def ask_rename(self) -> None:
        old = self.selected()
        if not old:
            return
        new, ok = QInputDialog.getText(self, "Rename the collection", "New name:", text=old)
        renamed = ok and new.strip() and new.strip() != old
        if renamed and self._do(lambda: self.collections.rename(old, new.strip())):
            self.reload(new.strip())

    def ask_delete(self) -> None:
        name = self.selected()
        if not name:
            return
        answer = QMessageBox.question(
            self,
            "Delete the collection",
            f"Delete the collection {name}? Its documents stay where they are.",
        )
        if answer == QMessageBox.StandardButton.Yes and self._do(
            lambda: self.collections.delete(name)
        ):
            self.reload()

    def _do(self, action: object) -> bool:
        assert callable(action)
        try:
            action()
        except (DocumentError, ValueError, OSError) as exc:
            self.note.setText(str(exc))
            return False
        return True
