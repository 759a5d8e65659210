"""Open a file or folder with the desktop's own app, and say where it is when none can.

``QDesktopServices.openUrl`` returns False where no opener exists (no ``xdg-open`` on a
minimal Linux, no handler for the type); the click then did nothing and never said
which file it meant. ``open_path`` shows the path instead, selectable, with a button
that copies it.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QMessageBox, QWidget

COPY = "Copy path"


def open_path(parent: QWidget | None, path: Path, what: str) -> QMessageBox | None:
    """Open ``path`` (``what`` names it for people: "the crash log"); where nothing
    opens it, a non-modal note gives its path to copy (returned: None when it opened)."""
    if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
        return None
    return path_note(parent, path, f"Nothing on this computer opened {what}.")


def path_note(parent: QWidget | None, path: Path, why: str) -> QMessageBox:
    """A non-modal note: ``why``, then ``path`` (selectable) and a button that copies it."""
    box = QMessageBox(parent)
    box.setObjectName("pathNote")
    box.setIcon(QMessageBox.Icon.Information)
    box.setWindowTitle("Where the file is")
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setText(f"{why} It is here:\n\n{path}")
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    copy = box.addButton(COPY, QMessageBox.ButtonRole.ActionRole)
    copy.setObjectName("copyPath")
    copy.clicked.connect(lambda: copy_path(path))
    box.addButton(QMessageBox.StandardButton.Close)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.open()
    return box


def copy_path(path: Path) -> None:
    """Put ``path`` on the clipboard, as text."""
    QGuiApplication.clipboard().setText(str(path))
