"""Thinking in the window: the Think button, Stop thinking, and what the model can do.

- The Think button (``ui.chat.think_button``) edits the open conversation's
  ``thinking`` and ``reasoning_effort`` through the one owner of ``SamplingParams``
  (the settings store, shown by the sampling panel), so both always agree and the
  next reply uses the choice.
- Stop thinking (a button beside Stop, "Chat → Stop thinking", Ctrl+Shift+.) sets the
  running reply's ``end_thinking`` Event: the engine closes the thinking block and the
  model answers. It is offered only while the reply thinks, and disabled with the
  engine's reason where it cannot (``Capabilities.thinking_control``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QLabel, QMainWindow

from app.config.setting_records import SamplingParams
from app.engine.backend import ModelInfo
from ui.chat.chat_pane import ChatPane
from ui.chat.think_button import ThinkButton
from ui.common.context import Context
from ui.settings.sampling_panel import SamplingPanel
from ui.window import capabilities, window_actions
from ui.window.session_view import WindowView

STOP_THINKING_KEYS = "Ctrl+Shift+."


class ThinkingHost(Protocol):
    """What the thinking controls reach: the main window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def chat(self) -> ChatPane: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    @property
    def status_model(self) -> QLabel: ...
    @property
    def session_view(self) -> WindowView: ...


class ThinkingControls(QObject):
    """The Think button and Stop thinking, kept in step with the model and the chat."""

    def __init__(self, win: ThinkingHost) -> None:
        super().__init__(win.ctx.parent)
        self._win = win
        ctx = win.ctx
        self.button = ThinkButton(win.chat)
        win.chat.add_tool(self.button)
        self.button.chosen.connect(self.choose)
        self.button.show_params(ctx.settings.value.sampling)
        self.stop_action = QAction("Stop thinking", ctx.parent)
        self.stop_action.setObjectName("stopThinkingAction")
        self.stop_action.setShortcut(QKeySequence(STOP_THINKING_KEYS))
        self.stop_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.stop_action.triggered.connect(self.stop_thinking)
        self.stop_action.setEnabled(False)
        ctx.parent.addAction(self.stop_action)
        if isinstance(ctx.parent, QMainWindow):
            window_actions.add_to_menu(ctx.parent, "&Chat", self.stop_action)
        win.chat.stop_thinking_button.clicked.connect(self.stop_thinking)
        win.chat.thinkingChanged.connect(self._on_thinking_changed)
        win.sampling_panel.samplingChanged.connect(self.button.show_params)
        win.session_view.conversation_listeners.append(self._on_conversation)
        ctx.model.changed.connect(self._on_model_changed)
        self._on_model_changed(ctx.model.info)

    def choose(self, name: str, value: str) -> None:
        """Set the open chat's ``thinking`` or ``reasoning_effort`` (from the next reply)."""
        ctx = self._win.ctx
        old = ctx.settings.value.sampling
        params: SamplingParams = (
            replace(old, thinking=value)
            if name == "thinking"
            else replace(old, reasoning_effort=value)
        )
        ctx.settings.update(sampling=params)
        self._win.sampling_panel.set_params(params)
        self.button.show_params(params)
        what = "Thinking" if name == "thinking" else "Reasoning effort"
        ctx.status(f"{what}: {value}, from the next reply on.", 4000)

    def stop_thinking(self) -> None:
        """End the running reply's thinking now; the model answers."""
        chat = self._win.chat
        if chat.can_stop_thinking and self._win.ctx.session.busy:
            self._win.ctx.client.end_thinking()
            chat.stop_thinking_button.setEnabled(False)
            self.stop_action.setEnabled(False)
            self._win.ctx.status("Ending the thinking: the model answers now.", 4000)

    def _on_thinking_changed(self, on: bool) -> None:
        self.stop_action.setEnabled(on and self._win.chat.can_stop_thinking)

    def _on_conversation(self, _conv: object) -> None:
        self.button.show_params(self._win.ctx.settings.value.sampling)

    def _on_model_changed(self, info: ModelInfo | None) -> None:
        self.button.set_model(info)
        caps = info.capabilities if info is not None else None
        can = caps is not None and caps.thinking_control
        why = caps.why_not.get("thinking_control", "") if caps is not None else ""
        self._win.chat.set_thinking_control(can, why)
        self.stop_action.setToolTip(
            "End the thinking now; the model answers" if can else f"Not here: {why}"
        )
        self._on_thinking_changed(self._win.chat.thinking)
        text = capabilities.thinking_text(info)
        label = self._win.status_model
        if text and not self._win.ctx.model.loading and not label.text().endswith(text):
            label.setText(f"{label.text()} · {text}")
