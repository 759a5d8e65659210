"""The engine on the real default model: streaming, stop, prefix reuse, errors."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, LoadCancelled, PrefillProgress, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.util.errors import ContextOverflowError, ModelFileError, ModelLoadError, NoModelLoaded
from tests.conftest import TEST_CTX, TEST_LOAD
from tests.near_tie import assert_greedy, reply_gaps, same_up_to_near_tie, token_text

GREEDY = SamplingParams.greedy(24)


def run(
    engine: Engine,
    messages: list[ChatMessage],
    params: SamplingParams = GREEDY,
    stop: threading.Event | None = None,
) -> tuple[list[str], Finished]:
    pieces: list[str] = []
    for event in engine.generate(messages, params, stop):
        if isinstance(event, Token):
            pieces.append(event.text)
        elif isinstance(event, Finished):
            return pieces, event
    raise AssertionError("no Finished event")


def long_text(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


def test_default_model_metadata(loaded_engine: Engine) -> None:
    info = loaded_engine.model
    assert info is not None
    assert info.architecture == "gemma3"
    assert info.n_ctx == TEST_CTX
    assert 250e6 < info.n_params < 300e6
    # No template in the GGUF: the app picks gemma's by architecture and says so.
    assert info.template == "gemma (for gemma3)"


def test_streams_a_non_empty_reply(engine: Engine) -> None:
    pieces, done = run(engine, [ChatMessage("user", "Hello! Who are you?")])
    assert "".join(pieces) == done.text
    assert done.text.strip(), "the gemma template must get a non-empty reply"
    m = done.metrics
    assert m.generated_tokens == len(m.token_times_ms) > 1
    assert m.stop_reason in ("eos", "max_tokens")
    assert m.prompt_tokens == m.evaluated_tokens > 0 and m.cached_tokens == 0
    assert 0 < m.prefill_ms <= m.ttft_ms
    assert m.decode_tok_s > 0 and m.prefill_tok_s > 0
    assert 0 < m.itl_p50_ms <= m.itl_p95_ms
    assert m.context_used == m.prompt_tokens + m.generated_tokens


def test_stop_mid_decode_returns_within_one_token(engine: Engine) -> None:
    stop = threading.Event()
    after_stop = 0
    finished = None
    for event in engine.generate(
        [ChatMessage("user", "Count to one hundred.")], SamplingParams.greedy(200), stop
    ):
        if isinstance(event, Token):
            if stop.is_set():
                after_stop += 1
            elif len(engine.cached_tokens) > 0 and event.text:
                stop.set()
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    assert finished.metrics.stop_reason == "cancelled"
    assert after_stop <= 1
    # Immediately usable again.
    _, again = run(engine, [ChatMessage("user", "Hi")])
    assert again.metrics.generated_tokens > 0


def test_stop_during_long_prompt_returns_promptly(engine: Engine) -> None:
    stop = threading.Event()
    messages = [ChatMessage("user", long_text(600))]
    n_prompt = len(engine.prompt_tokens(messages))
    assert n_prompt > 1000  # three or more 512-token batches: several seconds of prefill
    timer = threading.Timer(0.3, stop.set)
    t0 = time.perf_counter()
    timer.start()
    try:
        _, done = run(engine, messages, stop=stop)
    finally:
        timer.cancel()
    stopped_at = time.perf_counter() - t0
    assert done.metrics.stop_reason == "cancelled"
    assert done.metrics.generated_tokens == 0
    assert done.metrics.evaluated_tokens < n_prompt
    # One 512-token batch takes over a second here; the abort callback ends it early.
    assert stopped_at < 0.3 + 0.6, f"stop took {stopped_at - 0.3:.2f}s after the request"
    # The cache holds only fully evaluated batches, and the engine carries on.
    assert len(engine.cached_tokens) == done.metrics.evaluated_tokens
    _, again = run(engine, [ChatMessage("user", "Hi")], SamplingParams.greedy(4))
    assert again.metrics.generated_tokens > 0


def test_prefill_reports_progress(engine: Engine) -> None:
    events = list(engine.generate([ChatMessage("user", long_text(250))], SamplingParams.greedy(1)))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert len(progress) >= 2
    assert progress[-1].done == progress[-1].total
    assert [p.done for p in progress] == sorted(p.done for p in progress)


def reused_reply(engine: Engine, reply: list[int], kept_text: str) -> int:
    """How many of ``reply``'s tokens spell the start of ``kept_text`` (whole characters)."""
    best = 0
    for j in range(1, len(reply) + 1):
        try:
            text = token_text(engine, reply[:j], strict=True)
        except UnicodeDecodeError:
            continue  # ends inside a character: no boundary to reuse at
        if not kept_text.startswith(text):
            break
        best = j
    return best


def test_second_turn_evaluates_only_new_tokens(engine: Engine) -> None:
    turn1 = [ChatMessage("user", "Name three colours.")]
    _, first = run(engine, turn1)
    n1 = first.metrics.prompt_tokens
    cached_first = engine.cached_tokens
    generated = first.metrics.generated_tokens
    # A stop string's last token is shown but not kept: the cache ends before it.
    assert len(cached_first) - n1 in (
        generated,
        generated - (first.metrics.stop_reason == "stop_string"),
    )

    turn2 = [*turn1, ChatMessage("assistant", first.text), ChatMessage("user", "And three fruits?")]
    _, second = run(engine, turn2)
    m = second.metrics
    n2 = m.prompt_tokens
    cached_second = engine.cached_tokens
    assert m.evaluated_tokens == n2 - m.cached_tokens
    # The cache holds exactly the new prompt, and its first part is the first turn's
    # tokens, kept as they were.
    assert token_text(engine, cached_second[:n2]) == token_text(engine, engine.prompt_tokens(turn2))
    assert cached_second[: m.cached_tokens] == cached_first[: m.cached_tokens]
    # Every reply token whose text the template kept is reused, and only the rest is
    # evaluated: what is left of the reply's text, then the new turn. (The template
    # strips the reply: its trailing whitespace is not reused, nor any of a reply that
    # starts with a space. Which the reply has depends on the CPU's rounding.)
    kept_text = first.text.strip()
    reused = reused_reply(engine, cached_first[n1:], kept_text)
    assert m.cached_tokens == n1 + reused
    rest = kept_text[len(token_text(engine, cached_first[n1 : n1 + reused])) :]
    new_turn = (
        "<end_of_turn>\n<start_of_turn>user\nAnd three fruits?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert token_text(engine, cached_second[m.cached_tokens : n2]) == rest + new_turn

    # Evaluating everything afresh reads the same text and gives the same reply up to a
    # near-tie (the two caches were batched differently, which can flip one); each reply
    # is the greedy reply of one batched evaluation of its own tokens.
    engine.reset()
    _, fresh = run(engine, turn2)
    nf = fresh.metrics.prompt_tokens
    assert fresh.metrics.evaluated_tokens == nf and fresh.metrics.cached_tokens == 0
    cached_fresh = engine.cached_tokens
    assert token_text(engine, cached_fresh[:nf]) == token_text(engine, cached_second[:n2])
    if cached_fresh[:nf] == cached_second[:n2]:
        same_up_to_near_tie(engine, cached_second, cached_fresh, n2)
    else:  # the reply re-tokenized differently: replies to other tokens, each greedy
        assert_greedy(reply_gaps(engine, cached_second, n2))
        assert_greedy(reply_gaps(engine, cached_fresh, nf))


def test_identical_prompt_evaluates_one_token(engine: Engine) -> None:
    msgs = [ChatMessage("user", "Say something.")]
    _, a = run(engine, msgs, SamplingParams.greedy(8))
    _, b = run(engine, msgs, SamplingParams.greedy(8))
    assert b.metrics.evaluated_tokens == 1  # the last prompt token, for its logits
    assert a.text == b.text


def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    params = SamplingParams(temperature=0.9, seed=1234, max_tokens=16)
    msgs = [ChatMessage("user", "Tell me a story.")]
    _, a = run(engine, msgs, params)
    engine.reset()
    _, b = run(engine, msgs, params)
    assert a.text == b.text and a.metrics.seed == b.metrics.seed == 1234
    _, c = run(engine, msgs, SamplingParams(temperature=0.9, seed=-1, max_tokens=4))
    assert c.metrics.seed is not None and c.metrics.seed >= 0  # shown, so it can be reused


def test_over_long_prompt_is_a_clear_error(engine: Engine) -> None:
    with pytest.raises(ContextOverflowError) as info:
        run(engine, [ChatMessage("user", long_text(3000))])
    assert "context holds 2048" in str(info.value)
    assert info.value.prompt_tokens > TEST_CTX
    _, ok = run(engine, [ChatMessage("user", "Hi")], SamplingParams.greedy(4))
    assert ok.metrics.generated_tokens > 0


def test_reply_stops_cleanly_when_context_fills(engine: Engine) -> None:
    msgs = [ChatMessage("user", long_text(10))]
    base = len(engine.prompt_tokens(msgs))
    words = 10
    # Grow the prompt until it sits a few tokens under the context size.
    while base < TEST_CTX - 40:
        words += max(1, (TEST_CTX - 20 - base) // 3)
        msgs = [ChatMessage("user", long_text(words))]
        base = len(engine.prompt_tokens(msgs))
    if base >= TEST_CTX:
        pytest.fail("could not build a near-full prompt")
    _, done = run(engine, msgs, SamplingParams.greedy(200))
    assert done.metrics.stop_reason in ("context_full", "eos")
    assert done.metrics.context_used <= TEST_CTX


def test_stop_strings_end_the_reply(engine: Engine) -> None:
    msgs = [ChatMessage("user", "Hello! Who are you?")]
    _, free = run(engine, msgs, SamplingParams.greedy(24))
    cut = free.text.strip().split()[1]  # a word the model will produce
    engine.reset()
    _, done = run(
        engine, msgs, SamplingParams(temperature=0.0, top_k=1, max_tokens=24, seed=0, stop=(cut,))
    )
    assert done.metrics.stop_reason == "stop_string"
    assert cut not in done.text
    assert free.text.startswith(done.text)


def test_no_model_loaded_is_a_clear_error() -> None:
    with pytest.raises(NoModelLoaded):
        next(Engine().generate([ChatMessage("user", "hi")], GREEDY))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("missing", "not found"),
        ("empty", "empty"),
        ("random", "not a GGUF"),
        ("truncated", "truncated"),
        ("directory", "Not a file"),
        ("header", "damaged"),
    ],
)
def test_bad_model_files_are_refused(
    kind: str, expected: str, tmp_path: Path, model_path: Path, loaded_engine: Engine
) -> None:
    target = tmp_path / "bad.gguf"
    if kind == "empty":
        target.write_bytes(b"")
    elif kind == "random":
        target.write_bytes(os.urandom(4096))
    elif kind == "truncated":
        with model_path.open("rb") as src:
            target.write_bytes(src.read(20_000_000))
    elif kind == "directory":
        target.mkdir()
    elif kind == "header":
        target.write_bytes(b"GGUF" + os.urandom(60))
    before = loaded_engine.model
    with pytest.raises(ModelFileError) as info:
        loaded_engine.load(target, TEST_LOAD)
    assert expected in str(info.value)
    # The model that was loaded stays loaded.
    assert loaded_engine.model is before


def test_unknown_architecture_is_a_clear_error(tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "alien.gguf"
    writer = GGUFWriter(str(path), "alienformer")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as info:
        Engine().load(path, TEST_LOAD)
    assert "alien.gguf" in str(info.value)


def test_load_reports_progress_and_can_be_cancelled(model_path: Path) -> None:
    seen: list[float] = []
    engine = Engine()
    engine.load(model_path, TEST_LOAD, lambda v: seen.append(v) or True)
    assert seen and seen[-1] == pytest.approx(1.0)
    assert seen == sorted(seen)
    engine.unload()
    with pytest.raises(LoadCancelled):
        engine.load(model_path, TEST_LOAD, lambda v: v < 0.5)
    assert engine.model is None
