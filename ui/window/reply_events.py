"""The engine's reply signals, taken on the GUI thread and passed to the session and views.

A reply reads its prompt (``prefillProgress``), streams thinking (``thoughts``) and
answer (``tokens``) pieces (a tool call being written shows as its count,
``callProgress``), then ends with one of ``finished``, ``cancelled`` or ``failed``
(``ui.engine.worker.EngineWorker``).
Only the reply the session waits for counts; a stale request's events are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from PySide6.QtCore import QObject, SignalInstance
from PySide6.QtWidgets import QLabel

from app.engine.chat_message import ToolCall
from app.engine.metrics import MessageMetrics
from ui.chat.chat_pane import ChatPane
from ui.common.context import Context
from ui.perf.perf_panel import PerfPanel
from ui.window.session_view import WindowView


def call_progress_text(tokens: int, chars: int, elapsed: float) -> str:
    """The status line while a tool call is written (its text shows once it is read)."""
    speed = f" · {tokens / elapsed:.1f} tok/s" if elapsed > 0 else ""
    words = f"{tokens:,} token{'s' * (tokens != 1)}, {chars:,} character{'s' * (chars != 1)}"
    return f"writing a tool call… {words}{speed}"


class ReplyHost(Protocol):
    """What the reply events reach: the main window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def chat(self) -> ChatPane: ...
    @property
    def perf_panel(self) -> PerfPanel: ...
    @property
    def status_speed(self) -> QLabel: ...
    @property
    def session_view(self) -> WindowView: ...
    @property
    def replyEnded(self) -> SignalInstance: ...


class ReplyEvents(QObject):
    """Connects the worker's reply signals to the session, the chat pane and the charts."""

    def __init__(self, win: ReplyHost) -> None:
        super().__init__()  # lives on the GUI thread: its slots are queued there
        self._win = win
        self._summary_pieces = 0  # a compaction's summary so far
        w = win.ctx.client.worker
        # Bound methods, never lambdas: a lambda would run on the worker's thread.
        w.prefillProgress.connect(self._on_prefill_progress)
        w.tokens.connect(self._on_tokens)
        w.thoughts.connect(self._on_thoughts)
        w.callProgress.connect(self._on_call_progress)
        w.finished.connect(self._on_finished)
        w.cancelled.connect(self._on_cancelled)
        w.failed.connect(self._on_failed)
        win.chat.flushed.connect(self._on_flushed)
        win.chat.thoughtsFlushed.connect(self._on_thoughts_flushed)

    def _current(self, request: int) -> bool:
        return request == self._win.ctx.session.request_id

    def _compacting(self, request: int) -> bool:
        """A compaction's summary (``app.chat.compact_run``): counted on the status line,
        never streamed into the transcript; its end goes to the session."""
        return request == self._win.ctx.session.compaction_id

    def _on_prefill_progress(self, request: int, done: int, total: int) -> None:
        if self._current(request) and total > 0:
            # Once read, "writing…" until tokens show (a tool call is written unseen).
            text = "writing the reply…" if done >= total else f"reading prompt {done}/{total}"
            self._win.status_speed.setText(text)

    def _on_tokens(self, request: int, text: str) -> None:
        if self._current(request):
            self._win.ctx.session.on_tokens(request, text)
            self._win.chat.add_tokens(text)
            self._win.perf_panel.add_tokens()
        elif self._compacting(request):
            self._summary_pieces += 1
            self._win.status_speed.setText(
                f"compacting: writing the summary… {self._summary_pieces} tokens"
            )

    def _on_thoughts(self, request: int, text: str) -> None:
        if self._current(request):
            self._win.ctx.session.on_tokens(request, text, reasoning=True)
            self._win.chat.add_thoughts(text)
            self._win.perf_panel.add_tokens()

    def _on_call_progress(self, request: int, tokens: int, chars: int) -> None:
        if self._current(request):
            self._win.status_speed.setText(call_progress_text(tokens, chars, self._elapsed()))
            self._win.perf_panel.add_tokens()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._win.session_view.reply_started

    def _on_flushed(self, n_tokens: int) -> None:
        elapsed = self._elapsed()
        if elapsed > 0:
            self._win.status_speed.setText(f"{n_tokens / elapsed:.1f} tok/s")

    def _on_thoughts_flushed(self, n_tokens: int) -> None:
        elapsed = self._elapsed()
        speed = f" · {n_tokens / elapsed:.1f} tok/s" if elapsed > 0 else ""
        self._win.status_speed.setText(f"thinking… {n_tokens} tokens{speed}")

    def _on_finished(
        self,
        request: int,
        text: str,
        metrics: MessageMetrics,
        reasoning: str = "",
        tool_calls: Sequence[ToolCall] = (),
    ) -> None:
        if self._current(request):
            self._win.ctx.session.on_finished(request, text, metrics, reasoning, tool_calls)
            self._win.replyEnded.emit("finished")
        elif self._compacting(request):
            self._compaction_ended()
            self._win.ctx.session.on_finished(request, text, metrics)
            self._win.replyEnded.emit("compacted")

    def _on_cancelled(
        self,
        request: int,
        text: str,
        metrics: MessageMetrics,
        reasoning: str = "",
        _tool_calls: Sequence[ToolCall] = (),  # a stopped reply's calls are not run
    ) -> None:
        if self._current(request) or self._compacting(request):
            self._compaction_ended()
            self._win.ctx.session.on_cancelled(request, text, metrics, reasoning)
            self._win.replyEnded.emit("cancelled")

    def _on_failed(self, request: int, message: str) -> None:
        if self._current(request) or self._compacting(request):
            self._compaction_ended()
            self._win.ctx.session.on_failed(request, message)
            self._win.replyEnded.emit("failed")

    def _compaction_ended(self) -> None:
        if self._summary_pieces:
            self._win.status_speed.setText("")
        self._summary_pieces = 0
