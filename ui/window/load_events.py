"""The engine's model reports, taken on the GUI thread: load progress, a model loaded or
unloaded, a load that failed, notes about a load, LoRA stacks applied or refused.

``LoadedModel`` (``ui.common.context``) holds the model in use; this sets it.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QObject, SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMessageBox

from app.config.presets import PresetStore
from app.engine.backend import ModelInfo
from app.gguf.lora import LoraStack
from ui.chat.chat_pane import ChatPane
from ui.common.context import Context
from ui.models.model_status import ModelStatus
from ui.perf.perf_panel import PerfPanel
from ui.remote.remote_control import RemoteControl
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel
from ui.window import capabilities
from ui.window.session_view import WindowView


class LoadHost(Protocol):
    """What the model reports reach: the main window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def chat(self) -> ChatPane: ...
    @property
    def model_status(self) -> ModelStatus: ...
    @property
    def remote(self) -> RemoteControl: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    @property
    def lora_panel(self) -> LoraPanel: ...
    @property
    def perf_panel(self) -> PerfPanel: ...
    @property
    def presets(self) -> PresetStore: ...
    @property
    def compact_cache_action(self) -> QAction: ...
    @property
    def status_lora(self) -> QLabel: ...
    @property
    def session_view(self) -> WindowView: ...
    @property
    def modelReady(self) -> SignalInstance: ...
    @property
    def modelFailed(self) -> SignalInstance: ...
    @property
    def closing(self) -> bool: ...
    def update_buttons(self) -> None: ...
    def setWindowTitle(self, title: str) -> None: ...
    def isVisible(self) -> bool: ...


class LoadEvents(QObject):
    """Connects the worker's model signals to the model in use and the views."""

    def __init__(self, win: LoadHost) -> None:
        super().__init__()  # lives on the GUI thread: its slots are queued there
        self._win = win
        w = win.ctx.client.worker
        # Bound methods, never lambdas: a lambda would run on the worker's thread.
        w.loadProgress.connect(self._on_load_progress)
        w.modelLoaded.connect(self._on_model_loaded)
        w.modelUnloaded.connect(self._on_unloaded)
        w.loadFailed.connect(self._on_load_failed)
        w.loadNote.connect(self._on_load_note)
        w.loraApplied.connect(self._on_lora_applied)
        w.loraFailed.connect(self._on_lora_failed)

    def _on_load_progress(self, value: float, what: str) -> None:
        self._win.model_status.advanced(value, what)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        win, ctx = self._win, self._win.ctx
        ctx.model.set_loading(False)
        ctx.model.set_loaded(info)  # the model status shows it
        win.setWindowTitle(f"Lamplight — {info.name}")
        settings = ctx.settings
        if not info.server:
            settings.value.remember_model(str(info.path))
            settings.mark_dirty()
            settings.update(model_path=str(info.path))
        win.sampling_panel.set_load(settings.value.load)
        conn = win.remote.loaded(info)
        capabilities.show(info, win.sampling_panel, win.lora_panel, conn)
        capabilities.show_in_window(info, win.compact_cache_action, win.perf_panel)
        key = f"{info.name}:{info.file_size}"
        win.sampling_panel.model_key = key
        conversation = ctx.session.conversation
        if key in win.presets.model_defaults and not conversation.sampling:
            win.sampling_panel.select_preset(win.presets.default_for(key))
        if conversation.messages:
            # Resume from the saved cache if it was made with this model; else re-read.
            ctx.client.restore_snapshot(conversation.id)
        win.update_buttons()
        win.chat.chat_input.setFocus()
        win.modelReady.emit(info)

    def _on_load_failed(self, message: str, previous_still_loaded: bool) -> None:
        win, model = self._win, self._win.ctx.model
        model.set_loading(False)
        win.remote.failed()
        if not previous_still_loaded:
            model.set(None)
        win.model_status.failed(model.info)
        win.chat.transcript.add_notice(message)
        win.update_buttons()
        win.modelFailed.emit(message)
        if not win.closing and win.isVisible():
            QMessageBox.warning(win.ctx.parent, "Could not load the model", message)

    def _on_unloaded(self) -> None:
        self._win.ctx.model.set(None)
        self._win.model_status.none()

    def _on_load_note(self, message: str) -> None:
        self._win.session_view.notice(message)

    def _on_lora_applied(self, stack: LoraStack) -> None:
        self._win.lora_panel.set_applied(stack)
        self._win.status_lora.setText(stack.summary())

    def _on_lora_failed(self, message: str, still: LoraStack) -> None:
        self._win.lora_panel.show_error(message)
        self._win.lora_panel.set_applied(still)
        self._win.status_lora.setText(still.summary())
