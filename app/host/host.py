"""``EngineHost``: one queue of jobs, run in order on the one engine thread.

The shape of llama.cpp's ``server_queue``: every request, from any thread (the
window, the API server, a signal handler), is one task on a FIFO queue; the engine
thread runs them one at a time, so a window reply and an API request never touch
the engine at once and each sees the other's effects in order. The thread is
whatever calls ``run``: a plain ``threading.Thread`` (``start``) for ``lamplight
serve``, a ``QThread`` for the window. API replies join the queue through ``line``
(``ReplyLine``: at most one of them on it at a time, the others waiting their turn).
``close`` ends the loop after the tasks queued before it; the loop frees the model as
it ends, on its own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, ModelInfo
from app.engine.chat_message import ChatMessage
from app.engine.local.crash_steps import EngineSteps
from app.engine.local.engine import Engine
from app.engine.native.guard import NativeGuard, store_file
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraStack
from app.host import compaction_steps, prompt_count
from app.host.core import EngineCore
from app.host.jobs import HostClosed, ReplyFailed, ReplyJob
from app.host.kv_pool import DEFAULT_POOL_MB, KvPool
from app.host.line import ReplyLine
from app.host.listener import HostListener
from app.host.replies import run_reply
from app.models.default_model import default_model_if_present

log = logging.getLogger(__name__)

THREAD_NAME = "lamplight-engine"
_Task = Callable[[], None]


class EngineHost:
    """The engine thread's queue and its requests; every request method may be called
    from any thread and returns at once (``drain`` waits)."""

    def __init__(
        self,
        engine: Backend,
        models_dir: Path,
        store: ConversationStore | None,
        listener: HostListener,
        pool_mb: int = DEFAULT_POOL_MB,
    ) -> None:
        self._core = EngineCore(engine, models_dir, store, listener, pool_mb)
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # no task is queued behind the end of the loop
        self._running = threading.Event()
        self._finished = threading.Event()  # the loop ran and ended
        self._closed = False
        self._ident = 0  # the engine thread's id while ``run`` runs
        self.line = ReplyLine(self.submit)  # API replies, one at a time onto the queue

    # -- what is in use (reads from any thread: single attribute reads) ----------------

    @property
    def engine(self) -> Backend:
        """The backend in use; its ``model`` is the one owner of "what is loaded"."""
        return self._core.engine

    @property
    def local(self) -> Backend:
        """The in-process engine (the backend in use unless a server is connected)."""
        return self._core.local

    @property
    def loading(self) -> bool:
        """Whether a load or connect is replacing the model (nothing to serve meanwhile)."""
        return self._core.loading

    @property
    def pool(self) -> KvPool:
        """The KV cache pool (engine thread only; tests read its stats when idle)."""
        return self._core.pool

    @property
    def steps(self) -> EngineSteps:
        return self._core.steps

    @property
    def quitting(self) -> threading.Event:
        """Set when the app quits: a model or draft load in progress is abandoned."""
        return self._core.quitting

    @property
    def running(self) -> bool:
        return self._running.is_set()

    # -- requests --------------------------------------------------------------------

    def post(self, task: _Task) -> bool:
        """Queue ``task`` behind every request queued before it (False: the host is closed
        and the task dropped)."""
        with self._lock:
            if self._closed:
                log.debug("engine host closed; a request was dropped")
                return False
            self._tasks.put(task)
            return True

    def submit(self, job: ReplyJob) -> None:
        """Queue a reply (the window's, or an API request's turn from ``line``); its sink
        gets one terminal event, also when the host is already closed (then at once, on
        the caller's thread)."""
        self._core.prefixes.preempt.set()  # an opening read ahead gives way to it
        if not self.post(lambda: run_reply(self._core, job)):
            job.relay.send(ReplyFailed(HostClosed()))

    def load(self, path: str, config: LoadConfig, cancel: threading.Event) -> None:
        """Load ``path`` (``DEFAULT_MODEL``: the embedded one); ``cancel`` abandons it."""
        self.post(lambda: self._core.load_model(path, config, cancel))

    def connect_remote(self, backend: Backend, cancel: threading.Event) -> None:
        """Use ``backend`` (a server's) instead of the engine, once it connects."""
        self.post(lambda: self._core.connect_remote(backend, cancel))

    def check_connection(self) -> None:
        self.post(self._core.check_connection)

    def reset(self) -> None:
        self.post(self._core.reset)

    def build_prefix(
        self,
        project: str,
        messages: list[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
        tries: int = 3,
    ) -> None:
        """Read ``project``'s opening (``messages``: its system turn; ``tools``: what its
        chats' first round offers) ahead of its next new chat, behind the work queued
        now; a reply queued meanwhile goes first and the read starts again after it (at
        most ``tries`` times)."""

        def task() -> None:
            def again() -> None:
                if tries > 1:
                    self.build_prefix(project, messages, params, tools, tries - 1)

            self._core.build_prefix(project, messages, params, tools, again)

        self.post(task)

    def forget_prefix(self, project: str) -> None:
        """Drop ``project``'s saved openings (it was deleted)."""
        self.post(lambda: self._core.prefixes.forget(project))

    def unload(self) -> None:
        self.post(self._core.unload)

    def save_snapshot(self, conv_id: str, keep: frozenset[str]) -> None:
        self.post(lambda: self._core.save_snapshot(conv_id, keep))

    def restore_snapshot(self, conv_id: str) -> None:
        self.post(lambda: self._core.restore_snapshot(conv_id))

    def drop_snapshot(self, conv_id: str) -> None:
        self.post(lambda: self._core.drop_snapshot(conv_id))

    def settle(
        self,
        conv_id: str,
        messages: list[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
    ) -> None:
        """A compacted chat read into the cache and saved (``compaction_steps.settle``)."""

        def task() -> None:
            compaction_steps.settle(self._core, conv_id, messages, params, tools)

        self.post(task)

    def count_prompt(
        self, messages: list[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Future[int]:
        """The tokens a reply's prompt would take (``prompt_count.count``), counted on
        the engine thread behind what is queued; a closed host's is HostClosed."""
        done: Future[int] = Future()

        def task() -> None:
            try:
                done.set_result(prompt_count.count(self.engine, messages, params, tools))
            except Exception as exc:  # the caller hears of it, whatever it is
                done.set_exception(exc)

        if not self.post(task):
            done.set_exception(HostClosed())
        return done

    @property
    def data_root(self) -> Path | None:
        """The data folder the host keeps its files in (None: it keeps none)."""
        store = self._core.store
        return store.snapshots_dir.parent if store is not None else None

    def prompt_cache_usage(self) -> tuple[int, int]:
        """The API's saved openings on disk: how many, and their bytes (``prompt_cache``;
        file sizes only, so any thread may ask)."""
        return self._core.prompt_cache.usage()

    def clear_prompt_cache(self) -> None:
        """Drop the API's saved openings, in memory and on disk (queued)."""
        self.post(self._core.prompt_cache.clear)

    def restore_undo(self, conv_id: str, summary_id: str) -> None:
        """Undo's cache (``compaction_steps.restore_undo``)."""

        def task() -> None:
            compaction_steps.restore_undo(self._core, conv_id, summary_id)

        self.post(task)

    def set_lora_stack(self, stack: LoraStack) -> None:
        self.post(lambda: self._core.set_lora_stack(stack))

    def set_template(
        self, override: TemplateOverride, chat: TemplateOverride | None = None
    ) -> None:
        self.post(lambda: self._core.set_template(override, chat))

    def choose_template(self, choose: Callable[[ModelInfo], TemplateOverride]) -> None:
        """Use the template ``choose`` picks for the model in use once the tasks before
        this one (a load) are done; nothing when no model is loaded then."""

        def task() -> None:
            info = self._core.engine.model
            if info is not None:
                self._core.set_template(choose(info))

        self.post(task)

    def set_draft(self, path: str) -> None:
        self.post(lambda: self._core.set_draft(path))

    def list_drafts(self, target: str, library_file: str, extra: Sequence[str]) -> None:
        self.post(lambda: self._core.list_drafts(target, library_file, extra))

    def run_here(self, job: ReplyJob) -> None:
        """Run ``job`` on the calling thread: only while no engine thread runs (tests)."""
        if self.running and threading.get_ident() != self._ident:
            raise RuntimeError("the engine thread is running: submit the job instead")
        run_reply(self._core, job)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every request queued before this call has run (False: timed out).

        The loop must be running, or about to (``run`` / ``start``); after ``close`` this
        waits for the loop to end.
        """
        if threading.get_ident() == self._ident:
            return True  # on the engine thread: everything before this has run
        done = threading.Event()
        with self._lock:
            if self._closed:
                done = self._finished
            else:
                self._tasks.put(done.set)
        return done.wait(timeout)

    def close(self) -> None:
        """End the loop after the requests queued before this (later ones are dropped)."""
        with self._lock:
            if not self._closed:
                self._tasks.put(None)
                self._closed = True

    # -- the engine thread ---------------------------------------------------------------

    def run(self) -> None:
        """Run queued tasks until ``close``; then free the model, on this thread."""
        self._ident = threading.get_ident()
        self._running.set()
        try:
            while (task := self._tasks.get()) is not None:
                try:
                    task()
                except Exception:  # a request that failed must not end the engine thread
                    log.exception("an engine request failed")
        finally:
            try:
                self._core.unload()
            except Exception:
                log.exception("freeing the model failed")
            self._running.clear()
            self._ident = 0
            self._finished.set()

    def start(self) -> threading.Thread:
        """Run the loop on a plain thread of its own (``lamplight serve``)."""
        thread = threading.Thread(target=self.run, name=THREAD_NAME, daemon=True)
        thread.start()
        return thread


def guarded_engine(models_dir: Path) -> Engine:
    """The in-process engine, with native paths that crash on this machine switched off
    (verdicts in the data folder, ``models_dir``'s parent); the checks run on the
    embedded default model when it is there (small, and always the same)."""

    guard = NativeGuard(
        store_file(models_dir.parent), probe_model=lambda: default_model_if_present(models_dir)
    )
    return Engine(guard=guard)
