"""One prompt pipeline for every backend that renders its own prompt.

The steps, in order (``docs/notes/prompts.md``):

1. ``render``: the chat template's text, or its fallback's when a chosen template
   fails on this conversation (the backend then keeps the fallback);
2. ``PromptPipeline.build``: tokens for that text, reusing the cached tokens up to the
   last mark whose text still matches and tokenizing the rest message by message, so
   message starts come back as marks (a later overflow can cut whole messages); first,
   ``certain_overflow`` refuses at once a long prompt that a lower bound on its tokens
   (``least_tokens``) says cannot fit, whatever the policy drops (25 MB took 75 s to
   tokenize, and Stop cannot cut a tokenization short);
3. ``PromptPipeline.fit``: while prompt plus reply budget overflow the context, drop
   whole older turns (``Overflow.drop``) and build again;
4. ``record_drops``: what was dropped, and text read again, into the reply's metrics;
5. ``PromptPipeline.next_turn``: the text that opens the user's next turn (prewarm).

``driver.PromptDriver`` runs these steps for both backends that render their own prompt,
over each one's tokenizer and cache map (llama.cpp's and KV sequence 0's in-process,
``/tokenize`` and the slot's for llama-server). New prompt features (tools, reasoning
switches, images) belong in ``PromptRequest`` and here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.image_part import has_markers, split_markers
from app.engine.metrics import MessageMetrics
from app.engine.prompt.overflow import Overflow, fewest_kept, message_starts, reply_budget
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate, render_or_fall_back
from app.util.errors import ContextOverflowError

Tokenize = Callable[[str, bool], list[int]]
"""Token ids for prompt text, special tokens parsed; the flag asks for BOS (if wanted)."""
LeastTokens = Callable[[str], int]
"""A lower bound on the tokens ``Tokenize`` makes of prompt text, found without it (0: none)."""

EMPTY_PROMPT = (
    "The chat template rendered an empty prompt: there is nothing to send to the "
    "model. Edit the conversation, or start a new chat."
)
SENTINEL = "\ue000"  # a private-use character no template produces
# Shorter prompts are not bounded first: they tokenize in well under a second (0.2 s here).
EARLY_CHARS = 1 << 18


@dataclass(frozen=True)
class PromptRequest:
    """What one reply's prompt is made from: the pipeline's single input."""

    messages: Sequence[ChatMessage]
    params: SamplingParams
    n_ctx: int

    @property
    def budget(self) -> int:
        """Room a drop leaves for the reply (``reply_budget``)."""
        return reply_budget(self.params.max_tokens, self.n_ctx)


@dataclass(frozen=True)
class Rendered:
    """The prompt text, and the fallback template to keep when the chosen one failed."""

    text: str
    fallback: ChatTemplate | None = None

    @property
    def note(self) -> str:
        """For the reply's metrics: why the fallback took over ("" when it did not)."""
        return self.fallback.note.rstrip(".") if self.fallback is not None else ""


@dataclass(frozen=True)
class Prompt:
    """A prompt's tokens, the text they encode, the cached tokens and text it reuses
    (``n_mark``, ``c_mark``) and the message starts in it (``bounds``: tokens, characters)."""

    tokens: list[int]
    text: str
    n_mark: int
    c_mark: int
    bounds: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class NextTurn:
    """The history as the template renders it up to the user's next words (``head``),
    the cache mark it shares with it (``keep``: tokens, characters) and where the
    reply's turn ends inside it (``split``)."""

    head: str
    keep: tuple[int, int]
    split: int


def render(template: ChatTemplate, messages: Sequence[ChatMessage]) -> Rendered:
    """Step 1: the prompt text, with the fallback's when ``template`` fails.

    Raises:
        ChatTemplateError: the template (and its fallback, if any) failed.
    """
    text, fallback = render_or_fall_back(template, messages)
    return Rendered(text, fallback)


def least_tokens(text: str, longest: int) -> int:
    """At least how many tokens ``text`` takes when no token stands for more than
    ``longest`` bytes of it (0 when ``longest`` is 0: no bound known). Image markers
    count none: an image's tokens are the backend's, not its marker's."""
    if longest <= 0:
        return 0
    parts = split_markers(text) if has_markers(text) else [(False, text)]
    size = sum(len(part.encode("utf-8", "replace")) for image, part in parts if not image)
    return -(-size // longest)


def record_drops(overflow: Overflow, metrics: MessageMetrics) -> None:
    """Step 4: the request's drops so far, and text read again, into ``metrics`` (one note)."""
    metrics.dropped_from = overflow.dropped_from
    metrics.dropped_count = overflow.dropped_count
    metrics.dropped_tokens = overflow.dropped_tokens
    # Text read again because the cache could not shift is evaluated work too.
    metrics.evaluated_tokens += overflow.reread_tokens - overflow.reread_reported
    overflow.reread_reported = overflow.reread_tokens
    if overflow.noted in metrics.notes:
        metrics.notes.remove(overflow.noted)  # a later drop in the same reply: one note
    overflow.noted = overflow.note()
    if overflow.noted:
        metrics.notes.append(overflow.noted)


class PromptPipeline:
    """Steps 2, 3 and 5 over one backend's template, tokenizer and context map."""

    def __init__(
        self,
        template: ChatTemplate,
        tokenize: Tokenize,
        cmap: ContextMap,
        least: LeastTokens | None = None,
    ) -> None:
        self.template = template
        self._tokenize = tokenize
        self._map = cmap
        self._least = least

    def certain_overflow(self, request: PromptRequest, text: str) -> int:
        """Step 2, first: a lower bound on the prompt's tokens when that many can never
        fit the context, else 0. ``text`` is ``request.messages`` rendered.

        The bound is taken of what stays when the policy drops all it may
        (``fewest_kept``): a prompt refused now is one ``fit`` could not have saved.
        """
        if self._least is None or len(text) < EARLY_CHARS:
            return 0
        kept = fewest_kept(request.messages, request.params.overflow)
        if len(kept) < len(request.messages):
            try:
                text = self.template.render(kept, True)
            except ChatTemplateError:
                return 0  # the long way says what is wrong
        least = self._least(text)
        return least if least >= request.n_ctx else 0

    def fitted(
        self,
        request: PromptRequest,
        text: str,
        overflow: Overflow,
        refused: type[ContextOverflowError] = ContextOverflowError,
    ) -> Prompt:
        """Steps 2 and 3: the prompt of ``text`` (``overflow.messages`` rendered), fitted.

        Raises:
            ContextOverflowError (``refused``): it does not fit; at once, tokenizing
                nothing, when ``certain_overflow`` says it cannot.
            ChatTemplateError.
        """
        least = self.certain_overflow(request, text)
        if least:
            raise refused(least + 1, request.n_ctx, at_least=True)
        prompt = self.fit(request, self.build(overflow.messages, text), overflow)
        if len(prompt.tokens) >= request.n_ctx:
            raise refused(len(prompt.tokens) + 1, request.n_ctx)
        return prompt

    def build(self, messages: Sequence[ChatMessage], text: str | None = None) -> Prompt:
        """Step 2: the tokens of ``text`` (``messages`` rendered, by default).

        The cached tokens are kept up to the last mark whose text is a prefix of
        ``text``; the rest is tokenized message by message (BOS before the first piece
        when nothing is kept). The map is not changed.

        Raises:
            ChatTemplateError: the template rendered nothing (or failed).
        """
        if text is None:
            text = self.template.render(messages, True)
        n_mark, c_mark = self._map.match(text)
        starts = message_starts(self.template.render, messages, text, after=c_mark)
        cuts = sorted(c for c in starts.values() if c_mark < c < len(text))
        tokens = self._map.tokens[:n_mark]
        bounds = []
        pos = c_mark
        for cut in [*cuts, len(text)]:
            piece = text[pos:cut]
            if piece:
                tokens += self._tokenize(piece, not tokens)
            if cut < len(text):
                bounds.append((len(tokens), cut))
            pos = cut
        if not tokens:  # llama.cpp aborts the process on an empty batch
            raise ChatTemplateError(EMPTY_PROMPT)
        return Prompt(tokens, text, n_mark, c_mark, bounds)

    def fit(self, request: PromptRequest, prompt: Prompt, overflow: Overflow) -> Prompt:
        """Step 3: drop whole older turns until ``prompt`` and the reply budget fit.

        A drop is measured per message, so the whole prompt is measured again after
        each (three tries at most). Marks past the reused ones are forgotten before
        a drop and once it fits; a prompt still too long comes back as it is, for the
        caller to refuse.
        """
        policy, n_ctx, budget = request.params.overflow, request.n_ctx, request.budget
        for _ in range(3):
            if policy == "stop" or len(prompt.tokens) + budget <= n_ctx:
                break
            self._map.keep_marks(prompt.n_mark)
            if not overflow.drop(len(prompt.tokens) + budget - n_ctx, keep_last=1):
                break
            prompt = self.build(overflow.messages)
        if len(prompt.tokens) < n_ctx:
            self._map.keep_marks(prompt.n_mark)
        return prompt

    def opening(self, messages: Sequence[ChatMessage]) -> str | None:
        """The text every chat that starts with ``messages`` (a project's system turn)
        opens with: the template's rendering up to where the first question's words go.
        None when the template puts nothing before them, or does not render the system
        text there (it may fold it into the question's turn after the words).

        Raises:
            ChatTemplateError: the template failed on the messages.
        """
        head = self._before_sentinel([*messages, ChatMessage("user", SENTINEL)])
        if head is None:
            return None
        said = [m.content.strip() for m in messages if isinstance(m.content, str)]
        if not all(text in head for text in said if text):
            return None
        return head

    def next_turn(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> NextTurn | None:
        """Step 5: the history the next turn will render after ``reply``, and how much of
        the cache it keeps; None when the cache already holds it, or shares nothing.

        The cache holds the reply as generated; the template may render it otherwise
        (past thinking dropped, trailing whitespace trimmed), so the cache is kept only
        up to the last mark that still matches, and the rest is evaluated again.

        Raises:
            ChatTemplateError: the template failed on the conversation with the reply.
        """
        # After calls, the next turn is the first call's result; else the user's words.
        first = reply.tool_calls[0] if reply.tool_calls else None
        nxt = (
            ChatMessage("tool", SENTINEL, tool_call_id=first.id, name=first.name)
            if first is not None
            else ChatMessage("user", SENTINEL)
        )
        head = self._before_sentinel([*messages, reply, nxt])
        if head is None:
            return None
        n_keep, c_keep = self._map.match(head)
        if n_keep == 0 or c_keep >= len(head):
            return None
        # The next message starts where the reply's turn ends: a mark there lets a
        # context overflow drop whole turns later.
        try:
            turn = self.template.render([*messages, reply], False)
        except ChatTemplateError:
            turn = ""
        # Only a turn shorter than the head is used: its start is then the head's.
        turn_end = len(turn) if turn and head.startswith(turn) else -1
        split = turn_end if c_keep < turn_end < len(head) else c_keep
        return NextTurn(head, (n_keep, c_keep), split)

    def _before_sentinel(self, history: Sequence[ChatMessage]) -> str | None:
        """``history`` rendered without the generation prompt, up to the ``SENTINEL``
        standing for the next message's words (None when nothing comes before it).

        Raises:
            ChatTemplateError: the template failed on the history.
        """
        rendered = self.template.render(history, False)
        cut = rendered.find(SENTINEL)
        return rendered[:cut] if cut > 0 else None
