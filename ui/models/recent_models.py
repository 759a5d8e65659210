"""Model -> Recent models: the local models loaded last, newest first.

The list is ``AppSettings.recent_models`` (the window adds each model it loads).
The menu is rebuilt each time it opens, so a file that went away since shows as
missing (disabled, with its path as the tip) and "Remove missing" tidies them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from PySide6.QtWidgets import QMenu

from app.gguf.header import shown
from ui.common.context import Context


def _is_file(path: str) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):  # a name too long, a NUL in it
        return False


class RecentModels:
    """The submenu and what its entries do."""

    def __init__(self, ctx: Context, parent: QMenu) -> None:
        self._ctx = ctx
        self.menu = parent.addMenu("Recent models")
        self.menu.setObjectName("recentModelsMenu")
        self.menu.setToolTipsVisible(True)
        self.menu.aboutToShow.connect(self.rebuild)
        self.rebuild()

    def rebuild(self) -> None:
        ctx = self._ctx
        self.menu.clear()
        paths = list(ctx.settings.value.recent_models)
        current = ctx.model.local_path
        names = [Path(p).name for p in paths]
        missing = 0
        for i, path in enumerate(paths):
            name = shown(names[i], 60)
            if names.count(names[i]) > 1:  # the same file name in two folders
                name = f"{name} ({shown(Path(path).parent.name, 30)})"
            exists = _is_file(path)
            missing += not exists
            text = f"&{i + 1} {name}" if i < 9 else name
            action = self.menu.addAction(text if exists else f"{text} — missing")
            action.setToolTip(path if exists else f"Not found: {path}")
            action.setStatusTip(path)
            action.setEnabled(exists and not ctx.model.loading)
            if path == current:
                action.setCheckable(True)
                action.setChecked(True)
            action.triggered.connect(partial(self.open, path))
        if not paths:
            self.menu.addAction("No recent models").setEnabled(False)
        self.menu.addSeparator()
        tidy = self.menu.addAction("Remove missing", self.remove_missing)
        tidy.setEnabled(missing > 0)
        clear = self.menu.addAction("Clear recent", self.clear)
        clear.setEnabled(bool(paths))

    def open(self, path: str) -> None:
        if not _is_file(path):
            self._ctx.status(f"{shown(path)} is gone.", 6000)
            self.rebuild()
            return
        self._ctx.open_model(path)

    def remove_missing(self) -> None:
        settings = self._ctx.settings
        kept = [p for p in settings.value.recent_models if _is_file(p)]
        gone = len(settings.value.recent_models) - len(kept)
        settings.update(recent_models=kept)
        self._ctx.status(f"Removed {gone} missing model(s) from the list.", 5000)
        self.rebuild()

    def clear(self) -> None:
        self._ctx.settings.update(recent_models=[])
        self.rebuild()


def install(ctx: Context, model_menu: QMenu) -> RecentModels:
    """Add Recent models to ``model_menu``."""
    return RecentModels(ctx, model_menu)
