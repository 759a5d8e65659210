"""Any OpenAI-compatible server as a ``Backend``: vLLM, Ollama, LM Studio, llama-server's
``/v1`` API, hosted services.

The server renders the chat with its own template (``/v1/chat/completions``),
so this client sends role/content messages and streams the content deltas back.
What such a server cannot do (keep a cache this app can save, stack LoRA
adapters, take a GBNF grammar, report each token's own latency) is declared in
``capabilities`` with a sentence for the tooltip, and refused when asked for,
never ignored.

The connection URL may or may not end with ``/v1``: ``http://host:8000`` and
``http://host:8000/v1`` name the same API.

Sampling fields sent: the OpenAI API's own (``temperature``, ``top_p``,
``max_tokens``, ``seed`` when set, ``stop``, ``presence_penalty``,
``frequency_penalty``, ``response_format``) plus ``EXTRA_FIELDS``, which
llama-server, vLLM and LM Studio read and Ollama ignores. A server that refuses
unknown fields (OpenAI's own API) gets the request again without them, and the
reply's note says so.

Context overflow: the server counts the tokens, and this client cannot tokenize for
it; when the server says its context size, older turns are dropped by an estimate that
the server's counts correct (``app.remote.openai.estimate``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    SERVER_ERROR,
    SIZE_LIMIT,
    TIME_LIMIT,
    Backend,
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    LoadCancelled,
    ModelInfo,
    Opening,
    ProgressFn,
)
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.native.hardware import HardwareInfo
from app.engine.prompt.overflow import reply_budget
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraError, LoraStack
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
    cannot_connect,
    end_early,
    end_lost,
    sentence,
    unfinished,
    where,
)
from app.remote.image_wire import has_images, images_refused, refuses_images
from app.remote.openai.estimate import TokenEstimate
from app.remote.openai.models import api_prefix, fetch_models, list_models, model_info, pick_model
from app.remote.openai.reply import (
    OwnPrefix,
    Request,
    finish_metrics,
    new_metrics,
    size_note,
    stop_reason,
    tokens,
    tool_calls_of,
)
from app.remote.openai.tool_wire import (
    TOOL_FIELDS,
    refuses_tools,
    tool_fields,
    tools_refused,
    wire_message,
)
from app.remote.openai.wire import (
    EXTRA_FIELDS,
    ReplyStream,
    event_error,
    first_int,
    generation_error,
    key_message,
    overflow_numbers,
    reasoning_fields,
    refused_field,
    refuses_extras,
    response_format_for,
    unsent_notes,
)
from app.remote.server_link import ON_SERVER, ServerLink, refuse_draft, require
from app.util.errors import ApiKeyRefused, ImageError, LamplightError, ModelLoadError

PING_S = 5.0
MAX_ATTEMPTS = 4  # requests for one reply: fewer fields, a shorter max_tokens, more turns dropped

WHY_NOT = {
    "snapshots": "an OpenAI-compatible server keeps no cache this app can save; "
    "reopening a chat re-reads it",
    "lora": "an OpenAI-compatible server takes no LoRA adapters from this app; "
    "connect to llama-server as a llama.cpp server to stack its adapters",
    "grammar": "an OpenAI-compatible server takes no GBNF grammar; JSON mode and JSON "
    "schemas are sent as response_format, and the server enforces them if it can",
    "prewarm": "an OpenAI-compatible server cannot read the next turn's opening ahead of time",
    "token_latency": "the times between tokens are measured as they arrive over the network, "
    "not by the server",
    "gpu_offload": "the model runs on the server; its GPU settings are the server's own",
    "template_override": "an OpenAI-compatible server renders the chat with its own template; "
    "change it on the server (or connect to llama-server as a llama.cpp server)",
    "mtp": "an OpenAI-compatible server drafts (or not) on its own",
    "draft_model": "a draft model runs with the in-process engine only; an OpenAI-compatible "
    "server decides on speculative decoding itself",
    "thinking_control": "an OpenAI-compatible server ends thinking on its own: no budget or "
    "Stop thinking here",
}
CAPABILITIES = Capabilities(tools=True, why_not=dict(WHY_NOT))
NO_VISION = "the server says this model takes no images"


class OpenAIBackend:
    """A ``Backend`` that streams ``/v1/chat/completions`` from one model of a server,
    over its ``ServerLink``; its ``TokenEstimate`` stands in for the server's tokenizer."""

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self._link = ServerLink(connection, api_key, limits)
        self._info: ModelInfo | None = None
        self._prefix = api_prefix(connection.url)
        self._model_id = ""
        self._extras_ok = True  # the server takes EXTRA_FIELDS
        self._refused: set[str] = set()  # reasoning fields the server refused
        self._estimate = TokenEstimate()
        self._tools: ToolRequest | None = None  # the reply's, while it is asked for
        self._vision = True  # the model takes images (as far as the server says)
        self._own = OwnPrefix()  # the last request, for the cached count (``reset``)

    @property
    def connection(self) -> Connection:
        return self._link.connection

    def _require(self) -> ModelInfo:
        return require(self._info, self._link)

    # -- connection and model ----------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def capabilities(self) -> Capabilities:
        if self._vision:
            return replace(CAPABILITIES, vision=True)
        return replace(CAPABILITIES, why_not=dict(WHY_NOT, vision=NO_VISION))

    def image_tokens(self, image: ImagePart) -> int:
        """0: the server counts them (ImageError when it says the model takes none)."""
        if not self._vision:
            raise ImageError(f"{NO_VISION.capitalize()}.")
        return 0

    def count_tokens(self, text: str) -> int:
        """0: this client cannot tokenize for the server (``TokenEstimate`` stands in)."""
        return 0

    def ping(self) -> str:
        def probe(client: Any) -> str:
            fetch_models(client, self.connection.url, timeout=PING_S)
            return ""

        return self._link.ping(probe)

    def list_models(self) -> list[str]:
        """The ids of the server's models.

        Raises:
            ApiKeyRefused, ServerUnreachable, ServerError.
        """
        return list_models(self.connection, self._link.api_key)

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Connect and pick the model: ``path`` names it ("" for the connection's model,
        or the server's first). ``config`` is the server's business and is ignored.

        Raises:
            ModelLoadError: the server cannot be reached, refuses the key, or does not
                have the model (the message lists the ones it has).
            LoadCancelled: ``progress`` returned False.
        """
        t0 = time.perf_counter()
        if progress is not None and not progress(0.0):
            raise LoadCancelled("cancelled")
        conn = self.connection
        client, streams = self._link.open()
        try:
            models = fetch_models(client, conn.url, self._link.limits.call_s)
        except BaseException as exc:
            client.close()
            streams.close()
            if isinstance(exc, LamplightError):
                raise ModelLoadError(cannot_connect(conn, exc)) from None
            raise
        wanted = str(path) if str(path) not in ("", ".") else conn.model
        try:
            chosen = pick_model(models, wanted, conn)
            if progress is not None and not progress(1.0):
                raise LoadCancelled("cancelled")
        except BaseException:
            client.close()
            streams.close()
            raise
        self._link.use(client, streams)
        self._model_id = chosen.id
        self._vision = chosen.vision is not False  # unknown: the server decides
        self._extras_ok = True
        self._refused = set()
        self._estimate.reset()
        self._own = OwnPrefix()
        self._info = model_info(chosen, conn, self.capabilities, t0)
        return self._info

    def unload(self) -> None:
        self._link.close()
        self._info = None
        self._model_id = ""

    def reset(self) -> None:
        """Another conversation, or another party's, comes next: the server's cache is
        out of reach, so only its cached count of that one's own requests is shown."""
        self._own = OwnPrefix()

    # -- what such a server cannot do --------------------------------------------

    def hardware(self) -> HardwareInfo:
        return ON_SERVER

    @property
    def draft_info(self) -> DraftInfo | None:
        return None  # speculative decoding is the server's business

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Only "no draft" is accepted.

        Raises:
            DraftError.
        """
        return refuse_draft(path, WHY_NOT["draft_model"])

    def opening(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Opening | None:
        return None  # a project's opening is kept in-process only (``capabilities.prefix``)

    def warm_opening(self, opening: Opening, stop: threading.Event | None = None) -> int:
        return 0

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        return 0

    @property
    def lora_stack(self) -> LoraStack:
        return LoraStack()

    def lora_signature(self) -> list[dict[str, Any]]:
        return []

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Only the empty stack is accepted.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        if len(stack):
            raise LoraError(f"Cannot use LoRA adapters here: {WHY_NOT['lora']}.")
        return False

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Only the automatic choice is accepted: the server renders the chat.

        Raises:
            NoModelLoaded, LamplightError.
        """
        info = self._require()
        if override.kind != "auto":
            raise LamplightError(
                f"Cannot choose the chat template here: {WHY_NOT['template_override']}."
            )
        return info

    def cache_config(self) -> dict[str, Any]:
        info = self._require()
        return {"n_ctx": info.n_ctx, "server": self.connection.url, "model": self._model_id}

    def export_state(self, key: str = "") -> KvState:
        return KvState(b"", [], "", [])

    def import_state(self, kv: KvState) -> None:
        """Accepts only an empty state.

        Raises:
            LamplightError: there is a cache to restore; this server cannot take it.
        """
        if kv.tokens:
            raise LamplightError(WHY_NOT["snapshots"])

    # -- generation --------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
        end_thinking: threading.Event | None = None,
        tools: ToolRequest | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the reply (see ``Backend.generate``); the server ends thinking itself
        (``end_thinking`` is not honoured: ``capabilities.thinking_control`` is False).
        ``tools`` go to the server, which parses the calls (``tool_wire``); a reply
        that asks for calls ends with them (``stop_reason`` "tool_calls").

        Once text has come, nothing ends the reply without it: a connection that drops
        (``connection_lost``), a server error (``server_error``), silence or the reply's
        time bound (``time_limit``), text past ``reply_byte_cap`` (``size_limit``) or
        deltas past ``max_tokens`` (``max_tokens``) end it with the text so far and a note.

        Raises:
            NoModelLoaded, SettingError (a GBNF grammar, a bad JSON schema),
            ContextOverflowError, ApiKeyRefused, DecodeError, ServerUnreachable
            (silence before any text), ToolsRefused (the server cannot use tools).
        """
        info = self._require()
        response_format = response_format_for(params)  # refused before any request
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        req = Request(list(messages), params.max_tokens)
        self._tools = tools
        n_ctx = info.n_ctx - self._estimate.of_tools(tools)
        if info.n_ctx > 0 and params.overflow != "stop":
            self._estimate.fit(req, params, max(1, n_ctx))
        notes = unsent_notes(params)
        bounds = self._link.limits.budget(params.max_tokens)
        last: ServerError | None = None
        for _ in range(MAX_ATTEMPTS):
            body = self._body(req, params, response_format)
            try:
                finished = yield from self._stream(body, req, params, t0, stop, bounds)
            except ServerError as exc:
                last = exc
                if self._recover(exc, req, params, info.n_ctx):
                    continue
                if has_images(req.messages) and refuses_images(exc):
                    raise images_refused(exc, where(self.connection.url)) from None
                if tools is not None and refuses_tools(exc) and overflow_numbers(exc) is None:
                    raise tools_refused(exc, where(self.connection.url)) from None
                raise generation_error(exc, info.n_ctx) from None
            finished.metrics.notes[:0] = notes
            refused = (*(EXTRA_FIELDS if not self._extras_ok else ()), *sorted(self._refused))
            if refused:
                finished.metrics.notes.append(
                    f"this server refused the fields {', '.join(refused)}; they were not sent"
                )
            yield finished
            return
        assert last is not None
        raise generation_error(last, info.n_ctx)

    def _body(
        self, req: Request, params: SamplingParams, response_format: dict[str, Any] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model_id,
            "messages": [wire_message(m) for m in req.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max(1, req.max_tokens),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
        }
        if params.seed >= 0:
            body["seed"] = params.seed
        stops = [s for s in params.stop if s]
        if stops:
            body["stop"] = stops
        if response_format is not None:
            body["response_format"] = response_format
        body.update(reasoning_fields(params, self._refused))
        body.update(tool_fields(self._tools, self._refused))
        if self._extras_ok:
            body["top_k"] = params.top_k
            body["min_p"] = params.min_p
            body["repeat_penalty"] = params.repeat_penalty
            body["repetition_penalty"] = params.repeat_penalty
        return body

    def _stream(
        self,
        body: dict[str, Any],
        req: Request,
        params: SamplingParams,
        t0: float,
        stop: threading.Event,
        bounds: Budget,
    ) -> Generator[EngineEvent, None, Finished]:
        """One streamed request. A ``ServerError`` escapes only before the first token
        (the caller may then retry); later errors end the reply with the text so far.

        The stream is cut on this side when the server sends more than ``max_tokens``
        (+ ``TOKEN_SLACK``) deltas or ``bounds.max_bytes`` of text, or runs out of time.
        """
        streams = self._link.streams
        assert streams is not None
        metrics = new_metrics(req, params, self._require().n_ctx)
        reply = ReplyStream(max_bytes=bounds.max_bytes)
        t_request = time.perf_counter()
        stream = EventStream(streams, self._prefix + "/chat/completions", body, stop, bounds)
        cut_off = False
        lost = ""  # why the connection dropped
        failed = ""  # why the server failed after the reply began
        try:
            for event in stream:
                parts = reply.feed_parts(event)
                if reply.error is not None:
                    raise event_error(reply.error)
                if parts:
                    now = time.perf_counter()
                    if not metrics.token_times_ms:
                        # Replaced by the server's own timer when it sends one.
                        metrics.prefill_ms = (now - t_request) * 1000
                    metrics.token_times_ms.append((now - t0) * 1000)
                    yield from tokens(parts, metrics, (now - t0) * 1000)
                if reply.full or reply.tools.over:
                    break
                if reply.deltas + reply.tools.deltas > req.max_tokens + TOKEN_SLACK:
                    cut_off = True
                    break
        except ServerError as exc:
            if not reply.deltas:
                raise  # nothing shown: the caller may ask again
            failed = sentence(str(exc))  # asking again would show the text twice
        except ServerUnreachable as exc:
            lost = str(exc)
        finally:
            stream.close()
        yield from tokens(reply.finish(), metrics, (time.perf_counter() - t0) * 1000)
        if stream.timed_out and not reply.deltas and not stream.stopped:
            raise ServerSilent(stream.timed_out)  # nothing to keep: the reply failed
        finish_metrics(metrics, reply, req, self._estimate.of(req.messages), self._own)
        if lost and not reply.finish_reason:  # a drop after the last chunk loses nothing
            end_lost(metrics, str(lost))
        elif failed:
            end_early(metrics, SERVER_ERROR, failed)
        elif stream.stopped:
            metrics.stop_reason = "cancelled"
        elif stream.timed_out:
            end_early(metrics, TIME_LIMIT, stream.timed_out)
        elif reply.full or reply.tools.over:
            end_early(metrics, SIZE_LIMIT, size_note(reply, bounds.max_bytes))
        elif cut_off:
            metrics.stop_reason = "max_tokens"
            metrics.notes.append(
                f"the server sent more than the {req.max_tokens} tokens asked for; "
                "the reply was cut off here"
            )
        elif not reply.finish_reason:
            end_lost(metrics, unfinished(self.connection.url))
        else:
            metrics.stop_reason = stop_reason(reply, metrics, req)
            if reply.finish_reason == "content_filter":
                metrics.notes.append("the server's content filter ended the reply")
        if reply.usage.get("prompt_tokens"):
            n_prompt = first_int(reply.usage.get("prompt_tokens"))
            self._estimate.calibrate(req.messages, n_prompt, self._tools)
        calls = tool_calls_of(reply, metrics, self._tools)
        return Finished(reply.text, metrics, reply.reasoning.strip(), calls)

    # -- context overflow --------------------------------------------------------

    def _recover(self, exc: ServerError, req: Request, params: SamplingParams, n_ctx: int) -> bool:
        """Change the request so that the server may take it; False when nothing helps.

        Raises:
            ApiKeyRefused: the server refused the key.
        """
        if exc.status in (401, 403):
            raise ApiKeyRefused(key_message(exc))
        if self._extras_ok and refuses_extras(exc):
            self._extras_ok = False
            return True
        optional = [*reasoning_fields(params, self._refused), *TOOL_FIELDS[2:]]
        field = refused_field(exc, [f for f in optional if f not in self._refused])
        if field:
            self._refused.add(field)
            return True
        over = overflow_numbers(exc)
        if over is None:
            return False
        n_prompt, server_ctx = over
        n_ctx = server_ctx or n_ctx
        if n_prompt <= 0 or n_ctx <= 0:
            return False
        self._estimate.calibrate(req.messages, n_prompt, self._tools)
        room = n_ctx - n_prompt
        if (
            room < reply_budget(params.max_tokens, n_ctx)
            and params.overflow != "stop"
            and self._estimate.fit(req, params, n_ctx)
        ):
            return True
        if 0 < room < req.max_tokens:  # the prompt fits; the reply's length limit did not
            req.max_tokens = room
            return True
        return False


def as_backend(backend: OpenAIBackend) -> Backend:
    """``backend`` where a ``Backend`` is wanted (mypy checks that it implements it)."""
    return backend
