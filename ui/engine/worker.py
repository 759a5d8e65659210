"""The engine's thread for the window: a ``QThread`` running the Qt-free ``EngineHost``.

``EngineWorker`` is the host's listener turned into signals; ``EngineClient`` starts
the thread, queues requests on the host (from any thread) and stops and joins it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal

from app.chat.project_chat import system_text
from app.chat.projects import Project
from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    Backend,
    CallProgress,
    DraftInfo,
    Finished,
    ModelInfo,
    PrefillProgress,
    Token,
)
from app.engine.chat_message import ChatMessage
from app.engine.local.crash_steps import EngineSteps
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraStack
from app.host.host import THREAD_NAME, EngineHost, guarded_engine
from app.host.jobs import DraftCandidate, ReplyEvent, ReplyJob, ReplySink
from app.host.kv_pool import DEFAULT_POOL_MB

__all__ = ["EngineClient", "EngineWorker", "GenerateJob", "live_engine_threads", "register_thread"]

log = logging.getLogger(__name__)

_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()


def live_engine_threads() -> list[QThread]:
    """Worker threads not yet garbage-collected (tests check none is left running)."""
    return list(_THREADS)


def register_thread(thread: QThread) -> None:
    """Track a worker thread so tests can check it was joined."""
    _THREADS.add(thread)


@dataclass(frozen=True)
class GenerateJob:
    """One window reply: its id, the conversation whose cache it extends, a stop flag,
    a Stop-thinking flag and the tools the model may call (None: none)."""

    request: int
    conv_id: str
    messages: list[ChatMessage]
    params: SamplingParams
    stop: threading.Event
    end_thinking: threading.Event = field(default_factory=threading.Event)
    tools: ToolRequest | None = None
    prefix: str = ""  # a new chat in this project starts from its opening (``ReplyJob``)
    compaction: str = ""  # a compaction's summary, on a fork of the cache (``ReplyJob``)


class EngineWorker(QObject):
    """The engine host's reports as signals (a ``HostListener``), emitted on its thread.

    Signals:
        loadProgress(float, str): load fraction 0..1 and what is happening.
        modelLoaded(object): the ``ModelInfo`` of the loaded model.
        loadFailed(str, bool): why the model could not be loaded, and whether the
            previous model is still loaded.
        loadNote(str): something to tell the user about a load (no fit, CPU fallback).
        prefillProgress(int, int, int): request id, prompt tokens done, total.
        callProgress(int, int, int): request id, tokens and characters of the tool call
            being written so far (its text shows only once the call is read).
        tokens(int, str): request id and reply text (the answer).
        thoughts(int, str): request id and thinking text (before the answer).
        finished(int, str, object, str, object): request id, the answer,
            ``MessageMetrics``, the thinking (markers removed; "" for none) and the
            tool calls the reply ended with (a tuple of ``ToolCall``; () for none).
        cancelled(int, str, object, str, object): as finished, for a reply stopped by
            the user.
        failed(int, str): request id and a message for the user.
        snapshotSaved(str, int, object): conversation id, bytes written, ids pruned.
        snapshotFailed(str, str): conversation id and why the cache was not saved.
        restored(object): a ``RestoreResult`` after opening a conversation.
        loraApplied(object): the ``LoraStack`` now applied (after a request or a load).
        loraFailed(str, object): why a stack was refused, and the stack still applied.
        connectionState(str, str): ``"local"``, ``"connected"`` or ``"lost"``, and a line
            saying where (or what went wrong), after a connect, a reply or a check.
        templateApplied(object): the ``ModelInfo`` after ``set_template`` (its ``notes`` say
            why a choice was not used); a refused choice is a ``loadNote`` instead.
        apiStarted(str, str): an API job's id and client, as it starts running.
        apiEnded(str): an API job's id, after its terminal event went to ``job.emit``.
        draftLoaded(object): the ``DraftInfo`` of the draft model now loaded, or None.
        draftFailed(str): why a draft model was not loaded (the one before stays, if any).
        draftCandidates(str, object): a target model's path and its ``DraftCandidate`` list.

    Exactly one of finished, cancelled, failed ends every request (``app.host.replies``);
    the rest is as ``app.host.listener.HostListener`` says. A slot connected to these
    must be a bound method of an object on the GUI thread (queued there), or take care
    to be thread-safe: the signals are emitted on the engine thread.
    """

    loadProgress = Signal(float, str)
    modelLoaded = Signal(object)
    modelUnloaded = Signal()
    loadFailed = Signal(str, bool)
    loadNote = Signal(str)
    prefillProgress = Signal(int, int, int)
    callProgress = Signal(int, int, int)
    tokens = Signal(int, str)
    thoughts = Signal(int, str)
    finished = Signal(int, str, object, str, object)
    cancelled = Signal(int, str, object, str, object)
    failed = Signal(int, str)
    snapshotSaved = Signal(str, int, object)
    snapshotFailed = Signal(str, str)
    restored = Signal(object)
    loraApplied = Signal(object)
    loraFailed = Signal(str, object)
    connectionState = Signal(str, str)
    templateApplied = Signal(object)
    apiStarted = Signal(str, str)
    apiEnded = Signal(str)
    draftLoaded = Signal(object)
    draftFailed = Signal(str)
    draftCandidates = Signal(str, object)

    def __init__(
        self,
        engine: Backend,
        models_dir: Path,
        store: ConversationStore | None,
        pool_mb: int = DEFAULT_POOL_MB,
    ) -> None:
        super().__init__()
        self.host = EngineHost(engine, models_dir, store, self, pool_mb)

    @property
    def steps(self) -> EngineSteps:
        return self.host.steps

    @property
    def quitting(self) -> threading.Event:
        return self.host.quitting

    def reply_sink(self, request: int) -> ReplySink:
        """A window reply's sink: its events as ``tokens`` ... ``failed`` signals."""

        def sink(event: ReplyEvent) -> None:
            if isinstance(event, Token):
                (self.thoughts if event.reasoning else self.tokens).emit(request, event.text)
            elif isinstance(event, PrefillProgress):
                self.prefillProgress.emit(request, event.done, event.total)
            elif isinstance(event, CallProgress):
                self.callProgress.emit(request, event.tokens, event.chars)
            elif isinstance(event, Finished):
                stopped = event.metrics.stop_reason == "cancelled"
                (self.cancelled if stopped else self.finished).emit(
                    request, event.text, event.metrics, event.reasoning, tuple(event.tool_calls)
                )
            else:
                self.failed.emit(request, event.message)

        return sink

    def reply_job(self, job: GenerateJob) -> ReplyJob:
        """The host's job for a window reply."""
        return ReplyJob(
            id=f"gui-{job.request}",
            origin="gui",
            messages=job.messages,
            params=job.params,
            sink=self.reply_sink(job.request),
            stop=job.stop,
            end_thinking=job.end_thinking,
            conv_id=job.conv_id,
            next_turn=bool(job.conv_id) and not job.compaction,
            tools=job.tools,
            prefix=job.prefix,
            compaction=job.compaction,
        )

    def generate(self, job: GenerateJob) -> None:
        """Run a window reply on the calling thread (with the host idle: tests)."""
        self.host.run_here(self.reply_job(job))

    # -- HostListener ----------------------------------------------------------------

    def load_progress(self, value: float, what: str) -> None:
        self.loadProgress.emit(value, what)

    def model_loaded(self, info: ModelInfo) -> None:
        self.modelLoaded.emit(info)

    def unloaded(self) -> None:
        self.modelUnloaded.emit()

    def load_failed(self, message: str, still_loaded: bool) -> None:
        self.loadFailed.emit(message, still_loaded)

    def load_note(self, message: str) -> None:
        self.loadNote.emit(message)

    def snapshot_saved(self, conv_id: str, size: int, dropped: object) -> None:
        self.snapshotSaved.emit(conv_id, size, dropped)

    def snapshot_failed(self, conv_id: str, why: str) -> None:
        self.snapshotFailed.emit(conv_id, why)

    def snapshot_restored(self, result: RestoreResult) -> None:
        self.restored.emit(result)

    def lora_applied(self, stack: LoraStack) -> None:
        self.loraApplied.emit(stack)

    def lora_failed(self, why: str, stack: LoraStack) -> None:
        self.loraFailed.emit(why, stack)

    def connection_state(self, state: str, detail: str) -> None:
        self.connectionState.emit(state, detail)

    def template_applied(self, info: ModelInfo) -> None:
        self.templateApplied.emit(info)

    def draft_loaded(self, info: DraftInfo | None) -> None:
        self.draftLoaded.emit(info)

    def draft_failed(self, why: str) -> None:
        self.draftFailed.emit(why)

    def draft_candidates(self, target: str, found: list[DraftCandidate]) -> None:
        self.draftCandidates.emit(target, found)

    def job_started(self, job: ReplyJob) -> None:
        if job.origin == "api":
            self.apiStarted.emit(job.id, job.client)

    def job_ended(self, job: ReplyJob) -> None:
        if job.origin == "api":
            self.apiEnded.emit(job.id)


class _EngineThread(QThread):
    """The window's engine thread: it runs the host's queue until the host closes."""

    def __init__(self, host: EngineHost) -> None:
        super().__init__()
        self._host = host
        self.setObjectName(THREAD_NAME)

    def run(self) -> None:
        self._host.run()


class EngineClient(QObject):
    """The GUI side: starts the engine thread, queues requests, stops and joins it.

    Every request goes to the host's one queue (``EngineHost``); the signals are the
    worker's (``EngineWorker``).
    """

    def __init__(
        self,
        models_dir: Path,
        engine_factory: Callable[[], Backend] | None = None,
        store: ConversationStore | None = None,
        parent: QObject | None = None,
        pool_mb: int = DEFAULT_POOL_MB,
    ) -> None:
        super().__init__(parent)
        engine = engine_factory() if engine_factory else guarded_engine(models_dir)
        self.worker = EngineWorker(engine, models_dir, store, pool_mb)
        self.host = self.worker.host
        self._thread = _EngineThread(self.host)
        _THREADS.add(self._thread)
        self._next_request = 0
        self._stop = threading.Event()
        self._end_thinking = threading.Event()
        self._cancel_load = threading.Event()
        self._thread.start()

    @property
    def engine_thread(self) -> QThread:
        return self._thread

    def load(self, path: str | Path, config: LoadConfig) -> None:
        """Load ``path`` (``DEFAULT_MODEL`` for the embedded one) on the engine thread."""
        self._cancel_load = threading.Event()
        self.host.load(str(path), config, self._cancel_load)

    def connect_remote(self, backend: Backend) -> None:
        """Connect to a server through ``backend`` (made here, used only on the engine thread)."""
        self._cancel_load = threading.Event()
        self.host.connect_remote(backend, self._cancel_load)

    def check_connection(self) -> None:
        """Ping the server in use (``connectionState`` answers)."""
        self.host.check_connection()

    def cancel_load(self) -> None:
        self._cancel_load.set()

    def generate(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
        prefix: str = "",
        compaction: str = "",
    ) -> int:
        """Queue a reply; its snapshot is saved as ``conv_id``'s after it ('' for none).
        ``tools``: what the model may call (its calls come with ``finished``); ``prefix``:
        the project of a new chat, which starts from the project's opening;
        ``compaction``: a compaction's summary (its message's id), written on a fork of
        the cache (nothing saved after it but the cache before it, for Undo).

        Returns the request id.
        """
        self._next_request += 1
        self._stop = threading.Event()
        self._end_thinking = threading.Event()
        job = GenerateJob(
            self._next_request,
            conv_id,
            list(messages),
            params,
            self._stop,
            self._end_thinking,
            tools,
            prefix,
            compaction,
        )
        self.host.submit(self.worker.reply_job(job))
        return self._next_request

    def settle(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
    ) -> None:
        """Read a compacted chat into the cache up to its next turn, with the tools its
        replies are offered, and save it (queued)."""
        self.host.settle(conv_id, list(messages), params, tools)

    def restore_undo(self, conv_id: str, summary_id: str) -> None:
        """Load the cache saved before the compaction that wrote ``summary_id`` (queued)."""
        self.host.restore_undo(conv_id, summary_id)

    def build_prefix(
        self, project: Project, params: SamplingParams, tools: ToolRequest | None = None
    ) -> None:
        """Read ``project``'s opening now (it changed), so its next new chat starts warm;
        ``tools``: what that chat's first round offers (``opening_request``). A reply
        asked for meanwhile goes first."""
        text = system_text(project)
        if text:
            self.host.build_prefix(project.id, [ChatMessage("system", text)], params, tools)

    def forget_prefix(self, project_id: str) -> None:
        """Drop a deleted project's saved openings (behind the work queued now)."""
        self.host.forget_prefix(project_id)

    def stop(self) -> None:
        """Ask the running reply to stop; its cancelled signal follows promptly."""
        self._stop.set()

    def end_thinking(self) -> None:
        """Ask the running reply to end its thinking now and answer (an Event: safe from
        any thread; the engine checks it between tokens)."""
        self._end_thinking.set()

    def reset(self) -> None:
        self.host.reset()

    def unload(self) -> None:
        """Free the model (before its file is deleted, say)."""
        self.host.unload()

    def save_snapshot(self, conv_id: str, keep: frozenset[str] = frozenset()) -> None:
        """Snapshot the KV cache as ``conv_id``'s (after the requests queued before it)."""
        self.host.save_snapshot(conv_id, keep)

    def restore_snapshot(self, conv_id: str) -> None:
        """Load ``conv_id``'s snapshot; ``restored`` reports how it went."""
        self.host.restore_snapshot(conv_id)

    def drop_snapshot(self, conv_id: str) -> None:
        """Delete ``conv_id``'s snapshot, after any write of it already queued."""
        self.host.drop_snapshot(conv_id)

    def set_lora_stack(self, stack: LoraStack) -> None:
        """Apply ``stack``; ``loraApplied`` or ``loraFailed`` answers."""
        self.host.set_lora_stack(stack.copy())  # a copy: the panel keeps editing its own

    def set_template(
        self, override: TemplateOverride, chat: TemplateOverride | None = None
    ) -> None:
        """Use ``override`` from the next reply on; ``templateApplied`` answers. ``chat``:
        the chat template chosen for the model, when ``override`` is continue-the-text
        mode's (API chats use it)."""
        self.host.set_template(override, chat)

    def set_draft(self, path: str | Path | None) -> None:
        """Load ``path`` as the draft model (None: none), after the vocabulary check;
        ``draftLoaded`` or ``draftFailed`` answers (after the next load, without a
        model)."""
        self.host.set_draft(str(path) if path else "")

    def list_drafts(
        self, target: str | Path, library_file: Path, extra: Sequence[str | Path] = ()
    ) -> None:
        """Check the library's models (and ``extra`` files) as drafts for ``target``;
        ``draftCandidates`` answers. ``library_file`` is the library's metadata cache."""
        self.host.list_drafts(str(target), str(library_file), [str(p) for p in extra])

    def drain(self) -> None:
        """Wait until the engine thread has run every request queued before this call."""
        if self._thread.isRunning():
            self.host.drain()

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Stop any work, let the queued requests end, free the model on its thread, and
        join the thread."""
        if not self._thread.isRunning():
            return True
        self._stop.set()
        self._cancel_load.set()
        self.host.quitting.set()  # a draft load in progress stops at its next step
        # Queued requests (a last snapshot save) still run; the stop above keeps this short.
        self.host.close()
        t0 = time.monotonic()
        ok = self._thread.wait(timeout_ms)
        log.info("engine thread joined in %.0f ms (ok=%s)", (time.monotonic() - t0) * 1000, ok)
        return bool(ok)
