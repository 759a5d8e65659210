"""llama.cpp's ``llama-server`` as a ``Backend``: the same chat, cache and snapshots, remotely.

Lamplight renders the prompt itself (the same templates and sandbox as
in-process) and sends it to ``/completion`` as token ids, so the server's slot
holds exactly the tokens this client tracks in its ``ContextMap``: generated
tokens are never re-tokenized, and a restored snapshot continues without
re-reading. The server matches the prompt against its slot (``cache_prompt``)
and evaluates only what is new; a request that would discard most of the slot, or
after ``reset`` (which erases it: another party asks), reuses nothing of it
(``Slot.reuses``), so no party is ever shown another's tokens as cached.

The KV cache is in the server's slot ``Connection.slot``: what it holds, its
snapshots (files in the server's ``--slot-save-path``) and its LoRA scales (of the
adapters the server loaded, ``--lora``) are the ``Slot``'s (``llama_server.slot``).
How the server's model remembers is read from its file when the server is on this
machine (``model_info.server_memory``): a hybrid or recurrent model's context
checkpoints stay in the server's memory, and its slot files hold none.

A context overflow follows the in-process policies: whole turns are dropped
before sending (measured with ``/tokenize``); the server re-reads what follows
them, since it cannot shift a slot on request. A reply that fills the context
drops turns and continues in a new request.

The server is not trusted to stop: a reply is cut on this side at ``n_predict``
(+ ``TOKEN_SLACK``) tokens, at ``reply_byte_cap`` bytes and at its time bounds
(``app.remote.http.Limits``), and every field of every answer is type-checked.
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

from app.config.params import grammar_for
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    SERVER_ERROR,
    TIME_LIMIT,
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    ModelInfo,
    Opening,
    ProgressFn,
)
from app.engine.chat_format.schema import schema_grammar
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.metrics import MessageMetrics
from app.engine.native.hardware import HardwareInfo
from app.engine.prompt.driver import PromptDriver
from app.engine.prompt.overflow import Overflow, reply_budget
from app.engine.prompt.pipeline import Prompt, PromptRequest, record_drops
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import TemplateOverride
from app.engine.templates.thinking import thinking_control
from app.engine.tool_spec import ToolRequest
from app.engine.tools.native_reply import native_reply
from app.gguf.lora import LoraStack
from app.remote.connection import Connection
from app.remote.http import (
    DEFAULT_LIMITS,
    Limits,
    ServerError,
    ServerSilent,
    ServerUnreachable,
    call,
    cannot_connect,
    end_early,
    end_lost,
    sentence,
    where,
)
from app.remote.llama_server.completion import stream_completion
from app.remote.llama_server.images import ServerImages
from app.remote.llama_server.model_info import (
    DRAFT_WHY_NOT,
    capabilities,
    model_info,
    server_memory,
)
from app.remote.llama_server.prompt import ServerTemplates, SlotCache
from app.remote.llama_server.slot import Slot
from app.remote.llama_server.think import ServerThinking
from app.remote.llama_server.tokenizer import ServerTokenizer
from app.remote.llama_server.tools import ServerTools
from app.remote.llama_server.wire import (
    check_props,
    parse_adapters,
    sampling_fields,
    template_inputs,
    wait_ready,
)
from app.remote.server_link import ON_SERVER, ServerLink, refuse_draft, require
from app.util.errors import LamplightError, ModelLoadError

log = logging.getLogger(__name__)

MAX_CONTINUATIONS = 8  # a reply that fills the context this many times ends there


class LlamaServerBackend:
    """A ``Backend`` that drives one slot of a llama-server. Its parts: the connection
    (``ServerLink``), the slot (``Slot``: what it holds, its LoRA and snapshots), the
    server's tokenizer, the images sent, the template in use (``ServerTemplates``) and
    the prompt driver over them (``PromptDriver``, with the slot as its ``SlotCache``)."""

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self._link = ServerLink(connection, api_key, limits)
        self._info: ModelInfo | None = None
        self._memory = ""  # how the server's model remembers ("" not known: server_memory)
        self._media = ServerImages(self._link.call)
        self._tokenizer = ServerTokenizer(self._link.call, self._media, self._n_ctx)
        self._slot = Slot(self._link)
        self._templates = ServerTemplates(self._tokenizer)
        self._cache = SlotCache(self._tokenizer, self._slot, self._link)
        self._prompt = PromptDriver(self._templates, self._cache)
        self._tools = ServerTools(None, self._tokenizer.has_token)  # the last request's

    @property
    def connection(self) -> Connection:
        return self._link.connection

    def _n_ctx(self) -> int:
        return self._info.n_ctx if self._info else 0

    def _require(self) -> ModelInfo:
        return require(self._info, self._link)

    # -- connection and model ----------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    def hardware(self) -> HardwareInfo:
        return ON_SERVER

    @property
    def draft_info(self) -> DraftInfo | None:
        return None  # a draft the server was started with is the server's business

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Only "no draft" is accepted: this app cannot load a model on a server.

        Raises:
            DraftError.
        """
        return refuse_draft(path, DRAFT_WHY_NOT)

    @property
    def capabilities(self) -> Capabilities:
        url, adapters = self.connection.url, bool(self._slot.adapters)
        return capabilities(url, adapters, self._media, self._memory)

    def ping(self) -> str:
        def probe(client: Any) -> str:
            health = call(client, "GET", "/health", timeout=5.0)
            if isinstance(health, dict) and health.get("status") == "ok":
                return ""
            return f"The server at {where(self.connection.url)} is not ready."

        return self._link.ping(probe)

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Connect: wait for the server's model, read its settings, template and adapters.

        ``path`` is ignored (a llama-server serves one model); ``config`` too: the
        context size and threads are the server's command line. Every wait is bounded
        (``Limits``); the model in use stays until the new one is ready.

        Raises:
            ModelLoadError: the server cannot be reached, is not a llama-server, or was
                not ready in time.
            LoadCancelled: ``progress`` returned False while waiting.
        """
        t0 = time.perf_counter()
        conn = self.connection
        client, streams = self._link.open()
        try:
            wait_ready(client, conn, self._link.limits, progress)
            call_s = self._link.limits.call_s
            props = call(client, "GET", "/props", timeout=call_s)
            models = call(client, "GET", "/v1/models", timeout=call_s)
            adapters = call(client, "GET", "/lora-adapters", timeout=call_s)
            n_ctx = check_props(props, conn)
        except BaseException as exc:
            client.close()
            streams.close()
            if isinstance(exc, ServerUnreachable | ServerError):
                raise ModelLoadError(cannot_connect(conn, exc)) from None
            raise
        self._link.use(client, streams)
        self._tokenizer.reset()
        self._slot.connect(props, parse_adapters(adapters))
        inputs = template_inputs(props, self._tokenizer.has_token)
        self._media.reset(props, inputs.bos_token)
        template = self._templates.connect(inputs)
        self._memory = server_memory(conn.url, props)
        info = model_info(props, models, n_ctx, conn, template, inputs, t0)
        self._info = replace(
            info,
            capabilities=self.capabilities,
            adapters=tuple(a["path"] for a in self._slot.adapters),
            tool_format=self._tools.format(template).label,
        )
        log.info("connected to llama-server %s (%s, n_ctx %d)", where(conn.url), info.name, n_ctx)
        return self._info

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Render prompts with ``override`` from the next message on (this app renders them).

        Raises:
            NoModelLoaded.
        """
        self._require()
        return self._describe(self._templates.choose(override))

    def _describe(self, template: ChatTemplate) -> ModelInfo:
        """The model's info once ``template`` is the one in use."""
        assert self._info is not None
        notes = (template.note,) if template.note else ()
        self._info = replace(
            self._info,
            template=template.label,
            notes=notes,
            reasoning=template.reasoning,
            tool_format=self._tools.format(template).label,
        )
        return self._info

    def unload(self) -> None:
        self._link.close()
        self._slot.disconnect()
        self._info = None
        self._memory = ""
        self._templates.clear()
        self._prompt.forget()

    def reset(self) -> None:
        """Forget the conversation here and on the server (the slot is erased)."""
        self._slot.map.clear()
        self._prompt.forget()
        if self._info is not None:
            self._slot.erase()

    # -- what the slot holds: images, LoRA, snapshots -------------------------------

    def image_tokens(self, image: ImagePart) -> int:
        """The server's count of ``image``'s tokens, 0 when it cannot say (ImageError
        when it takes no images)."""
        return self._tokenizer.image_tokens(image)

    def count_tokens(self, text: str) -> int:
        """The server's count of ``text``'s tokens (``/tokenize``)."""
        return len(self._tokenizer.tokenize(text))

    @property
    def adapters(self) -> list[dict[str, Any]]:
        """The adapters the server loaded: ``id``, ``path``, ``name``."""
        return self._slot.adapters

    @property
    def lora_stack(self) -> LoraStack:
        return self._slot.lora_stack

    def lora_signature(self) -> list[dict[str, Any]]:
        return self._slot.lora_signature()

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Use ``stack`` from the next request on; every entry must be a server adapter.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        return self._slot.set_lora_stack(stack)

    def cache_config(self) -> dict[str, Any]:
        return self._slot.cache_config(self._require().n_ctx)

    def export_state(self, key: str = "") -> KvState:
        """The slot saved as this conversation's file (``Slot.export_state``).

        Raises:
            NoModelLoaded, LamplightError.
        """
        self._require()
        return self._slot.export_state(key)

    def import_state(self, kv: KvState) -> None:
        """The conversation's file restored into the slot (``Slot.import_state``).

        Raises:
            NoModelLoaded, LamplightError.
        """
        self._slot.import_state(kv, self._require().n_ctx)

    # -- generation --------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
        end_thinking: threading.Event | None = None,
        tools: ToolRequest | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the reply from the server (see ``Backend.generate``); ``tools`` are
        rendered, constrained and parsed as in-process (``llama_server_tools``).

        Once text has come, nothing ends the reply without it: a connection that drops
        (``connection_lost``), a server error (``server_error``), silence or the reply's
        time bound (``time_limit``), text past ``reply_byte_cap`` (``size_limit``) or
        tokens past ``n_predict`` (``max_tokens``) end it with the text so far and a note.
        A template that marks thinking streams it apart; its block is ended here at the
        budget or on ``end_thinking`` (``llama_server_think``).

        Raises:
            NoModelLoaded, ChatTemplateError, SettingError, ContextOverflowError,
            ApiKeyRefused, DecodeError, ServerUnreachable (also silence before any text).
        """
        self._tools = ServerTools(tools, self._tokenizer.has_token)
        yield from self._tools.parse(self._generate(messages, params, stop, end_thinking))

    def _generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None,
        end_thinking: threading.Event | None,
    ) -> Generator[EngineEvent, None, None]:
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        grammar = grammar_for(params, schema_grammar)  # a bad schema fails before any request
        prompt, overflow, metrics, think = self._start(messages, params, stop, end_thinking)
        self._tools.start(self._templates.rendering, prompt.text, grammar)
        parts: list[str] = []  # the text streamed, markers and the text this side wrote
        bounds = self._link.limits.budget(params.max_tokens)
        shown = 0  # bytes of reply text so far
        for _ in range(MAX_CONTINUATIONS):
            try:
                body = self._body(prompt, params, grammar, metrics, think)
                room = bounds.max_bytes - shown
                ended = yield from stream_completion(
                    self._link, self._slot, body, prompt, metrics, t0, stop, bounds, room, think
                )
                parts.append(ended.text)
                shown += len(ended.text.encode("utf-8"))
                more = metrics.generated_tokens < params.max_tokens
                why = think.due_after(metrics) if think is not None and more else ""
                if why and think is not None:  # the block ends here; the answer follows
                    tokens, closing = think.close(why, metrics)
                    yield from tokens
                    parts.append(closing)
                    prompt = self._cache.go_on(prompt, ended.text, closing)
                    continue
                if metrics.stop_reason != "context_full" or not more:
                    break
                # The reply filled the context: drop older turns, then go on in a new
                # request whose prompt ends with the reply so far.
                room = reply_budget(params.max_tokens, metrics.n_ctx)
                if params.overflow == "stop" or not overflow.drop(room, keep_last=1):
                    break
                base = self._prompt.build(overflow.messages)
                self._slot.map.keep_marks(base.n_mark)
                reply = "".join(parts)
                ids = base.tokens + self._tokenizer.tokenize(reply)
                prompt = replace(base, tokens=ids, text=base.text + reply)
            except LamplightError as exc:
                if not shown:
                    raise
                # A continuation failed: what the earlier requests sent is kept.
                if isinstance(exc, ServerSilent):
                    end_early(metrics, TIME_LIMIT, str(exc))
                elif isinstance(exc, ServerUnreachable):
                    end_lost(metrics, str(exc))
                else:
                    end_early(metrics, SERVER_ERROR, sentence(str(exc)))
                break
        if overflow.dropped_count:
            record_drops(overflow, metrics)
        if think is None:
            yield Finished("".join(parts), metrics)
            return
        yield from think.flush()
        yield Finished("".join(think.answer), metrics, "".join(think.thoughts).strip())

    def _start(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event,
        end_thinking: threading.Event | None,
    ) -> tuple[Prompt, Overflow, MessageMetrics, ServerThinking | None]:
        """A reply's first prompt, its overflow, its metrics and its thinking (None when
        the template marks none); the template's switches are bound for the request."""
        info = self._require()
        self._media.remember(messages)
        self._templates.start(params, self._tools)
        request = PromptRequest(messages, params, info.n_ctx)
        rendered = self._prompt.render(request)
        if rendered.fallback is not None:  # the chosen template failed on this conversation
            self._describe(self._templates.template)
        lora_note = self._slot.sync_lora()
        prepared = self._prompt.fit(request, rendered, stop)
        prompt, overflow = prepared.prompt, prepared.overflow
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt.tokens),
            n_ctx=request.n_ctx,
            seed=seed,
            cache_note=lora_note,
            turn_offset=prompt.n_mark,
        )
        if rendered.note:
            metrics.notes.append(rendered.note)
        reasoning = prepared.template.reasoning
        control = thinking_control(reasoning, prompt.text, params, end_thinking)
        native = native_reply(
            prepared.template, self._tools.tools, prompt.text, params, end_thinking
        )
        self._tools.native = native
        if native is not None:  # llama.cpp rendered the prompt: its parser reads the reply
            control = native.thinking
        return prompt, overflow, metrics, ServerThinking(control) if control else None

    def _body(
        self,
        prompt: Prompt,
        params: SamplingParams,
        grammar: str,
        metrics: MessageMetrics,
        think: ServerThinking | None,
    ) -> dict[str, Any]:
        left = params.max_tokens - metrics.generated_tokens
        # The context's end is this client's to handle (drop turns, go on).
        n_predict = max(1, min(left, metrics.n_ctx - len(prompt.tokens)))
        body: dict[str, Any] = {
            "prompt": self._media.prompt(prompt.tokens, prompt.text),
            "stream": True,
            "return_progress": True,
            "cache_prompt": self._slot.reuses(prompt.tokens) > 0,
            "id_slot": self.connection.slot,
            "n_predict": think.n_predict(n_predict, metrics) if think else n_predict,
            "n_keep": 0,
            **sampling_fields(params, metrics.seed or 0),
            "stop": [
                s
                for s in (*params.stop, *self._templates.stop_strings(), *self._tools.stops())
                if s
            ],
            "lora": self._slot.lora_body(),
        }
        if preserved := self._tools.preserved():
            body["preserved_tokens"] = list(preserved)
        return body | self._tools.grammar_fields(grammar)

    def opening(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Opening | None:
        return None  # a project's opening is kept in-process only (``capabilities.prefix``)

    def warm_opening(self, opening: Opening, stop: threading.Event | None = None) -> int:
        return 0

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        """Have the server hold the history as the template renders it with ``reply``
        (past thinking dropped, say) and the next turn's opening (``n_predict`` 0): the
        slot is kept up to the last text they share, and the rest evaluated."""
        info = self._require()
        try:
            return self._prompt.prewarm(messages, reply, info.n_ctx)
        except ChatTemplateError:
            return 0
