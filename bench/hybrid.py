"""Hybrid and recurrent models with checkpoints versus without, in one run (issue 43).

    .venv/bin/python bench/hybrid.py [--words 300]   # prints one JSON object

On the tiny random models of ``tests/arch_models.py`` (mamba2: recurrent; lfm2 and
qwen35: hybrid), a chat of one long user message (``--words`` words, byte tokens) and
a short greedy reply goes through what a user does next, each step timed from the
request to the reply's end, with the tokens llama.cpp evaluated for it:

* ``next_turn``: a new message after the reply (the app reads the next turn's opening
  ahead of time, as after every reply);
* ``regenerate``: the same prompt again;
* ``edit``: the last message changed;
* ``resume``: the chat saved as a snapshot after a reply, the cache emptied (a restart),
  the snapshot read back, then a new message;
* ``reopen_regenerate``: the same, then a regenerate instead.

``*_eval_ratio`` is evaluated ÷ new tokens, where "new" is the last user message as the
template wraps it (what a turn must read at least; a regenerate needs only the prompt's
last token, so its ratio is far below 1). The goal is <= 1.1; the baseline is the same
engine with its checkpoints switched off (what it did before: llama.cpp refuses to cut a
recurrent state back, the cache is dropped and the whole chat read again).
``snapshot_ratio`` is the snapshot file's bytes ÷ (llama.cpp's state + checkpoints).
``mtp`` drafts with the next-token layers of ``tests/mtp_model.py`` (a tiny qwen35 whose
NextN block was made to agree with its trunk about a third of the time): acceptance,
decode time against plain decoding in the same run, and whether the greedy replies
are the same. On a model this small a target pass costs about what a guess does, so
the speed-up says little; on a real MTP model a guess costs one layer of dozens.
The models are tiny, so the milliseconds are mostly the engine's own; the evaluated-
token counts are what a real model pays for by the thousand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.guarded import use_native_guard

use_native_guard()

from app.chat.snapshot import SnapshotHeader, read_snapshot, write_snapshot  # noqa: E402
from app.config.setting_records import LoadConfig, SamplingParams  # noqa: E402
from app.engine.backend import Finished  # noqa: E402
from app.engine.chat_message import ChatMessage  # noqa: E402
from app.engine.local.engine import Engine  # noqa: E402
from app.engine.templates.override import TemplateOverride  # noqa: E402
from tests.arch_models import ARCHS, arch_model_path  # noqa: E402
from tests.mtp_model import mtp_model_path  # noqa: E402

PLAIN = TemplateOverride(
    "custom",
    source="{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
)
GREEDY = SamplingParams.greedy(max_tokens=24)
HEADER = SnapshotHeader({"name": "t", "size": 1, "sha256": "0" * 64}, {"x": "y"}, {"n": 1}, [])


def _step(engine: Engine, messages: list[ChatMessage]) -> tuple[Finished, dict[str, Any]]:
    t0 = time.perf_counter()
    done = list(engine.generate(messages, GREEDY))[-1]
    assert isinstance(done, Finished)
    ms = (time.perf_counter() - t0) * 1000
    return done, {"evaluated": done.metrics.evaluated_tokens, "ms": round(ms, 1)}


def _run(engine: Engine, words: int, checkpoints: bool, tmp: Path) -> dict[str, Any]:
    kv = engine._kv
    assert kv is not None
    engine.reset()
    if not checkpoints:
        kv.checkpoints = None
    ask = [ChatMessage("user", " ".join(f"word{i % 97}" for i in range(words)))]
    first, _ = _step(engine, ask)
    answer = ChatMessage("assistant", first.text)
    engine.prewarm(ask, answer)
    out: dict[str, Any] = {"prompt_tokens": first.metrics.prompt_tokens}
    chat = [*ask, answer, ChatMessage("user", "And then?")]
    new = len(engine.tokenize("And then?\n<|assistant|>"))
    _done, out["next_turn"] = _step(engine, chat)
    _done, out["regenerate"] = _step(engine, chat)
    edited = [*ask, answer, ChatMessage("user", "Or else?")]
    done, out["edit"] = _step(engine, edited)
    engine.prewarm(edited, ChatMessage("assistant", done.text))
    state = engine.export_state()
    path = tmp / "chat.lpkv"
    write_snapshot(path, HEADER, state)
    held = len(state.state) + sum(len(data) for _n, data in state.checkpoints)
    out["snapshot_bytes"] = path.stat().st_size
    out["snapshot_ratio"] = round(path.stat().st_size / held, 3)
    resumed = [*edited, ChatMessage("assistant", done.text), ChatMessage("user", "And then?")]
    for step, messages in (("resume", resumed), ("reopen_regenerate", edited)):
        engine.reset()
        engine.import_state(read_snapshot(path, HEADER))
        _done, out[step] = _step(engine, messages)
    for step in ("next_turn", "regenerate", "resume"):
        out[f"{step}_eval_ratio"] = round(out[step]["evaluated"] / new, 3)
    return out


def _mtp(tokens: int) -> dict[str, Any]:
    """Greedy replies plain and drafted by the next-token layers, on the same engine."""
    engine = Engine()
    engine.load(mtp_model_path(), LoadConfig(n_ctx=2048, n_threads=2))
    engine.set_template(PLAIN)
    plain = replace(GREEDY, max_tokens=tokens, mtp=False)
    modes = {"plain": plain, "mtp_3": replace(plain, mtp=True, adaptive_draft=False, draft_len=3)}
    modes["mtp_adaptive"] = replace(plain, mtp=True)
    out: dict[str, Any] = {}
    texts = {}
    for name, params in modes.items():
        ms = drafted = kept = 0.0
        texts[name] = []
        for ask in ("Hello there, how are you today?", "abc abc abc", "The cat sat on the mat."):
            engine.reset()
            t0 = time.perf_counter()
            done = list(engine.generate([ChatMessage("user", ask)], params))[-1]
            assert isinstance(done, Finished)
            ms += (time.perf_counter() - t0) * 1000
            drafted += done.metrics.drafted_tokens
            kept += done.metrics.accepted_tokens
            texts[name].append(done.text)
        out[name] = {"ms": round(ms, 1), "drafted": int(drafted), "accepted": int(kept)}
        if drafted:
            out[name]["acceptance"] = round(kept / drafted, 3)
    for name in ("mtp_3", "mtp_adaptive"):
        out[name]["speedup"] = round(out["plain"]["ms"] / out[name]["ms"], 3)
        out[name]["same_replies"] = texts[name] == texts["plain"]
    engine.unload()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=300)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "hybrid", "words": args.words}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            engine = Engine()
            engine.load(arch_model_path(arch), LoadConfig(n_ctx=8192, n_threads=2))
            engine.set_template(PLAIN)
            # The baseline first: its run cannot leave checkpoints behind for the other.
            base = _run(engine, args.words, False, Path(tmp))
            engine.unload()
            engine.load(arch_model_path(arch), LoadConfig(n_ctx=8192, n_threads=2))
            engine.set_template(PLAIN)
            new = _run(engine, args.words, True, Path(tmp))
            engine.unload()
            result[arch] = {"without_checkpoints": base, "with_checkpoints": new}
    result["mtp"] = _mtp(200)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
