"""One ``/completion`` stream of the llama-server backend: its events as tokens, how it
ended, and what the slot holds after it.

The server is not trusted to stop: the stream is cut on this side at ``n_predict``
(+ ``TOKEN_SLACK``) tokens, at the reply's byte budget and at its time bounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from typing import Any

from app.engine.backend import SERVER_ERROR, EngineEvent, Finished
from app.engine.context_map import common_prefix
from app.engine.metrics import MessageMetrics
from app.engine.prompt.pipeline import Prompt
from app.remote.http import (
    TOKEN_SLACK,
    Budget,
    EventStream,
    ServerError,
    ServerUnreachable,
    end_early,
    end_lost,
    sentence,
    unfinished,
)
from app.remote.llama_server.slot import Slot
from app.remote.llama_server.think import ServerThinking, show_tokens
from app.remote.llama_server.wire import (
    ReplyText,
    cut_short,
    events,
    generation_error,
    progress_of,
    stop_match,
    stop_reason,
    token_ids,
)
from app.remote.server_link import ServerLink


def stream_completion(
    link: ServerLink,
    slot: Slot,
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
    It is cut here past ``n_predict`` (+ ``TOKEN_SLACK``) tokens, past ``room`` bytes of
    text, or out of ``bounds``; an error after the first token ends it with the text so far.
    """
    assert link.streams is not None
    keep = common_prefix(slot.map.tokens, prompt.tokens) if body["cache_prompt"] else 0
    text = ReplyText(room, int(body["n_predict"]) + TOKEN_SLACK)
    final: dict[str, Any] = {}
    first_request = not metrics.token_times_ms and not metrics.evaluated_tokens
    t_prefill = time.perf_counter()
    stream = EventStream(link.streams, "/completion", body, stop, bounds)
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
                slot.prefilled(prompt)
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
            slot.map.truncate(keep)
            raise generation_error(exc) from None
        slot.after_reply(prompt, text.generated, "".join(text.parts), prefilled, keep)
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
        slot.prefilled(prompt)
        prefilled = True
    slot.after_reply(prompt, text.generated, reply, prefilled, keep)
    if ended_here:
        cut_short(stream, text, metrics, bounds, int(body["n_predict"]))
    elif final:
        slot.timings(final, metrics, first_request, keep)
        metrics.stop_reason = stop_reason(final, len(prompt.tokens), metrics.n_ctx)
        metrics.stop_match = stop_match(final, metrics.stop_reason)
    elif not thought_cut:
        end_lost(metrics, unfinished(link.connection.url))
    return Finished(reply, metrics)
