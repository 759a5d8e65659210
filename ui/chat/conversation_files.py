"""Import and export of conversations and their metrics, with the file dialogs."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.chat.conversation import Conversation, ConversationError
from app.chat.import_review import restore
from app.chat.metrics_csv import metrics_csv
from app.chat.transcript_markdown import export_images, to_markdown
from app.util.atomic import atomic_write_text
from app.util.datafiles import os_reason
from ui.chat.import_review_dialog import confirm_held
from ui.common.context import Context


def _stem(title: str, fallback: str) -> str:
    return "".join(c if c.isalnum() or c in " -_" else "_" for c in title)[:60] or fallback


def ask_import(ctx: Context) -> None:
    session = ctx.session
    path, _ = QFileDialog.getOpenFileName(
        ctx.parent, "Import a conversation", str(Path.home()), "Lamplight JSON (*.json)"
    )
    if not path:
        return
    try:
        conv, held = session.store.import_reviewed(Path(path))
    except ConversationError as exc:
        QMessageBox.warning(ctx.parent, "Could not import", str(exc))
        return
    except OSError as exc:
        QMessageBox.warning(
            ctx.parent, "Could not import", f"It could not be saved: {os_reason(exc)}"
        )
        return
    # Its documents, collections, draft model and tool settings only once confirmed.
    if held and confirm_held(held, ctx.parent):
        restore(conv, held)
        try:
            session.store.save(conv)
        except (ConversationError, OSError) as exc:
            reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
            QMessageBox.warning(
                ctx.parent,
                "Could not attach",
                f"The conversation opens without them: it could not be saved ({reason}).",
            )
    session.open(conv.id)


def ask_delete(ctx: Context, conv_id: str) -> None:
    title = ctx.store.summary(conv_id).title
    answer = QMessageBox.question(
        ctx.parent,
        "Delete conversation",
        f"Delete “{title}” and its saved cache? This cannot be undone.",
    )
    if answer == QMessageBox.StandardButton.Yes:
        ctx.session.delete(conv_id)


def ask_export(ctx: Context, conv_id: str, fmt: str) -> None:
    """Ask where to write conversation ``conv_id`` (the open one as shown) and write it."""
    current = ctx.session.conversation
    try:
        conv = current if conv_id == current.id else ctx.store.load(conv_id)
    except ConversationError as exc:
        QMessageBox.warning(ctx.parent, "Could not export", str(exc))
        return
    suffix, kind = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
    path, _ = QFileDialog.getSaveFileName(
        ctx.parent,
        "Export conversation",
        str(Path.home() / f"{_stem(conv.title, 'chat')}{suffix}"),
        kind,
    )
    if path:
        export_conversation(ctx, conv, Path(path), fmt)


def export_conversation(ctx: Context, conv: Conversation, path: Path, fmt: str) -> None:
    text = to_markdown(conv) if fmt == "markdown" else json.dumps(conv.to_dict(), indent=1)
    if not _write(ctx, path, text):
        return
    notes: list[str] = []
    # The Markdown links point at images/ beside the file: the pictures travel with it.
    copied = export_images(conv, ctx.store.images, path.parent, notes) if fmt == "markdown" else []
    if notes:
        QMessageBox.warning(ctx.parent, "Some images were not exported", "\n".join(notes[:10]))
    extra = f" with {len(copied)} image{'s' * (len(copied) != 1)}" if copied else ""
    ctx.status(f"Exported to {path}{extra}", 5000)


def ask_export_metrics(ctx: Context, conv: Conversation) -> None:
    path, _ = QFileDialog.getSaveFileName(
        ctx.parent,
        "Export metrics",
        str(Path.home() / f"{_stem(conv.title, 'metrics')}.csv"),
        "CSV (*.csv)",
    )
    if path:
        export_metrics(ctx, conv, Path(path))


def export_metrics(ctx: Context, conv: Conversation, path: Path) -> None:
    if _write(ctx, path, metrics_csv(conv.messages)):
        ctx.status(f"Metrics exported to {path}", 5000)


def _write(ctx: Context, path: Path, text: str) -> bool:
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        QMessageBox.warning(ctx.parent, "Could not export", f"{path}: {exc.strerror or exc}")
        return False
    return True
