"""The engine's thread: one worker QObject owns the engine; the GUI talks to it by signals."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from app.api.gateway import ApiEvent, ApiFailure, ApiJob, failure_for, model_id
from app.chat.session_cache import RestoreResult, SessionCache
from app.chat.store import ConversationStore
from app.config.params import LoadConfig, SamplingParams
from app.engine.backend import (
    Backend,
    DraftInfo,
    EngineEvent,
    Finished,
    PrefillProgress,
    Token,
)
from app.engine.crash_steps import EngineSteps, marked
from app.engine.kv_pool import DEFAULT_POOL_MB, KvPool
from app.engine.llama import Engine
from app.engine.metrics import MessageMetrics
from app.engine.native_guard import NativeGuard, store_file
from app.engine.offload import fit_report, load_with_fallback
from app.engine.templates import AUTO, PLAIN, ChatMessage, TemplateOverride
from app.gguf.lora import LoraStack
from app.models.default_model import default_model_if_present, ensure_default_model
from app.remote.http import ServerUnreachable
from app.util.errors import LamplightError
from app.util.hashing import FingerprintCache
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)

# A load request with this path prepares and loads the embedded default model.
DEFAULT_MODEL = ""
MAX_DRAFT_CANDIDATES = 64  # library models checked as drafts, smallest first
DRAFT_CHECKS_KEPT = 256  # remembered answers of draft_problem, by both files' versions

_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()


def live_engine_threads() -> list[QThread]:
    """Worker threads not yet garbage-collected (tests check none is left running)."""
    return list(_THREADS)


def register_thread(thread: QThread) -> None:
    """Track a worker thread so tests can check it was joined."""
    _THREADS.add(thread)


class EngineWorker(QObject):
    """Runs backend calls on its own thread.

    Signals:
        loadProgress(float, str): load fraction 0..1 and what is happening.
        modelLoaded(object): the ``ModelInfo`` of the loaded model.
        loadFailed(str, bool): why the model could not be loaded, and whether the
            previous model is still loaded.
        loadNote(str): something to tell the user about a load (no fit, CPU fallback).
        prefillProgress(int, int, int): request id, prompt tokens done, total.
        tokens(int, str): request id and reply text.
        finished(int, str, object): request id, full reply, ``MessageMetrics``.
        cancelled(int, str, object): as finished, for a reply stopped by the user.
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

    Exactly one of finished, cancelled, failed ends every request; one of loraApplied,
    loraFailed answers every ``set_lora_stack``. One of draftLoaded, draftFailed answers
    every ``set_draft`` made while a model is loaded; without one, the choice is kept
    and answered after the next load (a failure that also lost the previous draft is
    followed by ``draftLoaded(None)``). After a reply that got going, the
    conversation's snapshot is written on this thread, so any request queued after
    the reply (a reload, a delete) sees it written.

    API jobs (``generate_api``) report through ``job.emit``, not per-token signals, and
    end with exactly one ``Finished`` or ``ApiFailure``. A ``KvPool`` keeps recent
    conversations' caches in RAM, so the GUI and API clients taking turns do not
    evaluate each other's prompts again.
    """

    loadProgress = Signal(float, str)
    modelLoaded = Signal(object)
    loadFailed = Signal(str, bool)
    loadNote = Signal(str)
    prefillProgress = Signal(int, int, int)
    tokens = Signal(int, str)
    finished = Signal(int, str, object)
    cancelled = Signal(int, str, object)
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
        self._local = engine  # the in-process engine; a server connection replaces it for a while
        self._engine = engine
        self._models_dir = models_dir
        self._lora_wanted = LoraStack()  # re-applied after each load: adapters die with a model
        self._cache = (
            SessionCache(
                engine,
                store,
                FingerprintCache(store.conversations_dir.parent / "fingerprints.json"),
            )
            if store is not None
            else None
        )
        self._store = store
        self.pool = KvPool(engine, pool_mb)  # worker thread only
        # The window's template choice (the engine's own until it sets one); API jobs
        # use theirs and put this one back.
        self._template_choice: TemplateOverride = AUTO
        # The draft model the user chose; loaded again after each load of a model, like
        # the LoRA stack (a new model drops the old one's draft).
        self._draft_wanted: Path | None = None
        self._draft_checks: dict[tuple[object, ...], str] = {}
        # What this thread is doing, for the crash record (a few writes per reply).
        self.steps = EngineSteps()
        # Set from the GUI thread when the app quits: a model or draft load in progress
        # is abandoned (llama.cpp's progress callback returns False).
        self.quitting = threading.Event()

    @Slot(str, object)
    @marked("save")
    def save_snapshot(self, conv_id: str, keep: frozenset[str]) -> None:
        if (
            self._cache is None
            or self._engine.model is None
            or not self._engine.capabilities.snapshots
        ):
            return
        try:
            size, dropped = self._cache.save(conv_id, keep)
        except (LamplightError, OSError) as exc:
            log.warning("snapshot save failed: %s", exc)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.snapshotFailed.emit(conv_id, f"The conversation cache was not saved: {reason}")
        else:
            self.snapshotSaved.emit(conv_id, size, dropped)

    @Slot(str)
    def drop_snapshot(self, conv_id: str) -> None:
        if self._store is not None:
            try:
                self._store.drop_snapshot(conv_id)
            except (LamplightError, OSError) as exc:
                log.warning("could not delete the snapshot of %s: %s", conv_id, exc)

    @Slot(str)
    @marked("restore")
    def restore_snapshot(self, conv_id: str) -> None:
        if self._cache is None or self._engine.model is None:
            why = "no model is loaded" if self._engine.model is None else "saving is off"
            self.restored.emit(RestoreResult(conv_id, False, 0, 0.0, why))
            return
        if not self._engine.capabilities.snapshots:
            why = self._engine.capabilities.why_not.get("snapshots", "this engine keeps none")
            self._engine.reset()
            self.pool.forget_live()
            self.restored.emit(RestoreResult(conv_id, False, 0, 0.0, why))
            return
        self.pool.stash_live()  # an API client's cache, say, before the snapshot replaces it
        try:
            result = self._cache.restore(conv_id)
        except Exception as exc:  # opening a conversation must never take the app down
            log.exception("restore failed")
            self._engine.reset()
            result = RestoreResult(conv_id, False, 0, 0.0, f"the saved cache failed to load: {exc}")
        if result.restored:
            self.pool.set_live(_gui_key(conv_id))
        else:
            self.pool.forget_live()
        if result.lora_stack is not None:
            self._lora_wanted = result.lora_stack  # the conversation's stack is now the one in use
        self.restored.emit(result)

    @Slot(object)
    def set_lora_stack(self, stack: LoraStack) -> None:
        """Apply ``stack`` without reloading the model (kept for the next load without one)."""
        self._lora_wanted = stack.copy()
        self._apply_lora()

    def _apply_lora(self) -> None:
        if self._engine.model is None:
            self.loraFailed.emit("No model is loaded; the adapters apply once one is.", LoraStack())
            return
        if not self._engine.capabilities.lora:
            why = self._engine.capabilities.why_not.get("lora", "this engine takes no adapters")
            self.loraFailed.emit(f"LoRA adapters are not available: {why}.", LoraStack())
            return
        try:
            self._engine.set_lora_stack(self._lora_wanted)
            self.pool.forget_live()
        except LamplightError as exc:
            self.loraFailed.emit(str(exc), self._engine.lora_stack)
        except Exception as exc:  # a bad adapter must not take the app down
            log.exception("applying the LoRA stack failed")
            self.loraFailed.emit(f"The LoRA stack was not applied: {exc}", self._engine.lora_stack)
        else:
            self.loraApplied.emit(self._engine.lora_stack)

    @Slot(object)
    def set_template(self, override: TemplateOverride) -> None:
        """Use ``override`` as the chat template from the next reply on (no reload)."""
        if self._engine.model is None:
            return  # the window applies the model's choice when one is loaded
        if not self._engine.capabilities.template_override:
            if override.kind != "auto":
                why = self._engine.capabilities.why_not.get("template_override", "")
                self.loadNote.emit(f"The chat template cannot be chosen here: {why}.")
            return
        try:
            info = self._engine.set_template(override)
        except LamplightError as exc:
            self.loadNote.emit(str(exc))
            return
        except Exception as exc:  # a template must never take the app down
            log.exception("setting the chat template failed")
            self.loadNote.emit(f"The chat template was not changed: {exc}")
            return
        self._template_choice = override
        self.templateApplied.emit(info)

    @Slot(str)
    def set_draft(self, path: str) -> None:
        """Load ``path`` as the draft model ("" for none), after the vocabulary check."""
        self._draft_wanted = Path(path) if path else None
        if self._engine.model is None:
            return  # loaded with the next model (``load_model``)
        self._apply_draft(answer=True)

    def _apply_draft(self, answer: bool = False, cancel: threading.Event | None = None) -> None:
        """Make the engine's draft the wanted one; ``answer``: say so even if unchanged.

        Quitting (or ``cancel``) abandons a draft load in progress.
        """
        engine, wanted = self._engine, self._draft_wanted
        if engine.model is None:
            return
        if not engine.capabilities.draft_model:
            if wanted is not None and answer:
                why = engine.capabilities.why_not.get("draft_model", "this engine takes none")
                self.draftFailed.emit(f"A draft model cannot be used: {why}.")
            return
        current = engine.draft_info
        if wanted is None and current is None:
            if answer:
                self.draftLoaded.emit(None)
            return
        if wanted is not None and current is not None and _same_file(current.path, wanted):
            self.draftLoaded.emit(current)
            return

        def progress(_value: float) -> bool:
            return not (self.quitting.is_set() or (cancel is not None and cancel.is_set()))

        try:
            if isinstance(engine, Engine):
                info = engine.set_draft(wanted, progress=progress)
            else:
                info = engine.set_draft(wanted)
        except LamplightError as exc:
            self._draft_failed(str(exc), current)
        except Exception as exc:  # a bad draft file must not take the app down
            log.exception("loading the draft model failed")
            self._draft_failed(f"The draft model was not loaded: {exc}", current)
        else:
            self.draftLoaded.emit(info)

    def _draft_failed(self, message: str, before: DraftInfo | None) -> None:
        now = self._engine.draft_info
        self._draft_wanted = now.path if now is not None else None
        self.draftFailed.emit(message)
        if now != before:
            self.draftLoaded.emit(now)

    @Slot(str, str, object)
    def list_drafts(self, target: str, library_file: str, extra: list[str]) -> None:
        """Check the library's models as drafts for ``target``; ``draftCandidates`` answers.

        Only header metadata is read (``app.gguf.vocab_compat``); answers are kept per
        file version, so a second look costs a directory scan.
        """
        try:
            found = self._draft_candidates(
                Path(target), Path(library_file), [Path(p) for p in extra]
            )
        except Exception:  # listing must never take the app down; an empty list says it
            log.exception("listing draft models failed")
            found = []
        self.draftCandidates.emit(target, found)

    def _draft_candidates(
        self, target: Path, library_file: Path, extra: list[Path]
    ) -> list[DraftCandidate]:
        from app.gguf.vocab_compat import draft_problem
        from app.models.library import Library

        library = Library(self._models_dir, library_file)
        library.imported = extra
        try:
            target_st = target.stat()
            target_key = (str(target.resolve()), target_st.st_size, target_st.st_mtime_ns)
        except OSError:
            return []
        entries = sorted(
            (
                e
                for e in library.scan()
                if e.valid and not e.is_adapter and str(e.path.resolve()) != target_key[0]
            ),
            key=lambda e: e.size,
        )[:MAX_DRAFT_CANDIDATES]
        out: list[DraftCandidate] = []
        for e in entries:
            if e.size >= target_st.st_size:
                problem = (
                    f"It is not smaller than the model ({size_text(e.size)} vs "
                    f"{size_text(target_st.st_size)}), so drafting with it would be slower."
                )
            else:
                try:
                    st = e.path.stat()
                except OSError as exc:
                    problem = f"It cannot be read ({exc.strerror or exc})."
                else:
                    key = (*target_key, str(e.path), st.st_size, st.st_mtime_ns)
                    if key not in self._draft_checks:
                        if len(self._draft_checks) >= DRAFT_CHECKS_KEPT:
                            self._draft_checks.clear()
                        self._draft_checks[key] = draft_problem(target, e.path)
                    problem = self._draft_checks[key]
            out.append(DraftCandidate(e.path, e.name, e.size, problem))
        out.sort(key=lambda c: (bool(c.problem), c.size))
        return out

    @Slot(str, object, object)
    @marked()
    def load_model(self, path: str, config: LoadConfig, cancel: threading.Event) -> None:
        last = [-1.0]

        def progress(value: float) -> bool:
            # llama.cpp reports thousands of steps; the GUI needs a few dozen.
            if value - last[0] >= 0.02 or value >= 1.0:
                last[0] = value
                self.loadProgress.emit(value, "Loading model")
            return not (cancel.is_set() or self.quitting.is_set())

        if cancel.is_set() or self.quitting.is_set():  # while this load waited its turn
            self.loadFailed.emit("Loading the model was cancelled.", self._engine.model is not None)
            return
        try:
            if path == DEFAULT_MODEL:
                self.loadProgress.emit(0.0, "Preparing the default model")
                path = str(ensure_default_model(self._models_dir))
            fit = fit_report(path, config, self._local.hardware())
            if not fit.fits:
                self.loadNote.emit(fit.warning(Path(path).name))
            self.steps.loading(path, config, self._local.hardware().gpu_offload)
            info, note = load_with_fallback(self._local, path, config, progress)
            for extra in (note, *info.notes):
                if extra:
                    self.loadNote.emit(extra)
        except LamplightError as exc:
            self.loadFailed.emit(str(exc), self._engine.model is not None)
        except Exception as exc:  # the app must survive any loader failure
            log.exception("model load failed")
            self.loadFailed.emit(f"Could not load the model: {exc}", self._engine.model is not None)
        else:
            self._switch(self._local)
            self.steps.loaded(info, config, self._local.hardware().gpu_offload)
            self.pool.clear()
            self._template_choice = AUTO  # a load starts with the model's own template
            if len(self._lora_wanted) and self._engine.capabilities.lora:
                self._apply_lora()
            self.modelLoaded.emit(info)
            self.connectionState.emit("local", "")
            self._apply_draft(cancel=cancel)

    @Slot(object, object)
    def connect_remote(self, backend: Backend, cancel: threading.Event) -> None:
        """Connect ``backend`` (a server's); on success it replaces the engine in use.

        A failed connect leaves the engine in use (and its model) as it was.
        """

        def progress(value: float) -> bool:
            self.loadProgress.emit(value, "Waiting for the server's model")
            return not cancel.is_set()

        self.loadProgress.emit(0.0, "Connecting")
        try:
            info = backend.load("", LoadConfig(), progress)
        except LamplightError as exc:
            self.loadFailed.emit(str(exc), self._engine.model is not None)
            return
        except Exception as exc:  # a strange server must not take the app down
            log.exception("connect failed")
            self.loadFailed.emit(f"Could not connect: {exc}", self._engine.model is not None)
            return
        self._switch(backend)
        self.steps.remote(info)
        self.pool.clear()
        self._template_choice = AUTO
        for note in info.notes:
            self.loadNote.emit(note)
        self._lora_wanted = LoraStack()  # local adapter files mean nothing to a server
        self.modelLoaded.emit(info)
        self.connectionState.emit("connected", info.backend)
        self.draftLoaded.emit(None)  # the local engine let go of its draft; the wish stays

    def _switch(self, engine: Backend) -> None:
        """Make ``engine`` the one in use; the previous one lets go of its model or server."""
        if engine is self._engine:
            return
        old, self._engine = self._engine, engine
        self.pool.backend = engine
        self.pool.clear()
        if self._cache is not None:
            self._cache.engine = engine
        old.unload()

    @Slot()
    def check_connection(self) -> None:
        """Ask the server in use whether it answers; ``connectionState`` says."""
        if self._engine is self._local:
            self.connectionState.emit("local", "")
            return
        why = self._engine.ping()
        if why:
            self.connectionState.emit("lost", why)
            return
        # The server answers again; it may have restarted (another model, an empty
        # slot), so connect afresh: the window then restores the open chat's cache.
        try:
            info = self._engine.load("", LoadConfig())
        except LamplightError as exc:
            self.connectionState.emit("lost", str(exc))
            return
        self.pool.clear()
        self._template_choice = AUTO
        self.modelLoaded.emit(info)
        self.connectionState.emit("connected", info.backend)

    @Slot(object)
    @marked()
    def generate(self, job: GenerateJob) -> None:
        self.steps.reply("chat", job.conv_id, job.params)
        key = _gui_key(job.conv_id) if job.conv_id else None
        try:
            self.pool.prepare(key, job.messages)
            with contextlib.closing(
                self._engine.generate(job.messages, job.params, job.stop)
            ) as ev:
                ended = self._relay(job.request, ev)
        except LamplightError as exc:
            self.failed.emit(job.request, str(exc))
            if isinstance(exc, ServerUnreachable):
                self.connectionState.emit("lost", str(exc))
            return
        except Exception as exc:  # one terminal signal per request, whatever happens
            log.exception("generation failed")
            self.failed.emit(job.request, f"Generation failed: {exc}")
            return
        if ended is not None:
            self.pool.finish(key, job.messages, ended.text)
        if ended is not None and ended.metrics.stop_reason == "connection_lost":
            self.connectionState.emit(
                "lost", ended.metrics.notes[-1] if ended.metrics.notes else ""
            )
            return
        if ended is None or not job.conv_id:
            return
        if ended.metrics.stop_reason != "cancelled":
            self._prewarm(job.messages, ended.text)
        if ended.metrics.generated_tokens or ended.metrics.stop_reason != "cancelled":
            # A reply stopped before its first token leaves the saved cache as it was.
            self.save_snapshot(job.conv_id, frozenset({job.conv_id}))

    def _prewarm(self, messages: Sequence[ChatMessage], reply: str) -> None:
        if not self._engine.capabilities.prewarm:
            return
        self.steps.mark("prewarm")
        try:
            self._engine.prewarm(messages, reply)
        except LamplightError as exc:
            log.info("could not prepare the next turn: %s", exc)

    def _relay(self, request: int, events: Iterator[EngineEvent]) -> Finished | None:
        """Forward events as signals; returns the ``Finished`` (None after a failure)."""
        for event in events:
            if isinstance(event, Token):
                self.steps.decoding()  # a marker write on the first token only
                self.tokens.emit(request, event.text)
            elif isinstance(event, PrefillProgress):
                self.prefillProgress.emit(request, event.done, event.total)
            else:
                if event.metrics.stop_reason == "cancelled":
                    self.cancelled.emit(request, event.text, event.metrics)
                else:
                    self.finished.emit(request, event.text, event.metrics)
                return event
        self.failed.emit(request, "The engine ended the reply without a result.")
        return None

    @Slot()
    def reset(self) -> None:
        try:
            if self._engine.model is not None:
                self.pool.stash_live()  # an API client's conversation survives a new chat
                self._engine.reset()
        except LamplightError as exc:
            log.warning("reset failed: %s", exc)
        self.pool.forget_live()

    # -- API jobs ----------------------------------------------------------------------

    @Slot(object)
    @marked()
    def generate_api(self, job: ApiJob) -> None:
        """Run an API request; exactly one terminal event reaches ``job.emit``."""
        self.steps.reply("api", "", job.params)
        self.apiStarted.emit(job.id, job.client)
        relay = _ApiRelay(job)
        try:
            self._run_api(job, relay)
        except Exception as exc:  # one terminal event per job, whatever happens
            relay.send(failure_for(exc))
        finally:
            if not relay.ended:
                relay.send(
                    ApiFailure(
                        500,
                        "server_error",
                        "internal_error",
                        "The engine ended the request without a result.",
                    )
                )
            self.apiEnded.emit(job.id)

    def _run_api(self, job: ApiJob, relay: _ApiRelay) -> None:
        if job.stop.is_set():
            relay.send(Finished("", MessageMetrics(stop_reason="cancelled")))
            return
        info = self._engine.model
        if info is None:
            relay.send(
                ApiFailure(503, "server_error", "model_not_loaded", "No model is loaded.", "model")
            )
            return
        if job.model_id not in (model_id(info), info.name):
            relay.send(
                ApiFailure(
                    404,
                    "invalid_request_error",
                    "model_not_found",
                    f"The model '{job.model_id}' is no longer loaded; '{model_id(info)}' is.",
                    "model",
                )
            )
            return
        caps = self._engine.capabilities
        want = PLAIN if job.kind == "completion" else AUTO
        if not caps.template_override and job.kind == "completion":
            why = caps.why_not.get("template_override", "the server renders the prompt itself")
            relay.send(
                ApiFailure(
                    400,
                    "invalid_request_error",
                    "unsupported_endpoint",
                    f"Text completion is not available with this engine: {why}. "
                    "Use /v1/chat/completions.",
                    "prompt",
                )
            )
            return
        swapped = caps.template_override and want != self._template_choice
        ended: Finished | None = None
        try:
            if swapped:
                self._engine.set_template(want)
            if job.reuse:
                self.pool.prepare(None, job.messages)
            else:
                self.pool.stash_live()
                self._engine.reset()
                self.pool.forget_live()
            with contextlib.closing(
                self._engine.generate(job.messages, job.params, job.stop)
            ) as events:
                ended = self._relay_api(relay, events)
            if ended is not None:
                self._after_api(job, ended)
        finally:
            if swapped:
                self._restore_template()
        if ended is None:
            relay.send(
                ApiFailure(
                    500,
                    "server_error",
                    "internal_error",
                    "The engine ended the reply without a result.",
                )
            )
        else:  # after the clean-up: when the client hears of it, the worker is done
            relay.send(ended)

    def _relay_api(self, relay: _ApiRelay, events: Iterator[EngineEvent]) -> Finished | None:
        # Tokens go to the client only: the scheduler counts them for the status bar.
        for event in events:
            if isinstance(event, Token):
                self.steps.decoding()
                relay.send(event)
            elif isinstance(event, Finished):
                return event
        return None

    def _after_api(self, job: ApiJob, ended: Finished) -> None:
        """Name the cache's owner and prepare the next turn; the reply stands whatever."""
        try:
            self.pool.finish(None, job.messages, ended.text)
            if job.kind == "chat" and ended.metrics.stop_reason != "cancelled":
                self._prewarm(job.messages, ended.text)
        except Exception:
            log.exception("after an API reply")
            self.pool.forget_live()

    def _restore_template(self) -> None:
        try:
            self._engine.set_template(self._template_choice)
        except Exception:  # the window's next message says so if this matters
            log.exception("could not put the window's chat template back")

    @Slot()
    def drain(self) -> None:
        """Does nothing; a blocking call to it waits for every request queued before it."""

    @Slot()
    def unload(self) -> None:
        self.pool.clear()
        self._engine.unload()
        if self._engine is not self._local:
            self._local.unload()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a == b or a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False


def _gui_key(conv_id: str) -> str:
    """The ``KvPool`` key of a GUI conversation."""
    return f"gui:{conv_id}"


class _ApiRelay:
    """Passes an API job's events to ``job.emit``: at most one terminal event, and an
    ``emit`` that raises never reaches the worker."""

    def __init__(self, job: ApiJob) -> None:
        self._job = job
        self.ended = False

    def send(self, event: ApiEvent) -> None:
        if self.ended:
            return
        if not isinstance(event, Token):
            self.ended = True
        try:
            self._job.emit(event)
        except Exception:
            log.exception("an API job's emit failed")


@dataclass(frozen=True)
class DraftCandidate:
    """A library model as a draft for the loaded one: ``problem`` says why it cannot be
    one ("" when it can)."""

    path: Path
    name: str
    size: int
    problem: str


@dataclass(frozen=True)
class GenerateJob:
    """One reply to run: its id, the conversation whose cache it extends, and a stop flag."""

    request: int
    conv_id: str
    messages: list[ChatMessage]
    params: SamplingParams
    stop: threading.Event


def guarded_engine(models_dir: Path) -> Engine:
    """The in-process engine, with native paths that crash on this machine switched off
    (verdicts in the data folder, ``models_dir``'s parent); the checks run on the
    embedded default model when it is there (small, and always the same)."""

    guard = NativeGuard(
        store_file(models_dir.parent), probe_model=lambda: default_model_if_present(models_dir)
    )
    return Engine(guard=guard)


class EngineClient(QObject):
    """The GUI side: starts the worker thread, sends requests, stops and joins it.

    Signals are re-exported from the worker (see ``EngineWorker``).
    """

    _loadRequested = Signal(str, object, object)
    _generateRequested = Signal(object)
    _dropRequested = Signal(str)
    _resetRequested = Signal()
    _saveRequested = Signal(str, object)
    _restoreRequested = Signal(str)
    _drainRequested = Signal()
    _unloadRequested = Signal()
    _loraRequested = Signal(object)
    _connectRequested = Signal(object, object)
    _checkRequested = Signal()
    _templateRequested = Signal(object)
    _apiRequested = Signal(object)
    _draftRequested = Signal(str)
    _draftListRequested = Signal(str, str, object)

    def __init__(
        self,
        models_dir: Path,
        engine_factory: Callable[[], Backend] | None = None,
        store: ConversationStore | None = None,
        parent: QObject | None = None,
        pool_mb: int = DEFAULT_POOL_MB,
    ) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("lamplight-engine")
        _THREADS.add(self._thread)
        engine = engine_factory() if engine_factory else guarded_engine(models_dir)
        self.worker = EngineWorker(engine, models_dir, store, pool_mb)
        self.worker.moveToThread(self._thread)
        self._loadRequested.connect(self.worker.load_model)
        self._generateRequested.connect(self.worker.generate)
        self._resetRequested.connect(self.worker.reset)
        self._saveRequested.connect(self.worker.save_snapshot)
        self._restoreRequested.connect(self.worker.restore_snapshot)
        self._dropRequested.connect(self.worker.drop_snapshot)
        self._unloadRequested.connect(self.worker.unload)
        self._loraRequested.connect(self.worker.set_lora_stack)
        self._connectRequested.connect(self.worker.connect_remote)
        self._checkRequested.connect(self.worker.check_connection)
        self._templateRequested.connect(self.worker.set_template)
        self._draftRequested.connect(self.worker.set_draft)
        self._draftListRequested.connect(self.worker.list_drafts)
        # Queued explicitly: generate_api may be called from the server's thread.
        self._apiRequested.connect(self.worker.generate_api, Qt.ConnectionType.QueuedConnection)
        self._drainRequested.connect(self.worker.drain, Qt.ConnectionType.BlockingQueuedConnection)
        # The model is freed on its own thread as that thread ends, after any running request.
        self._thread.finished.connect(self.worker.unload, Qt.ConnectionType.DirectConnection)
        self._next_request = 0
        self._stop = threading.Event()
        self._cancel_load = threading.Event()
        self._thread.start()

    @property
    def engine_thread(self) -> QThread:
        return self._thread

    def load(self, path: str | Path, config: LoadConfig) -> None:
        """Load ``path`` (``DEFAULT_MODEL`` for the embedded one) on the worker."""
        self._cancel_load = threading.Event()
        self._loadRequested.emit(str(path), config, self._cancel_load)

    def connect_remote(self, backend: Backend) -> None:
        """Connect to a server through ``backend`` (made here, used only on the worker)."""
        self._cancel_load = threading.Event()
        self._connectRequested.emit(backend, self._cancel_load)

    def check_connection(self) -> None:
        """Ask the worker to ping the server in use (``connectionState`` answers)."""
        self._checkRequested.emit()

    def cancel_load(self) -> None:
        self._cancel_load.set()

    def generate(
        self, conv_id: str, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> int:
        """Queue a reply; the worker saves ``conv_id``'s snapshot after it ('' for none).

        Returns the request id.
        """
        self._next_request += 1
        self._stop = threading.Event()
        self._generateRequested.emit(
            GenerateJob(self._next_request, conv_id, list(messages), params, self._stop)
        )
        return self._next_request

    def generate_api(self, job: ApiJob) -> None:
        """Queue an API job behind the requests already queued (callable from any thread)."""
        self._apiRequested.emit(job)

    def stop(self) -> None:
        """Ask the running reply to stop; its cancelled signal follows promptly."""
        self._stop.set()

    def reset(self) -> None:
        self._resetRequested.emit()

    def unload(self) -> None:
        """Free the model (before its file is deleted, say)."""
        self._unloadRequested.emit()

    def save_snapshot(self, conv_id: str, keep: frozenset[str] = frozenset()) -> None:
        """Snapshot the KV cache as ``conv_id``'s (after the requests queued before it)."""
        self._saveRequested.emit(conv_id, keep)

    def restore_snapshot(self, conv_id: str) -> None:
        """Load ``conv_id``'s snapshot; ``restored`` reports how it went."""
        self._restoreRequested.emit(conv_id)

    def drop_snapshot(self, conv_id: str) -> None:
        """Delete ``conv_id``'s snapshot, after any write of it already queued."""
        self._dropRequested.emit(conv_id)

    def set_lora_stack(self, stack: LoraStack) -> None:
        """Apply ``stack`` on the worker; ``loraApplied`` or ``loraFailed`` answers."""
        self._loraRequested.emit(stack.copy())  # a copy: the panel keeps editing its own

    def set_template(self, override: TemplateOverride) -> None:
        """Use ``override`` from the next reply on; ``templateApplied`` answers."""
        self._templateRequested.emit(override)

    def set_draft(self, path: str | Path | None) -> None:
        """Load ``path`` as the draft model (None: none) on the worker, after the vocabulary
        check; ``draftLoaded`` or ``draftFailed`` answers (after the next load, without a
        model)."""
        self._draftRequested.emit(str(path) if path else "")

    def list_drafts(
        self, target: str | Path, library_file: Path, extra: Sequence[str | Path] = ()
    ) -> None:
        """Check the library's models (and ``extra`` files) as drafts for ``target``;
        ``draftCandidates`` answers. ``library_file`` is the library's metadata cache."""
        self._draftListRequested.emit(str(target), str(library_file), [str(p) for p in extra])

    def drain(self) -> None:
        """Wait until the worker has run every request queued before this call."""
        if self._thread.isRunning():
            self._drainRequested.emit()

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Stop any work, free the model on its thread, and join the thread."""
        if not self._thread.isRunning():
            return True
        self._stop.set()
        self._cancel_load.set()
        self.worker.quitting.set()  # a draft load in progress stops at its next step
        # Let queued requests (a last snapshot save) finish; the stop above keeps this short.
        self._drainRequested.emit()
        self._thread.quit()
        t0 = time.monotonic()
        ok = self._thread.wait(timeout_ms)
        log.info("engine thread joined in %.0f ms (ok=%s)", (time.monotonic() - t0) * 1000, ok)
        return bool(ok)
