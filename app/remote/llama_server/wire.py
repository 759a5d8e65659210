"""What llama-server's answers hold, checked field by field, and what its requests carry.

Every value from the server is type-checked before use: a count or id beyond
``MAX_COUNT``, a string where a number belongs, a list cut short, all read as "not said".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Generator
from pathlib import PurePosixPath
from typing import Any

from app.config.field_spec import SettingError
from app.config.setting_records import SamplingParams
from app.engine.backend import (
    SIZE_LIMIT,
    TIME_LIMIT,
    LoadCancelled,
    PrefillProgress,
    ProgressFn,
    fit_bytes,
)
from app.engine.metrics import MessageMetrics
from app.engine.templates.builtin import template_for_architecture
from app.engine.templates.chat_template import clean_text
from app.engine.templates.jinja_template import TURN_MARKERS
from app.engine.templates.override import TemplateInputs
from app.gguf.lora import LoraStack
from app.remote.connection import Connection
from app.remote.http import (
    MAX_BODY,
    TOO_LARGE,
    Budget,
    EventStream,
    Limits,
    ServerError,
    ServerSilent,
    call,
    end_early,
    too_large,
    where,
)
from app.util.errors import (
    ApiKeyRefused,
    DecodeError,
    LamplightError,
    ModelLoadError,
    ServerOverflowError,
)

MAX_COUNT = (1 << 31) - 1  # a count or token id beyond this from the server is not believed
MIROSTAT = {"off": 0, "v1": 1, "v2": 2}


def sampling_fields(params: SamplingParams, seed: int) -> dict[str, Any]:
    """The sampler settings of a ``/completion`` request."""
    return {
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "typical_p": params.typical_p,
        "repeat_penalty": params.repeat_penalty,
        "repeat_last_n": params.repeat_last_n,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "mirostat": MIROSTAT.get(params.mirostat, 0),
        "mirostat_tau": params.mirostat_tau,
        "mirostat_eta": params.mirostat_eta,
        "seed": seed,
    }


def events(stream: EventStream) -> Generator[dict[str, Any], None, None]:
    for event in stream:
        if isinstance(event, dict):
            if "error" in event:
                err = event["error"]
                msg = err.get("message") if isinstance(err, dict) else err
                raise ServerError(0, f"The server stopped the reply: {str(msg)[:300]}")
            yield event


def generation_error(exc: ServerError) -> LamplightError:
    body = exc.body
    if exc.kind == "exceed_context_size_error":
        return ServerOverflowError(
            int_or(body.get("n_prompt_tokens"), 0), int_or(body.get("n_ctx"), 0)
        )
    if exc.status in (401, 403):
        return ApiKeyRefused(str(exc))
    if "grammar" in str(exc).lower():
        return SettingError("grammar", f"The server refused the grammar: {exc}")
    return DecodeError(str(exc))


def tokens_error(exc: ServerError, n_ctx: int) -> LamplightError:
    """What to say when ``/tokenize`` failed: a token list over ``MAX_BODY`` (a 25 MB
    message: 30 s of the server's time) holds more tokens than any context it serves."""
    # 16 bytes a token is more than a JSON writer spends on a 10-digit id and its comma.
    if exc.kind == TOO_LARGE and 0 < n_ctx < MAX_BODY // 16:
        return ServerOverflowError(0, n_ctx)
    return exc


def parse_adapters(data: Any) -> list[dict[str, Any]]:
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and isinstance(item.get("id"), int):
            path = str(item.get("path") or f"adapter {item['id']}")[:1000]
            out.append({"id": item["id"], "path": path, "name": PurePosixPath(path).name})
    return out[:64]


def signature(stack: LoraStack) -> list[dict[str, Any]]:
    # Server adapters cannot be hashed from here: the server's path stands for the file.
    return [
        {
            "name": e.path.name,
            "path": str(e.path),
            "size": None,
            "sha256": "server:" + str(e.path),
            "scale": e.scale,
            "enabled": e.enabled,
        }
        for e in stack
    ]


def model_meta(models: Any) -> dict[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        meta = data[0].get("meta")
        if isinstance(meta, dict):
            return meta
    return {}


def family(has_token: Any) -> str:
    """A model family for the built-in templates, told by which turn markers are tokens."""
    if has_token("<start_of_turn>"):
        return "gemma3"
    if has_token("<|im_start|>"):
        return "qwen2"
    if has_token("<|start_header_id|>") or has_token("[INST]"):
        return "llama"
    if has_token("<|user|>"):
        return "phi3"
    return ""


def check_props(props: Any, connection: Connection) -> int:
    """The context size from llama-server's ``/props``.

    Raises:
        ModelLoadError: not llama-server's answer, or no context size in it.
    """
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(settings, dict):
        raise ModelLoadError(
            f"Could not connect to {connection.name}: the server at {where(connection.url)} "
            "does not look like llama-server (its /props has no generation settings). If it "
            "is another kind of server, add it as an OpenAI-compatible server instead."
        )
    n_ctx = int_or(settings.get("n_ctx"), 0)
    if n_ctx <= 0:
        raise ModelLoadError(
            f"Could not connect to {connection.name}: the server did not say its context "
            "size (/props n_ctx)."
        )
    return n_ctx


def settings_of(props: Any) -> dict[str, Any]:
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    return settings if isinstance(settings, dict) else {}


def text_of(value: Any, limit: int) -> str:
    """``value`` if it is a string (cut to ``limit`` characters), else ""."""
    return clean_text(value[:limit]) if isinstance(value, str) else ""


def snippet(value: Any) -> str:
    """What a server answered, short, for a message."""
    if value is None:
        return "nothing"
    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())
    return repr(text[:120] + ("…" if len(text) > 120 else ""))


def int_or(value: Any, default: int) -> int:
    """``value`` if it is an int (not a bool) in ±MAX_COUNT, else ``default``."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_COUNT:
        return value
    return default


def float_or(value: Any, default: float) -> float:
    """``value`` if it is a finite number (not a bool), else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    if isinstance(value, int) and abs(value) > MAX_COUNT:  # float() of a huge int raises
        return default
    return float(value) if math.isfinite(value) else default


class ReplyText:
    """A reply as it streams in: its text, cleaned and cut at ``room`` UTF-8 bytes, and
    its token ids, at most ``most`` of them."""

    def __init__(self, room: int, most: int) -> None:
        self.room = room
        self.most = most
        self.size = 0
        self.parts: list[str] = []
        self.generated: list[int] = []
        self.n_tokens = 0  # as the server counts them (ids), for a server that ignores n_predict
        self.cut = ""  # why this side ended the stream ("size_limit", "max_tokens")

    def count(self, ids: list[int], piece: Any) -> None:
        """Take one event's token ids (and count a piece of text that came without)."""
        self.n_tokens += max(len(ids), 1 if isinstance(piece, str) and piece else 0)
        self.generated += ids[: max(0, self.most - len(self.generated))]

    def add(self, piece: str) -> str:
        """Take one piece of text; returns what of it to show ("" when none)."""
        if not piece:
            return ""
        piece, n, cut = fit_bytes(clean_text(piece), self.size, self.room)
        if cut:
            self.cut = SIZE_LIMIT
        if piece:
            self.parts.append(piece)
            self.size += n
        return piece


def cut_short(
    stream: EventStream, text: ReplyText, metrics: MessageMetrics, bounds: Budget, n_predict: int
) -> None:
    """How a stream this side ended (stopped, out of time, too long) goes in ``metrics``.

    Raises:
        ServerSilent: the time ran out before any text: the reply failed.
    """
    if stream.timed_out and not text.parts and not stream.stopped:
        raise ServerSilent(stream.timed_out)  # nothing to keep: the reply failed
    if stream.stopped:
        metrics.stop_reason = "cancelled"
    elif stream.timed_out:
        end_early(metrics, TIME_LIMIT, stream.timed_out)
    elif text.cut == SIZE_LIMIT:
        end_early(metrics, SIZE_LIMIT, too_large(bounds.max_bytes))
    else:
        metrics.stop_reason = "max_tokens"
        metrics.notes.append(
            f"the server sent more than the {n_predict} tokens asked for; "
            "the reply was cut off here"
        )


def stop_reason(final: dict[str, Any], n_prompt: int, n_ctx: int) -> str:
    """Why the server ended a reply, from its last event."""
    stop_type = final.get("stop_type")
    if final.get("truncated") or (
        stop_type == "limit" and n_prompt + int_or(final.get("tokens_predicted"), 0) >= n_ctx
    ):
        return "context_full"
    if stop_type == "limit":
        return "max_tokens"
    if stop_type == "word":
        return "stop_string"
    return "eos"


def stop_match(final: dict[str, Any], reason: str) -> str:
    """The stop string the server says ended a reply ("" for none), bounded."""
    word = final.get("stopping_word")
    return word[:256] if reason == "stop_string" and isinstance(word, str) else ""


def progress_of(progress: Any) -> PrefillProgress | None:
    """A ``prompt_progress`` event as ``PrefillProgress`` (None when it says nothing)."""
    if not isinstance(progress, dict):
        return None
    total = int_or(progress.get("total"), 0) - int_or(progress.get("cache"), 0)
    done = int_or(progress.get("processed"), 0) - int_or(progress.get("cache"), 0)
    return PrefillProgress(max(0, min(done, total)), total) if total > 0 else None


def token_ids(ids: Any) -> list[int]:
    """The token ids of an event (those that are ids)."""
    return [i for i in ids if int_or(i, -1) >= 0] if isinstance(ids, list) else []


def wait_ready(
    client: Any, connection: Connection, limits: Limits, progress: ProgressFn | None
) -> None:
    """Wait while the server loads its model (503), at most ``Limits.ready_s``.

    Raises:
        ModelLoadError: a ``/health`` that is not llama-server's, or not ready in time.
        ServerUnreachable, ServerError, LoadCancelled.
    """
    limit = limits.ready_s
    deadline = time.monotonic() + limit
    host = where(connection.url)
    step = 0
    while True:
        try:
            health = call(client, "GET", "/health", timeout=min(10.0, limits.call_s))
        except ServerError as exc:
            if exc.status != 503:
                raise
            if time.monotonic() > deadline:
                raise ModelLoadError(
                    f"Could not connect to {connection.name}: the server at {host} "
                    f"was still loading its model after {limit:.0f} s ({exc})."
                ) from None
        else:
            if isinstance(health, dict) and health.get("status") == "ok":
                if progress is not None:
                    progress(1.0)
                return
            # vLLM, a proxy's page, another server: 200, but not llama-server's answer.
            raise ModelLoadError(
                f"Could not connect to {connection.name}: the server at {host} "
                "answers /health but not as llama-server does (it said "
                f"{snippet(health)}). If it is another kind of server, add it as an "
                "OpenAI-compatible server instead."
            )
        step += 1
        # The server does not say how far its load is: an honest creep, never 100 %.
        if progress is not None and not progress(min(0.9, step / (step + 20))):
            raise LoadCancelled("cancelled")
        time.sleep(0.25)


def template_inputs(props: dict[str, Any], has_token: Callable[[str], bool]) -> TemplateInputs:
    """What the server's templates are made from: its ``/props``, and which texts are one
    token of its vocabulary (``has_token``)."""
    source = props.get("chat_template")
    source = source if isinstance(source, str) else ""
    bos = str(props.get("bos_token") or "")
    eos = str(props.get("eos_token") or "")
    # llama-server falls back to ChatML for a model without a template; its markers
    # are then no tokens of this vocabulary, and the built-in template for the
    # model's family (told by which turn markers are tokens) fits better.
    uses = [t for t in TURN_MARKERS if t in source]
    if uses and not any(has_token(t) for t in uses):
        source = ""
    arch = family(has_token)
    builtin = template_for_architecture(arch, has_token).name
    return TemplateInputs(source, arch, builtin, bos, eos)
