"""System prompts, chat template choices and continue-the-text mode, wired to the window.

``PromptControls(ctx, chat, ...)`` adds the system prompt bar and the text-completion notice above
the transcript, "Chat → System prompt…" and "Model → Chat template…", and keeps
them in step with the loaded model and the open conversation:

- A new chat starts with the loaded model's default system prompt, else the global
  default (``AppSettings.system_prompt``). Editing the bar changes the open chat's
  prompt from its next reply on; it is saved with the conversation.
- Each model's template choice and continue-the-text mode live in
  ``model_prefs.json`` (``app.config.model_prefs``) and are applied on the engine's
  thread as soon as the model is loaded, or chosen, without reloading the weights
  (``EngineClient.set_template``).
- A base model (no chat template, no "instruct"/"chat"/"-it" in its names) gets a
  notice saying it is a text-completion model, with the mode switch; the mode is on
  by default for it, and the transcript then reads as one text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QBoxLayout, QDialog, QMessageBox

from app.chat.conversation import Conversation
from app.config.model_prefs import FILE_NAME, ModelPrefsStore, model_key
from app.engine.backend import ModelInfo
from app.engine.templates.override import AUTO, TemplateInputs, effective_override
from app.util.datafiles import os_reason
from ui.chat.chat_pane import ChatPane
from ui.chat.completion_notice import CompletionNotice
from ui.chat.system_prompt_bar import SystemPromptBar
from ui.chat.template_dialog import TemplateDialog
from ui.common.context import Context

log = logging.getLogger(__name__)

SAVE_DELAY_MS = 800  # a system prompt being typed is saved this long after the last key
CHAT_INPUT_HINT = "Message the model…  (Enter sends, Shift+Enter: new line)"
COMPLETION_INPUT_HINT = "Write the beginning of a text; the model continues it…  (Enter sends)"
COMPLETION_NAMES = {"user": "Your text", "assistant": "Continued by the model"}


def key_for(info: ModelInfo) -> str:
    return model_key(info.path, info.file_size, info.server)


class PromptControls(QObject):
    """The window's system prompt bar, text-completion notice and template dialog.

    ``add_to_menu(title, action)`` puts an action in the window's menu ``title``;
    ``model_ready`` is emitted with the ``ModelInfo`` once a loaded model is in place.
    """

    def __init__(
        self,
        ctx: Context,
        chat: ChatPane,
        add_to_menu: Callable[[str, QAction], None],
        model_ready: SignalInstance,
    ) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._chat = chat
        self.prefs = ModelPrefsStore(ctx.dirs.root / FILE_NAME)
        self.model: ModelInfo | None = None
        self.key = ""
        self.completion = False
        self.dialog: TemplateDialog | None = None
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(SAVE_DELAY_MS)
        self._save_timer.timeout.connect(self._save_prompt)
        self._edited_id = ""  # the conversation whose prompt is being typed

        self.bar = SystemPromptBar(chat)
        self.notice = CompletionNotice(chat)
        layout = chat.layout()
        assert isinstance(layout, QBoxLayout)
        layout.insertWidget(0, self.notice)
        layout.insertWidget(0, self.bar)
        self.bar.edited.connect(self._on_prompt_edited)
        self.bar.globalDefaultRequested.connect(self.set_global_default)
        self.bar.modelDefaultRequested.connect(self.set_model_default)
        self.bar.modelDefaultCleared.connect(self.clear_model_default)
        self.notice.modeRequested.connect(self.set_completion)

        self.prompt_action = QAction("System prompt…", ctx.parent)
        self.prompt_action.setToolTip("Show and edit this chat's system prompt")
        self.prompt_action.triggered.connect(self.bar.expand)
        self.template_action = QAction("Chat template…", ctx.parent)
        self.template_action.setToolTip("Choose or write the loaded model's chat template")
        self.template_action.triggered.connect(self.show_template_dialog)
        self.template_action.setEnabled(False)
        add_to_menu("&Chat", self.prompt_action)
        add_to_menu("&Model", self.template_action)

        model_ready.connect(self._on_model_ready)
        ctx.client.worker.templateApplied.connect(self._on_template_applied)
        self._show_prompt(ctx.session.conversation)
        if self.prefs.notes:
            QTimer.singleShot(0, self._show_file_notes)

    def _show_file_notes(self) -> None:
        for note in self.prefs.notes:
            self._ctx.notice(note)

    # -- system prompt ---------------------------------------------------------------------

    def _model_default(self) -> str | None:
        return self.prefs.get(self.key).system_prompt if self.key else None

    def default_prompt(self) -> str:
        """What a new chat starts with: the model's default, else the global one."""
        model = self._model_default()
        return model if model is not None else self._ctx.settings.value.system_prompt

    def _where(self, conv: Conversation) -> str:
        if conv.messages or conv.system_prompt != self.default_prompt():
            return ""
        if self._model_default() is not None:
            return "this model's default"
        return "the default for new chats" if conv.system_prompt else ""

    def _show_prompt(self, conv: Conversation) -> None:
        self.bar.show_prompt(conv.system_prompt, self._where(conv))
        model = self.model
        self.bar.set_model(model.name if model else None, self._model_default() is not None)

    def on_conversation_shown(self, conv: Conversation) -> None:
        """A conversation was shown (opened, new, or shown again)."""
        self._show_prompt(conv)

    def _on_prompt_edited(self, text: str) -> None:
        session = self._ctx.session
        session.set_system_prompt(text, save=False)
        self._edited_id = session.conversation.id
        self._save_timer.start()

    def _save_prompt(self) -> None:
        session = self._ctx.session
        if session.conversation.id == self._edited_id:
            session.set_system_prompt(session.conversation.system_prompt, save=True)

    def set_global_default(self, text: str) -> None:
        ctx = self._ctx
        ctx.settings.update(system_prompt=text)
        ctx.session.set_default_system_prompt(self.default_prompt())
        first = self._model_default() is not None
        where = " (this model's own default still comes first)" * first
        ctx.status(f"New chats start with this system prompt{where}.", 6000)
        self._show_prompt(ctx.session.conversation)

    def set_model_default(self, text: str) -> None:
        if not self.key or self.model is None:
            return
        if self._update(system_prompt=text):
            self._ctx.session.set_default_system_prompt(text)
            self._ctx.status(
                f"New chats with {self.model.name} start with this system prompt.", 6000
            )
        self._show_prompt(self._ctx.session.conversation)

    def clear_model_default(self) -> None:
        if self.key and self._update(system_prompt=None):
            self._ctx.session.set_default_system_prompt(self.default_prompt())
        self._show_prompt(self._ctx.session.conversation)

    def _update(self, **changes: object) -> bool:
        """Store changes to the loaded model's preferences; False (and a message) if not."""
        try:
            self.prefs.update(self.key, **changes)
        except (OSError, ValueError) as exc:
            reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
            QMessageBox.warning(
                self._ctx.parent, "Could not save the model's preferences", f"{FILE_NAME}: {reason}"
            )
            return False
        return True

    # -- template and continue-the-text mode -----------------------------------------------

    def _on_model_ready(self, info: ModelInfo) -> None:
        self.model = info
        self.key = key_for(info)
        prefs = self.prefs.get(self.key)
        self._ctx.session.set_default_system_prompt(self.default_prompt())
        can = info.capabilities.template_override
        self.template_action.setEnabled(can)
        self.template_action.setToolTip(
            "Choose or write the loaded model's chat template"
            if can
            else "Not here: " + info.capabilities.why_not.get("template_override", "")
        )
        self._set_mode(can and prefs.completion_on(info.base_model))
        override = effective_override(prefs, self.completion) if can else AUTO
        if override != AUTO:
            self._ctx.client.set_template(override, effective_override(prefs, False))
        self._show_prompt(self._ctx.session.conversation)

    def _set_mode(self, completion: bool) -> None:
        """Show continue-the-text mode (or chat turns) in the widgets."""
        self.completion = completion
        info = self.model
        if info is not None and info.base_model and info.capabilities.template_override:
            self.notice.show_for(info.name, completion)
        else:
            self.notice.hide()
        self.bar.set_completion(completion)
        box = self._chat.chat_input
        box.setPlaceholderText(COMPLETION_INPUT_HINT if completion else CHAT_INPUT_HINT)
        # Qt repaints a hint only as it appears or goes: one already shown kept the old text.
        box.viewport().update()
        # The chat shown before the mode was known (at start) is named for it too.
        self._chat.transcript.headers.rename_roles(dict(COMPLETION_NAMES) if completion else {})

    def set_completion(self, on: bool) -> None:
        """Switch continue-the-text mode for the loaded model (saved for it)."""
        info = self.model
        if info is None or not info.capabilities.template_override:
            return
        prefs = self.prefs.get(self.key)
        stored = None if on == info.base_model else on
        if prefs.completion != stored:
            self._update(completion=stored)
        self._apply(on)

    def _apply(self, completion: bool) -> None:
        """The model's saved template choice, in continue-the-text mode or not (the chat
        template goes along: API chats use it)."""
        was = self.completion
        self._set_mode(completion)
        prefs = self.prefs.get(self.key)
        chat = effective_override(prefs, False)
        self._ctx.client.set_template(effective_override(prefs, completion), chat)
        conv = self._ctx.session.conversation
        if was != completion and conv.messages:
            self._ctx.notice(
                "Continue-the-text mode is on: from the next reply, this chat is read as one "
                "text and the model continues it."
                if completion
                else "Chat turns are back: from the next reply, messages are wrapped in the "
                "model's chat template."
            )

    def show_template_dialog(self) -> None:
        info = self.model
        if info is None or not info.capabilities.template_override:
            return
        dialog = TemplateDialog(
            info.name,
            info.template_inputs or TemplateInputs(),
            info.base_model,
            self.prefs.get(self.key),
            self._ctx.session.conversation.chat(),
            self._ctx.parent,
        )
        self.dialog = dialog
        dialog.finished.connect(self._on_dialog_finished)
        dialog.open()

    def _on_dialog_finished(self, result: int) -> None:
        dialog, self.dialog = self.dialog, None
        info = self.model
        if dialog is not None:
            dialog.deleteLater()
        if dialog is None or info is None or result != QDialog.DialogCode.Accepted:
            return
        choice = dialog.choice()
        o = choice.override
        stored = None if choice.completion == info.base_model else choice.completion
        if not self._update(
            template=o.kind if o.kind in ("builtin", "custom") else "auto",
            template_name=o.name if o.kind == "builtin" else "",
            template_source=o.source if o.kind == "custom" else "",
            completion=stored,
        ):
            return
        on = choice.completion
        self._apply(on)

    def _on_template_applied(self, info: ModelInfo) -> None:
        if self.model is None or key_for(info) != self.key:
            return
        shown = self.model.notes  # the load's notes (a native path off here) were said once
        self.model = info
        self._ctx.model.set(info)
        for note in info.notes:
            if note not in shown:
                self._ctx.notice(note)
