"""The one prompt driver: the in-process engine and the llama-server backend both use it.

It owns the sequence a reply's prompt goes through (``docs/notes/prompts.md``):

1. which template: the one the backend's ``Templates`` render with now (the request's
   switches and tools bound); when it fails on the conversation, its fallback, kept from
   then on (``Templates.fall_back``);
2. render, tokenize with message marks, fit the context (``PromptPipeline``), older turns
   dropped through the backend's ``Overflow`` (``record_drops`` notes them in the reply);
3. what the model still sees of the conversation after those drops (``seen``), and the
   next turn opened ahead of time over it (``warm_up``, ``prewarm``).

What differs between backends is a ``PromptCache``: how text becomes tokens, what the cache
holds (its ``ContextMap``), how a drop reaches it (shift, re-read, or nothing: the server
re-reads), and how the next turn's opening is read into it (llama.cpp's KV sequence 0, or a
``/completion`` with ``n_predict`` 0 on the server's slot).

Issue 42 (chat formats): how a template's output is parsed (its reasoning markers, its
tool-call syntax) is still chosen by each backend from ``Prepared.template`` and the
prompt's text (``thinking_control``, ``tool_decoding``). The format seam goes here, beside
``Templates``: one format per template, chosen in ``fit`` and carried in ``Prepared``,
so both backends parse a reply the same way. Not built yet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import (
    LeastTokens,
    Prompt,
    PromptPipeline,
    PromptRequest,
    Rendered,
    render,
)
from app.engine.templates.chat_template import ChatTemplate
from app.util.errors import ContextOverflowError

Render = Callable[[Sequence[ChatMessage], bool], str]


class Templates(Protocol):
    """Which template a backend renders with (its own state: the driver keeps none)."""

    @property
    def rendering(self) -> ChatTemplate:
        """The template in use, the request's switches and tools bound."""
        ...

    def fall_back(self, fallback: ChatTemplate, params: SamplingParams) -> None:
        """The template in use failed on a conversation: render with ``fallback``
        (``Rendered.fallback``, bound) from now on, for this request too."""
        ...


class PromptCache(Protocol):
    """What the driver needs of a backend's cache and tokenizer."""

    refused: type[ContextOverflowError]  # raised when a prompt cannot fit
    least_tokens: LeastTokens | None  # a quick lower bound on a text's tokens, if known

    @property
    def map(self) -> ContextMap:
        """What the cache holds: tokens, their text, message marks."""
        ...

    def tokenize(self, text: str, bos: bool = False) -> list[int]:
        """Token ids for prompt text, special tokens parsed (BOS when asked and wanted)."""
        ...

    def overflow(
        self, render: Render, messages: list[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        """A request's overflow over ``messages``: how a drop reaches this cache."""
        ...

    def warm(self, warm: Warmup, stop: threading.Event | None = None) -> int:
        """Make the cache hold ``warm.tokens`` (keep up to ``n_keep``, read the rest); the
        number of tokens read, 0 when it could not or ``stop`` was set (the cache then as
        its map says)."""
        ...


@dataclass(frozen=True)
class Prepared:
    """A reply's prompt, fitted: its tokens, the overflow that fitted it, the template it
    was rendered with, and the note to show when that was the fallback."""

    prompt: Prompt
    overflow: Overflow
    template: ChatTemplate
    rendered: Rendered


@dataclass(frozen=True)
class Warmup:
    """The cache's tokens after the next turn's opening is read (``prewarm``): the
    ``n_keep`` it keeps, then ``n_new`` more; ``head`` is their text, ``mark`` a message
    start inside it (tokens, characters), if any."""

    tokens: list[int]
    n_keep: int
    n_new: int
    head: str
    mark: tuple[int, int] | None


class PromptDriver:
    """The prompt steps for one backend's ``templates`` and ``cache``."""

    def __init__(self, templates: Templates, cache: PromptCache) -> None:
        self._templates = templates
        self._cache = cache
        # The last request's messages, and its overflow (what the model still sees).
        self._sent: tuple[list[ChatMessage], Overflow] | None = None

    def pipeline(self) -> PromptPipeline:
        """The prompt pipeline over the template in use, the tokenizer and the cache's map."""
        cache = self._cache
        return PromptPipeline(
            self._templates.rendering, cache.tokenize, cache.map, cache.least_tokens
        )

    def prepare(self, request: PromptRequest, stop: threading.Event) -> Prepared:
        """The request's prompt: ``render`` then ``fit``.

        Raises:
            ContextOverflowError (``PromptCache.refused``), ChatTemplateError, and the
            tokenizer's errors.
        """
        return self.fit(request, self.render(request), stop)

    def render(self, request: PromptRequest) -> Rendered:
        """The request's text, with the fallback's when the template in use fails on it
        (the fallback is then the template in use, ``Templates.fall_back``).

        Raises:
            ChatTemplateError.
        """
        rendered = render(self._templates.rendering, request.messages)
        if rendered.fallback is not None:
            self._templates.fall_back(rendered.fallback, request.params)
        return rendered

    def fit(self, request: PromptRequest, rendered: Rendered, stop: threading.Event) -> Prepared:
        """The prompt of ``rendered`` (the request's text), fitted to the context, older
        turns dropped if the policy drops; what the model still sees is kept (``seen``).

        Raises:
            ContextOverflowError (``PromptCache.refused``), ChatTemplateError, and the
            tokenizer's errors.
        """
        template = self._templates.rendering
        messages, policy = list(request.messages), request.params.overflow
        overflow = self._cache.overflow(template.render, messages, policy, stop)
        prompt = self.pipeline().fitted(request, rendered.text, overflow, self._cache.refused)
        self._sent = (list(messages), overflow)
        return Prepared(prompt, overflow, template, rendered)

    def build(self, messages: Sequence[ChatMessage]) -> Prompt:
        """``messages``' prompt over the cache as it is (after a drop); the map unchanged."""
        return self.pipeline().build(messages)

    def forget(self) -> None:
        """Another conversation comes next."""
        self._sent = None

    def seen(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        """What the model still sees of ``messages``: fewer after the last request's drops."""
        sent = self._sent
        return sent[1].messages if sent is not None and sent[0] == list(messages) else messages

    def warm_up(
        self, messages: Sequence[ChatMessage], reply: ChatMessage, n_ctx: int
    ) -> Warmup | None:
        """The history as the template renders it with ``reply`` (past thinking dropped,
        say) and the next turn's opening, as the cache should hold it: kept up to the
        last text they share, the rest to read. None when there is nothing to read.

        Raises:
            ChatTemplateError: the template failed on the conversation with the reply.
        """
        if self._templates.rendering.completion:
            return None  # continue-the-text mode opens no turn
        turn = self.pipeline().next_turn(self.seen(messages), reply)
        if turn is None:
            return None
        head, (n_keep, c_keep), split = turn.head, turn.keep, turn.split
        first = self._cache.tokenize(head[c_keep:split])
        extra = first + self._cache.tokenize(head[split:])
        if not extra or n_keep + len(extra) + 1 >= n_ctx:
            return None
        tokens = [*self._cache.map.tokens[:n_keep], *extra]
        mark = (n_keep + len(first), split) if first and split > c_keep else None
        return Warmup(tokens, n_keep, len(extra), head, mark)

    def opening(self, messages: Sequence[ChatMessage], n_ctx: int) -> Warmup | None:
        """What the cache holds once a new chat's opening with ``messages`` is read (a
        project's system turn, ``PromptPipeline.opening``): None when there is none.

        Raises:
            ChatTemplateError: the template failed on the messages.
        """
        if self._templates.rendering.completion:
            return None  # continue-the-text mode renders no turns
        head = self.pipeline().opening(messages)
        if head is None:
            return None
        tokens = self._cache.tokenize(head, True)
        if not tokens or len(tokens) + 1 >= n_ctx:
            return None
        return Warmup(tokens, 0, len(tokens), head, None)

    def warm_opening(self, warm: Warmup, stop: threading.Event | None = None) -> int:
        """Read ``warm`` (``opening``) into an empty cache, marked at its end so the first
        question's prompt keeps it; the tokens read (0: it could not, or ``stop``)."""
        read = self._cache.warm(warm, stop)
        if read:
            self._cache.map.mark(warm.head)
        return read

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage, n_ctx: int) -> int:
        """Make the cache hold the history and the opening of the next turn
        (``warm_up``); the number of tokens read (0: nothing done).

        Raises:
            ChatTemplateError: the template failed on the conversation with the reply.
        """
        warm = self.warm_up(messages, reply, n_ctx)
        read = self._cache.warm(warm) if warm is not None else 0
        if warm is None or not read:
            return 0
        cmap = self._cache.map
        if warm.mark is not None:
            cmap.mark_at(*warm.mark)
        cmap.mark(warm.head)
        return read
