"""The prompt the llama-server backend sends: this client renders it (the same templates
and sandbox as in-process), tokenizes it with ``/tokenize``, fits it to the context and
opens the next turn ahead of time, over the slot's ``ContextMap``.

The steps are ``app.engine.prompt.pipeline``'s; this module holds the template state and
drives them for the server's slot, which cannot shift on request (the server re-reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import (
    Prompt,
    PromptPipeline,
    PromptRequest,
    Rendered,
    render,
)
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import (
    AUTO,
    TemplateInputs,
    TemplateOverride,
    build_template,
)
from app.engine.templates.thinking import request_template
from app.remote.llama_server.slot import Slot
from app.remote.llama_server.tokenizer import ServerTokenizer
from app.remote.llama_server.tools import ServerTools
from app.util.errors import ServerOverflowError


@dataclass(frozen=True)
class Warmup:
    """The slot's tokens after the next turn's opening is read (``prewarm``): the
    ``n_keep`` it keeps, then ``n_new`` more; ``head`` is their text, ``mark`` a message
    start inside it (tokens, characters), if any."""

    tokens: list[int]
    n_keep: int
    n_new: int
    head: str
    mark: tuple[int, int] | None


class ServerPrompt:
    """The template in use and the prompts rendered with it for one slot."""

    def __init__(self, tokenizer: ServerTokenizer, slot: Slot) -> None:
        self._tokenizer = tokenizer
        self._slot = slot
        self._template: ChatTemplate | None = None
        self._bound: ChatTemplate | None = None  # the last request's, switches bound
        self._inputs = TemplateInputs()
        # The last request's messages, and those sent after the drops (for ``warm_up``).
        self._sent: tuple[list[ChatMessage], list[ChatMessage]] | None = None

    @property
    def inputs(self) -> TemplateInputs:
        return self._inputs

    def connect(self, inputs: TemplateInputs) -> ChatTemplate:
        """A new server's template inputs; the template chosen automatically."""
        self._inputs = inputs
        template = build_template(AUTO, inputs, self._tokenizer.has_token)
        self._template, self._bound = template, None
        return template

    def clear(self) -> None:
        self._template = self._bound = None
        self._inputs = TemplateInputs()
        self._sent = None

    def forget(self) -> None:
        """Another conversation comes next."""
        self._sent = None

    def choose(self, override: TemplateOverride) -> ChatTemplate:
        """Render with ``override`` from the next request on; the template it builds."""
        template = build_template(override, self._inputs, self._tokenizer.has_token)
        self.use(template)
        return template

    def use(self, template: ChatTemplate) -> None:
        self._template = template
        self._bound = None

    def rendering(self) -> ChatTemplate:
        """The template renders use: the last request's, its switches bound."""
        assert self._template is not None
        return self._bound or self._template

    def stop_strings(self) -> tuple[str, ...]:
        return self._template.stop_strings if self._template is not None else ()

    def _pipeline(self) -> PromptPipeline:
        """The prompt pipeline over the template, ``/tokenize`` and the slot's map."""
        return PromptPipeline(self.rendering(), self._tokenizer.tokenize, self._slot.map)

    def build(self, messages: Sequence[ChatMessage]) -> Prompt:
        """``messages``' prompt; marks past the tokens it reuses are forgotten."""
        prompt = self._pipeline().build(messages)
        self._slot.map.keep_marks(prompt.n_mark)
        return prompt

    def render(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ServerTools
    ) -> tuple[Rendered, ChatTemplate | None]:
        """A request's text, its template's switches bound; with the template now in use
        when the chosen one failed on this conversation and gave way to its fallback.

        Raises:
            ChatTemplateError.
        """
        assert self._template is not None
        template = self._template
        self._bound = tools.bind(request_template(template, params))
        rendered = render(self._bound, messages)
        if rendered.fallback is None or template.fallback is None:
            return rendered, None
        self.use(template.fallback)
        self._bound = rendered.fallback
        return rendered, template.fallback

    def fit(self, request: PromptRequest, text: str) -> tuple[Prompt, Overflow]:
        """The request's prompt (``text``, rendered) fitted to the context, whole older
        turns dropped if the policy drops, and its overflow.

        Raises:
            ChatTemplateError, ServerOverflowError, and the errors of ``/tokenize``.
        """
        pipeline = self._pipeline()
        overflow = Overflow(
            render=pipeline.template.render,
            tokenize=self._tokenizer.tokenize,
            cmap=ContextMap(),  # the slot cannot shift on request: the server re-reads
            mem=None,
            can_shift=False,
            refill=lambda _t: True,
            policy=request.params.overflow,
            messages=list(request.messages),
        )
        prompt = pipeline.build(overflow.messages, text)
        self._slot.map.keep_marks(prompt.n_mark)
        prompt = pipeline.fit(request, prompt, overflow)
        if len(prompt.tokens) >= request.n_ctx:
            raise ServerOverflowError(len(prompt.tokens) + 1, request.n_ctx)
        self._sent = (list(request.messages), overflow.messages)
        return prompt, overflow

    def go_on(self, prompt: Prompt, reply: str, closing: str) -> Prompt:
        """The prompt that continues after ``reply`` (this request's text) and ``closing``:
        the tokens the slot holds (the reply's as sampled) and the closing text's."""
        held = self._slot.map.tokens
        n = len(prompt.tokens)
        if len(held) > n and held[:n] == prompt.tokens:
            tokens = list(held)
        else:  # the server sent no token ids: its text, tokenized
            tokens = prompt.tokens + self._tokenizer.tokenize(reply)
        text = prompt.text + reply + closing
        return replace(prompt, tokens=tokens + self._tokenizer.tokenize(closing), text=text)

    def warm_up(
        self, messages: Sequence[ChatMessage], reply: ChatMessage, n_ctx: int
    ) -> Warmup | None:
        """The history as the template renders it with ``reply`` (past thinking dropped,
        say) and the next turn's opening, as the slot should hold it: kept up to the
        last text they share, the rest to evaluate. None when there is nothing to read."""
        if self.rendering().completion:
            return None  # continue-the-text mode opens no turn
        if self._sent is not None and self._sent[0] == list(messages):
            messages = self._sent[1]
        try:
            turn = self._pipeline().next_turn(messages, reply)
        except ChatTemplateError:
            return None
        if turn is None:
            return None
        head, (n_keep, c_keep), split = turn.head, turn.keep, turn.split
        first = self._tokenizer.tokenize(head[c_keep:split])
        extra = first + self._tokenizer.tokenize(head[split:])
        tokens = [*self._slot.map.tokens[:n_keep], *extra]
        if not extra or len(tokens) + 1 >= n_ctx or min(tokens) < 0:
            return None  # images (negative ids) are sent with their text, in the next request
        mark = (n_keep + len(first), split) if first and split > c_keep else None
        return Warmup(tokens, n_keep, len(extra), head, mark)

    def warmed(self, warm: Warmup) -> None:
        """The server read ``warm``'s tokens: the slot holds them."""
        cmap = self._slot.map
        cmap.truncate(warm.n_keep)
        cmap.tokens = warm.tokens
        if warm.mark is not None:
            cmap.mark_at(*warm.mark)
        cmap.mark(warm.head)
