"""The inference engine: one ``llama_cpp.Llama``, streamed generation, prefix reuse.

The engine is not thread-safe. One thread (the UI's worker thread, or a test)
owns it and makes every call; other threads may only set the stop ``Event``
they passed to :meth:`Engine.generate`.

llama-cpp-python's ``Llama`` loads the model, context and vocabulary; the
generation loop itself calls llama.cpp directly (``llama_decode`` on a
one-token batch, the native sampler chain) so no per-token copy of the
262k-entry logits row is made in Python.

``Engine`` is the only entry point. The modules beside it hold its parts:
``loader`` (opening a model), ``vocab`` (token text), ``adapters`` (LoRA
handles), ``kv_state`` (KV serialization), ``sampler`` (the native sampler
chain), ``decode`` (the decode loops) and ``llama_log`` (llama.cpp's log).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.config.params import LoadConfig, SamplingParams
from app.engine.adapters import AdapterSet
from app.engine.backend import (
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    LoadCancelled,
    ModelInfo,
    PrefillProgress,
    ProgressFn,
)
from app.engine.context_map import ContextMap, common_prefix
from app.engine.decode import decode
from app.engine.draft_length import DraftCosts, DraftLength
from app.engine.drafting import Drafter, ModelDrafter, NgramDrafter
from app.engine.hardware import HardwareInfo, detect_hardware
from app.engine.kv_state import read_sequence, write_sequence
from app.engine.llama_log import install_log_route
from app.engine.loader import open_llama
from app.engine.metrics import MessageMetrics
from app.engine.native_guard import NativeGuard, default_guard
from app.engine.native_libs import load_backends
from app.engine.overflow import Overflow, message_starts, reply_budget
from app.engine.sampler import build_sampler
from app.engine.templates import (
    AUTO as AUTO_TEMPLATE,
)
from app.engine.templates import (
    ChatMessage,
    ChatTemplate,
    ChatTemplateError,
    TemplateInputs,
    TemplateOverride,
    build_template,
    looks_like_base_model,
    render_or_fall_back,
    template_for_architecture,
)
from app.engine.threadpool import SharedThreadPool, ThreadPoolUnavailable
from app.engine.vocab import Vocab
from app.gguf.info import read_gguf_info
from app.gguf.lora import AdapterInfo, LoraStack, stack_key
from app.util.errors import (
    ContextOverflowError,
    DecodeError,
    DraftError,
    LamplightError,
    ModelFileError,
    ModelLoadError,
    NoModelLoaded,
)

log = logging.getLogger(__name__)

LORA_CHANGED_NOTE = "the LoRA stack changed"
HEAD_LOST_NOTE = "the cached conversation did not start with the model's BOS token"


_CAPABILITIES = Capabilities(
    snapshots=True,
    lora=True,
    grammar=True,
    prewarm=True,
    token_latency=True,
    template_override=True,
    draft_model=True,
    why_not={
        "gpu_offload": "this llama.cpp build runs on the CPU only; Hardware and backends "
        "says how to get a GPU build"
    },
)
_CAPABILITIES_GPU = replace(_CAPABILITIES, gpu_offload=True, why_not={})


class Engine:
    """Owns one model and its KV cache; streams replies as events."""

    def __init__(self, guard: NativeGuard | None = None) -> None:
        install_log_route()
        load_backends()  # the CPU variant for this processor, GPU modules: before any model
        # Switches off native paths that crash on this machine (the window's and the
        # server's engines get one on their data folder; see native_guard.default_guard).
        self._guard = guard if guard is not None else default_guard()
        self._llm: Any = None
        self._info: ModelInfo | None = None
        self._template: ChatTemplate | None = None
        self._inputs = TemplateInputs()  # what the loaded model's templates are made from
        self._backend: HardwareInfo | None = None
        self._config: LoadConfig | None = None
        # Tokens whose keys/values are in KV sequence 0, and the text they encode.
        self._map = ContextMap()
        self._n_swa = 0
        self._stop = threading.Event()
        self._abort_cb: Any = None
        self._vocab: Vocab | None = None
        self._stop_ids: frozenset[int] = frozenset()  # the template's stop tokens with no text
        self._notes: tuple[str, ...] = ()
        self._guard_notes: tuple[str, ...] = ()  # native paths off on this machine
        self._extra_bufts = True  # the loaded model's; its draft loads the same way
        self._can_shift = False  # llama_memory_can_shift: drops need no re-reading
        # The last request's messages, and its overflow (what the model still sees).
        self._sent: tuple[list[ChatMessage], Overflow] | None = None
        self._one_token: Any = None
        # What the engine puts before the template's text (BOS, if the model wants it).
        self._head: tuple[int, ...] = ()
        self.load_count = 0  # successful loads, so tests can tell a hot swap from a reload
        # LoRA: the loaded adapters and the applied stack; the stack the KV cache was
        # computed under (it goes stale when the two differ).
        self._adapters = AdapterSet()
        self._kv_lora_sig: list[dict[str, Any]] = []
        # Templates built for the loaded model, by choice: the API server swaps between
        # the window's choice and its own per request, so each is built once per load.
        self._built: dict[TemplateOverride, tuple[ChatTemplate, frozenset[int]]] = {}
        # Speculative decoding: the draft model (dropped with the target model), and
        # the measured costs the adaptive draft length weighs, per kind of drafter.
        self._drafter: ModelDrafter | None = None
        self._pool: SharedThreadPool | None = None  # one CPU thread pool for model and draft
        self._draft_info: DraftInfo | None = None
        self._draft_costs: dict[str, DraftCosts] = {}

    # -- model -----------------------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def template(self) -> ChatTemplate | None:
        return self._template

    @property
    def load_notes(self) -> tuple[str, ...]:
        """What the user should know about the last load (a chat template not used)."""
        return self._notes

    @property
    def llama(self) -> Any:
        """The ``llama_cpp.Llama`` object, for benchmarks and tests on the owner thread."""
        return self._llm

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the token ids currently held in the KV cache."""
        return list(self._map.tokens)

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES_GPU if self.hardware().gpu_offload else _CAPABILITIES

    def ping(self) -> str:
        return ""

    def hardware(self) -> HardwareInfo:
        if self._backend is None:
            self._backend = detect_hardware()
        return self._backend

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Load a GGUF model, replacing the current one once the new one is ready.

        The current model keeps working while the new one loads, and stays loaded
        when the load fails or is cancelled.

        Raises:
            ModelFileError: missing, empty, non-GGUF or truncated file.
            ModelLoadError: llama.cpp refused the file.
            LoadCancelled: ``progress`` returned False.
        """
        gguf = read_gguf_info(path)  # a bad file is refused before llama.cpp sees it
        from app.engine.offload import AUTO, resolve

        if config.n_gpu_layers == AUTO:
            config = resolve(config, gguf, self.hardware())
        guarded: tuple[str, ...] = ()
        extra_bufts = True
        if self._guard is not None:
            prepared = self._guard.prepare(gguf.path, config, self.hardware().gpu_offload)
            config, extra_bufts, guarded = prepared.config, prepared.extra_bufts, prepared.notes
        import llama_cpp

        t0 = time.perf_counter()
        llm = open_llama(gguf, config, progress, extra_bufts)
        load_ms = (time.perf_counter() - t0) * 1000
        vocab = Vocab(llm)
        try:
            inputs = TemplateInputs(
                embedded=gguf.chat_template or "",
                arch=gguf.architecture,
                builtin=template_for_architecture(gguf.architecture, vocab.is_special).name,
                bos_token=vocab.text(llm.token_bos()),
                eos_token=vocab.text(llm.token_eos()),
            )
            template = build_template(AUTO_TEMPLATE, inputs, vocab.is_special)
            stop_ids = vocab.stop_tokens(template.stop_strings)
        except BaseException:
            llm.close()
            raise
        self.unload()  # the old model, its adapters and its cache: only now
        self.load_count += 1
        self._built = {AUTO_TEMPLATE: (template, stop_ids)}
        self._llm = llm
        self._vocab = vocab
        self._adapters = AdapterSet(gguf.path)
        self._config = config
        self._template = template
        self._inputs = inputs
        self._stop_ids = stop_ids
        self._guard_notes = guarded
        self._extra_bufts = extra_bufts
        self._notes = (*guarded, *((template.note,) if template.note else ()))
        for note in self._notes:
            log.warning("%s", note)
        self._n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model))
        mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
        self._can_shift = bool(llama_cpp.llama_memory_can_shift(mem))
        self._one_token = (llama_cpp.llama_token * 1)()
        self._head = head_tokens(llm)
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        self._info = ModelInfo(
            path=gguf.path,
            name=gguf.display_name,
            architecture=gguf.architecture,
            n_params=gguf.n_params,
            file_size=gguf.file_size,
            n_ctx=llm.n_ctx(),
            n_ctx_train=llm._model.n_ctx_train(),
            n_threads=config.threads(),
            n_gpu_layers=config.n_gpu_layers,
            template=self._template.label,
            backend=self.hardware().label if config.n_gpu_layers != 0 else "CPU",
            load_ms=load_ms,
            notes=self._notes,
            capabilities=self.capabilities,
            template_inputs=inputs,
            base_model=looks_like_base_model(
                (gguf.name, gguf.path.name), has_template=bool(gguf.chat_template)
            ),
        )
        log.info("loaded %s in %.0f ms (template %s)", gguf.path, load_ms, self._template.label)
        return self._info

    def unload(self) -> None:
        """Free the model, its context and its LoRA adapters."""
        # llama.cpp frees every adapter with its model (llama_model::~llama_model), so the
        # handles are only dropped here: freeing one after the model would be a double free.
        self._adapters = AdapterSet()
        self._kv_lora_sig = []
        self._drop_draft()
        self._draft_costs = {}
        if self._llm is not None:
            self._llm.close()
        self._llm = None
        self._vocab = None
        self._info = None
        self._template = None
        self._inputs = TemplateInputs()
        self._stop_ids = frozenset()
        self._notes = ()
        self._built = {}
        self._map.clear()

    # -- draft model -----------------------------------------------------------------------

    @property
    def draft_info(self) -> DraftInfo | None:
        """The loaded draft model, or None."""
        return self._draft_info

    @property
    def draft_tokens(self) -> list[int]:
        """A copy of the token ids in the draft model's KV cache (for tests)."""
        return self._drafter.cached_tokens if self._drafter is not None else []

    def set_draft(
        self, path: str | Path | None, n_ctx: int = 0, progress: ProgressFn | None = None
    ) -> DraftInfo | None:
        """Load ``path`` as the draft model for speculative decoding; None drops it.

        The draft's vocabulary is compared with the loaded model's before llama.cpp
        sees the file (``app.gguf.vocab_compat.draft_problem``). It runs on this
        thread with its own KV cache of ``n_ctx`` tokens (0: the model's context, at
        most 4096) and the model's thread count. On any error the previous draft
        stays. Loading or unloading the model drops the draft. ``progress`` returning
        False cancels the load, as for ``load`` (a quit does not wait for a draft).

        Raises:
            NoModelLoaded.
            DraftError: the draft cannot draft for this model, cannot be loaded, or its
                load was cancelled.
        """
        llm = self._require()
        if path is None:
            self._drop_draft()
            return None
        from app.gguf.vocab_compat import draft_problem

        assert self._info is not None and self._config is not None
        problem = draft_problem(self._info.path, Path(path))
        if problem:
            raise DraftError(problem)
        size = n_ctx if n_ctx > 0 else min(llm.n_ctx(), 4096)
        config = replace(self._config, n_ctx=size)
        try:
            gguf = read_gguf_info(path)
            if progress is not None and not progress(0.0):  # asked before llama.cpp starts
                raise LoadCancelled("cancelled")
            draft_llm = open_llama(gguf, config, progress, self._extra_bufts)
        except LoadCancelled as exc:
            raise DraftError("Loading the draft model was cancelled.") from exc
        except (ModelFileError, ModelLoadError) as exc:
            raise DraftError(f"The draft model was not loaded: {exc}") from exc
        self._drop_draft()
        self._drafter = ModelDrafter(draft_llm)
        self._pool = share_threads(config.threads(), (llm._ctx.ctx, draft_llm._ctx.ctx))
        # What was learnt about this draft with this model stays while the model does.
        costs = self._draft_costs.setdefault(self._costs_key(gguf.path), DraftCosts())
        costs.read_prior, costs.guess_prior = self._drafter.warm()
        self._draft_info = DraftInfo(
            path=gguf.path, name=gguf.display_name, n_params=gguf.n_params, n_ctx=draft_llm.n_ctx()
        )
        log.info("draft model loaded: %s (n_ctx %d)", gguf.path, draft_llm.n_ctx())
        return self._draft_info

    def _drop_draft(self) -> None:
        if self._pool is not None:  # detached before either context is freed
            self._pool.close()
            self._pool = None
        if self._drafter is not None:
            self._drafter.close()
            log.info("draft model unloaded")
        self._drafter = None
        self._draft_info = None

    @staticmethod
    def _costs_key(draft: Path | None) -> str:
        """Which ``DraftCosts`` a drafter uses: prompt lookup's, or one per draft file."""
        return f"model:{draft}" if draft is not None else "lookup"

    # -- chat template -------------------------------------------------------------------

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Use ``override`` from the next message on; the model and its cache stay.

        A choice that cannot be used gives the automatic template, and ``notes`` of the
        returned ``ModelInfo`` (and ``load_notes``) say why. The next prompt reuses the
        cached tokens up to where its text differs from the cached text.

        Raises:
            NoModelLoaded.
        """
        self._require()
        assert self._vocab is not None
        built = self._built.get(override)
        if built is None:
            template = build_template(override, self._inputs, self._vocab.is_special)
            built = (template, self._vocab.stop_tokens(template.stop_strings))
            if len(self._built) >= 16:  # a custom template edited many times: start over
                self._built = {k: v for k, v in self._built.items() if k == AUTO_TEMPLATE}
            self._built[override] = built
        self._use_template(*built)
        log.info("chat template set: %s", self._template.label if self._template else "")
        assert self._info is not None
        return self._info

    def _use_template(self, template: ChatTemplate, stop_ids: frozenset[int] | None = None) -> None:
        assert self._vocab is not None and self._info is not None
        self._template = template
        self._stop_ids = (
            stop_ids if stop_ids is not None else self._vocab.stop_tokens(template.stop_strings)
        )
        self._notes = (*self._guard_notes, *((template.note,) if template.note else ()))
        for note in self._notes:
            log.warning("%s", note)
        self._info = replace(self._info, template=template.label, notes=self._notes)

    def _render(self, messages: Sequence[ChatMessage]) -> tuple[str, str]:
        """The prompt text, and a note when a chosen template failed and its fallback took
        over (from now on)."""
        assert self._template is not None
        text, fallback = render_or_fall_back(self._template, messages)
        if fallback is None:
            return text, ""
        self._use_template(fallback)
        return text, fallback.note.rstrip(".")

    @property
    def context_text(self) -> str:
        """The text the KV cache holds (the last prompt as rendered, and its reply)."""
        return self._map.text

    def reset(self) -> None:
        """Forget the conversation held in the KV cache (for a new chat)."""
        llm = self._require()
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm._ctx.ctx), True)
        self._map.clear()

    # -- LoRA --------------------------------------------------------------------------

    @property
    def lora_stack(self) -> LoraStack:
        """A copy of the adapter stack applied to the context (empty after every load)."""
        return self._adapters.stack.copy()

    def lora_signature(self) -> list[dict[str, Any]]:
        """The applied stack's ``LoraStack.signature()``."""
        return [dict(s) for s in self._adapters.signature]

    @property
    def lora_stale(self) -> bool:
        """The KV cache holds tokens evaluated under a stack that changes the output differently."""
        return bool(self._map.tokens) and stack_key(self._kv_lora_sig) != stack_key(
            self._adapters.signature
        )

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Apply ``stack`` from the next message on; the model stays loaded.

        Loaded adapters are reused, new ones checked first (``AdapterSet.apply``).
        On any error nothing changes.

        Returns True when the cached conversation is now stale: the next ``generate``
        evaluates it again and says so in ``metrics.cache_note``. Changes that leave the
        output alone (order, a disabled or scale-0 entry) keep the cache.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._adapters.apply(self._require(), stack)
        stale = self.lora_stale
        log.info(
            "LoRA stack applied: %s%s",
            self._adapters.stack.summary() or "none",
            " (cache stale)" * stale,
        )
        return stale

    def adapter_info(self, path: str | Path) -> AdapterInfo:
        """Read ``path`` and check it against the loaded model, without loading it.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        return self._adapters.check(path)

    @property
    def loaded_adapters(self) -> int:
        """How many adapters llama.cpp holds for this model (applied or idle)."""
        return len(self._adapters)

    def last_logits(self) -> Any:
        """A numpy copy of the logits of the last evaluated token (for tests and benches)."""
        llm = self._require()
        import llama_cpp
        import numpy as np

        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        if not row:
            raise LamplightError("There are no logits yet: nothing has been evaluated.")
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()

    def _check_head(self) -> str:
        """Empty a cache that does not start with ``_head`` (BOS); returns the note to show.

        Older versions dropped BOS with the first message when the context was full, and
        saved such caches in snapshots: every later reply would be read without it.
        """
        head = list(self._head)
        if not head or not self._map.tokens or self._map.tokens[: len(head)] == head:
            return ""
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._llm._ctx.ctx), True)
        self._map.clear()
        log.info("cache rebuilt: %s", HEAD_LOST_NOTE)
        return HEAD_LOST_NOTE

    def _sync_lora(self) -> str:
        """Empty a cache evaluated under another stack; returns the note to show, if any."""
        if not self.lora_stale:
            return ""
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._llm._ctx.ctx), True)
        self._map.clear()
        self._kv_lora_sig = self._adapters.signature
        log.info("cache rebuilt: %s", LORA_CHANGED_NOTE)
        return LORA_CHANGED_NOTE

    # -- KV state ------------------------------------------------------------------

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved KV state depends on."""
        self._require()
        assert self._config is not None
        return {
            "n_ctx": self._llm.n_ctx(),
            "kv_type": self._config.kv_type,
            # Flash attention stores V untransposed: a state from one does not fit the other.
            "flash_attn": self._config.flash_attn or self._config.kv_type != "f16",
            "swa_full": True,
            "n_swa": self._n_swa,
            # The adapters the cached tokens were evaluated with (SessionCache moves this
            # to the snapshot header's own ``lora`` field).
            "lora": [
                dict(s)
                for s in (self._kv_lora_sig if self._map.tokens else self._adapters.signature)
            ],
        }

    def state_size(self) -> int:
        """Bytes llama.cpp needs to serialize KV sequence 0."""
        import llama_cpp

        return int(llama_cpp.llama_state_seq_get_size(self._require()._ctx.ctx, 0))

    def export_state(self, key: str = "") -> KvState:
        """Copy KV sequence 0 out of llama.cpp (no logits: it scales with the cache)."""
        return KvState(
            state=read_sequence(self._require()._ctx.ctx),
            tokens=list(self._map.tokens),
            text=self._map.text,
            marks=list(self._map.marks),
        )

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure the cache is left empty.

        Raises:
            LamplightError: llama.cpp rejected the state, or it does not cover ``kv.tokens``.
        """
        import llama_cpp

        ctx = self._require()._ctx.ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        self._map.clear()
        if not kv.tokens:
            return
        write_sequence(ctx, kv.state, len(kv.tokens), self._n_swa)
        # Sorted, each once: files from versions whose drops doubled a mark hold repeats.
        self._map = ContextMap(list(kv.tokens), kv.text, sorted(set(kv.marks)) or [(0, 0)])
        # The caller (SessionCache) applied the stack the state was saved under.
        self._kv_lora_sig = self._adapters.signature

    # -- tokens ------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids for prompt text: special tokens parsed, BOS added if the model wants it."""
        llm = self._require()
        return list(llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=True))

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation rendered by the chat template and tokenized."""
        assert self._template is not None
        return self.tokenize(self._template.render(messages, True))

    # -- generation ----------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the assistant's reply to ``messages``.

        Yields ``PrefillProgress`` while the prompt is read, ``Token`` for each
        piece of text, and one ``Finished`` last. Setting ``stop`` ends the
        stream promptly with ``stop_reason == "cancelled"``, during prompt
        evaluation too. The KV cache keeps the conversation, so the next call
        evaluates only tokens that are new.

        Raises:
            NoModelLoaded, ContextOverflowError, DecodeError, ChatTemplateError (the
            model's own template failed on ``messages``, or rendered nothing).
        """
        import llama_cpp

        llm = self._require()
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        assert self._template is not None
        # A bad grammar fails before any work.
        build_sampler(llm, params, 0, self._map.tokens, check_only=True)
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        lora_note = self._sync_lora() or self._check_head()
        text, template_note = self._render(messages)
        n_mark, c_mark = self._map.match(text)
        prompt, bounds = self._prompt(messages, text, n_mark, c_mark)
        if not prompt:  # llama.cpp aborts the process on an empty batch
            raise ChatTemplateError(
                "The chat template rendered an empty prompt: there is nothing to send to the "
                "model. Edit the conversation, or start a new chat."
            )
        n_ctx = llm.n_ctx()
        overflow = self._overflow(messages, params.overflow, stop)
        budget = reply_budget(params.max_tokens, n_ctx)
        for _ in range(3):  # a drop is measured per message; re-measure the whole prompt
            if params.overflow == "stop" or len(prompt) + budget <= n_ctx:
                break
            self._map.keep_marks(n_mark)
            if not overflow.drop(len(prompt) + budget - n_ctx, keep_last=1):
                break
            text = self._template.render(overflow.messages, True)
            n_mark, c_mark = self._map.match(text)
            prompt, bounds = self._prompt(overflow.messages, text, n_mark, c_mark)
        if len(prompt) >= n_ctx:
            raise ContextOverflowError(len(prompt) + 1, n_ctx)
        self._sent = (list(messages), overflow)

        self._map.keep_marks(n_mark)
        keep = common_prefix(self._map.tokens, prompt)
        if keep == len(prompt):
            keep -= 1  # the last prompt token must be evaluated to get its logits
        note = self._rewind(keep)
        keep = len(self._map.tokens)
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt),
            cached_tokens=keep,
            n_ctx=n_ctx,
            seed=seed,
            cache_note=lora_note or note,
            turn_offset=min(n_mark, keep),
        )
        if template_note:
            metrics.notes.append(template_note)

        t_prefill = time.perf_counter()
        yield from self._prefill(prompt[keep:], stop)
        metrics.evaluated_tokens = len(self._map.tokens) - keep
        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
        self._record_drops(overflow, metrics)
        if len(self._map.tokens) < len(prompt):
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics)
            return
        for n_tokens, n_chars in bounds:
            self._map.mark_at(n_tokens, n_chars)
        self._map.mark(text)

        def make_room() -> bool:
            if params.overflow == "stop":
                return False
            before = len(self._map.tokens)
            if not overflow.drop(budget, keep_last=1):
                return False
            # No boundaries to cut at (a template that folds the system prompt into the
            # first user turn): the kept text is read again, then the reply so far.
            if len(self._map.tokens) >= before and not self._reread_reply(overflow, stop):
                return False
            self._record_drops(overflow, metrics)
            return True

        yield from self._decode(params, seed, metrics, t0, stop, make_room)

    def _prompt(
        self, messages: Sequence[ChatMessage], text: str, n_mark: int, c_mark: int
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """The prompt's tokens: the cached ones up to the mark, then the rest of ``text``.

        The rest is tokenized message by message, and the boundaries come back
        as ``(n_tokens, n_chars)`` marks, so a later context overflow can drop
        whole messages from the cache.
        """
        assert self._template is not None
        starts = message_starts(self._template.render, messages, text, after=c_mark)
        cuts = sorted(c for c in starts.values() if c_mark < c < len(text))
        tokens = self._map.tokens[:n_mark]
        bounds = []
        pos = c_mark
        for cut in [*cuts, len(text)]:
            tokens += self._tokenize(text[pos:cut], bos=not tokens)
            if cut < len(text):
                bounds.append((len(tokens), cut))
            pos = cut
        return tokens, bounds

    def _reread_reply(self, overflow: Overflow, stop: threading.Event) -> bool:
        """Read ``overflow.messages`` again from the last mark they share with the cache,
        then the reply so far (its marks kept); False when there is no room or it stopped."""
        assert self._template is not None
        cmap = self._map
        old = cmap.text  # the prompt's text: the reply's is added when it ends
        n_end = cmap.char_mark(len(old))
        if n_end is None:
            return False
        reply = cmap.tokens[n_end:]
        reply_marks = [(n - n_end, c - len(old)) for n, c in cmap.marks if n > n_end]
        text = self._template.render(overflow.messages, True)
        n_mark, c_mark = cmap.match(text)
        prompt, bounds = self._prompt(overflow.messages, text, n_mark, c_mark)
        if len(prompt) + len(reply) >= self._llm.n_ctx():
            return False
        self._rewind(n_mark)  # may empty the cache: then all of the prompt is read
        start = len(cmap.tokens)
        for _event in self._prefill(prompt[start:], stop):
            pass
        if len(cmap.tokens) < len(prompt):
            return False
        for n_tokens, n_chars in bounds:
            cmap.mark_at(n_tokens, n_chars)
        cmap.mark(text)
        for _event in self._prefill(reply, stop):
            pass
        if len(cmap.tokens) < len(prompt) + len(reply):
            return False
        cmap.marks += [(n + len(prompt), c + len(text)) for n, c in reply_marks]
        overflow.reread_tokens += len(prompt) - start + len(reply)
        return True

    def _overflow(
        self, messages: Sequence[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        import llama_cpp

        assert self._template is not None

        def refill(tokens: list[int]) -> bool:
            for _event in self._prefill(tokens, stop):
                pass
            return not stop.is_set()

        return Overflow(
            render=self._template.render,
            tokenize=lambda t: self._tokenize(t, bos=False),
            cmap=self._map,
            mem=llama_cpp.llama_get_memory(self._llm._ctx.ctx),
            can_shift=self._can_shift,
            refill=refill,
            policy=policy,
            messages=list(messages),
            head=self._head,
        )

    def _record_drops(self, overflow: Overflow, metrics: MessageMetrics) -> None:
        metrics.dropped_from = overflow.dropped_from
        metrics.dropped_count = overflow.dropped_count
        metrics.dropped_tokens = overflow.dropped_tokens
        # Text read again because the cache could not shift is evaluated work too.
        metrics.evaluated_tokens += overflow.reread_tokens - overflow.reread_reported
        overflow.reread_reported = overflow.reread_tokens
        if overflow.noted in metrics.notes:
            metrics.notes.remove(overflow.noted)  # a later drop in the same reply: one note
        overflow.noted = overflow.note()
        if overflow.noted:
            metrics.notes.append(overflow.noted)

    def prewarm(self, messages: Sequence[ChatMessage], reply: str) -> int:
        """Evaluate the template text that opens the user's next turn, ahead of time.

        Called after a reply, while the user reads it: the next message (and a
        resumed conversation) then starts with only the user's own words to
        evaluate. Returns the number of tokens evaluated (0 when the cached
        text does not end where the template continues).
        """
        llm = self._require()
        assert self._template is not None
        if self.lora_stale or self._template.completion:
            # Continue-the-text mode opens no turn: the next text may follow with no space.
            return 0  # the cache belongs to the previous stack; generate will rebuild it
        sentinel = "\ue000"  # a private-use character no template produces
        if self._sent is not None and self._sent[0] == list(messages):
            messages = self._sent[1].messages  # what the model still sees after an overflow
        history = [*messages, ChatMessage("assistant", reply), ChatMessage("user", sentinel)]
        rendered = self._template.render(history, False)
        cut = rendered.find(sentinel)
        cached = self._map.text
        if cut <= len(cached) or not rendered.startswith(cached):
            return 0
        head = rendered[:cut]
        marks = self._map.marks
        if not marks or marks[-1][0] != len(self._map.tokens):
            return 0  # the cached tokens end mid-character: no safe boundary to extend
        # The next message starts where the reply's turn ends: a mark there lets a
        # context overflow drop whole turns later.
        try:
            turn = self._template.render([*messages, ChatMessage("assistant", reply)], False)
        except ChatTemplateError:
            turn = ""
        turn_end = len(turn) if turn and rendered.startswith(turn) else -1
        split = turn_end if len(cached) < turn_end < len(head) else len(cached)
        first = self._tokenize(head[len(cached) : split], bos=False)
        tokens = first + self._tokenize(head[split:], bos=False)
        if not tokens or len(self._map.tokens) + len(tokens) + 1 >= llm.n_ctx():
            return 0
        stop = threading.Event()
        done = 0
        for event in self._prefill(tokens, stop):
            done = event.done
        if done != len(tokens):
            return 0
        if first and split > len(cached):
            self._map.mark_at(len(self._map.tokens) - len(tokens) + len(first), split)
        self._map.mark(head)
        return done

    def _tokenize(self, text: str, bos: bool) -> list[int]:
        if not text:
            return []
        data = text.encode("utf-8", "replace")
        return list(self._llm.tokenize(data, add_bos=bos, special=True))

    def _prefill(self, tokens: Sequence[int], stop: threading.Event) -> Iterator[PrefillProgress]:
        """Evaluate ``tokens`` in batches with the abort callback armed."""
        import llama_cpp

        if not tokens:  # llama.cpp aborts the process on an empty batch
            return
        ctx = self._llm._ctx.ctx
        n_batch = self._llm.n_batch
        self._stop = stop
        if not self._map.tokens:
            # An empty cache fills under the applied stack.
            self._kv_lora_sig = self._adapters.signature
        llama_cpp.llama_set_abort_callback(ctx, self._abort_cb, None)
        try:
            for start in range(0, len(tokens), n_batch):
                if stop.is_set():
                    return
                chunk = tokens[start : start + n_batch]
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
                if rc == 2 or (rc != 0 and stop.is_set()):
                    # Aborted: some ubatches may be in memory; drop what we cannot vouch for.
                    self._rewind(len(self._map.tokens))
                    return
                if rc != 0:
                    self._rewind(len(self._map.tokens))
                    raise DecodeError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
                self._map.tokens.extend(chunk)
                yield PrefillProgress(start + len(chunk), len(tokens))
        finally:
            # Off during decoding: llama.cpp calls it for every graph node, which
            # would cost a Python call per node per token.
            llama_cpp.llama_set_abort_callback(ctx, llama_cpp.ggml_abort_callback(), None)

    def _decode(
        self,
        params: SamplingParams,
        seed: int,
        metrics: MessageMetrics,
        t0: float,
        stop: threading.Event,
        make_room: Callable[[], bool],
    ) -> Generator[EngineEvent, None, None]:
        """The reply's events once the prompt is in the cache (see ``decode.decode``)."""
        assert self._template is not None and self._vocab is not None
        flash = self._config is not None and (
            self._config.flash_attn or self._config.kv_type != "f16"
        )
        drafter: Drafter | None = None
        if params.draft_model and self._drafter is not None:
            drafter = self._drafter
        elif params.speculative:
            drafter = NgramDrafter()
        if params.draft_model and self._drafter is None:
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
        length = None
        if drafter is not None:
            draft = self._draft_info.path if self._draft_info and drafter.kind == "model" else None
            costs = self._draft_costs.setdefault(self._costs_key(draft), DraftCosts())
            length = DraftLength(
                params.draft_len,
                params.adaptive_draft,
                costs,
                reads_prompt=drafter.kind == "model",
            )
        return decode(
            self._llm,
            self._map,
            params,
            seed,
            metrics,
            t0,
            stop,
            template_stops=self._template.stop_strings,
            drafter=drafter,
            length=length,
            one=self._one_token,
            token_bytes=self._vocab.piece,
            rewind=self._rewind,
            stop_ids=self._stop_ids | self._vocab.stop_tokens(params.stop),
            make_room=make_room,
        )

    # -- internals -----------------------------------------------------------------

    def _should_abort(self, _data: Any) -> bool:
        return self._stop.is_set()

    def _rewind(self, n: int) -> str:
        """Keep only the first ``n`` tokens in the KV cache.

        Returns a note when the cache had to be emptied instead: llama.cpp
        refused the partial removal, or a sliding-window layer no longer holds
        the window that position ``n`` attends to (restored snapshots keep only
        the last window). Then the whole prompt is evaluated again.
        """
        import llama_cpp

        mem = llama_cpp.llama_get_memory(self._llm._ctx.ctx)
        note = ""
        # Checked before the removal: afterwards the window's cells may all be gone.
        pos_min = llama_cpp.llama_memory_seq_pos_min(mem, 0)
        if n > 0 and self._n_swa > 0 and pos_min > max(0, n - self._n_swa):
            note = (
                f"the sliding-window cache starts at token {pos_min}, "
                f"too late to continue from token {n}"
            )
        elif n < len(self._map.tokens) and not llama_cpp.llama_memory_seq_rm(mem, 0, n, -1):
            note = "llama.cpp could not rewind the cache"
        if note:
            log.info("cache rebuilt: %s", note)
            llama_cpp.llama_memory_clear(mem, True)
            self._map.clear()
        else:
            self._map.truncate(n)
        return note

    def _require(self) -> Any:
        if self._llm is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        return self._llm


def head_tokens(llm: Any) -> tuple[int, ...]:
    """The tokens llama.cpp puts before a prompt's text (BOS, when the model wants one)."""
    probe = b"a"
    with_head = list(llm.tokenize(probe, add_bos=True, special=True))
    bare = list(llm.tokenize(probe, add_bos=False, special=True))
    for i in range(len(with_head) - len(bare) + 1):
        if with_head[i : i + len(bare)] == bare:
            return tuple(with_head[:i])
    return ()


def share_threads(n_threads: int, contexts: tuple[Any, ...]) -> SharedThreadPool | None:
    """One ggml thread pool for ``contexts`` (the model's and its draft's), or None.

    Without OpenMP each context brings its own pool, whose threads poll for a while
    after their work and steal cores from the other model's; with OpenMP (this
    wheel) both already run on the calling thread's libgomp team and the shared pool
    changes nothing measurable (``app/engine/threadpool.py``, ``bench/threadpool.py``).
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
