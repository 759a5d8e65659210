"""Hybrid and recurrent models with checkpoints versus without, in one run (issue 43).

    .venv/bin/python bench/recurrent_memory.py [--words 300]   # prints one JSON object

On the tiny random models of ``tests/arch_models.py`` (mamba2: recurrent; lfm2 and
qwen35: hybrid), a chat of one long user message (``--words`` words, byte tokens) and
a short greedy reply goes through what a user does next, each step timed from the
request to the reply's end, with the tokens llama.cpp evaluated for it:

* ``next_turn``: a new message after the reply (the app reads the next turn's opening
  ahead of time, as after every reply);
* ``regenerate``: the same prompt again;
* ``edit``: the last message changed;
* ``reopen_regenerate``: the chat saved as a snapshot, the cache emptied, the snapshot
  read back, then a regenerate.

The baseline is the same engine with its checkpoints switched off (what the engine did
before: llama.cpp refuses to cut a recurrent state back, the cache is dropped and the
whole chat read again). The models are tiny, so the milliseconds are mostly the engine's
own; the evaluated-token counts are what a real model pays for by the thousand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
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
    _done, out["next_turn"] = _step(engine, chat)
    _done, out["regenerate"] = _step(engine, chat)
    _done, out["edit"] = _step(engine, [*ask, answer, ChatMessage("user", "Or else?")])
    path = tmp / "chat.lpkv"
    write_snapshot(path, HEADER, engine.export_state())
    engine.reset()
    engine.import_state(read_snapshot(path, HEADER))
    _done, out["reopen_regenerate"] = _step(engine, [*ask, answer, ChatMessage("user", "Or else?")])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--words", type=int, default=300)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "recurrent_memory", "words": args.words}
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
    print(json.dumps(result))


if __name__ == "__main__":
    main()
