"""One reply's decoding once its prompt is in the cache: the job ``decode.decode`` runs,
made from the loaded model's parts (its vocabulary's stop tokens, the template's stops,
the drafter chosen for the reply) and the reply's own hooks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator

from app.config.setting_records import SamplingParams
from app.engine.backend import EngineEvent
from app.engine.local.decode import DecodeJob, decode
from app.engine.local.draft.slot import DraftSlot
from app.engine.local.kv_sequence import KvSequence
from app.engine.local.loaded_model import LoadedModel
from app.engine.local.template_state import TemplateState
from app.engine.metrics import MessageMetrics
from app.engine.templates.thinking import ThinkingControl
from app.engine.tools.binding import ToolDecoding


def decode_reply(
    parts: tuple[LoadedModel, TemplateState, KvSequence, DraftSlot],
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
    model, chat, kv, draft = parts
    drafter, length = draft.choose(params, model.flash, metrics)
    # A draft model reads no images; drafts at explicit positions miss M-RoPE's.
    images = model.tokenizer.has_images
    if drafter is not None and images and (drafter.kind == "model" or model.mrope):
        metrics.notes.append("drafting is off in a conversation with images")
        drafter = length = None
    job = DecodeJob(
        native=model.native,
        cmap=kv.map,
        params=params,
        seed=seed,
        metrics=metrics,
        t0=t0,
        stop=stop,
        token_bytes=_pieces(model, chat.special_ids),
        rewind=kv.rewind,
        template_stops=(*chat.template.stop_strings, *chat.extra_stops),
        stop_ids=chat.stop_ids | model.vocab.stop_tokens(params.stop),
        drafter=drafter,
        length=length,
        make_room=make_room,
        thinking=thinking,
        tools=tools,
        tokenize=lambda text: model.tokenizer.tokenize(text, bos=False),
        ended=kv.checkpoint,
    )
    return decode(job)


def _pieces(model: LoadedModel, special: frozenset[int]) -> Callable[[int], bytes]:
    """Token bytes; the control tokens llama.cpp's parser reads (``special``) as their
    text, so a marker such as ``[TOOL_CALLS]`` reaches it (and never the shown text)."""
    piece = model.vocab.piece
    if not special:
        return piece
    return lambda token: piece(token, token in special)
