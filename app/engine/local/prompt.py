"""The prompt the in-process engine reads: rendered with the request's template, fitted
to the context, older turns dropped (or read again) when the reply runs out of room,
and the next turn opened ahead of time (prewarm), over KV sequence 0's ``ContextMap``.

The steps are ``app.engine.prompt.pipeline``'s; this module drives them for the loaded
model, whose cache can shift on request (``Overflow``) or is read again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from app.engine.chat_message import ChatMessage
from app.engine.local.kv_sequence import KvSequence
from app.engine.local.loaded_model import LoadedModel
from app.engine.local.template_state import TemplateState
from app.engine.metrics import MessageMetrics
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import Prompt, PromptPipeline, PromptRequest, record_drops, render
from app.engine.templates.chat_template import ChatTemplate


class LocalPrompt:
    """The prompt steps for one loaded model's ``chat`` templates and ``kv`` sequence.

    ``use_template`` is called when the chosen template fails and its fallback takes
    over (the engine keeps its ``ModelInfo`` in step).
    """

    def __init__(
        self,
        model: LoadedModel,
        chat: TemplateState,
        kv: KvSequence,
        use_template: Callable[[ChatTemplate], None],
    ) -> None:
        self._model = model
        self._tokens = model.tokenizer
        self._chat = chat
        self._kv = kv
        self._use_template = use_template

    def pipeline(self) -> PromptPipeline:
        """The prompt pipeline over this model's template, tokenizer and cache map."""
        return PromptPipeline(
            self._chat.rendering, self._tokens.tokenize, self._kv.map, self._tokens.least_tokens
        )

    def fit(self, request: PromptRequest, stop: threading.Event) -> tuple[Prompt, Overflow, str]:
        """The request's prompt, fitted to the context (older turns dropped, if the policy
        drops), its overflow, and a note when the template's fallback took over.

        Raises:
            ContextOverflowError, ChatTemplateError.
        """
        rendered = render(self._chat.rendering, request.messages)
        if rendered.fallback is not None:
            self._use_template(rendered.fallback)
            self._chat.start(request.params, self._chat.tools)
        overflow = self._overflow(request.messages, request.params.overflow, stop)
        prompt = self.pipeline().fitted(request, rendered.text, overflow)
        return prompt, overflow, rendered.note

    def _overflow(
        self, messages: Sequence[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        def refill(tokens: list[int]) -> bool:
            for _event in self._kv.prefill(tokens, stop):
                pass
            return not stop.is_set()

        return Overflow(
            render=self._chat.rendering.render,
            tokenize=lambda t: self._tokens.tokenize(t, bos=False),
            cmap=self._kv.map,
            mem=self._model.native.memory,
            can_shift=self._model.can_shift,
            refill=refill,
            policy=policy,
            messages=list(messages),
            head=self._model.head,
        )

    def room_maker(
        self,
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
            before = len(self._kv.map.tokens)
            if not overflow.drop(request.budget, keep_last=1):
                return False
            # No boundaries to cut at (a template that folds the system prompt into the
            # first user turn): the kept text is read again, then the reply so far.
            if len(self._kv.map.tokens) >= before and not self._reread_reply(overflow, stop):
                return False
            record_drops(overflow, metrics)
            return True

        return make_room

    def _reread_reply(self, overflow: Overflow, stop: threading.Event) -> bool:
        """Read ``overflow.messages`` again from the last mark they share with the cache,
        then the reply so far (its marks kept); False when there is no room or it stopped."""
        cmap = self._kv.map
        old = cmap.text  # the prompt's text: the reply's is added when it ends
        n_end = cmap.char_mark(len(old))
        if n_end is None:
            return False
        reply = cmap.tokens[n_end:]
        reply_marks = [(n - n_end, c - len(old)) for n, c in cmap.marks if n > n_end]
        prompt = self.pipeline().build(overflow.messages)
        if len(prompt.tokens) + len(reply) >= self._model.llm.n_ctx():
            return False
        self._kv.rewind(prompt.n_mark)  # may empty the cache: then all of the prompt is read
        start = len(cmap.tokens)
        for _event in self._kv.prefill(prompt.tokens[start:], stop):
            pass
        if len(cmap.tokens) < len(prompt.tokens):
            return False
        self._kv.mark_prompt(prompt)
        for _event in self._kv.prefill(reply, stop):
            pass
        if len(cmap.tokens) < len(prompt.tokens) + len(reply):
            return False
        cmap.marks += [(n + len(prompt.tokens), c + len(prompt.text)) for n, c in reply_marks]
        overflow.reread_tokens += len(prompt.tokens) - start + len(reply)
        return True

    def prewarm(
        self,
        messages: Sequence[ChatMessage],
        reply: ChatMessage,
        seen: Sequence[ChatMessage] | None = None,
    ) -> int:
        """Make the cache hold the history and the opening of the next turn (see
        ``Engine.prewarm``). ``seen``: what the model still saw of ``messages`` after
        an overflow. Returns the number of tokens evaluated."""
        if self._kv.lora_stale or self._chat.rendering.completion:
            # Continue-the-text mode opens no turn: the next text may follow with no space.
            return 0  # the cache belongs to the previous stack; generate will rebuild it
        self._tokens.use_images(messages)
        turn = self.pipeline().next_turn(seen if seen is not None else messages, reply)
        if turn is None:
            return 0
        head, (n_keep, c_keep), split = turn.head, turn.keep, turn.split
        first = self._tokens.tokenize(head[c_keep:split], bos=False)
        tokens = first + self._tokens.tokenize(head[split:], bos=False)
        if not tokens or n_keep + len(tokens) + 1 >= self._model.llm.n_ctx():
            return 0
        if self._kv.rewind(n_keep):
            return 0  # the cache was emptied: the next message reads it all anyway
        stop = threading.Event()
        done = 0
        for event in self._kv.prefill(tokens, stop):
            done = event.done
        if done != len(tokens):
            return 0
        cmap = self._kv.map
        if first and split > c_keep:
            cmap.mark_at(len(cmap.tokens) - len(tokens) + len(first), split)
        cmap.mark(head)
        return done
