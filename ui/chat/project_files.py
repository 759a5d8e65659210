"""A project exported (JSON to import again, Markdown to read) and imported, from the
Projects dialog or a project's header in the sidebar (issue 44, item 5).

The bundle's format and what an import holds back are ``app.chat.project_bundle``'s.
Here: where to write or read, and the one confirmation of an import: what the project
and each of its chats would use on this computer (pinned documents and adapters by
path, a model file or server connection, its tools, the API switch, each chat's
documents, collections, draft model and tool settings) is listed, and nothing of it is
used unless the user picks Attach. Don't attach (the default) keeps the project and its
chats without any of it.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.chat.conversation import Conversation, ConversationError
from app.chat.import_review import restore
from app.chat.project_bundle import (
    MAX_BYTES,
    ImportedProject,
    export_json,
    export_markdown,
    import_bundle,
    restore_project,
)
from app.chat.projects import ProjectError, ProjectStore
from app.chat.transcript_markdown import export_images
from app.util.atomic import atomic_write_text
from app.util.datafiles import os_reason
from ui.chat.import_review_dialog import confirm_lines
from ui.common.context import Context

INTRO = (
    "This project asks to use the following on your computer. Its documents would be "
    "read and sent with its chats' messages (to a remote server too, when you use one), "
    "its tools could be called by the model. Attach them only if you trust where the "
    "file came from."
)


def project_chats(ctx: Context, project_id: str) -> list[Conversation]:
    """The saved chats of the project (one that cannot be read is left out)."""
    chats = []
    for row in ctx.store.list():
        if row.project_id == project_id and not row.error:
            try:
                chats.append(ctx.store.load(row.id))
            except ConversationError:
                continue
    return chats


def ask_export(ctx: Context, projects: ProjectStore, project_id: str, fmt: str) -> None:
    """Ask where to write the project (``fmt``: "json" or "markdown") and write it."""
    try:
        project = projects.load(project_id)
    except ProjectError as exc:
        QMessageBox.warning(ctx.parent, "Could not export", str(exc))
        return
    stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in project.name)[:60]
    kind = "Lamplight project (*.json)" if fmt == "json" else "Markdown (*.md)"
    suffix = ".json" if fmt == "json" else ".md"
    path, _ = QFileDialog.getSaveFileName(
        ctx.parent, "Export the project", str(Path.home() / f"{stem or 'project'}{suffix}"), kind
    )
    if path:
        export_project(ctx, projects, project_id, Path(path), fmt)


def export_project(
    ctx: Context, projects: ProjectStore, project_id: str, path: Path, fmt: str
) -> bool:
    """Write the project and its chats to ``path``; whether it was written."""
    try:
        project = projects.load(project_id)
    except ProjectError as exc:
        QMessageBox.warning(ctx.parent, "Could not export", str(exc))
        return False
    chats = project_chats(ctx, project_id)
    text = export_json(project, chats) if fmt == "json" else export_markdown(project, chats)
    try:
        atomic_write_text(path, text)
    except OSError as exc:
        QMessageBox.warning(ctx.parent, "Could not export", f"{path}: {os_reason(exc)}")
        return False
    notes: list[str] = []
    images = 0
    if fmt == "markdown":  # the links point at images/ beside the file
        for conv in chats:
            images += len(export_images(conv, ctx.store.images, path.parent, notes))
    if notes:
        QMessageBox.warning(ctx.parent, "Some images were not exported", "\n".join(notes[:10]))
    n = len(chats)
    ctx.status(f"{project.name} exported to {path} with {n} chat{'s' * (n != 1)}", 5000)
    return True


def ask_import(ctx: Context, projects: ProjectStore) -> str:
    """Ask for an exported project and import it; its new id ("" when none was)."""
    path, _ = QFileDialog.getOpenFileName(
        ctx.parent, "Import a project", str(Path.home()), "Lamplight project (*.json)"
    )
    return import_project(ctx, projects, Path(path)) if path else ""


def import_project(ctx: Context, projects: ProjectStore, path: Path) -> str:
    """Import the project at ``path`` (what it would use held until confirmed); its new
    id, or "" when it could not be imported (a message said why)."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise ProjectError("The project file is too large to import.")
        text = path.read_text(encoding="utf-8", errors="replace")
        got = import_bundle(text, projects, ctx.store)
    except ProjectError as exc:
        QMessageBox.warning(ctx.parent, "Could not import", str(exc))
        return ""
    except OSError as exc:
        QMessageBox.warning(ctx.parent, "Could not import", f"{path}: {os_reason(exc)}")
        return ""
    lines = review_lines(got)
    if lines and confirm_lines(lines, "Imported project", INTRO, ctx.parent):
        attach(ctx, projects, got)
    n = len(got.chats)
    ctx.status(f"Imported {got.project.name} with {n} chat{'s' * (n != 1)}", 5000)
    return got.project.id


def review_lines(got: ImportedProject) -> list[str]:
    """What the confirmation lists: the project's, then each chat's, named."""
    lines = got.held.lines()
    for conv, held in got.chats:
        lines += [f"Chat “{conv.title}”: {line}" for line in held.lines()]
    return lines


def attach(ctx: Context, projects: ProjectStore, got: ImportedProject) -> None:
    """The user confirmed: the project and its chats get back what was held."""
    problems: list[str] = []
    if got.held:
        restore_project(got.project, got.held)
        try:
            projects.save(got.project)
        except (ProjectError, OSError) as exc:
            problems.append(f"{got.project.name}: {exc}")
    for conv, held in got.chats:
        if held:
            restore(conv, held)
            try:
                ctx.store.save(conv)
            except (ConversationError, OSError) as exc:
                problems.append(f"{conv.title}: {exc}")
    if problems:
        QMessageBox.warning(
            ctx.parent,
            "Could not attach",
            "These were imported without what they use:\n" + "\n".join(problems[:10]),
        )
