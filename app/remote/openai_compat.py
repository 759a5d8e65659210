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

Context overflow: the server counts the tokens, and this client cannot
tokenize for it. When the server says its context size, each message is
estimated at ``len(content) / chars_per_token`` plus ``MESSAGE_OVERHEAD``
tokens; the ratio starts conservative (``DEFAULT_CHARS_PER_TOKEN``) and is
corrected from the server's own count (``usage.prompt_tokens`` of each reply,
or the count in a context-overflow error). With the ``truncate_middle`` and
``rolling`` policies, whole older turns are dropped (``plan_drop``) before
sending; if the server still says the prompt is too long, the ratio is
corrected from its count and the drop planned again, once per attempt.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from app.config.params import LoadConfig, SamplingParams, SettingError
from app.engine.backend import (
    MAX_REPLY_BYTES,
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
    ProgressFn,
    Token,
    cut_to_bytes,
)
from app.engine.hardware import HardwareInfo
from app.engine.metrics import MessageMetrics
from app.engine.overflow import plan_drop, reply_budget
from app.engine.templates import ChatMessage, TemplateOverride, clean_text
from app.gguf.lora import LoraError, LoraStack
from app.remote.connection import Connection
from app.remote.http import (
    DEFAULT_LIMITS,
    JSON_DEPTH,
    TOKEN_SLACK,
    Budget,
    EventStream,
    Limits,
    ServerError,
    ServerSilent,
    ServerUnreachable,
    call,
    cannot_connect,
    client_for,
    end_early,
    end_lost,
    make_client,
    make_clients,
    sentence,
    too_large,
    unfinished,
    where,
)
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import (
    ApiKeyRefused,
    DecodeError,
    DraftError,
    LamplightError,
    ModelLoadError,
    NoModelLoaded,
    ServerOverflowError,
)

PING_S = 5.0
MAX_MODELS = 1000  # entries read from /v1/models
MAX_ID = 300  # characters of a model id
MAX_ATTEMPTS = 4  # requests for one reply: fewer fields, a shorter max_tokens, more turns dropped
DEFAULT_CHARS_PER_TOKEN = 3.0  # below English's ~4: an estimate errs towards dropping early
MESSAGE_OVERHEAD = 4  # tokens a chat template adds around each message
EXTRA_FIELDS = ("top_k", "min_p", "repeat_penalty", "repetition_penalty")
"""Sent besides the OpenAI fields: llama-server and LM Studio read ``repeat_penalty``,
vLLM ``repetition_penalty``; all three read ``top_k`` and ``min_p``."""
MAX_COUNT = (1 << 31) - 1  # a token count or context size above this is not believed

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
    "draft_model": "a draft model runs with the in-process engine only; an OpenAI-compatible "
    "server decides on speculative decoding itself",
}
CAPABILITIES = Capabilities(why_not=dict(WHY_NOT))


def api_prefix(url: str) -> str:
    """The path to put before ``/models`` and ``/chat/completions``: ``/v1`` unless the
    connection URL already ends with it."""
    path = urlsplit(url.strip()).path.rstrip("/")
    return "" if path.endswith("/v1") else "/v1"


@dataclass(frozen=True)
class ServerModel:
    """One entry of ``/v1/models``; numbers the server did not give are 0."""

    id: str
    n_ctx: int = 0
    n_ctx_train: int = 0
    n_params: int = 0
    size: int = 0
    owned_by: str = ""


def parse_models(data: Any) -> list[ServerModel]:
    """The entries of a ``/v1/models`` answer, in the server's order.

    The context size is llama-server's ``meta.n_ctx``, vLLM's ``max_model_len``,
    or ``context_length`` / ``max_context_length`` (OpenRouter, LM Studio).
    """
    items = data.get("data") if isinstance(data, dict) else None
    out: list[ServerModel] = []
    for item in items if isinstance(items, list) else []:
        if len(out) >= MAX_MODELS:
            break
        if not isinstance(item, dict):
            continue
        ident = item.get("id")
        if not isinstance(ident, str) or not ident.strip() or len(ident) > MAX_ID:
            continue
        meta = item.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        n_ctx = _first_int(
            meta.get("n_ctx"),
            item.get("max_model_len"),
            item.get("context_length"),
            item.get("max_context_length"),
        )
        out.append(
            ServerModel(
                id=ident,
                n_ctx=n_ctx,
                n_ctx_train=_first_int(meta.get("n_ctx_train")),
                n_params=_first_int(meta.get("n_params")),
                size=_first_int(meta.get("size")),
                owned_by=str(item.get("owned_by") or "")[:100],
            )
        )
    return out


def list_models(connection: Connection, api_key: str = "") -> list[str]:
    """The ids of the models the server offers (for the connection dialog).

    Raises:
        ApiKeyRefused, ServerUnreachable, ServerError, LamplightError (a bad URL).
    """
    client = make_client(connection.url, api_key, connection.verify_tls)
    try:
        return [m.id for m in _fetch_models(client, connection.url)]
    finally:
        client.close()


def _fetch_models(client: Any, url: str, timeout: float = 30.0) -> list[ServerModel]:
    try:
        data = call(client, "GET", api_prefix(url) + "/models", timeout=timeout)
    except ServerError as exc:
        if exc.status in (401, 403):
            raise ApiKeyRefused(_key_message(exc)) from None
        if exc.status == 404:
            raise ServerError(
                404,
                f"The server at {where(url)} has no {api_prefix(url)}/models: it does not "
                "look like an OpenAI-compatible server (check the address).",
            ) from None
        raise
    models = parse_models(data)
    if not models:
        raise ServerError(0, f"The server at {where(url)} lists no models.")
    return models


@dataclass
class _Request:
    """One reply's requests: what is sent, and what was dropped to make it fit."""

    messages: list[ChatMessage]
    max_tokens: int
    dropped_from: int = 0
    dropped_count: int = 0
    dropped_tokens: int = 0


@dataclass
class ReplyStream:
    """The content of a ``chat.completion.chunk`` stream, fed event by event.

    Pure: every field of an event is checked before use, so any JSON value is
    safe to feed. The text is kept as parts (joined once, not copied per delta) and
    stops at ``max_bytes`` (``full``): a delta that would pass it is cut.
    """

    max_bytes: int = MAX_REPLY_BYTES
    deltas: int = 0
    size: int = 0  # UTF-8 bytes of the text
    full: bool = False
    finish_reason: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    parts: list[str] = field(default_factory=list, repr=False)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, event: Any) -> str:
        """Take one event; returns its new reply text ("" when none)."""
        if not isinstance(event, dict):
            return ""
        if event.get("error"):
            err = event["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)[:300]}
            return ""
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        timings = event.get("timings")  # llama-server's own rates
        if isinstance(timings, dict):
            self.timings = timings
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason[:40]
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
        if not isinstance(piece, str) or not piece or self.full:
            return ""
        piece = clean_text(piece)
        n = len(piece.encode("utf-8"))
        if self.size + n > self.max_bytes:
            piece = cut_to_bytes(piece, self.max_bytes - self.size)
            n = len(piece.encode("utf-8"))
            self.full = True
        if not piece:
            return ""
        self.parts.append(piece)
        self.size += n
        self.deltas += 1
        return piece


class OpenAIBackend:
    """A ``Backend`` that streams ``/v1/chat/completions`` from one model of a server."""

    def __init__(
        self, connection: Connection, api_key: str = "", limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.connection = connection
        self._api_key = api_key
        self._limits = limits
        self._prefix = api_prefix(connection.url)
        self._client: Any = None  # the model list, on kept-alive connections
        self._streams: Any = None  # replies, a connection each (see app.remote.http)
        self._info: ModelInfo | None = None
        self._model_id = ""
        self._extras_ok = True  # the server takes EXTRA_FIELDS
        self._chars_per_token = DEFAULT_CHARS_PER_TOKEN

    # -- connection and model ----------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def hardware(self) -> HardwareInfo:
        return HardwareInfo(False, ())

    def ping(self) -> str:
        try:
            with client_for(self._client, self.connection, self._api_key) as client:
                _fetch_models(client, self.connection.url, timeout=PING_S)
        except LamplightError as exc:
            return str(exc)
        return ""

    def list_models(self) -> list[str]:
        """The ids of the server's models.

        Raises:
            ApiKeyRefused, ServerUnreachable, ServerError.
        """
        return list_models(self.connection, self._api_key)

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
        try:
            client, streams = make_clients(conn.url, self._api_key, conn.verify_tls)
        except LamplightError as exc:
            raise ModelLoadError(cannot_connect(conn, exc)) from None
        try:
            models = _fetch_models(client, conn.url, self._limits.call_s)
        except BaseException as exc:
            client.close()
            streams.close()
            if isinstance(exc, LamplightError):
                raise ModelLoadError(cannot_connect(conn, exc)) from None
            raise
        wanted = str(path) if str(path) not in ("", ".") else self.connection.model
        chosen = next((m for m in models if m.id == wanted), None) if wanted else models[0]
        if chosen is None:
            client.close()
            streams.close()
            have = ", ".join(m.id for m in models[:20])
            more = f" and {len(models) - 20} more" if len(models) > 20 else ""
            raise ModelLoadError(
                f"Could not connect to {self.connection.name}: the server has no model "
                f"{wanted!r}. It has: {have}{more}."
            )
        if progress is not None and not progress(1.0):
            client.close()
            streams.close()
            raise LoadCancelled("cancelled")
        old = (self._client, self._streams)
        self._client, self._streams = client, streams
        for each in old:
            if each is not None:
                each.close()
        self._model_id = chosen.id
        self._extras_ok = True
        self._chars_per_token = DEFAULT_CHARS_PER_TOKEN
        name = chosen.id
        if name.startswith("/") or name.lower().endswith(".gguf"):
            name = PurePosixPath(name.replace("\\", "/")).name or name
        notes: tuple[str, ...] = ()
        if chosen.n_ctx <= 0:
            notes = (
                "The server does not say this model's context size: a conversation that "
                "outgrows it ends with the server's error instead of dropping older messages.",
            )
        ident = json.dumps([self.connection.url, chosen.id, chosen.size, chosen.n_params])
        self._info = ModelInfo(
            path=Path(chosen.id),
            name=name,
            architecture="",
            n_params=chosen.n_params,
            file_size=chosen.size,
            n_ctx=chosen.n_ctx,
            n_ctx_train=chosen.n_ctx_train or chosen.n_ctx,
            n_threads=0,
            n_gpu_layers=0,
            template="the server's",
            backend=f"OpenAI-compatible server at {where(self.connection.url)}",
            load_ms=(time.perf_counter() - t0) * 1000,
            notes=notes,
            capabilities=CAPABILITIES,
            server=self.connection.url,
            fingerprint={
                "name": name,
                "size": chosen.size,
                "sha256": "server:" + hashlib.sha256(ident.encode()).hexdigest(),
            },
            runtime={"openai": chosen.owned_by},
        )
        return self._info

    def unload(self) -> None:
        for client in (self._client, self._streams):
            if client is not None:
                client.close()
        self._client = self._streams = None
        self._info = None
        self._model_id = ""

    def reset(self) -> None:
        """Nothing to forget: the server keeps no conversation for this client."""

    # -- what such a server cannot do --------------------------------------------

    def prewarm(self, messages: Sequence[ChatMessage], reply: str) -> int:
        return 0

    @property
    def lora_stack(self) -> LoraStack:
        return LoraStack()

    @property
    def draft_info(self) -> DraftInfo | None:
        return None

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Only "no draft" is accepted.

        Raises:
            DraftError.
        """
        if path:
            raise DraftError(f"Cannot use a draft model here: {WHY_NOT['draft_model']}.")
        return None

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
    ) -> Generator[EngineEvent, None, None]:
        """Stream the reply (see ``Backend.generate``).

        Once text has come, nothing ends the reply without it: a connection that drops
        (``connection_lost``), a server error (``server_error``), silence or the reply's
        time bound (``time_limit``), text past ``reply_byte_cap`` (``size_limit``) or
        deltas past ``max_tokens`` (``max_tokens``) end it with the text so far and a note.

        Raises:
            NoModelLoaded, SettingError (a GBNF grammar, a bad JSON schema),
            ContextOverflowError, ApiKeyRefused, DecodeError, ServerUnreachable
            (silence before any text).
        """
        info = self._require()
        response_format = _response_format(params)  # refused before any request
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        req = _Request(list(messages), params.max_tokens)
        if info.n_ctx > 0 and params.overflow != "stop":
            self._fit(req, params, info.n_ctx)
        notes = _unsent_notes(params)
        bounds = self._limits.budget(params.max_tokens)
        last: ServerError | None = None
        for _ in range(MAX_ATTEMPTS):
            body = self._body(req, params, response_format)
            try:
                finished = yield from self._stream(body, req, params, t0, stop, bounds)
            except ServerError as exc:
                last = exc
                if self._recover(exc, req, params, info.n_ctx):
                    continue
                raise _generation_error(exc, info.n_ctx) from None
            finished.metrics.notes[:0] = notes
            if not self._extras_ok:
                finished.metrics.notes.append(
                    "this server refused the fields " + ", ".join(EXTRA_FIELDS) + "; they "
                    "were not sent"
                )
            yield finished
            return
        assert last is not None
        raise _generation_error(last, info.n_ctx)

    def _body(
        self, req: _Request, params: SamplingParams, response_format: dict[str, Any] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model_id,
            "messages": [{"role": m.role, "content": m.content} for m in req.messages],
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
        if self._extras_ok:
            body["top_k"] = params.top_k
            body["min_p"] = params.min_p
            body["repeat_penalty"] = params.repeat_penalty
            body["repetition_penalty"] = params.repeat_penalty
        return body

    def _stream(
        self,
        body: dict[str, Any],
        req: _Request,
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
        assert self._streams is not None
        info = self._require()
        metrics = MessageMetrics(
            n_ctx=info.n_ctx,
            seed=params.seed if params.seed >= 0 else None,
            dropped_from=req.dropped_from,
            dropped_count=req.dropped_count,
            dropped_tokens=req.dropped_tokens,
        )
        if req.dropped_count:
            metrics.notes.append(_drop_note(req))
        reply = ReplyStream(max_bytes=bounds.max_bytes)
        t_request = time.perf_counter()
        stream = EventStream(self._streams, self._prefix + "/chat/completions", body, stop, bounds)
        cut_off = False
        lost = ""  # why the connection dropped
        failed = ""  # why the server failed after the reply began
        try:
            for event in stream:
                piece = reply.feed(event)
                if reply.error is not None:
                    raise _event_error(reply.error)
                if piece:
                    now = time.perf_counter()
                    if not metrics.token_times_ms:
                        # Replaced by the server's own timer when it sends one.
                        metrics.prefill_ms = (now - t_request) * 1000
                    metrics.token_times_ms.append((now - t0) * 1000)
                    yield Token(piece)
                if reply.full:
                    break
                if reply.deltas > req.max_tokens + TOKEN_SLACK:
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
        if stream.timed_out and not reply.deltas and not stream.stopped:
            raise ServerSilent(stream.timed_out)  # nothing to keep: the reply failed
        self._finish_metrics(metrics, reply, req)
        if lost and not reply.finish_reason:  # a drop after the last chunk loses nothing
            end_lost(metrics, str(lost))
        elif failed:
            end_early(metrics, SERVER_ERROR, failed)
        elif stream.stopped:
            metrics.stop_reason = "cancelled"
        elif stream.timed_out:
            end_early(metrics, TIME_LIMIT, stream.timed_out)
        elif reply.full:
            end_early(metrics, SIZE_LIMIT, too_large(bounds.max_bytes))
        elif cut_off:
            metrics.stop_reason = "max_tokens"
            metrics.notes.append(
                f"the server sent more than the {req.max_tokens} tokens asked for; "
                "the reply was cut off here"
            )
        elif not reply.finish_reason:
            end_lost(metrics, unfinished(self.connection.url))
        else:
            metrics.stop_reason = _stop_reason(reply, metrics, req)
            if reply.finish_reason == "content_filter":
                metrics.notes.append("the server's content filter ended the reply")
        if reply.usage.get("prompt_tokens"):
            self._calibrate(req.messages, _first_int(reply.usage.get("prompt_tokens")))
        return Finished(reply.text, metrics)

    def _finish_metrics(self, metrics: MessageMetrics, reply: ReplyStream, req: _Request) -> None:
        """Token counts and rates: the server's where it gives them, else this client's."""
        usage, timings = reply.usage, reply.timings
        metrics.generated_tokens = _first_int(usage.get("completion_tokens")) or reply.deltas
        metrics.prompt_tokens = _first_int(usage.get("prompt_tokens")) or self._estimate(
            req.messages
        )
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        metrics.cached_tokens = _first_int(timings.get("cache_n"), cached)
        metrics.evaluated_tokens = _first_int(timings.get("prompt_n")) or max(
            0, metrics.prompt_tokens - metrics.cached_tokens
        )
        if _first_float(timings.get("prompt_ms")) > 0:
            metrics.prefill_ms = _first_float(timings.get("prompt_ms"))
        metrics.native_prefill_tok_s = _first_float(timings.get("prompt_per_second"))
        metrics.native_decode_tok_s = _first_float(timings.get("predicted_per_second"))

    # -- context overflow --------------------------------------------------------

    def _estimate_one(self, message: ChatMessage) -> int:
        return int(len(message.content) / self._chars_per_token) + MESSAGE_OVERHEAD

    def _estimate(self, messages: Sequence[ChatMessage]) -> int:
        return sum(self._estimate_one(m) for m in messages)

    def _calibrate(self, messages: Sequence[ChatMessage], n_tokens: int) -> None:
        """Correct the characters-per-token ratio from the server's count of ``messages``."""
        chars = sum(len(m.content) for m in messages)
        text_tokens = n_tokens - MESSAGE_OVERHEAD * len(messages)
        if chars > 0 and text_tokens > 0:
            self._chars_per_token = min(8.0, max(0.5, chars / text_tokens))

    def _fit(self, req: _Request, params: SamplingParams, n_ctx: int) -> bool:
        """Drop whole older turns until the estimate plus a reply budget fits ``n_ctx``;
        True when something was dropped."""
        sizes = [self._estimate_one(m) for m in req.messages]
        need = sum(sizes) + reply_budget(params.max_tokens, n_ctx) - n_ctx
        plan = plan_drop(sizes, [m.role for m in req.messages], params.overflow, need, 1)
        if plan is None:
            return False
        a, b = plan
        if not req.dropped_count:
            req.dropped_from = a
        req.dropped_count += b - a
        req.dropped_tokens += sum(sizes[a:b])
        req.messages = [*req.messages[:a], *req.messages[b:]]
        return True

    def _recover(self, exc: ServerError, req: _Request, params: SamplingParams, n_ctx: int) -> bool:
        """Change the request so that the server may take it; False when nothing helps.

        Raises:
            ApiKeyRefused: the server refused the key.
        """
        if exc.status in (401, 403):
            raise ApiKeyRefused(_key_message(exc))
        if self._extras_ok and _refuses_extras(exc):
            self._extras_ok = False
            return True
        over = _overflow_numbers(exc)
        if over is None:
            return False
        n_prompt, server_ctx = over
        n_ctx = server_ctx or n_ctx
        if n_prompt <= 0 or n_ctx <= 0:
            return False
        self._calibrate(req.messages, n_prompt)
        room = n_ctx - n_prompt
        if (
            room < reply_budget(params.max_tokens, n_ctx)
            and params.overflow != "stop"
            and self._fit(req, params, n_ctx)
        ):
            return True
        if 0 < room < req.max_tokens:  # the prompt fits; the reply's length limit did not
            req.max_tokens = room
            return True
        return False

    # -- helpers -----------------------------------------------------------------

    def _require(self) -> ModelInfo:
        if self._info is None or self._client is None:
            raise NoModelLoaded("Not connected to the server: connect first.")
        return self._info


def _response_format(params: SamplingParams) -> dict[str, Any] | None:
    """The ``response_format`` for the output format.

    Raises:
        SettingError: a GBNF grammar, or a JSON schema that is not a JSON object.
    """
    fmt = params.output_format
    if fmt == "gbnf":
        raise SettingError(
            "grammar",
            "An OpenAI-compatible server cannot take a GBNF grammar. Use JSON mode or a JSON "
            "schema, or add the server as a llama.cpp server if it is llama-server.",
        )
    if fmt == "json":
        return {"type": "json_object"}
    if fmt == "json_schema":
        try:
            schema = parse_json(params.json_schema, JSON_DEPTH * 4)
        except DataFileError as exc:
            raise SettingError("json_schema", f"The JSON schema {exc}.") from None
        if not isinstance(schema, dict):
            raise SettingError("json_schema", "The JSON schema must be a JSON object.")
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return None


def _unsent_notes(params: SamplingParams) -> list[str]:
    unsent = []
    if params.mirostat != "off":
        unsent.append("mirostat")
    if params.typical_p != 1.0:
        unsent.append("typical-p")
    if not unsent:
        return []
    return [f"an OpenAI-compatible server takes no {' or '.join(unsent)} setting; not sent"]


def _stop_reason(reply: ReplyStream, metrics: MessageMetrics, req: _Request) -> str:
    if reply.finish_reason != "length":
        return "eos"  # "stop" (end of turn or a stop string), "tool_calls", "content_filter"
    completion = _first_int(reply.usage.get("completion_tokens"))
    if 0 < completion < req.max_tokens:
        return "context_full"  # the server ended it before the length asked for
    if metrics.n_ctx > 0 and metrics.prompt_tokens + metrics.generated_tokens >= metrics.n_ctx:
        return "context_full"
    return "max_tokens"


def _drop_note(req: _Request) -> str:
    n = req.dropped_count
    return (
        f"the context was full: {n} older message{'s' if n != 1 else ''} (about "
        f"{req.dropped_tokens} tokens) left the model's memory; the server reads the "
        "kept text again. They stay in the transcript"
    )


_CTX_PATTERNS = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"context (?:size|length|window) (?:is |of )?\(?(\d+)"),
    re.compile(r"available context size \((\d+)"),
)
_PROMPT_PATTERNS = (
    re.compile(r"(\d+) in the messages"),
    re.compile(r"(\d+) input tokens"),
    re.compile(r"messages resulted in (\d+) tokens"),
    re.compile(r"request \((\d+) tokens\)"),
    re.compile(r"requested (\d+) tokens"),
)
_OVERFLOW_KINDS = ("exceed_context_size_error", "context_length_exceeded")
_OVERFLOW_WORDS = re.compile(r"context (?:length|size|window)|too many tokens", re.IGNORECASE)


def _overflow_numbers(exc: ServerError) -> tuple[int, int] | None:
    """``(prompt tokens, context size)`` when ``exc`` says the request does not fit the
    context (0 for a number it does not give); None for another error.

    Knows llama-server's error body and the messages of vLLM and OpenAI.
    """
    message = str(exc)[:2000]
    if exc.kind not in _OVERFLOW_KINDS and not (
        exc.status in (0, 400, 413, 422) and _OVERFLOW_WORDS.search(message)
    ):
        return None
    n_prompt = _first_int(exc.body.get("n_prompt_tokens"))
    n_ctx = _first_int(exc.body.get("n_ctx"))
    if not n_ctx:
        n_ctx = next((int(m[1]) for p in _CTX_PATTERNS if (m := p.search(message))), 0)
    if not n_prompt:
        n_prompt = next((int(m[1]) for p in _PROMPT_PATTERNS if (m := p.search(message))), 0)
    return n_prompt, n_ctx


def _refuses_extras(exc: ServerError) -> bool:
    """A 400 that names one of ``EXTRA_FIELDS`` as unknown (OpenAI's own API)."""
    text = str(exc).lower()
    return (
        exc.status in (400, 422)
        and any(f in text for f in EXTRA_FIELDS)
        and any(w in text for w in ("unrecognized", "unknown", "not permitted", "extra"))
    )


def _generation_error(exc: ServerError, n_ctx: int) -> LamplightError:
    if exc.status in (401, 403):
        return ApiKeyRefused(_key_message(exc))
    over = _overflow_numbers(exc)
    if over is not None:
        n_prompt, server_ctx = over
        return ServerOverflowError(n_prompt, server_ctx or n_ctx)
    if "response_format" in str(exc) or "json_schema" in str(exc):
        return SettingError("output_format", f"The server refused the output format: {exc}")
    return DecodeError(str(exc))


def _event_error(err: dict[str, Any]) -> ServerError:
    code = err.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 0
    message = str(err.get("message") or "")[:500]
    kind = str(err.get("type") or err.get("code") or "")[:100]
    return ServerError(status, f"The server stopped the reply: {message}", kind, err)


def _key_message(exc: ServerError) -> str:
    return f"{sentence(str(exc))} Check the API key in the connection's settings."


def _first_int(*values: Any) -> int:
    """The first value that is an int (not a bool) in 0..MAX_COUNT; 0 if none is."""
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT:
            return v
    return 0


def _first_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, int) and value > MAX_COUNT:  # float() of a huge int raises
        return 0.0
    return max(0.0, float(value)) if math.isfinite(value) else 0.0


def as_backend(backend: OpenAIBackend) -> Backend:
    """``backend`` where a ``Backend`` is wanted (mypy checks that it implements it)."""
    return backend
