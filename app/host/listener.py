"""``HostListener``: what the engine host reports, called on the engine thread.

The Qt adapter (``ui.engine.worker.EngineWorker``) turns each call into a signal;
``lamplight serve`` listens with a few methods of ``QuietListener``. A listener
must return promptly and must not call back into the host's engine (it may queue
requests). Exactly one of ``model_loaded`` / ``load_failed`` answers every load or
connect; one of ``lora_applied`` / ``lora_failed`` every LoRA stack; ``job_started``
and ``job_ended`` bracket every reply job (``job_ended`` after its terminal event).
"""

from __future__ import annotations

from typing import Protocol

from app.chat.session_cache import RestoreResult
from app.engine.backend import DraftInfo, ModelInfo
from app.gguf.lora import LoraStack
from app.host.jobs import DraftCandidate, ReplyJob


class HostListener(Protocol):
    """Receives the host's reports; every method runs on the engine thread."""

    def load_progress(self, value: float, what: str) -> None:
        """A load is ``value`` (0..1) done; ``what`` it is doing."""

    def model_loaded(self, info: ModelInfo) -> None:
        """``info`` is now the model in use (a load, a connect, a reconnect)."""

    def unloaded(self) -> None:
        """No model is loaded any more: the engine has let go of its file."""

    def load_failed(self, message: str, still_loaded: bool) -> None:
        """Why a load or connect failed, and whether the model before is still there."""

    def load_note(self, message: str) -> None:
        """Something to tell the user about a load or a template (no fit, fallback)."""

    def snapshot_saved(self, conv_id: str, size: int, dropped: object) -> None:
        """``conv_id``'s cache was saved (``size`` bytes; ``dropped``: ids pruned)."""

    def snapshot_failed(self, conv_id: str, why: str) -> None:
        """``conv_id``'s cache was not saved."""

    def snapshot_restored(self, result: RestoreResult) -> None:
        """How opening a conversation's saved cache went."""

    def lora_applied(self, stack: LoraStack) -> None:
        """``stack`` is now applied."""

    def lora_failed(self, why: str, stack: LoraStack) -> None:
        """A stack was refused; ``stack`` is the one still applied."""

    def connection_state(self, state: str, detail: str) -> None:
        """``"local"``, ``"connected"`` or ``"lost"``, and where (or what went wrong)."""

    def template_applied(self, info: ModelInfo) -> None:
        """The model after a template choice (its ``notes`` say what was not used)."""

    def draft_loaded(self, info: DraftInfo | None) -> None:
        """The draft model now in use (None: none)."""

    def draft_failed(self, why: str) -> None:
        """A draft model was not loaded (the one before stays, if any)."""

    def draft_candidates(self, target: str, found: list[DraftCandidate]) -> None:
        """The library's models checked as drafts for ``target``."""

    def job_started(self, job: ReplyJob) -> None:
        """``job`` starts running."""

    def job_ended(self, job: ReplyJob) -> None:
        """``job`` is done; its terminal event has gone to its sink."""


class QuietListener:
    """A ``HostListener`` that ignores everything; override what you need."""

    def load_progress(self, value: float, what: str) -> None:
        pass

    def model_loaded(self, info: ModelInfo) -> None:
        pass

    def unloaded(self) -> None:
        pass

    def load_failed(self, message: str, still_loaded: bool) -> None:
        pass

    def load_note(self, message: str) -> None:
        pass

    def snapshot_saved(self, conv_id: str, size: int, dropped: object) -> None:
        pass

    def snapshot_failed(self, conv_id: str, why: str) -> None:
        pass

    def snapshot_restored(self, result: RestoreResult) -> None:
        pass

    def lora_applied(self, stack: LoraStack) -> None:
        pass

    def lora_failed(self, why: str, stack: LoraStack) -> None:
        pass

    def connection_state(self, state: str, detail: str) -> None:
        pass

    def template_applied(self, info: ModelInfo) -> None:
        pass

    def draft_loaded(self, info: DraftInfo | None) -> None:
        pass

    def draft_failed(self, why: str) -> None:
        pass

    def draft_candidates(self, target: str, found: list[DraftCandidate]) -> None:
        pass

    def job_started(self, job: ReplyJob) -> None:
        pass

    def job_ended(self, job: ReplyJob) -> None:
        pass
