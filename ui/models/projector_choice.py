"""The vision projector a local model loads with, and "Vision projector…" to choose it.

``load_config(ctx, model)`` is the window's load settings with the model's projector
(``app.models.projectors``: chosen by hand, else found beside the model).
``choose_projector(ctx, parent, model)`` asks for a projector file, or none, or
automatic, checks that it fits the model before remembering it, and returns what
was chosen; the caller reloads the model if it is the one in use.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app.config.setting_records import LoadConfig
from app.engine.native.guard import projector_checks_file
from app.gguf.header import shown
from app.models.projectors import (
    FILE_NAME,
    ProjectorPairs,
    check_pair,
    find_projector,
    load_config_for,
    model_shape,
)
from app.util.datafiles import os_reason
from app.util.errors import ProjectorError
from ui.common.context import Context


def pairs(ctx: Context) -> ProjectorPairs:
    """The pairings by hand, and the verdicts the engine's guard keeps on projector files."""
    return ProjectorPairs(ctx.dirs.root / FILE_NAME, projector_checks_file(ctx.dirs.root))


def load_config(ctx: Context, model: Path) -> LoadConfig:
    """The load settings for ``model``: the window's, with its projector (a note says
    why a projector chosen by hand is not used)."""
    config, note = load_config_for(model, ctx.settings.value.load, pairs(ctx))
    if note:
        ctx.notice(note)
    return config


def projector_text(ctx: Context, model: Path) -> str:
    """What the model pairs with, in words (for the dialog and the library's tooltip)."""
    chosen = pairs(ctx).get(model)
    if chosen == "":
        return "No vision projector (chosen by hand)."
    if chosen:
        return f"Vision projector: {shown(Path(chosen).name)} (chosen by hand)."
    found = find_projector(model, checks=pairs(ctx).checks)
    if found is None:
        return "No vision projector beside it: it reads text only."
    return f"Vision projector: {shown(found.name)} (found beside it)."


def choose_projector(ctx: Context, parent: QWidget, model: Path) -> str | None:
    """Ask for ``model``'s projector; returns what was stored ("" none, "auto", a path)
    or None when nothing changed."""
    box = QMessageBox(parent)
    box.setWindowTitle("Vision projector")
    box.setText(f"{shown(model.name)}\n\n{projector_text(ctx, model)}")
    box.setInformativeText(
        "A vision projector (an mmproj file published with the model) lets it see images."
    )
    pick = box.addButton("Choose file…", QMessageBox.ButtonRole.ActionRole)
    none = box.addButton("No projector", QMessageBox.ButtonRole.ActionRole)
    auto = box.addButton("Automatic", QMessageBox.ButtonRole.ResetRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    clicked = box.clickedButton()
    if clicked is none:
        return _store(ctx, parent, model, "")
    if clicked is auto:
        return _store(ctx, parent, model, None)
    if clicked is not pick:
        return None
    path, _ = QFileDialog.getOpenFileName(
        parent, "Vision projector", str(model.parent), "Vision projector (*.gguf)"
    )
    return choose_file(ctx, parent, model, Path(path)) if path else None


def choose_file(ctx: Context, parent: QWidget, model: Path, projector: Path) -> str | None:
    """Check ``projector`` fits ``model`` and remember it; a refusal is shown, not stored."""
    try:
        check_pair(projector, model_shape(model), shown(model.name), pairs(ctx).checks)
    except ProjectorError as exc:
        QMessageBox.warning(parent, "Not a projector for this model", str(exc))
        return None
    return _store(ctx, parent, model, str(projector))


def _store(ctx: Context, parent: QWidget, model: Path, projector: str | None) -> str | None:
    try:
        pairs(ctx).set(model, projector)
    except (OSError, ValueError) as exc:
        QMessageBox.warning(parent, "Not saved", f"The choice was not saved: {os_reason(exc)}")
        return None
    return "auto" if projector is None else projector


def ask(ctx: Context, parent: QWidget, path: str) -> None:
    """ "Vision projector…" for the model at ``path``: a new choice reloads it if in use."""
    model = Path(path)
    if choose_projector(ctx, parent, model) is None:
        return
    info = ctx.model.info
    if info is not None and not info.server and Path(info.path) == model:
        ctx.open_model(model)
