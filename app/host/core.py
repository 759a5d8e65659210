"""``EngineCore``: what the engine thread owns, and every job but a reply.

The backend in use (the in-process engine, or a server connection for a while), its
KV cache pool and saved snapshots, and the user's wishes that outlive a model: the
LoRA stack, the chat template, the draft model. Only the engine thread calls it
(``EngineHost`` queues the calls); reports go to the ``HostListener``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from app.chat.session_cache import RestoreResult, SessionCache
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, DraftInfo
from app.engine.chat_message import ChatMessage
from app.engine.local.crash_steps import EngineSteps, marked
from app.engine.local.engine import Engine
from app.engine.local.offload import fit_report, load_with_fallback
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraStack
from app.host import prompt_cache
from app.host.drafts import draft_candidates
from app.host.kv_pool import DEFAULT_POOL_MB, KvPool
from app.host.listener import HostListener
from app.host.prefixes import Prefixes
from app.models.default_model import ensure_default_model
from app.util.errors import LamplightError
from app.util.hashing import FingerprintCache

log = logging.getLogger(__name__)

# A load request with this path prepares and loads the embedded default model.
DEFAULT_MODEL = ""


class EngineCore:
    """The engine thread's state and its jobs (replies are ``replies.run_reply``)."""

    def __init__(
        self,
        engine: Backend,
        models_dir: Path,
        store: ConversationStore | None,
        listener: HostListener,
        pool_mb: int = DEFAULT_POOL_MB,
    ) -> None:
        self.local = engine  # the in-process engine; a server connection replaces it a while
        self.engine = engine  # the backend in use
        self.models_dir = models_dir
        self.listener = listener
        self.lora_wanted = LoraStack()  # re-applied after each load: adapters die with a model
        self.cache = (
            SessionCache(
                engine,
                store,
                FingerprintCache(store.conversations_dir.parent / "fingerprints.json"),
            )
            if store is not None
            else None
        )
        self.store = store
        self.pool = KvPool(engine, pool_mb)
        # Projects' openings, read once and kept (``prefixes``): beside the snapshots.
        folder = store.snapshots_dir.parent / "prefixes" if store is not None else None
        self.prefixes = Prefixes(self.cache, folder)
        # API parties' long openings (agents' prompts), kept across restarts.
        api = store.snapshots_dir.parent / prompt_cache.FOLDER if store is not None else None
        self.prompt_cache = Prefixes(self.cache, api, prompt_cache.MAX_BYTES)
        # The window's template choice (the engine's own until it sets one); a job with
        # a template of its own puts this one back. ``chat_choice``: the chat template
        # chosen for the model (never continue-the-text mode's), what API chats use.
        self.template_choice: TemplateOverride = AUTO
        self.chat_choice: TemplateOverride = AUTO
        # The draft model the user chose; loaded again after each load of a model, like
        # the LoRA stack (a new model drops the old one's draft).
        self.draft_wanted: Path | None = None
        self.draft_checks: dict[tuple[object, ...], str] = {}
        self.steps = EngineSteps()  # what this thread is doing, for the crash record
        # Set from any thread when the app quits: a model or draft load in progress is
        # abandoned (llama.cpp's progress callback returns False).
        self.quitting = threading.Event()
        # True while a load or connect replaces the backend's model (read from any thread).
        self.loading = False

    # -- snapshots ---------------------------------------------------------------------

    @marked("save")
    def save_snapshot(self, conv_id: str, keep: frozenset[str]) -> None:
        if (
            self.cache is None
            or self.engine.model is None
            or not self.engine.capabilities.snapshots
        ):
            return
        try:
            size, dropped = self.cache.save(conv_id, keep)
        except (LamplightError, OSError) as exc:
            log.warning("snapshot save failed: %s", exc)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.listener.snapshot_failed(
                conv_id, f"The conversation cache was not saved: {reason}"
            )
        else:
            self.listener.snapshot_saved(conv_id, size, dropped)

    def build_prefix(
        self,
        project: str,
        messages: list[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None,
        again: Callable[[], object],
    ) -> None:
        """Read ``project``'s opening ahead of its next new chat; a reply queued meanwhile
        stops it, and ``again`` queues it once more, behind that reply."""
        self.prefixes.preempt.clear()
        how = self.prefixes.prebuild(
            self.engine, self.pool, project, messages, params, tools, self.prefixes.preempt
        )
        log.info("project %s's opening read ahead: %s", project, how or "none")
        if how == "stopped":
            again()

    def drop_snapshot(self, conv_id: str) -> None:
        if self.store is not None:
            try:
                self.store.drop_snapshot(conv_id)
            except (LamplightError, OSError) as exc:
                log.warning("could not delete the snapshot of %s: %s", conv_id, exc)

    @marked("restore")
    def restore_snapshot(self, conv_id: str) -> None:
        engine = self.engine
        if self.cache is None or engine.model is None:
            why = "no model is loaded" if engine.model is None else "saving is off"
            self.listener.snapshot_restored(RestoreResult(conv_id, False, 0, 0.0, why))
            return
        if not engine.capabilities.snapshots:
            why = engine.capabilities.why_not.get("snapshots", "this engine keeps none")
            engine.reset()
            self.pool.forget_live()
            self.listener.snapshot_restored(RestoreResult(conv_id, False, 0, 0.0, why))
            return
        self.pool.stash_live()  # an API client's cache, say, before the snapshot replaces it
        try:
            result = self.cache.restore(conv_id)
        except Exception as exc:  # opening a conversation must never take the app down
            log.exception("restore failed")
            engine.reset()
            result = RestoreResult(conv_id, False, 0, 0.0, f"the saved cache failed to load: {exc}")
        if result.restored:
            self.pool.set_live(gui_key(conv_id))
        else:
            self.pool.forget_live()
        if result.lora_stack is not None:
            self.lora_wanted = result.lora_stack  # the conversation's stack is now the one in use
        self.listener.snapshot_restored(result)

    # -- wishes: LoRA stack, template, draft model ---------------------------------------

    def set_lora_stack(self, stack: LoraStack) -> None:
        """Apply ``stack`` without reloading the model (kept for the next load without one)."""
        self.lora_wanted = stack.copy()
        self.apply_lora()

    def apply_lora(self) -> None:
        engine, listener = self.engine, self.listener
        if engine.model is None:
            listener.lora_failed("No model is loaded; the adapters apply once one is.", LoraStack())
            return
        if not engine.capabilities.lora:
            why = engine.capabilities.why_not.get("lora", "this engine takes no adapters")
            listener.lora_failed(f"LoRA adapters are not available: {why}.", LoraStack())
            return
        try:
            engine.set_lora_stack(self.lora_wanted)
            self.pool.forget_live()
        except LamplightError as exc:
            listener.lora_failed(str(exc), engine.lora_stack)
        except Exception as exc:  # a bad adapter must not take the app down
            log.exception("applying the LoRA stack failed")
            listener.lora_failed(f"The LoRA stack was not applied: {exc}", engine.lora_stack)
        else:
            listener.lora_applied(engine.lora_stack)

    def set_template(
        self, override: TemplateOverride, chat: TemplateOverride | None = None
    ) -> None:
        """Use ``override`` as the chat template from the next reply on (no reload).
        ``chat``: the chat template chosen for the model (``chat_choice``) when
        ``override`` is continue-the-text mode's; None: ``override`` itself, or, for
        that mode, the one before."""
        engine = self.engine
        if engine.model is None:
            return  # the window applies the model's choice when one is loaded
        if not engine.capabilities.template_override:
            if override.kind != "auto":
                why = engine.capabilities.why_not.get("template_override", "")
                self.listener.load_note(f"The chat template cannot be chosen here: {why}.")
            return
        try:
            info = engine.set_template(override)
        except LamplightError as exc:
            self.listener.load_note(str(exc))
            return
        except Exception as exc:  # a template must never take the app down
            log.exception("setting the chat template failed")
            self.listener.load_note(f"The chat template was not changed: {exc}")
            return
        self.template_choice = override
        if chat is not None or override.kind != "plain":
            self.chat_choice = chat if chat is not None else override
        self.listener.template_applied(info)

    def restore_template(self) -> None:
        """Put the window's template back after a job that used its own."""
        try:
            self.engine.set_template(self.template_choice)
        except Exception:  # the window's next message says so if this matters
            log.exception("could not put the window's chat template back")

    def set_draft(self, path: str) -> None:
        """Load ``path`` as the draft model ("" for none), after the vocabulary check."""
        self.draft_wanted = Path(path) if path else None
        if self.engine.model is None:
            return  # loaded with the next model (``load_model``)
        self.apply_draft(answer=True)

    def apply_draft(self, answer: bool = False, cancel: threading.Event | None = None) -> None:
        """Make the engine's draft the wanted one; ``answer``: say so even if unchanged.

        Quitting (or ``cancel``) abandons a draft load in progress.
        """
        engine, wanted, listener = self.engine, self.draft_wanted, self.listener
        if engine.model is None:
            return
        if not engine.capabilities.draft_model:
            if wanted is not None and answer:
                why = engine.capabilities.why_not.get("draft_model", "this engine takes none")
                listener.draft_failed(f"A draft model cannot be used: {why}.")
            return
        current = engine.draft_info
        if wanted is None and current is None:
            if answer:
                listener.draft_loaded(None)
            return
        if wanted is not None and current is not None and _same_file(current.path, wanted):
            listener.draft_loaded(current)
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
            listener.draft_loaded(info)

    def _draft_failed(self, message: str, before: DraftInfo | None) -> None:
        now = self.engine.draft_info
        self.draft_wanted = now.path if now is not None else None
        self.listener.draft_failed(message)
        if now != before:
            self.listener.draft_loaded(now)

    def list_drafts(self, target: str, library_file: str, extra: Sequence[str]) -> None:
        """Check the library's models as drafts for ``target``; ``draft_candidates`` answers."""
        try:
            found = draft_candidates(
                self.models_dir,
                Path(target),
                Path(library_file),
                [Path(p) for p in extra],
                self.draft_checks,
            )
        except Exception:  # listing must never take the app down; an empty list says it
            log.exception("listing draft models failed")
            found = []
        self.listener.draft_candidates(target, found)

    # -- the backend: load, connect, switch --------------------------------------------

    @marked()
    def load_model(self, path: str, config: LoadConfig, cancel: threading.Event) -> None:
        listener, last = self.listener, [-1.0]

        def progress(value: float) -> bool:
            # llama.cpp reports thousands of steps; the GUI needs a few dozen.
            if value - last[0] >= 0.02 or value >= 1.0:
                last[0] = value
                listener.load_progress(value, "Loading model")
            return not (cancel.is_set() or self.quitting.is_set())

        if cancel.is_set() or self.quitting.is_set():  # while this load waited its turn
            listener.load_failed("Loading the model was cancelled.", self.engine.model is not None)
            return
        self.loading = True
        try:
            if path == DEFAULT_MODEL:
                listener.load_progress(0.0, "Preparing the default model")
                path = str(ensure_default_model(self.models_dir))
            fit = fit_report(path, config, self.local.hardware())
            if not fit.fits:
                listener.load_note(fit.warning(Path(path).name))
            self.steps.loading(path, config, self.local.hardware().gpu_offload)
            info, note = load_with_fallback(self.local, path, config, progress)
            for extra in (note, *info.notes):
                if extra:
                    listener.load_note(extra)
        except LamplightError as exc:
            self._load_failed(str(exc))
        except Exception as exc:  # the app must survive any loader failure
            log.exception("model load failed")
            self._load_failed(f"Could not load the model: {exc}")
        else:
            self.switch(self.local)
            self.steps.loaded(info, config, self.local.hardware().gpu_offload)
            self.pool.clear()
            self.template_choice = self.chat_choice = AUTO  # a load starts with its own
            if len(self.lora_wanted) and self.engine.capabilities.lora:
                self.apply_lora()
            self.loading = False
            # Local before ready (as a remote connect says "connected" first): whoever
            # waits for the model finds the server's status already gone.
            listener.connection_state("local", "")
            listener.model_loaded(info)
            self.apply_draft(cancel=cancel)

    def _load_failed(self, message: str) -> None:
        self.loading = False
        self.listener.load_failed(message, self.engine.model is not None)

    def connect_remote(self, backend: Backend, cancel: threading.Event) -> None:
        """Connect ``backend`` (a server's); on success it replaces the engine in use.

        A failed connect leaves the engine in use (and its model) as it was.
        """
        listener = self.listener

        def progress(value: float) -> bool:
            listener.load_progress(value, "Waiting for the server's model")
            return not cancel.is_set()

        self.loading = True
        listener.load_progress(0.0, "Connecting")
        try:
            info = backend.load("", LoadConfig(), progress)
        except LamplightError as exc:
            self._load_failed(str(exc))
            return
        except Exception as exc:  # a strange server must not take the app down
            log.exception("connect failed")
            self._load_failed(f"Could not connect: {exc}")
            return
        self.switch(backend)
        self.steps.remote(info)
        self.pool.clear()
        self.template_choice = self.chat_choice = AUTO
        for note in info.notes:
            listener.load_note(note)
        self.lora_wanted = LoraStack()  # local adapter files mean nothing to a server
        self.loading = False
        # Connected before ready: whoever waits for the model finds the connection shown.
        listener.connection_state("connected", info.backend)
        listener.model_loaded(info)
        listener.draft_loaded(None)  # the local engine let go of its draft; the wish stays

    def switch(self, engine: Backend) -> None:
        """Make ``engine`` the one in use; the previous one lets go of its model or server."""
        if engine is self.engine:
            return
        old, self.engine = self.engine, engine
        self.pool.backend = engine
        self.pool.clear()
        if self.cache is not None:
            self.cache.engine = engine
        old.unload()

    def check_connection(self) -> None:
        """Ask the server in use whether it answers; ``connection_state`` says."""
        listener = self.listener
        if self.engine is self.local:
            listener.connection_state("local", "")
            return
        why = self.engine.ping()
        if why:
            listener.connection_state("lost", why)
            return
        # The server answers again; it may have restarted (another model, an empty
        # slot), so connect afresh: the window then restores the open chat's cache.
        try:
            info = self.engine.load("", LoadConfig())
        except LamplightError as exc:
            listener.connection_state("lost", str(exc))
            return
        self.pool.clear()
        self.template_choice = self.chat_choice = AUTO
        listener.connection_state("connected", info.backend)
        listener.model_loaded(info)

    # -- the cache ------------------------------------------------------------------------

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> None:
        """Prepare the next turn's prompt after ``reply`` (where the backend can)."""
        if not self.engine.capabilities.prewarm:
            return
        self.steps.mark("prewarm")
        try:
            self.engine.prewarm(messages, reply)
        except LamplightError as exc:
            log.info("could not prepare the next turn: %s", exc)

    def reset(self) -> None:
        try:
            if self.engine.model is not None:
                self.pool.stash_live()  # an API client's conversation survives a new chat
                self.engine.reset()
        except LamplightError as exc:
            log.warning("reset failed: %s", exc)
        self.pool.forget_live()

    def unload(self) -> None:
        self.pool.clear()
        self.engine.unload()
        if self.engine is not self.local:
            self.local.unload()
        self.listener.unloaded()


def gui_key(conv_id: str) -> str:
    """The ``KvPool`` key of a window conversation."""
    return f"gui:{conv_id}"


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a == b or a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False
