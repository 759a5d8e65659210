"""Generating a reply once its prompt is in the KV cache: the decode loops.

The loops call llama.cpp directly (``llama_decode`` on a one-token batch, the
native sampler chain), so no per-token copy of the logits row is made in
Python. They run once per token: keep them free of Python work that could be
done before the loop.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.config.setting_records import SamplingParams
from app.engine.backend import CallProgress, EngineEvent, Finished, Token
from app.engine.context_map import ContextMap
from app.engine.local.draft.drafters import Drafter
from app.engine.local.draft.length import RETRY, DraftLength
from app.engine.local.guess_check import GuessCheck, take_back
from app.engine.local.sampler import build_sampler
from app.engine.metrics import MessageMetrics
from app.engine.native.chat_shim import load_shim
from app.engine.native.handles import Native
from app.engine.stopping import StopStringFilter
from app.engine.templates.thinking import ThinkingControl
from app.engine.tool_spec import TOOL_CALLS
from app.util.errors import DecodeError
from app.util.sysinfo import rss_bytes

if TYPE_CHECKING:
    from app.engine.tools.binding import CallParser, ToolDecoding

Shown = Token | CallProgress  # what a sampled token shows: text, or a call's progress


class Reply:
    """The reply being generated: its text, stop strings, and the cache's text marks.

    ``emit`` turns a sampled token into events to show (thinking apart from answer
    when the template marks thinking); ``commit`` records that the token is now in
    the KV cache (so its text is part of what the cache holds).
    """

    def __init__(
        self,
        cmap: ContextMap,
        token_bytes: Callable[[int], bytes],
        params: SamplingParams,
        template_stops: tuple[str, ...],
        metrics: MessageMetrics,
        t0: float,
        thinking: ThinkingControl | None = None,
        tools: CallParser | None = None,
    ) -> None:
        self._map = cmap
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = (*params.stop, *template_stops)
        self._stops = StopStringFilter(stops)
        self._think_stops = StopStringFilter(stops)  # thinking's own: held text stays thinking
        self._metrics = metrics
        self._t0 = t0
        self.thinking = thinking
        self.tools = tools  # answer text goes through it: calls are taken out
        self._parts: list[str] = []
        self._thought: list[str] = []
        self._raw: list[str] = []  # decoded text before stop-string filtering: what the KV holds
        self._raw_len = 0
        self._piece = ""
        self.count = 0
        self._call_tokens = 0  # of the tool call being written (its text is held back)

    @property
    def hit(self) -> bool:
        return self._stops.hit or self._think_stops.hit

    @property
    def matched(self) -> str:
        """The stop string that ended the reply ("" for none, or a template's token)."""
        return self._stops.matched or self._think_stops.matched

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def reasoning(self) -> str:
        return "".join(self._thought).strip()

    def emit(self, token: int) -> list[Shown]:
        now = (time.perf_counter() - self._t0) * 1000
        self._metrics.token_times_ms.append(now)
        self._metrics.generated_tokens += 1
        self.count += 1
        self._piece = self._decoder.decode(self._token_bytes(token))
        think = self.thinking
        if think is None:
            text = self._stops.feed(self._piece)
            if text and self.tools is not None:
                text = self.tools.feed(text)
            if text:
                self._parts.append(text)
                return [Token(text)]
            return self._call_progress()
        was = think.splitter.inside
        out = self._split(think.splitter.feed(self._piece, token in think.markers))
        if was or think.splitter.inside:
            self._metrics.reasoning_tokens += 1
        if not self._metrics.first_answer_ms and any(not t.reasoning for t in out):
            self._metrics.first_answer_ms = now
        shown: list[Shown] = [*out]
        return shown or self._call_progress()

    def _call_progress(self) -> list[Shown]:
        """A token that went into a tool call shows nothing: say how far the call got
        (a small model can write one for minutes)."""
        parser = self.tools
        if parser is None or not parser.started:
            return []
        self._call_tokens += 1
        return [CallProgress(self._call_tokens, parser.call_chars)]

    def _split(self, parts: list[tuple[bool, str]]) -> list[Token]:
        out: list[Token] = []
        for thought, text in parts:
            if not thought:
                held = self._think_stops.flush()  # the block ended: what it held was thinking
                if held:
                    self._thought.append(held)
                    out.append(Token(held, True))
            shown = (self._think_stops if thought else self._stops).feed(text)
            if shown and not thought and self.tools is not None:
                shown = self.tools.feed(shown)
            if shown:
                (self._thought if thought else self._parts).append(shown)
                out.append(Token(shown, thought))
        return out

    def inject(self, shown: str, text: str, tokens: list[int]) -> list[Token]:
        """``tokens`` (encoding ``text``) were evaluated to close the thinking block: the
        cache holds them; ``shown`` is the thinking text to show for them."""
        assert self.thinking is not None
        out = self._split([*self.thinking.splitter.end_thinking(), (True, shown)])
        held = self._think_stops.flush()
        if held:
            self._thought.append(held)
            out.append(Token(held, True))
        self._map.tokens.extend(tokens)
        self._raw.append(text)
        self._raw_len += len(text)
        self._map.marks.append((len(self._map.tokens), len(self._map.text) + self._raw_len))
        return out

    def commit(self, token: int) -> None:
        self._map.tokens.append(token)
        if self._piece:
            self._raw.append(self._piece)
            self._raw_len += len(self._piece)
            self._piece = ""
        if not self._decoder.getstate()[0]:  # no partial UTF-8 character pending
            self._map.marks.append((len(self._map.tokens), len(self._map.text) + self._raw_len))

    def ended(self, max_tokens: int) -> str:
        """ "stop_string" or "max_tokens" once the reply must end, else ""."""
        if self.hit:
            return "stop_string"
        return "max_tokens" if self.count >= max_tokens else ""

    def close(self) -> None:
        # ``text`` is still the prompt's (a context shift may have shortened it).
        self._map.text = self._map.text + "".join(self._raw)
        self._map.keep_marks(len(self._map.tokens))

    def tail(self) -> list[Token]:
        """Text held back for a possible stop string or marker, once the reply has ended."""
        if self.hit:
            return []
        rest = self._decoder.decode(b"", final=True)
        if self.thinking is None:
            return self._answer_tail(self._stops.feed(rest) + self._stops.flush())
        splitter = self.thinking.splitter
        out = self._split(splitter.feed(rest) + splitter.flush())
        held = self._think_stops.flush()
        if held:
            self._thought.append(held)
            out.append(Token(held, True))
        return out + self._answer_tail(self._stops.flush())

    def _answer_tail(self, text: str) -> list[Token]:
        """The answer's last text: what the stop filter held, then what the tool-call
        parser held (a call that did not parse comes back as text)."""
        if self.tools is not None:
            text = (self.tools.feed(text) if text else "") + self.tools.finish()
        if text:
            self._parts.append(text)
            return [Token(text)]
        return []


@dataclass
class DecodeJob:
    """One reply's decoding, once its prompt is in the KV cache.

    ``native`` is the loaded model's handles; ``cmap`` the engine's map of its KV
    sequence 0, kept up to date as tokens are evaluated. ``token_bytes`` gives a
    token's text, ``rewind`` is the engine's cache rewind. ``stop_ids`` are stop
    strings that are single tokens with no text (``<start_of_turn>``): sampling one
    ends the reply like its stop string. ``drafter`` (with the draft length
    ``length``) picks speculative decoding. ``make_room`` frees space when the
    context is full (dropping older messages); when it cannot, the reply ends with
    ``context_full``.
    """

    native: Native
    cmap: ContextMap
    params: SamplingParams
    seed: int
    metrics: MessageMetrics
    t0: float
    stop: threading.Event
    token_bytes: Callable[[int], bytes]
    rewind: Callable[[int], str]
    template_stops: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    drafter: Drafter | None = None
    length: DraftLength | None = None
    make_room: Callable[[], bool] = field(default=lambda: False)
    thinking: ThinkingControl | None = None  # a template that marks thinking
    tools: ToolDecoding | None = None  # the tools the model may call
    tokenize: Callable[[str], list[int]] = field(default=lambda _text: [])  # no BOS
    # Called once the reply is in the cache (a recurrent state's checkpoint is kept there).
    ended: Callable[[], None] = field(default=lambda: None)


def decode(job: DecodeJob) -> Generator[EngineEvent, None, None]:
    """Sample the reply after the prompt in ``job.cmap``: ``Token`` events, then ``Finished``."""
    import llama_cpp

    native, cmap, params, metrics = job.native, job.cmap, job.params, job.metrics
    tools = job.tools
    grammar = tools.grammar if tools is not None else None
    sampler = build_sampler(native.llm, params, job.seed, cmap.tokens, tools=grammar)
    parser = tools.parser if tools is not None else None
    reply = Reply(
        cmap, job.token_bytes, params, job.template_stops, metrics, job.t0, job.thinking, parser
    )
    try:
        if job.drafter is not None:
            length = job.length or DraftLength(params.draft_len, params.adaptive_draft)
            reason = yield from loop_draft(job, sampler, reply, job.drafter, length)
        else:
            reason = yield from loop_plain(job, sampler, reply)
    finally:
        llama_cpp.llama_sampler_free(sampler)
        reply.close()
    yield from reply.tail()
    calls = tuple(parser.calls) if parser is not None and reason != "cancelled" else ()
    if parser is not None:
        metrics.notes.extend(parser.problems)
    metrics.stop_reason = TOOL_CALLS if calls else reason
    metrics.stop_match = reply.matched if reason == "stop_string" else ""
    metrics.kv_tokens = len(cmap.tokens)
    read_perf(native, metrics)
    job.ended()
    yield Finished(reply.text, metrics, reply.reasoning, calls)


def read_perf(native: Native, metrics: MessageMetrics) -> None:
    """llama.cpp's own prefill and decode speeds, and the process's memory, into ``metrics``."""
    perf = native.perf()
    if perf.prompt_ms > 0:
        metrics.native_prefill_tok_s = perf.n_prompt * 1000.0 / perf.prompt_ms
    if perf.decode_ms > 0:
        metrics.native_decode_tok_s = perf.n_decode * 1000.0 / perf.decode_ms
    metrics.rss_mb = rss_bytes() / 1e6


def loop_plain(job: DecodeJob, sampler: Any, reply: Reply) -> Generator[Shown, None, str]:
    """One token per llama_decode (the fastest path when nothing can be drafted)."""
    import llama_cpp

    native, cmap, stop, stop_ids = job.native, job.cmap, job.stop, job.stop_ids
    ctx, vocab, n_ctx = native.ctx, native.vocab, native.n_ctx()
    decode_one = native.decode_one
    think = job.thinking
    for _ in range(job.params.max_tokens):
        if stop.is_set():
            return "cancelled"
        if len(cmap.tokens) >= n_ctx and not job.make_room():
            return "context_full"
        if think is not None and (why := think.due(job.metrics.reasoning_tokens)):
            ended = yield from end_thinking(job, sampler, reply, why)
            if ended:
                return ended
        tok = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            return "eos"
        if tok in stop_ids:
            return "stop_string"
        yield from reply.emit(tok)
        if reply.hit:
            return "stop_string"
        if stop.is_set():
            return "cancelled"
        rc = decode_one(tok)
        if rc != 0:
            job.rewind(len(cmap.tokens))
            raise DecodeError(f"llama.cpp failed while generating (code {rc}).")
        reply.commit(tok)
    return "max_tokens"


def end_thinking(
    job: DecodeJob, sampler: Any, reply: Reply, why: str, drafter: Drafter | None = None
) -> Generator[Shown, None, str]:
    """Close the thinking block now (``why``: "budget" spent, or "user" Stop thinking): evaluate the
    budget message and the template's closing text, so the model goes on to answer.
    Returns a stop reason when the reply must end instead ("" to go on).

    Raises:
        DecodeError: llama.cpp failed (what it evaluated is removed).
    """

    think, native, cmap = job.thinking, job.native, job.cmap
    assert think is not None
    shown, text = think.closing(why)
    tokens = job.tokenize(text)
    if len(cmap.tokens) + len(tokens) + 1 >= native.n_ctx():
        return "context_full"
    n_past = len(cmap.tokens)
    for start in range(0, len(tokens), native.n_batch):
        rc = native.decode(tokens[start : start + native.n_batch])
        if rc != 0:
            take_back(native, cmap, n_past)
            raise DecodeError(f"llama.cpp failed while ending the thinking (code {rc}).")
    if job.params.output_format == "text" and not _accept_text(sampler, native, tokens, text):
        # A tool grammar refused the closing text (llama.cpp would have thrown through
        # ctypes and ended the process): end the reply rather than sample from it.
        job.metrics.notes.append("The reply's tool-call grammar refused the end of its thinking.")
        return "stop"
    job.metrics.thinking_cut = why
    yield from reply.inject(shown, text, tokens)
    if drafter is not None:
        drafter.sync(cmap.tokens, job.stop)
    return ""


def _accept_text(sampler: Any, native: Native, tokens: list[int], text: str) -> bool:
    """The sampler chain (and its grammar) told of text the engine evaluated itself.
    Through the chat shim, which catches a grammar's refusal; without it, token by token
    (then only the Python path's lazy grammars, which accept it, are in the chain)."""
    import llama_cpp

    shim = load_shim()
    if shim is not None:
        return shim.grammar_prefill(sampler, native.vocab, text)
    for tok in tokens:
        llama_cpp.llama_sampler_accept(sampler, tok)
    return True


def loop_draft(
    job: DecodeJob, sampler: Any, reply: Reply, drafter: Drafter, length: DraftLength
) -> Generator[Shown, None, str]:
    """Speculative decoding: ``drafter`` guesses, the target checks the guesses in one batch
    (``GuessCheck``: every token is still the target's own sample). Rejected guesses are
    removed from the KV cache. A step with no guesses (``length`` says 0, or the drafter
    has none) is a plain one-token step, as in :func:`loop_plain`.
    """
    import llama_cpp

    native, cmap, params, metrics, stop = job.native, job.cmap, job.params, job.metrics, job.stop
    ctx, vocab, n_ctx = native.ctx, native.vocab, native.n_ctx()
    k_max = max(1, length.k_max)
    check = GuessCheck(native, cmap, sampler, k_max, job.stop_ids)
    sample = llama_cpp.llama_sampler_sample
    perf = time.perf_counter
    metrics.draft_kind = drafter.kind
    try:
        drafter.sync(cmap.tokens, stop)
        pending = sample(sampler, ctx, -1)
        while True:
            if stop.is_set():
                return "cancelled"
            if len(cmap.tokens) >= n_ctx:
                if not job.make_room():
                    return "context_full"
                drafter.sync(cmap.tokens, stop)
            if job.thinking is not None and (why := job.thinking.due(metrics.reasoning_tokens)):
                ended = yield from end_thinking(job, sampler, reply, why, drafter)
                if ended:
                    return ended
                pending = sample(sampler, ctx, -1)  # the one before the block closed is dropped
            n_past = len(cmap.tokens)
            if llama_cpp.llama_vocab_is_eog(vocab, pending):
                return "eos"
            if pending in job.stop_ids:
                return "stop_string"
            yield from reply.emit(pending)
            ended = reply.ended(params.max_tokens)
            if ended:
                return ended
            if stop.is_set():
                return "cancelled"
            drafter.observe((pending,))
            left = min(params.max_tokens - reply.count, n_ctx - n_past - 2, k_max)
            room = min(length.next(drafter.lag), left)
            t0 = perf()
            draft = drafter.propose(room, length.read_limit) if room > 0 else []
            spent = ((t1 := perf()) - t0) * 1000
            metrics.draft_ms += spent
            if room > 0 and drafter.read_n:
                length.read(drafter.read_n, drafter.read_ms)
            if not draft:
                check.plain(pending, n_past)
                reply.commit(pending)
                pending = sample(sampler, ctx, -1)
                length.plain((perf() - t1) * 1000, drafter.round_ms if room > 0 else 0.0, spent)
                continue
            kept, nxt = check.guesses(pending, draft, n_past, params.max_tokens - reply.count)
            reply.commit(pending)
            length.round(len(draft), kept, (perf() - t1) * 1000, drafter.round_ms, spent)
            used = 0
            for guess in draft[:kept]:
                yield from reply.emit(guess)
                reply.commit(guess)
                used += 1
                if reply.hit or stop.is_set():
                    break
            metrics.drafted_tokens += len(draft)
            metrics.accepted_tokens += used
            drafter.rewind(used)
            if used < len(draft):
                check.reject(n_past + 1 + used)
            ended = reply.ended(params.max_tokens)
            if ended:
                return ended
            pending = nxt
    finally:
        check.close()
        _finish_draft(length, metrics)


def _finish_draft(length: DraftLength, metrics: MessageMetrics) -> None:
    """The draft length's last word on this reply, and a note when drafting stays off."""
    metrics.draft_len_final = length.k
    length.finish()
    if length.adaptive and length.cannot_pay():
        c = length.costs
        metrics.notes.append(
            f"drafting cannot speed this model up here (a guess costs {c.draft_ms:.1f} ms "
            f"against {c.plain_ms:.1f} ms for a model step, and checking guesses in a "
            "batch costs more than they save), so it stays off"
        )
    elif length.resting:
        metrics.notes.append(
            "the draft model did not speed up recent replies, so this one was not "
            f"drafted (it tries again every {RETRY}th reply)"
        )
