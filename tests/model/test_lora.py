"""LoRA stacking on the real model: scales, hot swaps, refusals, snapshots and resume."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from app.chat.session_cache import SessionCache
from app.chat.snapshot import read_header
from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.adapters import MAX_IDLE_ADAPTERS
from app.engine.local.engine import Engine
from app.engine.local.kv_sequence import LORA_CHANGED_NOTE
from app.gguf.lora import (
    LoraError,
    LoraStack,
    read_adapter,
    read_model_tensors,
    stack_key,
    validate_adapter,
)
from app.util.hashing import FingerprintCache, sha256_file
from tests.conftest import TEST_LOAD
from tests.lora_factory import (
    corrupt_lora,
    make_lora,
    model_gguf,
    truncated_lora,
    wrong_architecture_lora,
    wrong_dimension_lora,
)

PROMPT = [ChatMessage("user", "Name a colour.")]
GREEDY = SamplingParams.greedy(8)


@pytest.fixture(scope="session")
def adapters(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("lora")
    return {
        "style": make_lora(d / "style.gguf", model_path, seed=1),
        "tone": make_lora(
            d / "tone.gguf", model_path, seed=2, targets=("attn_v", "ffn_up"), layers=(4, 5, 6)
        ),
        "wrong-arch": wrong_architecture_lora(d / "llama-style.gguf", model_path),
        "wrong-dims": wrong_dimension_lora(d / "wide.gguf", model_path),
        "not-adapter": model_gguf(d / "model.gguf", model_path),
        "truncated": truncated_lora(d / "cut.gguf", model_path),
        "corrupt": corrupt_lora(d / "noise.gguf"),
        "missing": d / "nowhere.gguf",
    }


@pytest.fixture(autouse=True)
def _no_stack_left(loaded_engine: Engine) -> Iterator[None]:
    """Other test modules share the session engine: leave it without adapters."""
    yield
    loaded_engine.set_lora_stack(LoraStack())
    loaded_engine.reset()


@pytest.fixture()
def cache(engine: Engine, tmp_path: Path) -> SessionCache:
    store = ConversationStore(tmp_path / "data")
    return SessionCache(engine, store, FingerprintCache(tmp_path / "data" / "fingerprints.json"))


@pytest.fixture()
def lora_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths passed to llama_adapter_lora_init (the engine looks it up at call time)."""
    calls: list[str] = []
    real = llama_cpp.llama_adapter_lora_init

    def spy(model: Any, path: bytes) -> Any:
        calls.append(path.decode())
        return real(model, path)

    monkeypatch.setattr(llama_cpp, "llama_adapter_lora_init", spy)
    return calls


def stack(*entries: tuple[Path, float]) -> LoraStack:
    s = LoraStack()
    for path, scale in entries:
        s.push(path, scale)
    return s


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams = GREEDY) -> Finished:
    for event in engine.generate(messages, params):
        if isinstance(event, Finished):
            return event
    raise AssertionError("no Finished event")


def logits(engine: Engine) -> np.ndarray:
    """Logits after a one-token greedy reply to PROMPT, from an empty cache."""
    engine.reset()
    reply(engine, PROMPT, SamplingParams.greedy(1))
    return engine.last_logits()


# -- the stack itself ---------------------------------------------------------------------


def test_stack_edits_and_summary(adapters: dict[str, Path]) -> None:
    s = stack((adapters["style"], 0.8), (adapters["tone"], 1.0))
    assert s.summary() == "LoRA: style×0.8, tone×1.0"
    with pytest.raises(ValueError, match="already in the LoRA stack"):
        s.push(adapters["style"])
    for bad in (2.5, -2.01, float("nan")):
        with pytest.raises(ValueError, match="between -2 and 2"):
            s.set_scale(0, bad)
    s.reorder(1, 0)
    assert [e.name for e in s] == ["tone", "style"]
    s.enable(0, False)
    assert s.summary() == "LoRA: style×0.8"
    s.set_scale(1, 0.0)
    assert s.summary() == "LoRA: none active" and s.active() == []
    s.remove(0)
    assert len(s) == 1
    s.clear()
    assert s.summary() == "" and s == LoraStack()


def test_signature_round_trip_and_order_free_key(adapters: dict[str, Path]) -> None:
    a = stack((adapters["style"], 0.5), (adapters["tone"], -1.0))
    sig = a.signature()
    assert [(x["name"], x["scale"], x["enabled"]) for x in sig] == [
        ("style.gguf", 0.5, True),
        ("tone.gguf", -1.0, True),
    ]
    assert sig[0]["sha256"] == sha256_file(adapters["style"])
    assert sig[0]["size"] == adapters["style"].stat().st_size
    assert LoraStack.from_signature(sig) == a
    b = a.copy()
    b.reorder(0, 1)
    assert stack_key(b.signature()) == stack_key(sig)
    b.enable(0, False)
    assert stack_key(b.signature()) != stack_key(sig)


def test_adapter_info_from_the_header(adapters: dict[str, Path], model_path: Path) -> None:
    info = validate_adapter(adapters["style"], model_path)
    assert (info.name, info.rank, info.alpha, info.architecture) == ("style", 8, 16.0, "gemma3")
    assert info.n_tensors == 24 and len(info.targets) == 12
    assert info.size == adapters["style"].stat().st_size


# -- applying it --------------------------------------------------------------------------


def test_scale_zero_or_disabled_is_the_base_model(
    engine: Engine, adapters: dict[str, Path]
) -> None:
    base = logits(engine)
    engine.set_lora_stack(stack((adapters["style"], 0.0)))
    assert np.array_equal(logits(engine), base)
    off = stack((adapters["style"], 1.0))
    off.enable(0, False)
    engine.set_lora_stack(off)
    assert np.array_equal(logits(engine), base)


def test_a_nonzero_scale_changes_the_logits(engine: Engine, adapters: dict[str, Path]) -> None:
    base = logits(engine)
    engine.set_lora_stack(stack((adapters["style"], 1.0)))
    full = logits(engine)
    engine.set_lora_stack(stack((adapters["style"], 0.25)))
    quarter = logits(engine)
    assert np.abs(full - base).max() > 1.0
    assert 0 < np.abs(quarter - base).max() < np.abs(full - base).max()


def test_two_adapters_repeat_exactly_and_do_not_depend_on_order(
    engine: Engine, adapters: dict[str, Path]
) -> None:
    style, tone = adapters["style"], adapters["tone"]
    engine.set_lora_stack(stack((style, 0.7)))
    only_style = logits(engine)
    engine.set_lora_stack(stack((style, 0.7), (tone, -0.5)))
    both = logits(engine)
    assert np.abs(both - only_style).max() > 0.1  # the second adapter counts
    engine.set_lora_stack(LoraStack())
    engine.set_lora_stack(stack((style, 0.7), (tone, -0.5)))
    assert np.array_equal(logits(engine), both)
    engine.set_lora_stack(stack((tone, -0.5), (style, 0.7)))
    np.testing.assert_allclose(logits(engine), both, rtol=0, atol=1e-4)


def test_hot_swap_keeps_the_model_and_rebuilds_the_cache(
    engine: Engine, adapters: dict[str, Path], lora_calls: list[str], tmp_path: Path
) -> None:
    # Fresh copies: the session engine may hold the originals from earlier tests.
    adapters = {k: Path(shutil.copy(adapters[k], tmp_path)) for k in ("style", "tone")}
    llm, info, loads = engine.llama, engine.model, engine.load_count
    first = reply(engine, PROMPT)
    history = [*PROMPT, ChatMessage("assistant", first.text), ChatMessage("user", "Another.")]
    assert engine.set_lora_stack(stack((adapters["style"], 0.8))) is True  # cache now stale
    assert (
        engine.prewarm(PROMPT, ChatMessage("assistant", first.text)) == 0
    )  # nothing added to a stale cache
    swapped = reply(engine, history)
    assert swapped.metrics.cache_note == LORA_CHANGED_NOTE
    assert swapped.metrics.cached_tokens == 0
    assert swapped.metrics.evaluated_tokens == swapped.metrics.prompt_tokens
    assert engine.llama is llm and engine.model is info and engine.load_count == loads
    assert engine.lora_stack == stack((adapters["style"], 0.8))

    # The next message reuses the cache again.
    again = reply(engine, history)
    assert again.metrics.cache_note == "" and again.metrics.cached_tokens > 0

    # Rescale, add, remove, re-add: each adapter file is loaded into llama.cpp once.
    engine.set_lora_stack(stack((adapters["style"], 0.3)))
    engine.set_lora_stack(stack((adapters["style"], 0.3), (adapters["tone"], 1.0)))
    engine.set_lora_stack(stack((adapters["tone"], 1.0)))
    engine.set_lora_stack(stack((adapters["style"], 1.0), (adapters["tone"], 1.0)))
    assert sorted(Path(c).name for c in lora_calls) == ["style.gguf", "tone.gguf"]

    # Order alone does not change the output: the cache stays valid.
    reply(engine, history)
    assert engine.set_lora_stack(stack((adapters["tone"], 1.0), (adapters["style"], 1.0))) is False
    assert reply(engine, history).metrics.cache_note == ""


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("wrong-arch", "llama-style.gguf was built for llama, the loaded model is gemma3"),
        ("wrong-dims", "blk.0.attn_k.weight: adapter expects 640x1024, model has 640x256"),
        ("not-adapter", "model.gguf is a model, not a LoRA adapter"),
        ("truncated", "cut.gguf is truncated"),
        ("corrupt", "noise.gguf is a damaged GGUF file"),
        ("missing", "nowhere.gguf is missing"),
    ],
)
def test_bad_adapters_are_refused_before_llama_cpp(
    engine: Engine,
    adapters: dict[str, Path],
    lora_calls: list[str],
    kind: str,
    message: str,
) -> None:
    good = stack((adapters["style"], 1.0))
    engine.set_lora_stack(good)
    calls = len(lora_calls)
    with pytest.raises(LoraError, match=message):
        engine.set_lora_stack(stack((adapters[kind], 1.0)))
    with pytest.raises(LoraError, match=message):  # one bad entry refuses the whole stack
        engine.set_lora_stack(stack((adapters["tone"], 1.0), (adapters[kind], 1.0)))
    assert not [c for c in lora_calls[calls:] if Path(c).name == adapters[kind].name]
    assert engine.lora_stack == good
    with pytest.raises(LoraError, match=message):
        engine.adapter_info(adapters[kind])


def test_read_adapter_explains_other_refusals(tmp_path: Path, model_path: Path) -> None:
    cases: dict[str, Callable[[Path], Path]] = {
        "is a control_vector adapter, not a LoRA": lambda p: make_lora(
            p, model_path, adapter_type="control_vector", layers=(0,)
        ),
        "not a GGUF file": lambda p: (p.write_bytes(b"PK\x03\x04" + bytes(100)), p)[1],
        "is empty": lambda p: (p.write_bytes(b""), p)[1],
    }
    for i, (message, make) in enumerate(cases.items()):
        with pytest.raises(LoraError, match=message):
            read_adapter(make(tmp_path / f"bad{i}.gguf"))
    model = read_model_tensors(model_path)
    assert model.architecture == "gemma3" and model.dims["blk.0.attn_q.weight"] == (640, 1024)


def test_a_changed_file_is_loaded_again_and_the_old_one_freed(
    engine: Engine,
    adapters: dict[str, Path],
    model_path: Path,
    tmp_path: Path,
    lora_calls: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freed: list[Any] = []
    real_free = llama_cpp.llama_adapter_lora_free
    monkeypatch.setattr(
        llama_cpp, "llama_adapter_lora_free", lambda h: (freed.append(h), real_free(h))
    )
    path = make_lora(tmp_path / "mutable.gguf", model_path, seed=5)
    engine.set_lora_stack(stack((path, 1.0)))
    before = logits(engine)
    make_lora(path, model_path, seed=6)  # same name, new weights
    engine.set_lora_stack(stack((path, 1.0)))
    assert len(lora_calls) == 2 and len(freed) == 1
    assert not np.array_equal(logits(engine), before)


def test_idle_adapters_are_freed_beyond_the_limit(
    engine: Engine, model_path: Path, tmp_path: Path
) -> None:
    paths = [
        make_lora(
            tmp_path / f"a{i}.gguf", model_path, seed=10 + i, layers=(0,), targets=("attn_q",)
        )
        for i in range(MAX_IDLE_ADAPTERS + 3)
    ]
    for path in paths:
        engine.set_lora_stack(stack((path, 1.0)))
    assert engine.loaded_adapters <= MAX_IDLE_ADAPTERS + 1


def test_unload_and_reload_start_without_adapters(
    model_path: Path, adapters: dict[str, Path]
) -> None:
    eng = Engine()
    eng.load(model_path, TEST_LOAD)
    try:
        eng.set_lora_stack(stack((adapters["style"], 1.0)))
        reply(eng, PROMPT, SamplingParams.greedy(2))
        eng.unload()  # llama.cpp frees the adapters with the model
        assert eng.lora_stack == LoraStack() and eng.loaded_adapters == 0
        eng.load(model_path, TEST_LOAD)
        assert eng.lora_stack == LoraStack()
        eng.set_lora_stack(stack((adapters["style"], 1.0)))
        assert reply(eng, PROMPT, SamplingParams.greedy(2)).text
    finally:
        eng.unload()


# -- snapshots and resume -------------------------------------------------------------------


def test_the_snapshot_header_records_the_stack(
    engine: Engine, cache: SessionCache, adapters: dict[str, Path]
) -> None:
    reply(engine, PROMPT)
    cache.save("plain")
    assert read_header(cache.store.snapshot_path("plain"))[0].lora == []

    s = stack((adapters["style"], 0.8), (adapters["tone"], 1.0))
    s.enable(1, False)
    engine.set_lora_stack(s)
    # Saved before the next message, the cache still belongs to the old (empty) stack.
    cache.save("stale")
    assert read_header(cache.store.snapshot_path("stale"))[0].lora == []
    reply(engine, PROMPT)
    cache.save("styled")
    header, raw, _ = read_header(cache.store.snapshot_path("styled"))
    assert header.lora == engine.lora_signature()
    assert [(e["name"], e["scale"], e["enabled"]) for e in header.lora] == [
        ("style.gguf", 0.8, True),
        ("tone.gguf", 1.0, False),
    ]
    assert header.lora[0]["sha256"] == sha256_file(adapters["style"])
    assert "lora" not in header.cache and "lora" not in raw["cache"]
    assert cache.saved_stack("styled") == s


def test_restore_re_applies_the_conversations_stack(
    engine: Engine, cache: SessionCache, adapters: dict[str, Path]
) -> None:
    styled = stack((adapters["style"], 0.8))
    engine.set_lora_stack(styled)
    first = reply(engine, PROMPT)
    cache.save("conv")
    n_saved = len(engine.cached_tokens)
    follow_up = [*PROMPT, ChatMessage("assistant", first.text), ChatMessage("user", "Why?")]
    expected = reply(engine, follow_up)

    engine.set_lora_stack(LoraStack())  # the user switched the adapters off meanwhile
    engine.reset()
    result = cache.restore("conv")
    assert result.restored, result.note
    assert result.lora_changed and result.lora_stack == styled == engine.lora_stack
    done = reply(engine, follow_up)
    assert done.text == expected.text
    assert done.metrics.cached_tokens == n_saved and done.metrics.cache_note == ""

    # Asked to keep the current stack instead, the cache is not used.
    engine.set_lora_stack(LoraStack())
    result = cache.restore("conv", apply_lora=False)
    assert not result.restored and "other LoRA adapters" in result.note
    assert engine.lora_stack == LoraStack() and not result.lora_changed


def test_a_missing_adapter_on_resume_is_explained_and_the_chat_goes_on(
    engine: Engine, cache: SessionCache, adapters: dict[str, Path], tmp_path: Path
) -> None:
    gone = Path(shutil.copy(adapters["style"], tmp_path / "gone.gguf"))
    engine.set_lora_stack(stack((gone, 1.0)))
    first = reply(engine, PROMPT)
    cache.save("conv")
    engine.set_lora_stack(LoraStack())
    gone.unlink()
    result = cache.restore("conv")
    assert not result.restored
    assert f"its LoRA adapter gone.gguf is missing ({gone})" == result.note
    assert engine.lora_stack == LoraStack() and engine.cached_tokens == []
    follow_up = [*PROMPT, ChatMessage("assistant", first.text), ChatMessage("user", "Go on.")]
    done = reply(engine, follow_up)
    assert done.metrics.cached_tokens == 0 and done.text.strip()


def test_a_changed_adapter_on_resume_is_explained(
    engine: Engine, cache: SessionCache, model_path: Path, tmp_path: Path
) -> None:
    path = make_lora(tmp_path / "drift.gguf", model_path, seed=7)
    engine.set_lora_stack(stack((path, 1.0)))
    reply(engine, PROMPT)
    cache.save("conv")
    engine.set_lora_stack(LoraStack())
    make_lora(path, model_path, seed=8)
    result = cache.restore("conv")
    assert not result.restored and "drift.gguf has changed since it was saved" in result.note
