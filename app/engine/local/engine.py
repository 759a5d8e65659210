"""The inference engine: one ``llama_cpp.Llama``, streamed generation, prefix reuse.

The engine is not thread-safe. One thread (the UI's worker thread, or a test)
owns it and makes every call; other threads may only set the stop ``Event``
they passed to :meth:`Engine.generate`.

llama-cpp-python's ``Llama`` loads the model, context and vocabulary; the
generation loop itself calls llama.cpp directly (``llama_decode`` on a
one-token batch, the native sampler chain) so no per-token copy of the
262k-entry logits row is made in Python.

``Engine`` is the only entry point. The modules beside it hold its parts:
``loader`` (opening a model), ``native`` (the binding's native handles),
``engine_cache`` (the KV cache side, Engine's base), ``prompt_pipeline`` (the
prompt's steps, shared with llama-server), ``draft_slot`` (the draft model),
``vocab`` (token text), ``adapters`` (LoRA handles), ``kv_state`` (KV
serialization), ``sampler`` (the native sampler chain), ``decode`` (the decode
loops) and ``llama_log`` (llama.cpp's log).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.config.params import LoadConfig, SamplingParams
from app.engine.backend import (
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    ModelInfo,
    ProgressFn,
)
from app.engine.chat_message import ChatMessage
from app.engine.context_map import common_prefix
from app.engine.local.adapters import AdapterSet
from app.engine.local.decode import DecodeJob, decode
from app.engine.local.draft.slot import DraftSlot, open_draft
from app.engine.local.engine_cache import EngineCache
from app.engine.local.loader import open_llama
from app.engine.local.model_template import auto_template, head_tokens
from app.engine.local.sampler import build_sampler
from app.engine.local.vision import check_projector, open_projector
from app.engine.local.vocab import Vocab
from app.engine.metrics import MessageMetrics
from app.engine.native.guard import NativeGuard, default_guard
from app.engine.native.handles import Native
from app.engine.native.hardware import HardwareInfo, detect_hardware
from app.engine.native.libs import load_backends
from app.engine.native.llama_log import install_log_route
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import (
    Prompt,
    PromptPipeline,
    PromptRequest,
    record_drops,
    render,
)
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import AUTO as AUTO_TEMPLATE
from app.engine.templates.override import (
    TemplateInputs,
    TemplateOverride,
    build_template,
    looks_like_base_model,
)
from app.engine.templates.thinking import (
    ThinkingControl,
    marker_ids,
    request_template,
    thinking_control,
)
from app.engine.tool_spec import ToolRequest
from app.engine.tools.binding import ToolDecoding, bind_tools, tool_decoding
from app.engine.tools.format import ToolFormat, detect_tool_format
from app.gguf.info import GgufInfo, read_gguf_info

log = logging.getLogger(__name__)


_CAPABILITIES = Capabilities(
    snapshots=True,
    lora=True,
    grammar=True,
    prewarm=True,
    token_latency=True,
    template_override=True,
    draft_model=True,
    thinking_control=True,
    tools=True,
    why_not={
        "gpu_offload": "this llama.cpp build runs on the CPU only; Hardware and backends "
        "says how to get a GPU build"
    },
)
_CAPABILITIES_GPU = replace(_CAPABILITIES, gpu_offload=True, why_not={})


class Engine(EngineCache):
    """Owns one model and its KV cache; streams replies as events."""

    def __init__(self, guard: NativeGuard | None = None) -> None:
        super().__init__()
        install_log_route()
        load_backends()  # the CPU variant for this processor, GPU modules: before any model
        # Switches off native paths that crash on this machine (the window's and the
        # server's engines get one on their data folder; see native_guard.default_guard).
        self._guard = guard if guard is not None else default_guard()
        self._info: ModelInfo | None = None
        self._template: ChatTemplate | None = None
        self._inputs = TemplateInputs()  # what the loaded model's templates are made from
        self._backend: HardwareInfo | None = None
        self._vocab: Vocab | None = None
        self._stop_ids: frozenset[int] = frozenset()  # the template's stop tokens with no text
        self._notes: tuple[str, ...] = ()
        self._guard_notes: tuple[str, ...] = ()  # native paths off on this machine
        self._extra_bufts = True  # the loaded model's; its draft loads the same way
        self._can_shift = False  # llama_memory_can_shift: drops need no re-reading
        # The last request's messages, and its overflow (what the model still sees).
        self._sent: tuple[list[ChatMessage], Overflow] | None = None
        # The template with the last request's thinking switches bound (``request_template``):
        # every render for that request, and the next turn's prewarm, use it.
        self._bound: ChatTemplate | None = None
        self._markers: frozenset[int] = frozenset()
        self._tools: ToolRequest | None = None  # the last request's tools (bound in ``_bound``)
        self.load_count = 0  # successful loads, so tests can tell a hot swap from a reload
        # Templates built for the loaded model, by choice: the API server swaps between
        # the window's choice and its own per request, so each is built once per load.
        self._built: dict[TemplateOverride, tuple[ChatTemplate, frozenset[int]]] = {}
        # Speculative decoding: the draft model (dropped with the target model), and
        # the measured costs the adaptive draft length weighs, per kind of drafter.
        self._draft = DraftSlot()

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
    def capabilities(self) -> Capabilities:
        caps = _CAPABILITIES_GPU if self.hardware().gpu_offload else _CAPABILITIES
        return replace(caps, vision=True) if self._projector is not None else caps

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
        config, extra_bufts, guarded = self._prepare(gguf, config)
        import llama_cpp

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
        self._projector = projector
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
        native = self._native = Native(llm)
        self._n_swa = native.n_swa()
        self._can_shift = native.can_shift()
        self._head = head_tokens(llm)
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        self._info = ModelInfo(
            path=gguf.path,
            name=gguf.display_name,
            architecture=gguf.architecture,
            n_params=gguf.n_params,
            file_size=gguf.file_size,
            n_ctx=llm.n_ctx(),
            n_ctx_train=native.n_ctx_train(),
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
            reasoning=template.reasoning,
            tool_format=self._tool_format(template).family,
            projector=projector.path.name if projector is not None else "",
        )
        self._bound = None
        self._markers = marker_ids(template.reasoning, lambda t: self._tokenize(t, bos=False))
        log.info("loaded %s in %.0f ms (template %s)", gguf.path, load_ms, self._template.label)
        return self._info

    def _prepare(
        self, gguf: GgufInfo, config: LoadConfig
    ) -> tuple[LoadConfig, bool, tuple[str, ...]]:
        """``config`` with auto offload resolved and the native guard's changes; whether
        extra buffer types are safe; the guard's notes."""
        from app.engine.local.offload import AUTO, resolve

        if config.n_gpu_layers == AUTO:
            config = resolve(config, gguf, self.hardware())
        if self._guard is None:
            return config, True, ()
        prepared = self._guard.prepare(gguf.path, config, self.hardware().gpu_offload)
        return prepared.config, prepared.extra_bufts, prepared.notes

    def unload(self) -> None:
        """Free the model, its context and its LoRA adapters."""
        # llama.cpp frees every adapter with its model (llama_model::~llama_model), so the
        # handles are only dropped here: freeing one after the model would be a double free.
        self._adapters = AdapterSet()
        self._kv_lora_sig = []
        self._draft.drop()
        self._draft.costs = {}
        if self._projector is not None:  # before its model
            self._projector.close()
            self._projector = None
        if self._llm is not None:
            self._llm.close()
        self._llm = None
        self._native = None
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
        llm = self._require()
        if path is None:
            self._draft.drop()
            return None
        assert self._info is not None and self._config is not None
        size = n_ctx if n_ctx > 0 else min(llm.n_ctx(), 4096)
        config = replace(self._config, n_ctx=size)
        draft_llm, info = open_draft(
            self._info.path, Path(path), config, progress, self._extra_bufts
        )
        self._draft.attach(draft_llm, info.path, info, self.native, config.threads())
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
        self._bound = None
        self._markers = marker_ids(template.reasoning, lambda t: self._tokenize(t, bos=False))
        self._stop_ids = (
            stop_ids if stop_ids is not None else self._vocab.stop_tokens(template.stop_strings)
        )
        self._notes = (*self._guard_notes, *((template.note,) if template.note else ()))
        for note in self._notes:
            log.warning("%s", note)
        self._info = replace(
            self._info,
            template=template.label,
            notes=self._notes,
            reasoning=template.reasoning,
            tool_format=self._tool_format(template).family,
        )

    # -- tokens ------------------------------------------------------------------

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation rendered by the chat template and tokenized."""
        assert self._template is not None
        self.use_images(messages)
        return self._tokenize(self._template.render(messages, True), bos=True)

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
        llm, stop, t0 = self._require(), stop or threading.Event(), time.perf_counter()
        self.use_images(messages)
        # A bad grammar fails before any work.
        build_sampler(llm, params, 0, self._map.tokens, check_only=True)
        self.native.perf_reset()
        lora_note = self._sync_lora() or self._check_head()
        assert self._template is not None
        self._tools = tools
        self._bound = self._bind(self._template, params)
        request = PromptRequest(messages, params, llm.n_ctx())
        prompt, overflow, template_note = self._fit(request, stop)
        keep = common_prefix(self._map.tokens, prompt.tokens)
        if keep == len(prompt.tokens):
            keep -= 1  # the last prompt token must be evaluated to get its logits
        note = self._rewind(keep)
        keep = len(self._map.tokens)
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt.tokens),
            cached_tokens=keep,
            n_ctx=request.n_ctx,
            seed=seed,
            cache_note=lora_note or note,
            turn_offset=min(prompt.n_mark, keep),
        )
        if template_note:
            metrics.notes.append(template_note)

        t_prefill = time.perf_counter()
        yield from self._prefill(prompt.tokens[keep:], stop)
        metrics.evaluated_tokens = len(self._map.tokens) - keep
        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
        record_drops(overflow, metrics)
        if len(self._map.tokens) < len(prompt.tokens):
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics)
            return
        for n_tokens, n_chars in prompt.bounds:
            self._map.mark_at(n_tokens, n_chars)
        self._map.mark(prompt.text)

        def make_room() -> bool:
            if params.overflow == "stop":
                return False
            before = len(self._map.tokens)
            if not overflow.drop(request.budget, keep_last=1):
                return False
            # No boundaries to cut at (a template that folds the system prompt into the
            # first user turn): the kept text is read again, then the reply so far.
            if len(self._map.tokens) >= before and not self._reread_reply(overflow, stop):
                return False
            record_drops(overflow, metrics)
            return True

        reasoning = self._rendering().reasoning
        think = thinking_control(reasoning, prompt.text, params, end_thinking, self._markers)
        calls = self._calls(tools, prompt.text)
        yield from self._decode(params, seed, metrics, t0, stop, make_room, think, calls)

    def _calls(self, tools: ToolRequest | None, prompt: str) -> ToolDecoding | None:
        """The reply's tool parser and grammar (none when continuing text: no tools shown)."""
        template = self._rendering()
        if template.completion:
            return None
        return tool_decoding(self._tool_format(template), tools, template.reasoning, prompt)

    def _bind(self, template: ChatTemplate, params: SamplingParams) -> ChatTemplate:
        """``template`` with the request's thinking switches and tools bound."""
        return bind_tools(request_template(template, params), self._tools, self._tool_format)

    def _tool_format(self, template: ChatTemplate) -> ToolFormat:
        """How ``template``'s model writes tool calls (the generic form when it knows none)."""
        has = self._vocab.is_special if self._vocab is not None else (lambda _t: False)
        return detect_tool_format(template.source, has)

    def _rendering(self) -> ChatTemplate:
        """The template renders use: the last request's, switches bound."""
        assert self._template is not None
        return self._bound or self._template

    def _pipeline(self) -> PromptPipeline:
        """The prompt pipeline over this model's template, tokenizer and cache map."""
        return PromptPipeline(self._rendering(), self._tokenize, self._map, self._least_tokens)

    def _fit(self, request: PromptRequest, stop: threading.Event) -> tuple[Prompt, Overflow, str]:
        """The request's prompt, fitted to the context (older turns dropped, if the policy
        drops), its overflow, and a note when the template's fallback took over.

        Raises:
            ContextOverflowError, ChatTemplateError.
        """
        rendered = render(self._rendering(), request.messages)
        if rendered.fallback is not None:
            self._use_template(rendered.fallback)
            self._bound = self._bind(rendered.fallback, request.params)
        overflow = self._overflow(request.messages, request.params.overflow, stop)
        prompt = self._pipeline().fitted(request, rendered.text, overflow)
        self._sent = (list(request.messages), overflow)
        return prompt, overflow, rendered.note

    def _reread_reply(self, overflow: Overflow, stop: threading.Event) -> bool:
        """Read ``overflow.messages`` again from the last mark they share with the cache,
        then the reply so far (its marks kept); False when there is no room or it stopped."""
        cmap = self._map
        old = cmap.text  # the prompt's text: the reply's is added when it ends
        n_end = cmap.char_mark(len(old))
        if n_end is None:
            return False
        reply = cmap.tokens[n_end:]
        reply_marks = [(n - n_end, c - len(old)) for n, c in cmap.marks if n > n_end]
        prompt = self._pipeline().build(overflow.messages)
        if len(prompt.tokens) + len(reply) >= self._llm.n_ctx():
            return False
        self._rewind(prompt.n_mark)  # may empty the cache: then all of the prompt is read
        start = len(cmap.tokens)
        for _event in self._prefill(prompt.tokens[start:], stop):
            pass
        if len(cmap.tokens) < len(prompt.tokens):
            return False
        for n_tokens, n_chars in prompt.bounds:
            cmap.mark_at(n_tokens, n_chars)
        cmap.mark(prompt.text)
        for _event in self._prefill(reply, stop):
            pass
        if len(cmap.tokens) < len(prompt.tokens) + len(reply):
            return False
        cmap.marks += [(n + len(prompt.tokens), c + len(prompt.text)) for n, c in reply_marks]
        overflow.reread_tokens += len(prompt.tokens) - start + len(reply)
        return True

    def _overflow(
        self, messages: Sequence[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        def refill(tokens: list[int]) -> bool:
            for _event in self._prefill(tokens, stop):
                pass
            return not stop.is_set()

        return Overflow(
            render=self._rendering().render,
            tokenize=lambda t: self._tokenize(t, bos=False),
            cmap=self._map,
            mem=self.native.memory,
            can_shift=self._can_shift,
            refill=refill,
            policy=policy,
            messages=list(messages),
            head=self._head,
        )

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
        llm = self._require()
        template = self._rendering()
        if self.lora_stale or template.completion:
            # Continue-the-text mode opens no turn: the next text may follow with no space.
            return 0  # the cache belongs to the previous stack; generate will rebuild it
        self.use_images(messages)
        if self._sent is not None and self._sent[0] == list(messages):
            messages = self._sent[1].messages  # what the model still sees after an overflow
        turn = self._pipeline().next_turn(messages, reply)
        if turn is None:
            return 0
        head, (n_keep, c_keep), split = turn.head, turn.keep, turn.split
        first = self._tokenize(head[c_keep:split], bos=False)
        tokens = first + self._tokenize(head[split:], bos=False)
        if not tokens or n_keep + len(tokens) + 1 >= llm.n_ctx():
            return 0
        if self._rewind(n_keep):
            return 0  # the cache was emptied: the next message reads it all anyway
        stop = threading.Event()
        done = 0
        for event in self._prefill(tokens, stop):
            done = event.done
        if done != len(tokens):
            return 0
        if first and split > c_keep:
            self._map.mark_at(len(self._map.tokens) - len(tokens) + len(first), split)
        self._map.mark(head)
        return done

    def _decode(
        self,
        params: SamplingParams,
        seed: int,
        metrics: MessageMetrics,
        t0: float,
        stop: threading.Event,
        make_room: Callable[[], bool],
        thinking: ThinkingControl | None = None,
        tools: ToolDecoding | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """The reply's events once the prompt is in the cache (see ``decode.decode``)."""
        assert self._template is not None and self._vocab is not None
        flash = self._config is not None and (
            self._config.flash_attn or self._config.kv_type != "f16"
        )
        drafter, length = self._draft.choose(params, flash, metrics)
        # A draft model reads no images; drafts at explicit positions miss M-RoPE's.
        mrope = self._projector is not None and self._projector.mrope
        if drafter is not None and self._images and (drafter.kind == "model" or mrope):
            metrics.notes.append("drafting is off in a conversation with images")
            drafter = length = None
        job = DecodeJob(
            native=self.native,
            cmap=self._map,
            params=params,
            seed=seed,
            metrics=metrics,
            t0=t0,
            stop=stop,
            token_bytes=self._vocab.piece,
            rewind=self._rewind,
            template_stops=self._template.stop_strings,
            stop_ids=self._stop_ids | self._vocab.stop_tokens(params.stop),
            drafter=drafter,
            length=length,
            make_room=make_room,
            thinking=thinking,
            tools=tools,
            tokenize=lambda text: self._tokenize(text, bos=False),
        )
        return decode(job)
