"""The in-process engine's side of the prompt driver (``app.engine.prompt.driver``):
its templates (``TemplateState``) and its cache, KV sequence 0, which can shift on
request when older turns are dropped (``Overflow``) or is read again; and what the
decode loop calls when the reply fills the context (``room_maker``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.local.kv_sequence import KvSequence
from app.engine.local.loaded_model import LoadedModel
from app.engine.local.template_state import TemplateState
from app.engine.metrics import MessageMetrics
from app.engine.prompt.driver import PromptDriver, Render, Warmup
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import LeastTokens, PromptRequest, record_drops
from app.engine.templates.chat_template import ChatTemplate
from app.util.errors import ContextOverflowError


class LocalTemplates:
    """The driver's ``Templates`` over the model's ``TemplateState``; ``use_template`` is
    called when the chosen template fails and its fallback takes over (the engine keeps
    its ``ModelInfo`` in step)."""

    def __init__(self, chat: TemplateState, use_template: Callable[[ChatTemplate], None]) -> None:
        self._chat = chat
        self._use_template = use_template

    @property
    def rendering(self) -> ChatTemplate:
        return self._chat.rendering

    def fall_back(self, fallback: ChatTemplate, params: SamplingParams) -> None:
        self._use_template(fallback)
        self._chat.start(params, self._chat.tools)


class LocalCache:
    """The driver's ``PromptCache`` over the loaded model's tokenizer and ``kv`` sequence."""

    refused: type[ContextOverflowError] = ContextOverflowError

    def __init__(self, model: LoadedModel, kv: KvSequence) -> None:
        self._model = model
        self._tokens = model.tokenizer
        self._kv = kv
        self.least_tokens: LeastTokens | None = self._tokens.least_tokens

    @property
    def map(self) -> ContextMap:
        return self._kv.map

    def tokenize(self, text: str, bos: bool = False) -> list[int]:
        return self._tokens.tokenize(text, bos)

    def overflow(
        self, render: Render, messages: list[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        def refill(tokens: list[int]) -> bool:
            for _event in self._kv.prefill(tokens, stop):
                pass
            return not stop.is_set()

        return Overflow(
            render=render,
            tokenize=lambda t: self._tokens.tokenize(t, bos=False),
            cmap=self._kv.map,
            mem=self._model.native.memory,
            can_shift=self._model.can_shift,
            refill=refill,
            policy=policy,
            messages=messages,
            head=self._model.head,
        )

    def warm(self, warm: Warmup, stop: threading.Event | None = None) -> int:
        if self._kv.rewind(warm.n_keep):
            return 0  # the cache was emptied: the next message reads it all anyway
        # A recurrent state goes back to a checkpoint, which may be earlier than n_keep.
        start = len(self._kv.map.tokens)
        for _event in self._kv.prefill(warm.tokens[start:], stop or threading.Event()):
            pass
        done = len(self._kv.map.tokens) == len(warm.tokens)
        if done and self._kv.checkpoints is not None:
            # At the opening's end: an edit of the message that follows rewinds to it.
            self._kv.checkpoints.take(len(warm.tokens))
        return len(warm.tokens) - start if done else 0


def room_maker(
    driver: PromptDriver,
    kv: KvSequence,
    request: PromptRequest,
    overflow: Overflow,
    metrics: MessageMetrics,
    stop: threading.Event,
) -> Callable[[], bool]:
    """What the decode loop calls when the context is full: drop older turns (if the
    policy drops) and say whether there is room again."""

    def make_room() -> bool:
        if request.params.overflow == "stop":
            return False
        before = len(kv.map.tokens)
        if not overflow.drop(request.budget, keep_last=1):
            return False
        # No boundaries to cut at (a template that folds the system prompt into the
        # first user turn): the kept text is read again, then the reply so far.
        if len(kv.map.tokens) >= before and not _reread_reply(
            driver, kv, request.n_ctx, overflow, stop
        ):
            return False
        record_drops(overflow, metrics)
        return True

    return make_room


def _reread_reply(
    driver: PromptDriver,
    kv: KvSequence,
    n_ctx: int,
    overflow: Overflow,
    stop: threading.Event,
) -> bool:
    """Read ``overflow.messages`` again from the last mark they share with the cache, then
    the reply so far (its marks kept); False when there is no room or it stopped."""
    cmap = kv.map
    old = cmap.text  # the prompt's text: the reply's is added when it ends
    n_end = cmap.char_mark(len(old))
    if n_end is None:
        return False
    reply = cmap.tokens[n_end:]
    reply_marks = [(n - n_end, c - len(old)) for n, c in cmap.marks if n > n_end]
    prompt = driver.build(overflow.messages)
    if len(prompt.tokens) + len(reply) >= n_ctx:
        return False
    kv.rewind(prompt.n_mark)  # may empty the cache: then all of the prompt is read
    start = len(cmap.tokens)
    for _event in kv.prefill(prompt.tokens[start:], stop):
        pass
    if len(cmap.tokens) < len(prompt.tokens):
        return False
    kv.mark_prompt(prompt)
    for _event in kv.prefill(reply, stop):
        pass
    if len(cmap.tokens) < len(prompt.tokens) + len(reply):
        return False
    cmap.marks += [(n + len(prompt.tokens), c + len(prompt.text)) for n, c in reply_marks]
    overflow.reread_tokens += len(prompt.tokens) - start + len(reply)
    return True
