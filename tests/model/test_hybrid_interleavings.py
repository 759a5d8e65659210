"""Random interleavings of send, stop, regenerate, edit, version switch and snapshot
restore on hybrid and recurrent models (issue 43) keep the engine's cache map equal to
what llama.cpp holds.

A Hypothesis state machine drives the real engine on the tiny random models of
``tests/arch_models.py`` as the app does (a prewarm after each finished reply, none
after a stopped one; a stopped reply kept as far as it got), some replies drafted by
prompt lookup so that rejected guesses are taken back. A hybrid model rewinds only to a
checkpoint of its recurrent state, so every rewind here is one the map must follow
exactly. After every step:

- llama.cpp holds as many positions as the map has tokens, and no checkpoint lies past
  them; the map's text tokenizes to (a prefix of) its tokens;
- exactly one ``Finished`` ends each request.

After each finished reply:

- the reply is the one a second engine gives reading the same messages from scratch
  (so the state llama.cpp holds is the one the map claims);
- the map's text is the rendered prompt and the reply (and, after the prewarm, the
  next turn's opening);
- the engine read no more than what the cache could not already hold: the new message
  after a prewarm, the last prompt token for a regenerate, the new message's turn for
  an edit.

Replies are greedy (a regenerate mostly sampled with a fixed seed, for a version of
other words) and kept to ASCII letters by a grammar: a random byte model's replies are
otherwise invalid UTF-8 (and a space, one byte token when generated, is three tokens
when "▁" is read back), so a read from scratch would differ for reasons that have
nothing to do with the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.chat.snapshot import SnapshotHeader, read_snapshot, write_snapshot
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import EngineEvent, Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.local.kv_sequence import KvSequence
from app.engine.templates.override import TemplateOverride
from tests.arch_models import ARCHS, arch_model_path
from tests.hypothesis_budget import examples

PLAIN = TemplateOverride(
    "custom",
    source="{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
)
OPEN, CLOSE = "<|user|>", "\n<|assistant|>"  # the next turn's opening; a user turn's end
ASCII = replace(SamplingParams.greedy(), grammar="root ::= [a-z]+", output_format="gbnf")
N_CTX = 1024  # no overflow: the steps below stay well inside it
STEPS = 15
# A small alphabet repeats itself, so prompt lookup finds something to guess.
WORDS = st.text(alphabet="abcd .", min_size=1, max_size=14)
LENGTHS = st.integers(3, 10)  # replies of several lengths: versions that differ
DRAFTS = st.booleans()
# Where a stop lands: -1 before the request, 0 at its first event, k after k tokens.
STOPS = st.integers(-1, 4)
TOTALS = dict.fromkeys(
    (
        "replies",
        "stops",
        "restores",
        "switches",
        "drafted",
        "rejected",
        "bounded",
        "after a switch",
    ),
    0,
)


def render(messages: list[ChatMessage]) -> str:
    """What ``PLAIN`` renders for ``messages`` without the generation prompt (no BOS)."""
    return "".join(f"<|{m.role}|>{m.content}\n" for m in messages)


def asked(messages: list[ChatMessage]) -> str:
    """The prompt's text for a reply to ``messages`` (no BOS)."""
    return render(messages) + "<|assistant|>"


@dataclass
class Run:
    done: Finished
    tokens: int  # Token events


def run(
    engine: Engine, messages: list[ChatMessage], params: SamplingParams, stop_at: int | None = None
) -> Run:
    """One request, stopped as ``STOPS`` says (never when ``stop_at`` is None)."""
    stop = threading.Event()
    if stop_at == -1:
        stop.set()
    events: list[EngineEvent] = []
    tokens = 0
    for event in engine.generate(messages, params, stop):
        events.append(event)
        tokens += isinstance(event, Token)
        if stop_at is not None and tokens >= stop_at:
            stop.set()  # from inside the loop, as the worker's Stop reaches the engine
    done = events[-1]
    assert isinstance(done, Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1
    return Run(done, tokens)


class HybridInterleavings(RuleBasedStateMachine):
    engine: Engine
    reference: Engine  # reads each checked prompt from scratch
    snapshot: Path

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[ChatMessage] = []
        self.versions: list[str] = []  # every version of the last reply, the shown one too
        # What the next send must read past what the cache holds ("": only its own turn),
        # and the rewind's extra token where the engine goes back to a prompt's checkpoint
        # (before that prompt's last token). None: no bound is known.
        self.tail: str | None = None
        self.tol = 0
        # What a rewind to the cache's end costs: 1 after a prewarm, which keeps its
        # checkpoint before its last token (as a prompt read does), not after it.
        self.end_tol = 0
        # The same, as it was when the last user message was sent (the bound of an edit).
        self.turn: tuple[str, int] | None = None
        # The last reply's prompt was read to its end, so its checkpoint is kept.
        self.prompt_read = False

    @property
    def kv(self) -> KvSequence:
        kv = self.engine._kv
        assert kv is not None
        return kv

    @initialize()
    def new_chat(self) -> None:
        self.engine.reset()  # the engines outlive each example

    # -- the checks ----------------------------------------------------------------------

    @invariant()
    def llama_cpp_holds_what_the_map_says(self) -> None:
        loaded = self.engine._loaded
        assert loaded is not None
        native, cmap = loaded.native, self.kv.map
        n = len(cmap.tokens)
        assert llama_cpp.llama_memory_seq_pos_max(native.memory, 0) + 1 == n
        # (Not 0: a recurrent state's one cell sits at the last position.)
        assert (native.seq_pos_min() == -1) == (n == 0)
        checkpoints = self.kv.checkpoints
        assert checkpoints is not None
        assert all(0 < p <= n for p in checkpoints.positions), (checkpoints.positions, n)
        assert all(0 <= t <= n and 0 <= c <= len(cmap.text) for t, c in cmap.marks)
        if n:
            # The text is vouched for up to the last mark: a rewind to a checkpoint
            # between marks keeps tokens past it.
            said = self.engine.tokenize(cmap.text)
            assert cmap.tokens[: len(said)] == said

    def check_reply(
        self, prompt: list[ChatMessage], params: SamplingParams, got: Run
    ) -> ChatMessage:
        """A finished reply: as from scratch, and in the map; then the app's prewarm."""
        done = got.done
        assert done.metrics.stop_reason in ("max_tokens", "eos"), done.metrics
        assert done.text.isascii() and done.text.isalpha()
        self.reference.reset()
        want = run(self.reference, prompt, replace(params, speculative=False)).done
        assert done.text == want.text, (done.metrics.notes, done.metrics.cache_note)
        # A drafted reply that reached max_tokens never read its last token in.
        text = self.kv.map.text
        assert text.startswith(asked(prompt)) and (asked(prompt) + done.text).startswith(text)
        TOTALS["replies"] += 1
        TOTALS["drafted"] += done.metrics.drafted_tokens
        TOTALS["rejected"] += done.metrics.drafted_tokens - done.metrics.accepted_tokens
        answer = ChatMessage("assistant", done.text)
        self.engine.prewarm(prompt, answer)
        assert self.kv.map.text == render([*prompt, answer]) + OPEN
        self.tail, self.tol, self.end_tol, self.prompt_read = "", 0, 0, True
        return answer

    def after_stop(self, prompt: list[ChatMessage], got: Run, regen: bool, held: int) -> None:
        """A stopped reply: the cache holds the prompt and no more of the reply than was
        shown (the last token shown is never read in)."""
        TOTALS["stops"] += 1
        text = self.kv.map.text
        if got.tokens:
            assert (asked(prompt) + got.done.text).startswith(text)
            assert text.startswith(asked(prompt))
            self.prompt_read = True
        elif not regen:
            # Stopped before its first token, perhaps before its prompt was read.
            self.prompt_read = False
        # (A regenerate stopped so early went back to its prompt's checkpoint, kept.)
        end_tol = self.end_tol
        self.unread()
        if len(self.kv.map.tokens) == held:
            self.end_tol = end_tol  # stopped before anything was read: the same end

    def unread(self) -> None:
        """The bound for the next send, where the cache holds a prefix of its prompt."""
        full = render(self.messages) + OPEN
        held = self.kv.map.text
        if self.kv.map.tokens and full.startswith(held):
            # A stopped reply's end: it keeps a checkpoint there.
            self.tail, self.tol, self.end_tol = full[len(held) :], 0, 0
        else:
            self.tail = None

    def turn_start(self) -> tuple[str, int] | None:
        """What an edit of a message sent now may read: back to the checkpoint at the
        cache's end, then what the send reads."""
        return None if self.tail is None else (self.tail, self.tol + self.end_tol)

    def cost(self, text: str) -> int:
        return self.engine.count_tokens(text)

    # -- the rules -----------------------------------------------------------------------

    def room(self) -> bool:
        return self.cost(render(self.messages)) < N_CTX - 120

    @precondition(room)
    @rule(words=WORDS, length=LENGTHS, draft=DRAFTS)
    def send(self, words: str, length: int, draft: bool) -> None:
        params = replace(ASCII, max_tokens=length, speculative=draft, adaptive_draft=False)
        prompt = [*self.messages, ChatMessage("user", words)]
        got = run(self.engine, prompt, params)
        read = got.done.metrics.evaluated_tokens
        if self.tail is None:
            assert read <= got.done.metrics.prompt_tokens
        else:
            assert read <= self.cost(self.tail + words + CLOSE) + self.tol, (self.tail, self.tol)
            TOTALS["bounded"] += 1
            TOTALS["after a switch"] += self.tol
        self.turn = self.turn_start()
        self.messages = [*prompt, self.check_reply(prompt, params, got)]
        self.versions = [got.done.text]

    @precondition(room)
    @rule(words=WORDS, stop_at=STOPS, again=st.booleans(), draft=DRAFTS)
    def stop(self, words: str, stop_at: int, again: bool, draft: bool) -> None:
        """Stop a new message's reply (kept, empty too) or a regenerate (kept when any
        of it was shown, else the shown version stays), as ``ReplyRun`` does."""
        params = replace(ASCII, max_tokens=12, speculative=draft, adaptive_draft=False)
        regen = again and bool(self.messages)
        prompt = self.messages[:-1] if regen else [*self.messages, ChatMessage("user", words)]
        before, held = self.turn_start(), len(self.kv.map.tokens)
        got = run(self.engine, prompt, params, stop_at)
        if got.done.metrics.stop_reason != "cancelled":  # it ended first: a finished reply
            answer = self.check_reply(prompt, params, got)
            if not regen:
                self.turn = before
                self.versions = []
            self.messages = [*prompt, answer]
            self.versions.append(answer.content)
            return
        text = got.done.text
        if not regen:
            self.turn = before
            self.messages, self.versions = [*prompt, ChatMessage("assistant", text)], [text]
        elif text:
            self.messages = [*prompt, ChatMessage("assistant", text)]
            self.versions.append(text)
        self.after_stop(prompt, got, regen, held)

    @precondition(lambda self: bool(self.messages))
    @rule(length=LENGTHS, draft=DRAFTS, seed=st.none() | st.integers(1, 999))
    def regenerate(self, length: int, draft: bool, seed: int | None) -> None:
        """Ask again; mostly sampled with a seed (a reply of other words, as a user
        regenerates for), which the reference then samples alike."""
        params = replace(ASCII, max_tokens=length, speculative=draft, adaptive_draft=False)
        if seed is not None:
            params = replace(params, temperature=1.0, top_k=0, top_p=1.0, seed=seed)
        prompt = self.messages[:-1]
        got = run(self.engine, prompt, params)
        if self.prompt_read:
            # Back to the checkpoint before the prompt's last token, which is read again.
            assert got.done.metrics.evaluated_tokens == 1, got.done.metrics
            TOTALS["bounded"] += 1
        self.messages = [*prompt, self.check_reply(prompt, params, got)]
        self.versions.append(got.done.text)

    @precondition(lambda self: bool(self.messages))
    @rule(words=WORDS, length=LENGTHS, draft=DRAFTS)
    def edit(self, words: str, length: int, draft: bool) -> None:
        """Edit the last user message; its reply is asked for again."""
        params = replace(ASCII, max_tokens=length, speculative=draft, adaptive_draft=False)
        prompt = [*self.messages[:-2], ChatMessage("user", words)]
        got = run(self.engine, prompt, params)
        if self.turn is not None:
            # Back to the checkpoint where the message's turn began.
            tail, tol = self.turn
            read = got.done.metrics.evaluated_tokens
            assert read <= self.cost(tail + words + CLOSE) + tol, (self.turn, got.done.metrics)
            TOTALS["bounded"] += 1
        self.messages = [*prompt, self.check_reply(prompt, params, got)]
        self.versions = [got.done.text]

    @precondition(lambda self: len(set(self.versions)) > 1)
    @rule(data=st.data(), then=st.none() | WORDS, length=LENGTHS, draft=DRAFTS)
    def switch(self, data: st.DataObject, then: str | None, length: int, draft: bool) -> None:
        """Show another version of the last reply (the cache holds the one shown last),
        and mostly write on from it at once."""
        shown = self.messages[-1].content
        other = data.draw(st.sampled_from(sorted(set(self.versions) - {shown})))
        self.messages = [*self.messages[:-1], ChatMessage("assistant", other)]
        TOTALS["switches"] += 1
        self.unread()
        if self.tail is None and self.prompt_read:
            # The cache goes back to the checkpoint before the reply's prompt's last token.
            self.tail, self.tol, self.end_tol = other + "\n" + OPEN, 1, 0
        if then is not None and self.room():
            self.send(then, length, draft)

    @precondition(lambda self: bool(self.messages))
    @rule()
    def restore(self) -> None:
        """The chat closed and reopened: its snapshot read back into an emptied cache."""
        before = self.engine.export_state()
        header = SnapshotHeader(
            model={"name": "tiny.gguf", "size": 1, "sha256": "00" * 32},
            runtime={"llama_cpp_python": "x"},
            cache={"n_ctx": N_CTX},
            lora=[],
        )
        write_snapshot(self.snapshot, header, before)
        self.engine.reset()
        self.engine.import_state(read_snapshot(self.snapshot, header))
        after = self.engine.export_state()
        assert (after.tokens, after.text, after.marks) == (before.tokens, before.text, before.marks)
        assert [n for n, _ in after.checkpoints] == [n for n, _ in before.checkpoints]
        TOTALS["restores"] += 1


@pytest.fixture(scope="module", params=ARCHS)
def engines(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, Engine]]:
    """The engine under test and the reference, each loaded once per architecture."""
    pair = (Engine(), Engine())
    for engine in pair:
        engine.load(arch_model_path(request.param), LoadConfig(n_ctx=N_CTX, n_threads=1))
        engine.set_template(PLAIN)
    yield pair
    for engine in pair:
        engine.unload()


def test_interleavings_keep_the_cache_map_true(
    engines: tuple[Engine, Engine], tmp_path: Path
) -> None:
    HybridInterleavings.engine, HybridInterleavings.reference = engines
    HybridInterleavings.snapshot = tmp_path / "chat.lpkv"
    TOTALS.update(dict.fromkeys(TOTALS, 0))
    budget = examples(12)
    run_state_machine_as_test(
        HybridInterleavings,
        settings=settings(
            max_examples=budget,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"hybrid interleavings: {TOTALS}")
    if budget >= 12:  # the ci budget or more (the dev profile's few examples may not)
        # Every kind of step ran, and some guesses were rejected (and taken back).
        assert all(TOTALS.values()), TOTALS
