"""Import and export of conversations and their metrics, with the file dialogs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.chat.conversation import Conversation, ConversationError, to_markdown
from app.chat.metrics_csv import metrics_csv
from app.util.atomic import atomic_write_text
from app.util.datafiles import os_reason

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow


def _stem(title: str, fallback: str) -> str:
    return "".join(c if c.isalnum() or c in " -_" else "_" for c in title)[:60] or fallback


def ask_import(win: MainWindow) -> None:
    session = win.session
    path, _ = QFileDialog.getOpenFileName(
        win, "Import a conversation", str(Path.home()), "Lamplight JSON (*.json)"
    )
    if not path:
        return
    try:
        conv = session.store.import_file(Path(path))
    except ConversationError as exc:
        QMessageBox.warning(win, "Could not import", str(exc))
        return
    except OSError as exc:
        QMessageBox.warning(win, "Could not import", f"It could not be saved: {os_reason(exc)}")
        return
    session.open(conv.id)


def ask_delete(win: MainWindow, conv_id: str) -> None:
    title = win.session.store.summary(conv_id).title
    answer = QMessageBox.question(
        win,
        "Delete conversation",
        f"Delete “{title}” and its saved cache? This cannot be undone.",
    )
    if answer == QMessageBox.StandardButton.Yes:
        win.delete_conversation(conv_id)


def ask_export(win: MainWindow, conv_id: str, fmt: str) -> None:
    """Ask where to write conversation ``conv_id`` (the open one as shown) and write it."""
    current = win.conversation
    try:
        conv = current if conv_id == current.id else win.session.store.load(conv_id)
    except ConversationError as exc:
        QMessageBox.warning(win, "Could not export", str(exc))
        return
    suffix, kind = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
    path, _ = QFileDialog.getSaveFileName(
        win, "Export conversation", str(Path.home() / f"{_stem(conv.title, 'chat')}{suffix}"), kind
    )
    if path:
        export_conversation(win, conv, Path(path), fmt)


def export_conversation(win: MainWindow, conv: Conversation, path: Path, fmt: str) -> None:
    text = to_markdown(conv) if fmt == "markdown" else json.dumps(conv.to_dict(), indent=1)
    if _write(win, path, text):
        win.statusBar().showMessage(f"Exported to {path}", 5000)


def ask_export_metrics(win: MainWindow, conv: Conversation) -> None:
    path, _ = QFileDialog.getSaveFileName(
        win,
        "Export metrics",
        str(Path.home() / f"{_stem(conv.title, 'metrics')}.csv"),
        "CSV (*.csv)",
    )
    if path:
        export_metrics(win, conv, Path(path))


def export_metrics(win: MainWindow, conv: Conversation, path: Path) -> None:
    if _write(win, path, metrics_csv(conv.messages)):
        win.statusBar().showMessage(f"Metrics exported to {path}", 5000)


def _write(win: MainWindow, path: Path, text: str) -> bool:
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        QMessageBox.warning(win, "Could not export", f"{path}: {exc.strerror or exc}")
        return False
    return True
