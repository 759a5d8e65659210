"""The inference engine: one ``llama_cpp.Llama``, streamed generation, prefix reuse.

The engine is not thread-safe. One thread (the UI's worker thread, or a test)
owns it and makes every call; other threads may only set the stop ``Event``
they passed to :meth:`Engine.generate`.

llama-cpp-python's ``Llama`` loads the model, context and vocabulary; the
generation loop itself calls llama.cpp directly (``llama_decode`` on a
one-token batch, the native sampler chain) so no per-token copy of the
262k-entry logits row is made in Python.

``Engine`` is the only entry point, a facade over members made for each loaded model:
``LoadedModel`` (the model, its vocabulary, adapters, projector and tokenizer),
``TemplateState`` (the chat template and the request's binding), ``KvSequence`` (KV
sequence 0 and what it holds) and a ``PromptDriver`` (rendering and fitting the prompt,
opening the next turn) over them (``local.prompt``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    ModelInfo,
    Opening,
    ProgressFn,
)
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.local import opening as local_opening
from app.engine.local.draft.slot import DraftSlot, open_draft
from app.engine.local.kv_sequence import KvSequence
from app.engine.local.loaded_model import LoadedModel, prepare
from app.engine.local.loader import open_llama
from app.engine.local.model_template import auto_template
from app.engine.local.prompt import LocalCache, LocalTemplates, room_maker
from app.engine.local.prompt_count import count_prompt
from app.engine.local.prompt_tokenizer import NO_PROJECTOR, NOT_SEEN
from app.engine.local.reply_decode import decode_reply
from app.engine.local.sampler import build_sampler
from app.engine.local.template_state import TemplateState
from app.engine.local.vision import ImageSeq, check_projector, open_projector
from app.engine.local.vocab import Vocab
from app.engine.metrics import MessageMetrics
from app.engine.native.guard import NativeGuard, default_guard
from app.engine.native.handles import Native
from app.engine.native.hardware import HardwareInfo, detect_hardware
from app.engine.native.libs import load_backends
from app.engine.native.llama_log import install_log_route
from app.engine.prompt.driver import PromptDriver
from app.engine.prompt.pipeline import PromptRequest, record_drops
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import TemplateOverride
from app.engine.templates.thinking import ThinkingControl, thinking_control
from app.engine.tool_spec import ToolRequest
from app.gguf.info import read_gguf_info
from app.gguf.lora import AdapterInfo, LoraStack
from app.util.errors import ImageError, NoModelLoaded

log = logging.getLogger(__name__)

NO_MODEL = "No model is loaded. Open a model first."

_CAPABILITIES = Capabilities(
    snapshots=True,
    lora=True,
    grammar=True,
    prewarm=True,
    token_latency=True,
    template_override=True,
    draft_model=True,
    prefix=True,
    thinking_control=True,
    tools=True,
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
        self._backend: HardwareInfo | None = None
        self.load_count = 0  # successful loads, so tests can tell a hot swap from a reload
        # The loaded model and its parts (all None, or all set, together).
        self._loaded: LoadedModel | None = None
        self._chat: TemplateState | None = None
        self._kv: KvSequence | None = None
        self._prompt: PromptDriver | None = None
        self._info: ModelInfo | None = None
        # Speculative decoding: the draft model (dropped with the target model), and
        # the measured costs the adaptive draft length weighs, per kind of drafter.
        self._draft = DraftSlot()

    def _require(self) -> LoadedModel:
        if self._loaded is None:
            raise NoModelLoaded(NO_MODEL)
        return self._loaded

    def _parts(self) -> tuple[LoadedModel, TemplateState, KvSequence, PromptDriver]:
        """The loaded model and its members.

        Raises:
            NoModelLoaded.
        """
        model = self._require()
        assert self._chat is not None and self._kv is not None and self._prompt is not None
        return model, self._chat, self._kv, self._prompt

    # -- model -----------------------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def template(self) -> ChatTemplate | None:
        return self._chat.template if self._chat is not None else None

    @property
    def load_notes(self) -> tuple[str, ...]:
        """What the user should know about the last load (a chat template not used)."""
        return self._chat.notes if self._chat is not None else ()

    @property
    def llama(self) -> Any:
        """The ``llama_cpp.Llama`` object, for benchmarks and tests on the owner thread."""
        return self._loaded.llm if self._loaded is not None else None

    @property
    def native(self) -> Native:
        """The loaded model's native handles (``app.engine.native.handles``), on the owner thread.

        Raises:
            NoModelLoaded.
        """
        return self._require().native

    @property
    def capabilities(self) -> Capabilities:
        caps = _CAPABILITIES_GPU if self.hardware().gpu_offload else _CAPABILITIES
        loaded = self._loaded
        if loaded is None:
            return caps
        mtp_why = {"mtp": self._draft.mtp_why} if self._draft.mtp_why else {}
        return replace(
            caps,
            vision=loaded.projector is not None,
            memory=loaded.memory,
            mtp=self._draft.mtp is not None,
            why_not=caps.why_not | mtp_why,
        )

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
        config, extra_bufts, guarded = prepare(gguf, config, self._guard, self.hardware)
        fits = check_projector(config, gguf)  # before llama.cpp reads either file
        t0 = time.perf_counter()
        llm = open_llama(gguf, config, progress, extra_bufts)
        load_ms = (time.perf_counter() - t0) * 1000
        vocab = Vocab(llm)
        try:
            inputs, template, stop_ids = auto_template(gguf, llm, vocab)
            projector = open_projector(config, llm, fits)
        except BaseException:
            llm.close()
            raise
        self.unload()  # the old model, its adapters and its cache: only now
        self.load_count += 1
        model = self._loaded = LoadedModel(llm, vocab, gguf.path, config, extra_bufts, projector)
        tokenize = model.tokenizer.tokenize
        chat = self._chat = TemplateState(
            inputs, (template, stop_ids), vocab, lambda t: tokenize(t, False), guarded
        )
        self._kv = KvSequence(model)
        self._draft.open_mtp(model.native, gguf.mtp_layers, config.threads())
        templates = LocalTemplates(chat, self._use_template)
        self._prompt = PromptDriver(templates, LocalCache(model, self._kv))
        backend = self.hardware().label if config.n_gpu_layers != 0 else "CPU"
        self._info = model.describe(gguf, chat, load_ms, backend, self.capabilities)
        log.info("loaded %s in %.0f ms (template %s)", gguf.path, load_ms, template.label)
        return self._info

    def unload(self) -> None:
        """Free the model, its context and its LoRA adapters."""
        self._draft.drop()  # its thread pool is detached before either context is freed
        self._draft.close_mtp(self._loaded.native if self._loaded is not None else None)
        self._draft.costs.clear()  # what was measured held for that model only
        loaded, self._loaded = self._loaded, None
        self._chat = self._kv = self._prompt = None
        self._info = None
        if loaded is not None:
            loaded.close()

    # -- draft model -----------------------------------------------------------------------

    @property
    def draft_info(self) -> DraftInfo | None:
        """The loaded draft model, or None."""
        return self._draft.info

    @property
    def draft_tokens(self) -> list[int]:
        """A copy of the token ids in the draft model's KV cache (for tests)."""
        return self._draft.tokens

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
        model = self._require()
        if path is None:
            self._draft.drop()
            return None
        size = n_ctx if n_ctx > 0 else min(model.llm.n_ctx(), 4096)
        config = replace(model.config, n_ctx=size)
        draft_llm, info = open_draft(model.path, Path(path), config, progress, model.extra_bufts)
        self._draft.attach(draft_llm, info.path, info, model.native, config.threads())
        return info

    # -- chat template -------------------------------------------------------------------

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Use ``override`` from the next message on; the model and its cache stay.

        A choice that cannot be used gives the automatic template, and ``notes`` of the
        returned ``ModelInfo`` (and ``load_notes``) say why. The next prompt reuses the
        cached tokens up to where its text differs from the cached text.

        Raises:
            NoModelLoaded.
        """
        _model, chat, _kv, _prompt = self._parts()
        self._use_template(*chat.build(override))
        log.info("chat template set: %s", chat.template.label)
        assert self._info is not None
        return self._info

    def _use_template(self, template: ChatTemplate, stop_ids: frozenset[int] | None = None) -> None:
        """Render with ``template`` from now on, and say so in ``model``."""
        _model, chat, _kv, _prompt = self._parts()
        assert self._info is not None
        chat.use(template, stop_ids)
        self._info = replace(
            self._info,
            template=template.label,
            notes=chat.notes,
            reasoning=template.reasoning,
            tool_format=chat.tool_format(template).label,
        )

    # -- LoRA ------------------------------------------------------------------------------

    @property
    def lora_stack(self) -> LoraStack:
        """A copy of the adapter stack applied to the context (empty after every load)."""
        return self._loaded.adapters.stack.copy() if self._loaded is not None else LoraStack()

    def lora_signature(self) -> list[dict[str, Any]]:
        """The applied stack's ``LoraStack.signature()``."""
        signature = self._loaded.adapters.signature if self._loaded is not None else []
        return [dict(s) for s in signature]

    @property
    def lora_stale(self) -> bool:
        """The KV cache holds tokens evaluated under a stack that changes the output differently."""
        return self._kv is not None and self._kv.lora_stale

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
        model, _chat, kv, _prompt = self._parts()
        model.adapters.apply(model.llm, stack)
        stale = kv.lora_stale
        log.info(
            "LoRA stack applied: %s%s",
            model.adapters.stack.summary() or "none",
            " (cache stale)" * stale,
        )
        return stale

    def adapter_info(self, path: str | Path) -> AdapterInfo:
        """Read ``path`` and check it against the loaded model, without loading it.

        Raises:
            NoModelLoaded, LoraError.
        """
        return self._require().adapters.check(path)

    @property
    def loaded_adapters(self) -> int:
        """How many adapters llama.cpp holds for this model (applied or idle)."""
        return len(self._loaded.adapters) if self._loaded is not None else 0

    # -- KV cache --------------------------------------------------------------------------

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the token ids currently held in the KV cache."""
        return list(self._kv.map.tokens) if self._kv is not None else []

    @property
    def context_text(self) -> str:
        """The text the KV cache holds (the last prompt as rendered, and its reply)."""
        return self._kv.map.text if self._kv is not None else ""

    def reset(self) -> None:
        """Forget the conversation held in the KV cache (for a new chat)."""
        self._parts()[2].clear()

    def last_logits(self) -> Any:
        """A numpy copy of the logits of the last evaluated token (for tests and benches)."""
        return self._require().last_logits()

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved KV state depends on."""
        return self._parts()[2].cache_config()

    def state_size(self) -> int:
        """Bytes llama.cpp needs to serialize KV sequence 0."""
        return self._require().native.state_size()

    def export_state(self, key: str = "") -> KvState:
        """Copy KV sequence 0 out of llama.cpp (no logits: it scales with the cache)."""
        return self._parts()[2].export_state()

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure the cache is left empty.

        Raises:
            LamplightError: llama.cpp rejected the state, or it does not cover ``kv.tokens``.
        """
        self._parts()[2].import_state(kv)

    # -- tokens ------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids for prompt text: special tokens parsed, BOS added if the model wants it."""
        llm = self._require().llm
        return list(llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=True))

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in a prompt (special tokens parsed, no BOS)."""
        llm = self._require().llm
        return len(llm.tokenize(text.encode("utf-8", "replace"), add_bos=False, special=True))

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation rendered by the chat template and tokenized."""
        model, chat, _kv, _prompt = self._parts()
        model.tokenizer.use_images(messages)
        return model.tokenizer.tokenize(chat.template.render(messages, True), bos=True)

    def count_prompt(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> int:
        """Tokens the prompt for ``messages`` takes (``prompt_count.count_prompt``)."""
        model, chat, _kv, _prompt = self._parts()
        return count_prompt(model, chat, messages, params, tools)

    def use_images(self, messages: Sequence[ChatMessage]) -> None:
        """The images the next renders of ``messages`` may show (by digest).

        Raises:
            ImageError: there are images and this model sees none.
        """
        if self._loaded is not None:
            self._loaded.tokenizer.use_images(messages)
        elif any(m.images for m in messages):
            raise ImageError(NOT_SEEN)

    def image_seq(self, image: ImagePart) -> ImageSeq:
        """``image`` tokenized by the projector (cached).

        Raises:
            ImageError.
        """
        if self._loaded is None:
            raise ImageError(NO_PROJECTOR)
        return self._loaded.tokenizer.image_seq(image)

    def image_tokens(self, image: ImagePart) -> int:
        """Context tokens ``image`` takes (its embeddings and the tokens around them)."""
        return len(self._require().tokenizer.image_seq(image).tokens)

    # -- generation ----------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
        end_thinking: threading.Event | None = None,
        tools: ToolRequest | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the assistant's reply to ``messages``.

        Yields ``PrefillProgress`` while the prompt is read, ``Token`` for each
        piece of text, and one ``Finished`` last. Setting ``stop`` ends the
        stream promptly with ``stop_reason == "cancelled"``, during prompt
        evaluation too. Thinking streams apart (``Token.reasoning``); setting
        ``end_thinking`` closes the block at once. ``tools``: what the model may call
        (see ``tool_binding``; calls end the reply, in ``Finished.tool_calls``). The KV
        cache keeps the conversation, so the next call evaluates only new tokens.

        Raises:
            NoModelLoaded, ContextOverflowError, DecodeError, ChatTemplateError (the
            model's own template failed on ``messages``, or rendered nothing).
        """
        model, chat, kv, prompter = self._parts()
        stop, t0 = stop or threading.Event(), time.perf_counter()
        model.tokenizer.use_images(messages)
        # A bad grammar fails before any work.
        build_sampler(model.llm, params, 0, kv.map.tokens, check_only=True)
        model.native.perf_reset()
        lora_note = kv.sync_lora() or kv.check_head()
        chat.start(params, tools)
        request = PromptRequest(messages, params, model.llm.n_ctx())
        prepared = prompter.prepare(request, stop)
        prompt, overflow = prepared.prompt, prepared.overflow
        keep, note = kv.reuse(prompt.tokens)
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt.tokens),
            cached_tokens=keep,
            n_ctx=request.n_ctx,
            seed=seed,
            cache_note=lora_note or note,
            turn_offset=min(prompt.n_mark, keep),
        )
        if prepared.rendered.note:
            metrics.notes.append(prepared.rendered.note)

        t_prefill = time.perf_counter()
        yield from kv.prefill(prompt.tokens[keep:], stop)
        metrics.evaluated_tokens = len(kv.map.tokens) - keep
        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
        record_drops(overflow, metrics)
        if len(kv.map.tokens) < len(prompt.tokens):
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics)
            return
        kv.mark_prompt(prompt)

        make_room = room_maker(prompter, kv, request, overflow, metrics, stop)
        native = chat.native_reply(tools, prompt.text, params, end_thinking)
        think: ThinkingControl | None
        if native is not None:  # llama.cpp rendered the prompt: its parser reads the reply
            think, calls = native
        else:
            reasoning = chat.rendering.reasoning
            think = thinking_control(reasoning, prompt.text, params, end_thinking, chat.markers)
            calls = chat.calls(tools, prompt.text)
        parts = (model, chat, kv, self._draft)
        yield from decode_reply(parts, params, seed, metrics, t0, stop, make_room, think, calls)

    def opening(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Opening | None:
        return local_opening.opening(self._parts(), messages, params, tools)

    def warm_opening(self, opening: Opening, stop: threading.Event | None = None) -> int:
        return local_opening.warm_opening(self._parts(), opening, stop)

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        """Make the cache hold the history as the template will render it, and the
        template text that opens the user's next turn, ahead of time.

        Called after a reply, while the user reads it: the next message (and a
        resumed conversation) then starts with only the user's own words to
        evaluate. Where the template renders the reply otherwise than it was
        generated (past thinking dropped, whitespace trimmed), the cache is rewound to
        the last text they share and the rest evaluated again. Returns the number of
        tokens evaluated (0 when there was nothing to do, or it could not be done).
        """
        model, chat, kv, prompter = self._parts()
        if kv.lora_stale or chat.rendering.completion:
            # Continue-the-text mode opens no turn: the next text may follow with no space.
            return 0  # the cache belongs to the previous stack; generate will rebuild it
        model.tokenizer.use_images(messages)
        # After an overflow the model still sees fewer messages than were sent (``seen``).
        return prompter.prewarm(messages, reply, model.llm.n_ctx())
