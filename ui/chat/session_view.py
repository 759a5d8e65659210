"""The main window's side of a ``ChatSession``: what the session says, shown in the widgets."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QMessageBox

from app.chat.conversation import Conversation, Message
from app.chat.session_cache import RestoreResult
from app.config.params import SettingError, validate_sampling
from app.engine.metrics import MessageMetrics
from app.util.errors import ContextOverflowError
from ui.common.draft_stats import reply_footer, tokens_per_pass

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)


class WindowView:
    """The ``SessionView`` of the main window."""

    def __init__(self, win: MainWindow) -> None:
        self._win = win
        # Called with each conversation shown (opened, new, or re-rendered after a failure).
        self.conversation_listeners: list[Callable[[Conversation], None]] = []

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None:
        w = self._win
        w.chat.show_edit(None)
        if opened and conv.sampling:
            try:
                params = validate_sampling(conv.sampling)
            except SettingError as exc:
                log.info("conversation %s: stored settings not used: %s", conv.id, exc)
            else:
                w._settings.sampling = params
                w.sampling_panel.set_params(params)
        if conv.messages:
            w.transcript.show_messages(
                conv.messages,
                [conv.version_of(i) for i in range(len(conv.messages))],
                answerable=not w.session.busy and conv.messages[-1].role == "user",
            )
        else:
            w.transcript.clear_conversation()
            w.status_speed.setText("")
        w.perf_panel.set_history(w.reply_metrics)
        w.refresh_sidebar()
        w._update_buttons()
        for listener in self.conversation_listeners:
            listener(conv)
        if opened and not restoring:
            w.conversationOpened.emit(RestoreResult(conv.id, False, 0, 0.0, ""))
        if not opened:
            w.chat_input.setFocus()

    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None:
        w = self._win
        w.chat.show_edit(None)
        conv = w.conversation
        if added_user:
            w.transcript.add_user_message(shown[-1].content, len(shown) - 1)
        else:
            w.transcript.show_messages(shown, [conv.version_of(i) for i in range(len(shown))])
        w.transcript.begin_reply(len(shown))
        w.perf_panel.start_reply()
        w.chat.begin_stream()
        w._reply_started = time.perf_counter()
        w.status_speed.setText("thinking…")
        w._update_buttons()

    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        w = self._win
        w.chat.end_stream()
        footer = reply_footer(metrics) if metrics is not None else ""
        if w.transcript.streaming:
            w.transcript.end_reply(text, footer=footer, error=error, kept=metrics is not None)
        elif error:  # the transcript was shown again (what the session kept): say why
            w.transcript.add_notice(f"No reply: {error}")
        conv = w.conversation
        w.transcript.set_versions(
            conv.messages, [conv.version_of(i) for i in range(len(conv.messages))]
        )
        if metrics is not None and metrics.dropped_count:
            w.transcript.mark_forgotten(w.conversation.messages)
        w.perf_panel.set_history(w.reply_metrics)
        if metrics is not None:
            speed = f"{metrics.decode_tok_s:.1f} tok/s · TTFT {metrics.ttft_ms:.0f} ms"
            if metrics.drafted_tokens:
                speed += f" · {tokens_per_pass(metrics):.2f} tokens/pass"
            w.status_speed.setText(speed)
            if metrics.cache_note:
                w.transcript.add_notice(f"Cache rebuilt: {metrics.cache_note}.")
            for note in metrics.notes:
                w.transcript.add_notice(note[:1].upper() + note[1:] + ".")
        elif error:
            w.status_speed.setText("error")
            if ContextOverflowError.MARK in error:
                w.transcript.add_notice(
                    "This reply needs more room than the context has.",
                    "drop-older",
                    "Drop older messages and continue",
                )
        w._update_buttons()

    def restored(self, result: RestoreResult) -> None:
        """The worker restored (or could not restore) an opened conversation's cache."""
        w = self._win
        if result.conv_id != w.conversation.id:
            return
        if result.lora_stack is not None:
            w.lora_panel.set_stack(result.lora_stack)
            w.status_lora.setText(result.lora_stack.summary())
            if result.lora_changed:
                w.transcript.add_notice(
                    f"Using this conversation's adapters: {result.lora_stack.summary()}."
                )
        if result.restored:
            w.status_speed.setText(f"resumed {result.n_tokens} tokens in {result.ms:.0f} ms")
        elif w.conversation.messages:
            w.transcript.add_notice(
                f"Saved cache not used: {result.note}. "
                "It will be rebuilt from the transcript when you continue."
            )
        w.conversationOpened.emit(result)

    def open_failed(self, message: str) -> None:
        w = self._win
        QMessageBox.warning(w, "Could not open the conversation", message)
        w.refresh_sidebar()

    def notice(self, text: str) -> None:
        w = self._win
        w.transcript.add_notice(text)
        w.statusBar().showMessage(text, 10000)

    def row_saved(self, conv_id: str) -> None:
        w = self._win
        w.sidebar.update_row(w._store.summary(conv_id), w.conversation.id)

    def row_removed(self, conv_id: str) -> None:
        w = self._win
        w.sidebar.remove_row(conv_id)
