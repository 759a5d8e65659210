"""Compaction in the window (issue 45): Chat → Compact chat… (what it frees and costs,
then yes), Chat → Undo compaction, Chat → Compaction prompt… (see and edit what the
model is asked), and the "compact" policy: after a reply, a chat nearly as long as the
context compacts itself (the panel's *When the context is full*).

While the summary is written the chat is busy (Stop ends it, nothing changes) and the
status line counts its tokens; the summary never streams into the transcript: it
shows, folded, once the compacted version is in place (``ui.chat.transcript``).
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QInputDialog, QLabel, QMainWindow, QMenu, QMessageBox

from app.chat import compaction
from app.chat.compact_run import TOO_LITTLE
from app.engine.backend import ModelInfo
from ui.common.context import Context
from ui.settings.sampling_panel import SamplingPanel
from ui.window import window_actions
from ui.window.session_view import WindowView

CHAT_MENU = "&Chat"
NEARLY_FULL = 0.75  # the "compact" policy compacts a chat past this share of the context


class CompactHost(Protocol):
    """What of the window this needs (the window itself)."""

    @property
    def ctx(self) -> Context: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    @property
    def status_speed(self) -> QLabel: ...
    @property
    def replyEnded(self) -> SignalInstance: ...
    @property
    def session_view(self) -> WindowView: ...
    def update_buttons(self) -> None: ...


class WindowCompaction:
    """The Chat menu's compaction entries and the "compact" policy."""

    def __init__(self, win: CompactHost, host: QMainWindow) -> None:
        self._win, self.ctx = win, win.ctx
        parent = self.ctx.parent
        self.compact_action = QAction("Compact chat…", parent)
        self.compact_action.setToolTip(
            "Summarise the older turns, keep the recent ones, and go on with more room"
        )
        self.compact_action.triggered.connect(self.ask_compact)
        self.undo_action = QAction("Undo compaction", parent)
        self.undo_action.setToolTip("Bring the summarised messages back, with their cache")
        self.undo_action.triggered.connect(self.undo)
        self.prompt_action = QAction("Compaction prompt…", parent)
        self.prompt_action.triggered.connect(self.edit_prompt)
        for action in (self.compact_action, self.undo_action, self.prompt_action):
            window_actions.add_to_menu(host, CHAT_MENU, action)
        menu = self.compact_action.associatedObjects()
        for owner in menu:
            if isinstance(owner, QMenu):
                owner.aboutToShow.connect(self.update)  # enabled for the chat shown now
        win.replyEnded.connect(self._on_reply_ended)
        win.session_view.conversation_listeners.append(lambda _conv: self.update())
        self.update()

    def _on_reply_ended(self, how: str) -> None:
        if how == "finished":
            self.after_reply()
        self.update()

    def update(self) -> None:
        """Enable what applies to the chat shown now."""
        session, ready = self.ctx.session, self.ctx.model.ready
        self.compact_action.setEnabled(ready and not session.busy)
        self.undo_action.setEnabled(session.can_undo_compaction())

    def prompt(self) -> str:
        return self.ctx.settings.value.compact_prompt or compaction.DEFAULT_PROMPT

    def ask_compact(self) -> None:
        """Say what compacting the chat frees and costs; compact on yes."""
        session = self.ctx.session
        found = compaction.plan(session.conversation)
        if found is None:
            self.ctx.notice(TOO_LITTLE.format(keep=compaction.KEEP_TURNS))
            return
        info = self.ctx.model.info
        of = f" of {info.n_ctx:,}" if info is not None and info.n_ctx else ""
        freed = f"about {found.freed:,} tokens{of}" if found.freed else "the older turns' room"
        kept = f" (about {found.kept_tokens:,} tokens)" if found.kept_tokens else ""
        text = (
            f"Summarise {found.summarised} earlier messages? That frees {freed}.\n\n"
            f"Once: the model writes the summary (at most {compaction.SUMMARY_TOKENS} "
            f"tokens) and reads it with the turns that stay{kept}.\n\n"
            "The messages stay in the transcript; Chat → Undo compaction brings the chat "
            f"back as it is now, {_undo_cost(info)}."
        )
        answer = QMessageBox.question(
            self.ctx.parent,
            "Compact the chat",
            text,
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.Yes,
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.compact()

    def compact(self) -> bool:
        """Start the compaction (no question); False when it did not start (a note says why)."""
        why = self.ctx.session.compact(self._win.sampling_panel.params(), self.prompt())
        if why:
            self.ctx.notice(why)
        else:
            self._win.status_speed.setText("compacting: writing the summary…")
        self._win.update_buttons()
        return not why

    def undo(self) -> None:
        if self.ctx.session.undo_compaction():
            self.ctx.status("Compaction undone: the chat is as it was, its cache restored.", 5000)
        self._win.update_buttons()

    def edit_prompt(self) -> None:
        """See and edit what the model is asked to summarise ("" brings back the default)."""
        text, ok = QInputDialog.getMultiLineText(
            self.ctx.parent,
            "Compaction prompt",
            "What the model is asked when a chat is compacted ({kept}: how many messages "
            "stay). Empty: the default.",
            self.prompt(),
        )
        if ok:
            text = text.strip()
            self.ctx.settings.update(
                compact_prompt="" if text == compaction.DEFAULT_PROMPT else text
            )

    def after_reply(self) -> None:
        """The "compact" policy: a chat past ``NEARLY_FULL`` of the context compacts."""
        params, info = self._win.sampling_panel.params(), self.ctx.model.info
        conv = self.ctx.session.conversation
        if params.overflow != "compact" or info is None or not info.n_ctx:
            return
        if conv.n_tokens < NEARLY_FULL * info.n_ctx or self.ctx.session.busy:
            return
        if compaction.plan(conv) is not None and self.compact():
            self.ctx.status("The chat is nearly as long as the context: compacting it…", 5000)


def _undo_cost(info: ModelInfo | None) -> str:
    """What Undo costs with the model in use: nothing read again where the cache is saved
    (in-process, llama-server's slot files); an OpenAI-compatible server reads the chat
    again, as it does every message."""
    if info is not None and info.server and not info.capabilities.snapshots:
        return "and this server reads it again with your next message (it keeps its own cache)"
    return "without reading it again"
