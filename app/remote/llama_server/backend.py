"""llama.cpp's ``llama-server`` as a ``Backend``: the same chat, cache and snapshots, remotely.

Lamplight renders the prompt itself (the same templates and sandbox as
in-process) and sends it to ``/completion`` as token ids, so the server's slot
holds exactly the tokens this client tracks in its ``ContextMap``: generated
tokens are never re-tokenized, and a restored snapshot continues without
re-reading. The server matches the prompt against its slot (``cache_prompt``)
and evaluates only what is new; a request that would discard most of the slot, or
after ``reset`` (which erases it: another party asks), reuses nothing of it
(``SlotState.reuses``), so no party is ever shown another's tokens as cached.

What lives where:

- the KV cache is in the server's slot ``Connection.slot``; snapshots are files
  in the server's ``--slot-save-path`` (a ring of ``SLOT_FILES`` per connection
  and slot, each conversation keeping its own while it is among the most recently
  saved), and the Lamplight snapshot on this machine keeps the compatibility
  header, the tokens and the text, and names the server file;
- LoRA adapters are the ones the server loaded at start (``--lora``); every
  request sends every adapter with an explicit scale (llama.cpp issue #28674).

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
from pathlib import Path, PurePosixPath
from typing import Any

from app.config.params import LoadConfig, SamplingParams, grammar_for
from app.engine.backend import (
    SERVER_ERROR,
    TIME_LIMIT,
    Capabilities,
    EngineEvent,
    Finished,
    ModelInfo,
    ProgressFn,
)
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap, common_prefix
from app.engine.metrics import MessageMetrics
from app.engine.prompt.overflow import Overflow, reply_budget
from app.engine.prompt.pipeline import (
    Prompt,
    PromptPipeline,
    PromptRequest,
    record_drops,
    render,
)
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import (
    AUTO,
    TemplateInputs,
    TemplateOverride,
    build_template,
    looks_like_base_model,
)
from app.engine.templates.thinking import request_template, thinking_control
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraStack
from app.remote.connection import Connection
from app.remote.http import (
    DEFAULT_LIMITS,
    TOKEN_SLACK,
    Budget,
    EventStream,
    Limits,
    ServerError,
    ServerSilent,
    ServerUnreachable,
    call,
    cannot_connect,
    end_early,
    end_lost,
    sentence,
    unfinished,
    where,
)
from app.remote.llama_server.images import ServerImages
from app.remote.llama_server.slot import SlotState
from app.remote.llama_server.think import ServerThinking, show_tokens
from app.remote.llama_server.tools import ServerTools
from app.remote.llama_server.wire import (
    ReplyText,
    check_props,
    cut_short,
    events,
    generation_error,
    int_or,
    model_meta,
    parse_adapters,
    progress_of,
    sampling_fields,
    stop_reason,
    template_inputs,
    text_of,
    token_ids,
    wait_ready,
)
from app.util.errors import LamplightError, ModelLoadError, ServerOverflowError

log = logging.getLogger(__name__)

MAX_CONTINUATIONS = 8  # a reply that fills the context this many times ends there
DRAFT_WHY_NOT = (
    "a draft model runs with the in-process engine only; llama-server drafts with the "
    "model given on its own command line (--model-draft FILE), if any"
)


class LlamaServerBackend(SlotState):
    """A ``Backend`` that drives one slot of a llama-server."""

    draft_why_not = DRAFT_WHY_NOT

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        super().__init__(connection, api_key, limits)
        self._props: dict[str, Any] = {}
        self._template: ChatTemplate | None = None
        self._bound: ChatTemplate | None = None  # the last request's, switches bound
        self._inputs = TemplateInputs()
        self._adapters: list[dict[str, Any]] = []  # the server's: id, path, name
        self._sent: tuple[list[ChatMessage], list[ChatMessage]] | None = None
        self._tools = ServerTools(None, self._has_token)  # the last request's
        self._media = ServerImages(self._call)

    # -- connection and model ----------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        why = {
            "token_latency": "the times between tokens are measured as they arrive over the "
            "network; the server's own decode rate is shown beside them",
            "gpu_offload": f"the model runs on the server at {where(self.connection.url)}; "
            "its GPU settings are the server's command line",
            "draft_model": DRAFT_WHY_NOT,
        }
        if not self._adapters:
            why["lora"] = (
                "the server loaded no LoRA adapters; start llama-server with --lora FILE "
                "(and --lora-init-without-apply) to stack them here"
            )
        return Capabilities(
            snapshots=True,
            lora=bool(self._adapters),
            grammar=True,
            prewarm=True,
            template_override=True,
            thinking_control=True,
            tools=True,
            vision=self._media.vision,
            why_not=why | self._media.why_not(),
        )

    def ping(self) -> str:
        def probe(client: Any) -> str:
            health = call(client, "GET", "/health", timeout=5.0)
            if isinstance(health, dict) and health.get("status") == "ok":
                return ""
            return f"The server at {where(self.connection.url)} is not ready."

        return self._ping(probe)

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
        client, streams = self._open_clients()
        try:
            wait_ready(client, self.connection, self._limits, progress)
            call_s = self._limits.call_s
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
        self._use_clients(client, streams)
        self._props = props
        self._special = {}
        self._adapters = parse_adapters(adapters)
        self._stack = LoraStack()
        self._kv_lora = ()
        self._map.clear()
        self._files.clear()
        self._restored = ""
        self._inputs = template_inputs(props, self._has_token)
        self._media.reset(props, self._inputs.bos_token)
        template = build_template(AUTO, self._inputs, self._has_token)
        self._template, self._bound = template, None
        self._info = self._model_info(props, models, n_ctx, template, t0)
        name = self._info.name
        log.info("connected to llama-server %s (%s, n_ctx %d)", where(conn.url), name, n_ctx)
        return self._info

    def _model_info(
        self,
        props: dict[str, Any],
        models: Any,
        n_ctx: int,
        template: ChatTemplate,
        t0: float,
    ) -> ModelInfo:
        """What ``/props`` and ``/v1/models`` say of the server's model."""
        conn = self.connection
        meta = model_meta(models)
        model_path = text_of(props.get("model_path"), 1000) or text_of(
            props.get("model_alias"), 1000
        )
        model_path = model_path or "model"
        name = PurePosixPath(model_path.replace("\\", "/")).name or model_path
        build = text_of(props.get("build_info"), 100)
        size = int_or(meta.get("size"), 0)
        n_params = int_or(meta.get("n_params"), 0)
        notes = (template.note,) if template.note else ()
        return ModelInfo(
            path=Path(model_path),
            name=name,
            architecture=(text_of(meta.get("ftype"), 60) or text_of(props.get("model_ftype"), 60)),
            n_params=n_params,
            file_size=size,
            n_ctx=n_ctx,
            n_ctx_train=int_or(meta.get("n_ctx_train"), n_ctx),
            n_threads=0,
            n_gpu_layers=0,
            template=template.label,
            backend=f"llama-server at {where(conn.url)}",
            load_ms=(time.perf_counter() - t0) * 1000,
            notes=notes,
            capabilities=self.capabilities,
            server=conn.url,
            fingerprint=self._fingerprint(
                name, size, [conn.url, model_path, size, n_params, build]
            ),
            runtime={"llama_server": build},
            adapters=tuple(a["path"] for a in self._adapters),
            template_inputs=self._inputs,
            reasoning=template.reasoning,
            tool_format=self._tools.format(template).family,
            base_model=looks_like_base_model(
                (text_of(props.get("model_alias"), 1000), name),
                has_template=bool(self._inputs.embedded),
            ),
        )

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Render prompts with ``override`` from the next message on (this app renders them).

        Raises:
            NoModelLoaded.
        """
        self._require()
        self._use_template(build_template(override, self._inputs, self._has_token))
        assert self._info is not None
        return self._info

    def _use_template(self, template: ChatTemplate) -> None:
        assert self._info is not None
        self._template = template
        self._bound = None
        notes = (template.note,) if template.note else ()
        self._info = replace(
            self._info,
            template=template.label,
            notes=notes,
            reasoning=template.reasoning,
            tool_format=self._tools.format(template).family,
        )

    def _rendering(self) -> ChatTemplate:
        """The template renders use: the last request's, its switches bound."""
        assert self._template is not None
        return self._bound or self._template

    def _pipeline(self) -> PromptPipeline:
        """The prompt pipeline over the template, ``/tokenize`` and the slot's map."""
        return PromptPipeline(self._rendering(), self._tokenize, self._map)

    def _build(self, messages: Sequence[ChatMessage]) -> Prompt:
        """``messages``' prompt; marks past the tokens it reuses are forgotten."""
        prompt = self._pipeline().build(messages)
        self._map.keep_marks(prompt.n_mark)
        return prompt

    def unload(self) -> None:
        self._close_clients()
        self._files.clear()
        self._restored = ""
        self._info = None
        self._template = self._bound = None
        self._inputs = TemplateInputs()
        self._map.clear()
        self._sent = None

    def reset(self) -> None:
        """Forget the conversation here and on the server (the slot is erased)."""
        self._map.clear()
        self._sent = None
        self._erase()

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
        self._tools = ServerTools(tools, self._has_token)
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
        grammar = grammar_for(params)  # a bad schema fails before any request
        prompt, overflow, metrics, think = self._start(messages, params, end_thinking)
        self._tools.start(self._rendering(), prompt.text, grammar)
        parts: list[str] = []  # the text streamed, markers and the text this side wrote
        bounds = self._limits.budget(params.max_tokens)
        shown = 0  # bytes of reply text so far
        for _ in range(MAX_CONTINUATIONS):
            try:
                body = self._body(prompt, params, grammar, metrics, think)
                ended = yield from self._stream(
                    body, prompt, metrics, t0, stop, bounds, bounds.max_bytes - shown, think
                )
                parts.append(ended.text)
                shown += len(ended.text.encode("utf-8"))
                more = metrics.generated_tokens < params.max_tokens
                why = think.due_after(metrics) if think is not None and more else ""
                if why and think is not None:  # the block ends here; the answer follows
                    tokens, closing = think.close(why, metrics)
                    yield from tokens
                    parts.append(closing)
                    prompt = self._go_on(prompt, ended.text, closing)
                    continue
                if metrics.stop_reason != "context_full" or not more:
                    break
                # The reply filled the context: drop older turns, then go on in a new
                # request whose prompt ends with the reply so far.
                room = reply_budget(params.max_tokens, metrics.n_ctx)
                if params.overflow == "stop" or not overflow.drop(room, keep_last=1):
                    break
                base = self._build(overflow.messages)
                reply = "".join(parts)
                prompt = replace(
                    base, tokens=base.tokens + self._tokenize(reply), text=base.text + reply
                )
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
        end_thinking: threading.Event | None,
    ) -> tuple[Prompt, Overflow, MessageMetrics, ServerThinking | None]:
        """A reply's first prompt, its overflow, its metrics and its thinking (None when
        the template marks none); the template's switches are bound for the request."""
        info = self._require()
        assert self._template is not None
        self._media.remember(messages)
        self._bound = self._tools.bind(request_template(self._template, params))
        # A chosen template that fails on this conversation gives way to its fallback here.
        rendered = render(self._bound, messages)
        if rendered.fallback is not None and self._template.fallback is not None:
            self._use_template(self._template.fallback)
            self._bound = rendered.fallback
        lora_note = self._sync_lora()
        request = PromptRequest(messages, params, info.n_ctx)
        prompt, overflow = self._fit(request, rendered.text)
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
        control = thinking_control(self._bound.reasoning, prompt.text, params, end_thinking)
        return prompt, overflow, metrics, ServerThinking(control) if control else None

    def _go_on(self, prompt: Prompt, reply: str, closing: str) -> Prompt:
        """The prompt that continues after ``reply`` (this request's text) and ``closing``:
        the tokens the slot holds (the reply's as sampled) and the closing text's."""
        held = self._map.tokens
        n = len(prompt.tokens)
        if len(held) > n and held[:n] == prompt.tokens:
            tokens = list(held)
        else:  # the server sent no token ids: its text, tokenized
            tokens = prompt.tokens + self._tokenize(reply)
        text = prompt.text + reply + closing
        return replace(prompt, tokens=tokens + self._tokenize(closing), text=text)

    def _fit(self, request: PromptRequest, text: str) -> tuple[Prompt, Overflow]:
        """The request's prompt (``text``, rendered) fitted to the context, whole older
        turns dropped if the policy drops, and its overflow.

        Raises:
            ChatTemplateError, ServerOverflowError, and the errors of ``/tokenize``.
        """
        pipeline = self._pipeline()
        overflow = Overflow(
            render=pipeline.template.render,
            tokenize=self._tokenize,
            cmap=ContextMap(),  # the slot cannot shift on request: the server re-reads
            mem=None,
            can_shift=False,
            refill=lambda _t: True,
            policy=request.params.overflow,
            messages=list(request.messages),
        )
        prompt = pipeline.build(overflow.messages, text)
        self._map.keep_marks(prompt.n_mark)
        prompt = pipeline.fit(request, prompt, overflow)
        if len(prompt.tokens) >= request.n_ctx:
            raise ServerOverflowError(len(prompt.tokens) + 1, request.n_ctx)
        self._sent = (list(request.messages), overflow.messages)
        return prompt, overflow

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
            "cache_prompt": self.reuses(prompt.tokens) > 0,
            "id_slot": self.connection.slot,
            "n_predict": think.n_predict(n_predict, metrics) if think else n_predict,
            "n_keep": 0,
            **sampling_fields(params, metrics.seed or 0),
            "stop": [s for s in (*params.stop, *self._stop_strings()) if s],
            "lora": self._lora_body(),
        }
        return body | self._tools.grammar_fields(grammar)

    def _stop_strings(self) -> tuple[str, ...]:
        return self._template.stop_strings if self._template is not None else ()

    def _stream(
        self,
        body: dict[str, Any],
        prompt: Prompt,
        metrics: MessageMetrics,
        t0: float,
        stop: threading.Event,
        bounds: Budget,
        room: int,
        think: ServerThinking | None = None,
    ) -> Generator[EngineEvent, None, Finished]:
        """One ``/completion`` stream; returns how it ended (``context_full`` at the
        context's end, "" when this side must end the thinking block). Tracks the tokens.

        The stream is cut on this side when the server sends more than ``n_predict``
        (+ ``TOKEN_SLACK``) tokens, more than ``room`` bytes of text, or runs out of
        ``bounds``; an error after the first token ends it with the text so far.
        """
        assert self._streams is not None
        keep = common_prefix(self._map.tokens, prompt.tokens) if body["cache_prompt"] else 0
        text = ReplyText(room, int(body["n_predict"]) + TOKEN_SLACK)
        final: dict[str, Any] = {}
        first_request = not metrics.token_times_ms and not metrics.evaluated_tokens
        t_prefill = time.perf_counter()
        stream = EventStream(self._streams, "/completion", body, stop, bounds)
        prefilled = False
        thought_cut = False  # stopped here to end the thinking block
        metrics.stop_reason = ""
        try:
            for event in events(stream):
                if isinstance(event.get("prompt_progress"), dict):
                    progress = progress_of(event["prompt_progress"])
                    if progress is not None:
                        yield progress
                    continue
                if event.get("stop"):
                    final = event
                    break
                if not prefilled:
                    prefilled = True
                    self._prefilled(prompt)
                    if first_request:
                        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
                piece = event.get("content")
                ids = token_ids(event.get("tokens"))
                text.count(ids, piece)
                shown = text.add(piece) if isinstance(piece, str) else ""
                yield from show_tokens(shown, bool(ids), metrics, t0, think)
                if text.cut or text.n_tokens > text.most:
                    text.cut = text.cut or "max_tokens"
                    break
                thought_cut = think is not None and bool(think.due(metrics))
                if thought_cut:
                    break
        except (ServerUnreachable, ServerError) as exc:
            if isinstance(exc, ServerError) and not text.parts:
                self._map.truncate(keep)
                raise generation_error(exc) from None
            self._after_reply(prompt, text.generated, "".join(text.parts), prefilled, keep)
            if isinstance(exc, ServerError):
                end_early(metrics, SERVER_ERROR, sentence(str(exc)))
            else:
                end_lost(metrics, str(exc))
            return Finished("".join(text.parts), metrics)
        finally:
            stream.close()
        reply = "".join(text.parts)
        ended_here = stream.stopped or stream.timed_out or text.cut
        if final and not ended_here and not prefilled:
            self._prefilled(prompt)
            prefilled = True
        self._after_reply(prompt, text.generated, reply, prefilled, keep)
        if ended_here:
            cut_short(stream, text, metrics, bounds, int(body["n_predict"]))
        elif final:
            self._timings(final, metrics, first_request, keep)
            metrics.stop_reason = stop_reason(final, len(prompt.tokens), metrics.n_ctx)
        elif not thought_cut:
            end_lost(metrics, unfinished(self.connection.url))
        return Finished(reply, metrics)

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        """Have the server hold the history as the template renders it with ``reply``
        (past thinking dropped, say) and the next turn's opening (``n_predict`` 0): the
        slot is kept up to the last text they share, and the rest evaluated."""
        self._require()
        template = self._rendering()
        if template.completion:
            return 0  # continue-the-text mode opens no turn
        if self._sent is not None and self._sent[0] == list(messages):
            messages = self._sent[1]
        try:
            turn = self._pipeline().next_turn(messages, reply)
        except ChatTemplateError:
            return 0
        if turn is None:
            return 0
        head, (n_keep, c_keep), split = turn.head, turn.keep, turn.split
        first = self._tokenize(head[c_keep:split])
        extra = first + self._tokenize(head[split:])
        tokens = [*self._map.tokens[:n_keep], *extra]
        if not extra or len(tokens) + 1 >= self._require().n_ctx or min(tokens) < 0:
            return 0  # images (negative ids) are sent with their text, in the next request
        body = {
            "prompt": tokens,
            "n_predict": 0,
            "cache_prompt": self.reuses(tokens) > 0,
            "id_slot": self.connection.slot,
            "lora": self._lora_body(),
        }
        try:
            self._call("POST", "/completion", body)
        except LamplightError as exc:
            log.info("prewarm on the server failed: %s", exc)
            return 0
        self._map.truncate(n_keep)
        self._map.tokens = tokens
        if first and split > c_keep:
            self._map.mark_at(n_keep + len(first), split)
        self._map.mark(head)
        return len(extra)
