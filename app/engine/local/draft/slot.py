"""The draft model beside a loaded model, and which drafter a reply uses.

``Engine`` opens the draft file (``Engine.set_draft``) and hands it to its
``DraftSlot``, which keeps the drafter, the thread pool it shares with the model, and
what was measured about each kind of drafter (``DraftCosts``) while the model stays.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import DraftInfo, LoadCancelled, ProgressFn
from app.engine.local.draft.drafters import Drafter, ModelDrafter, NgramDrafter
from app.engine.local.draft.length import DraftCosts, DraftLength
from app.engine.metrics import MessageMetrics
from app.engine.native.handles import HYBRID, RECURRENT, Native

if TYPE_CHECKING:
    from app.engine.local.draft.mtp import MtpDrafter
from app.engine.native.threadpool import SharedThreadPool, ThreadPoolUnavailable
from app.util.errors import DraftError, ModelFileError, ModelLoadError

log = logging.getLogger(__name__)


class DraftSlot:
    """One model's draft: ``drafter`` and ``info`` while one is loaded; ``costs`` by
    ``costs_key``, kept across drafts until the model goes."""

    def __init__(self) -> None:
        self.drafter: ModelDrafter | None = None
        self.info: DraftInfo | None = None
        self.costs: dict[str, DraftCosts] = {}
        self._pool: SharedThreadPool | None = None  # one CPU thread pool for model and draft
        # The model's own next-token layers, while the model stays (``open_mtp``).
        self.mtp: MtpDrafter | None = None
        self.mtp_why = "the model has no next-token (MTP) layers"

    @property
    def tokens(self) -> list[int]:
        """A copy of the token ids in the draft model's KV cache (for tests)."""
        return self.drafter.cached_tokens if self.drafter is not None else []

    def attach(
        self, draft_llm: Any, path: Path, info: DraftInfo, target: Native, n_threads: int
    ) -> None:
        """Use ``draft_llm`` (opened from ``path``) as the draft for ``target``; the
        previous draft is dropped first."""
        self.drop()
        self.drafter = ModelDrafter(draft_llm)
        self._pool = share_threads(n_threads, (target.ctx, self.drafter.native.ctx))
        # What was learnt about this draft with this model stays while the model does.
        costs = self.costs.setdefault(costs_key(path), DraftCosts())
        costs.read_prior, costs.guess_prior = self.drafter.warm()
        self.info = info
        log.info("draft model loaded: %s (n_ctx %d)", path, info.n_ctx)

    def open_mtp(self, target: Native, mtp_layers: int, n_threads: int) -> None:
        """Draft with ``target``'s next-token layers where it has them (``mtp_why`` says
        why not); they read every batch the target reads from now on."""
        from app.engine.local.draft.mtp import MtpDrafter
        from app.engine.native.nextn import why_not

        self.close_mtp()
        self.mtp_why = why_not(target, mtp_layers)
        if self.mtp_why:
            return
        try:
            self.mtp = MtpDrafter(target, n_threads)
        except RuntimeError as exc:
            self.mtp_why = f"llama.cpp could not open the model's next-token layers ({exc})"
            return
        target.after_decode = self.mtp.tap
        log.info("drafting with the model's next-token layers is available")

    def close_mtp(self, target: Native | None = None) -> None:
        """Stop drafting with the next-token layers (before the model is freed)."""
        if self.mtp is not None:
            if target is not None:
                target.after_decode = None
            self.mtp.close()
            self.mtp = None
        self.mtp_why = "the model has no next-token (MTP) layers"

    def drop(self) -> None:
        """Unload the draft model (its costs stay)."""
        if self._pool is not None:  # detached before either context is freed
            self._pool.close()
            self._pool = None
        if self.drafter is not None:
            self.drafter.close()
            log.info("draft model unloaded")
        self.drafter = None
        self.info = None

    def choose(
        self, params: SamplingParams, flash: bool, metrics: MessageMetrics
    ) -> tuple[Drafter | None, DraftLength | None]:
        """The drafter for a reply with ``params`` (None: plain decoding) and its length;
        notes in ``metrics`` say why a drafter asked for is not used."""
        drafter: Drafter | None = None
        if params.draft_model and self.drafter is not None:
            drafter = self.drafter
        elif params.mtp and self.mtp is not None:
            drafter = self.mtp
        elif params.speculative:
            drafter = NgramDrafter()
        if params.draft_model and self.drafter is None:
            metrics.notes.append(
                "no draft model is loaded"
                + (": prompt lookup drafted instead" * (params.speculative and not flash))
            )
        if drafter is not None and flash:
            metrics.notes.append(
                "drafting is off with flash attention, whose batched evaluation rounds "
                "differently and could change the reply"
            )
            drafter = None
        if drafter is None:
            return None, None
        draft = self.info.path if self.info and drafter.kind == "model" else None
        key = "mtp" if drafter.kind == "mtp" else costs_key(draft)
        costs = self.costs.setdefault(key, DraftCosts())
        length = DraftLength(
            params.draft_len, params.adaptive_draft, costs, reads_prompt=drafter.kind == "model"
        )
        return drafter, length


def costs_key(draft: Path | None) -> str:
    """Which ``DraftCosts`` a drafter uses: prompt lookup's, or one per draft file."""
    return f"model:{draft}" if draft is not None else "lookup"


def share_threads(n_threads: int, contexts: tuple[Any, ...]) -> SharedThreadPool | None:
    """One ggml thread pool for ``contexts`` (the model's and its draft's), or None.

    Without OpenMP each context brings its own pool, whose threads poll for a while
    after their work and steal cores from the other model's; with OpenMP (this
    wheel) both already run on the calling thread's libgomp team and the shared pool
    changes nothing measurable (``app/engine/native/threadpool.py``, ``bench/threadpool.py``).
    Where the pool cannot be made, llama.cpp's own threads are used, as before.
    """
    try:
        pool = SharedThreadPool(n_threads)
    except ThreadPoolUnavailable as exc:
        log.info("no shared thread pool for the draft model: %s", exc)
        return None
    for ctx in contexts:
        pool.attach(ctx)
    return pool


def open_draft(
    target: Path, path: Path, config: LoadConfig, progress: ProgressFn | None, extra_bufts: bool
) -> tuple[Any, DraftInfo]:
    """A draft model for ``target``: its vocabulary compared before llama.cpp sees it.

    Raises:
        DraftError: it cannot draft for ``target``, cannot be loaded, or its load was
            cancelled.
    """
    from app.engine.local.loader import open_llama
    from app.gguf.info import read_gguf_info
    from app.gguf.vocab_compat import draft_problem

    problem = draft_problem(target, path)
    if problem:
        raise DraftError(problem)
    try:
        gguf = read_gguf_info(path)
        if progress is not None and not progress(0.0):  # asked before llama.cpp starts
            raise LoadCancelled("cancelled")
        draft_llm = open_llama(gguf, config, progress, extra_bufts)
    except LoadCancelled as exc:
        raise DraftError("Loading the draft model was cancelled.") from exc
    except (ModelFileError, ModelLoadError) as exc:
        raise DraftError(f"The draft model was not loaded: {exc}") from exc
    if Native(draft_llm).memory_kind() in (RECURRENT, HYBRID):
        # Its guesses are evaluated in its own cache and cut back after each round,
        # which a recurrent state refuses: it would restart every round and guess nothing.
        draft_llm.close()
        raise DraftError(
            "This draft model's memory is recurrent (a Mamba-style state): it cannot take "
            "back its own guesses yet. Choose a draft model with attention layers only."
        )
    info = DraftInfo(
        path=gguf.path, name=gguf.display_name, n_params=gguf.n_params, n_ctx=draft_llm.n_ctx()
    )
    return draft_llm, info
