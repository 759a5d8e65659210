"""What a feature gets instead of the window: the shared state it observes and the
services it calls.

- ``LoadedModel``: the one copy of the model in use (and whether a load is under
  way); every view observes it instead of keeping its own copy.
- ``SettingsStore``: ``AppSettings`` with one writer. ``update`` marks it dirty and
  writes once; ``save`` writes only when something changed.
- ``Context``: the narrow set of services a window feature is built with (the
  engine client, settings, data folders, chat session, loaded model, and the
  window's status line and notices), so nothing reaches into the window's members.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.config.paths import DataDirs
from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from app.util.datafiles import os_reason
from ui.engine.worker import EngineClient

log = logging.getLogger(__name__)


class LoadedModel(QObject):
    """The model in use (None: none) and whether a load or connect is under way.

    Signals:
        changed(object): the new ``ModelInfo`` or None, after it changed (a new model,
            none, or the same model's info after a template change).
        loaded(object): a model was loaded or connected (after ``changed``): what the
            engine held for the previous one (a draft model) is gone.
        loadingChanged(bool): a load or connect began (True) or ended (False).
    """

    changed = Signal(object)
    loaded = Signal(object)
    loadingChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._info: ModelInfo | None = None
        self._loading = False

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    @property
    def loading(self) -> bool:
        return self._loading

    @property
    def ready(self) -> bool:
        """A model is in use and no load is under way (a message can be sent)."""
        return self._info is not None and not self._loading

    @property
    def local_path(self) -> str | None:
        """The in-process model's file (None for none or a server)."""
        info = self._info
        return str(info.path) if info is not None and not info.server else None

    def set(self, info: ModelInfo | None) -> None:
        """The model's info changed (a template applied), or none is in use."""
        self._info = info
        self.changed.emit(info)

    def set_loaded(self, info: ModelInfo) -> None:
        """The engine loaded (or connected to) ``info``."""
        self.set(info)
        self.loaded.emit(info)

    def set_loading(self, loading: bool) -> None:
        if loading != self._loading:
            self._loading = loading
            self.loadingChanged.emit(loading)


class SettingsStore:
    """The app's settings and their one writer (a saveable with a dirty flag)."""

    def __init__(
        self,
        settings: AppSettings,
        path: Path,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.value = settings
        self.path = path
        self.dirty = False
        # Told why a save failed (the window shows it in the status bar).
        self.on_error = on_error

    def update(self, **changes: object) -> None:
        """Set the named settings and write them if any changed."""
        for name, value in changes.items():
            if not hasattr(self.value, name):
                raise AttributeError(f"AppSettings has no {name!r}")
            if getattr(self.value, name) != value:
                setattr(self.value, name, value)
                self.dirty = True
        self.save()

    def mark_dirty(self) -> None:
        """Something inside a setting changed in place (``remember_model``)."""
        self.dirty = True

    def save(self) -> bool:
        """Write the settings if they changed since the last write; False if that failed."""
        if not self.dirty:
            return True
        try:
            self.value.save(self.path)
        except OSError as exc:
            log.warning("could not save settings: %s", exc)
            if self.on_error is not None:
                self.on_error(f"Could not save settings: {os_reason(exc)}")
            return False
        self.dirty = False
        return True


@dataclass(frozen=True)
class Context:
    """The services a window feature is built with.

    ``status(text, ms)`` shows a line in the status bar; ``notice(text)`` adds a
    notice to the transcript (and the status bar); ``open_model(path)`` loads a local
    model once the reply in progress is settled (None: the embedded default).
    """

    client: EngineClient
    settings: SettingsStore
    dirs: DataDirs
    session: ChatSession
    model: LoadedModel
    parent: QWidget
    status: Callable[[str, int], None]
    notice: Callable[[str], None]
    open_model: Callable[[str | Path | None], None]

    @property
    def store(self) -> ConversationStore:
        return self.session.store
