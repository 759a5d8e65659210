"""The main window's side of a ``ChatSession``: what the session says, shown in the widgets."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from PySide6.QtGui import QAccessible, QAccessibleEvent
from PySide6.QtWidgets import QLabel, QMessageBox, QStatusBar, QWidget

from app.chat.conversation import Conversation, Message
from app.chat.session import ChatSession
from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.field_spec import SettingError
from app.config.params import validate_sampling
from app.config.settings import AppSettings
from app.engine.metrics import MessageMetrics
from app.util.errors import ContextOverflowError
from app.util.sysinfo import size_text
from ui.chat.chat_pane import ChatInput, ChatPane
from ui.chat.conversation_list import ConversationList
from ui.chat.thinking_block import CUT_NOTES
from ui.chat.tool_args_dialog import ToolArgsDialog
from ui.chat.tool_card import DECISIONS, accessible_text
from ui.chat.transcript import TranscriptView
from ui.common.draft_stats import reply_footer, tokens_per_pass
from ui.perf.perf_panel import PerfPanel
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel

log = logging.getLogger(__name__)

TRANSCRIPT_DESCRIPTION = "The messages of the open chat"


class ViewHost(Protocol):
    """What the view shows the session in: the main window's widgets."""

    @property
    def chat(self) -> ChatPane: ...
    @property
    def transcript(self) -> TranscriptView: ...
    @property
    def chat_input(self) -> ChatInput: ...
    @property
    def sidebar(self) -> ConversationList: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    @property
    def perf_panel(self) -> PerfPanel: ...
    @property
    def lora_panel(self) -> LoraPanel: ...
    @property
    def status_speed(self) -> QLabel: ...
    @property
    def status_lora(self) -> QLabel: ...
    @property
    def session(self) -> ChatSession: ...
    @property
    def settings(self) -> AppSettings: ...
    @property
    def store(self) -> ConversationStore: ...
    @property
    def conversation(self) -> Conversation: ...
    @property
    def reply_metrics(self) -> list[MessageMetrics]: ...

    def refresh_sidebar(self) -> None: ...
    def update_buttons(self) -> None: ...
    def stop(self) -> None: ...
    def conversation_opened(self, result: RestoreResult) -> None: ...
    def statusBar(self) -> QStatusBar: ...


def speed_text(m: MessageMetrics) -> str:
    """A finished reply's figures for the status bar: ``12.3 tok/s · TTFT 80 ms ·
    first answer 4.2 s · thought 380 tokens``."""
    speed = f"{m.decode_tok_s:.1f} tok/s · TTFT {m.ttft_ms:.0f} ms"
    if m.reasoning_tokens:
        if m.first_answer_ms:
            speed += f" · first answer {m.first_answer_ms / 1000:.1f} s"
        speed += f" · thought {m.reasoning_tokens} tokens"
        if m.thinking_cut:
            speed += f" ({CUT_NOTES.get(m.thinking_cut, m.thinking_cut)})"
    if m.drafted_tokens:
        speed += f" · {tokens_per_pass(m):.2f} tokens/pass"
    return speed


class WindowView:
    """The ``SessionView`` of the main window."""

    def __init__(self, win: ViewHost, parent: QWidget) -> None:
        self._win = win
        self._parent = parent  # for message boxes
        self.reply_started = 0.0  # perf_counter() when the reply in progress was asked for
        # Called with each conversation shown (opened, new, or re-rendered after a failure).
        self.conversation_listeners: list[Callable[[Conversation], None]] = []
        self._cards_connected = False
        self.args_dialog: ToolArgsDialog | None = None  # the open Edit arguments… dialog

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None:
        w = self._win
        w.chat.show_edit(None)
        if opened and conv.sampling:
            try:
                params = validate_sampling(conv.sampling)
            except SettingError as exc:
                log.info("conversation %s: stored settings not used: %s", conv.id, exc)
            else:
                w.settings.sampling = params  # in use, not saved: the chat's own settings
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
        self._cards_changed()
        w.update_buttons()
        for listener in self.conversation_listeners:
            listener(conv)
        if opened and not restoring:
            w.conversation_opened(RestoreResult(conv.id, False, 0, 0.0, ""))
        if not opened:
            w.chat_input.setFocus()

    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None:
        w = self._win
        w.chat.show_edit(None)
        conv = w.conversation
        if added_user:
            last = shown[-1]
            index = len(shown) - 1
            w.transcript.add_user_message(
                last.content, index, images=last.images, sources=last.sources
            )
        else:
            w.transcript.show_messages(shown, [conv.version_of(i) for i in range(len(shown))])
        w.transcript.begin_reply(len(shown))
        w.transcript.thoughts.budget = w.settings.sampling.thinking_budget
        w.perf_panel.start_reply()
        w.chat.begin_stream()
        self.reply_started = time.perf_counter()
        # Not "thinking…": that is what a reasoning model's thinking block shows.
        w.status_speed.setText("waiting for the first token…")
        w.update_buttons()

    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        w = self._win
        w.chat.end_stream()
        footer = reply_footer(metrics) if metrics is not None else ""
        if w.transcript.streaming:
            kept = metrics is not None
            last = w.conversation.messages[-1] if w.conversation.messages else None
            # What the session saved is the reply's thinking; else what streamed.
            thought = last.reasoning if kept and last and last.role == "assistant" else None
            w.transcript.end_reply(text, footer, error, kept, thought, metrics)
        elif error:  # the transcript was shown again (what the session kept): say why
            w.transcript.add_notice(f"No reply: {error}")
        conv = w.conversation
        w.transcript.headers.set_versions(
            conv.messages, [conv.version_of(i) for i in range(len(conv.messages))]
        )
        if metrics is not None and metrics.dropped_count:
            w.transcript.headers.mark_forgotten(w.conversation.messages)
        w.perf_panel.set_history(w.reply_metrics)
        if metrics is not None:
            w.status_speed.setText(speed_text(metrics))
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
        w.update_buttons()

    # -- tool calls ------------------------------------------------------------------------

    def tool_calls_changed(self, message: Message) -> None:
        """Redraw the cards of ``message``'s calls (the session changed their state)."""
        w = self._win
        msgs = w.conversation.messages
        index = next((i for i, m in enumerate(msgs) if m is message), None)
        if index is None:
            index = next((i for i, m in enumerate(msgs) if m.id == message.id), None)
        if index is None:
            return
        w.transcript.show_tool_calls(index, message, msgs)
        self._cards_changed()
        w.update_buttons()

    def _cards_changed(self) -> None:
        """Listen to the cards' links (once), and say on the transcript what waits."""
        transcript = self._win.transcript
        if not self._cards_connected:
            transcript.cards.requested.connect(self._on_card)
            self._cards_connected = True
        waiting = transcript.cards.waiting()
        text = TRANSCRIPT_DESCRIPTION
        if waiting:
            text += f". {len(waiting)} tool call(s) wait for your approval: " + " ".join(
                accessible_text(c) for c in waiting
            )
        if transcript.accessibleDescription() != text:
            transcript.setAccessibleDescription(text)
            event = QAccessibleEvent(transcript, QAccessible.Event.DescriptionChanged)
            QAccessible.updateAccessibility(event)

    def _on_card(self, verb: str, call_id: str) -> None:
        session = self._win.session
        decision = DECISIONS.get(verb)
        if decision is not None:
            why = session.decide(call_id, decision)
            if why:
                self.notice(why)
        elif verb == "edit":
            self.edit_arguments(call_id)
        elif verb == "stop":
            self._win.stop()  # the whole reply: its running calls are cancelled

    def decide_waiting(self, decision: str) -> bool:
        """Answer the first call waiting for approval (a menu action's: a ``DECISIONS``
        choice, or "edit"); False if none waits."""
        waiting = self._win.transcript.cards.waiting()
        if not waiting or decision not in (*DECISIONS, "edit"):
            return False
        if decision == "edit":
            self.edit_arguments(waiting[0].id)
        else:
            self._on_card(decision, waiting[0].id)
        return True

    def edit_arguments(self, call_id: str) -> None:
        """Open the Edit arguments… dialog of call ``call_id``; its Run answers ``decide``."""
        cards = self._win.transcript.cards
        where = cards.call_at(call_id)
        if where is None:
            return
        call = cards.calls(where[0])[where[1]]
        if call.state != "ask":
            return
        session = self._win.session

        def submit(text: str) -> str:
            return session.decide(call_id, "once", arguments=text)

        if self.args_dialog is not None:
            self.args_dialog.close()
        dialog = ToolArgsDialog(call.name, call.server, call.arguments, submit, self._parent)
        dialog.finished.connect(self._on_args_closed)
        self.args_dialog = dialog
        dialog.open()

    def _on_args_closed(self, _result: int) -> None:
        if self.args_dialog is not None:
            self.args_dialog.deleteLater()
            self.args_dialog = None

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
        w.conversation_opened(result)

    def open_failed(self, message: str) -> None:
        w = self._win
        QMessageBox.warning(self._parent, "Could not open the conversation", message)
        w.refresh_sidebar()

    def notice(self, text: str) -> None:
        w = self._win
        w.transcript.add_notice(text)
        w.statusBar().showMessage(text, 10000)

    def snapshot_saved(self, conv_id: str, dropped: list[str]) -> None:
        """A conversation's cache was written (``dropped``: caches removed for room)."""
        w = self._win
        store = w.store
        if dropped:
            w.statusBar().showMessage(
                f"Dropped {len(dropped)} old conversation cache(s) to stay within "
                f"{size_text(store.budget_bytes)}",
                6000,
            )
        for changed in (conv_id, *dropped):
            if store.transcript_path(changed).exists():
                self.row_saved(changed)
        w.sidebar.set_usage(store.total_snapshot_bytes(), store.budget_bytes)

    def row_saved(self, conv_id: str) -> None:
        w = self._win
        w.sidebar.update_row(w.store.summary(conv_id), w.conversation.id)

    def row_removed(self, conv_id: str) -> None:
        w = self._win
        w.sidebar.remove_row(conv_id)
