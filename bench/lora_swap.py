"""Hot-swapping the LoRA stack versus reloading the model with the adapters applied.

Writes two real adapters for the default model (every attention and feed-forward
projection of every layer, rank 16 by default, F32) with ``tests/lora_factory``,
loads the model (not timed), applies adapter A and runs a short warm-up reply.
Then, per round, with A applied:

* three hot swaps through ``Engine.set_lora_stack``: add B ([A, B]), rescale B
  ([A, B x 0.5]), remove B ([A]). Round 0 is the cold round: adding B loads its
  file into llama.cpp; later rounds reuse the loaded adapter.
* one reload: ``unload`` + ``load`` + ``set_lora_stack([A, B])`` (the adapters are
  freed with the model, so they are read and loaded again).

Each operation is timed twice: the call alone, and the call plus a one-token reply
to a short prompt from an empty cache (``*_first_token_ms``). The second figure
includes llama.cpp's deferred graph re-reservation, which a changed adapter set
triggers at the next decode, and the prompt evaluation both paths need anyway;
``first_token_unchanged_ms`` is that reply with the stack untouched, for reference.

Prints one JSON object. ``swap_ms`` is the MEAN PER OPERATION over the warm rounds'
add/rescale/remove calls (``swap_ms_is`` says so); ``reload_ms`` is the mean of the
reloads; ``ratio`` = reload_ms / swap_ms and ``ratio_first_token`` the same for
the first-token figures. Per-operation means and the cold add are listed too.
Usage: python bench/lora_swap.py [--rounds 5] [--threads 2] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.gguf.info import read_gguf_info
from app.gguf.lora import LoraStack
from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard
from tests.lora_factory import make_lora

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 2048
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
PROMPT = [ChatMessage("user", "Say hello.")]


def stack(*entries: tuple[Path, float]) -> LoraStack:
    s = LoraStack()
    for path, scale in entries:
        s.push(path, scale)
    return s


def first_token(engine: Engine) -> None:
    """A one-token reply to PROMPT from an empty cache."""
    engine.reset()
    for event in engine.generate(PROMPT, SamplingParams.greedy(1)):
        if isinstance(event, Finished):
            return
    raise RuntimeError("no Finished event")


def timed(op: Callable[[], Any], engine: Engine) -> tuple[float, float]:
    """(ms for ``op``, ms for ``op`` and then a one-token reply)."""
    t0 = time.perf_counter()
    op()
    t1 = time.perf_counter()
    first_token(engine)
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t0) * 1000


def mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 3)


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit("--rounds must be at least 2 (round 0 is the cold one)")

    model = ensure_default_model(ROOT / ".cache" / "test-models")
    load = LoadConfig(n_ctx=N_CTX, n_threads=args.threads)
    n_layers = read_gguf_info(model).n_layers or 0
    with tempfile.TemporaryDirectory(prefix="lamplight-lora-") as tmp:
        layers = range(n_layers)
        a = make_lora(Path(tmp) / "a.gguf", model, targets=TARGETS, layers=layers, rank=args.rank)
        b = make_lora(
            Path(tmp) / "b.gguf", model, targets=TARGETS, layers=layers, rank=args.rank, seed=1
        )
        engine = Engine()
        engine.load(model, load)
        engine.set_lora_stack(stack((a, 1.0)))
        first_token(engine)  # warm-up: graph built, pages touched
        llm, loads = engine.llama, engine.load_count

        ops: dict[str, list[tuple[float, float]]] = {"add": [], "rescale": [], "remove": []}
        cold_add: tuple[float, float] | None = None
        reloads: list[tuple[float, float]] = []
        unchanged: list[float] = []  # the one-token reply alone, stack untouched
        for round_no in range(args.rounds):
            unchanged.append(timed(lambda: None, engine)[1])
            for name, target in (
                ("add", stack((a, 1.0), (b, 1.0))),
                ("rescale", stack((a, 1.0), (b, 0.5))),
                ("remove", stack((a, 1.0))),
            ):
                result = timed(lambda s=target: engine.set_lora_stack(s), engine)
                if round_no == 0 and name == "add":
                    cold_add = result
                elif round_no > 0:
                    ops[name].append(result)
            if engine.llama is not llm or engine.load_count != loads:
                raise RuntimeError("a hot swap reloaded the model")

            def reload() -> None:
                engine.unload()
                engine.load(model, load)
                engine.set_lora_stack(stack((a, 1.0), (b, 1.0)))

            reloads.append(timed(reload, engine))
            engine.set_lora_stack(stack((a, 1.0)))  # the next round starts from [A] again
            first_token(engine)
            llm, loads = engine.llama, engine.load_count
        engine.unload()
        adapter_bytes = a.stat().st_size

    assert cold_add is not None
    warm = [v for values in ops.values() for v in values]
    swap_ms = mean([v[0] for v in warm])
    swap_ft = mean([v[1] for v in warm])
    reload_ms = mean([v[0] for v in reloads])
    reload_ft = mean([v[1] for v in reloads])
    print(
        json.dumps(
            {
                "swap_ms": swap_ms,
                "swap_ms_is": "mean per operation (add, rescale, remove) over the warm rounds",
                "reload_ms": reload_ms,
                "reload_ms_is": "mean of unload + load + set_lora_stack([A, B])",
                "ratio": round(reload_ms / swap_ms, 1),
                "swap_first_token_ms": swap_ft,
                "reload_first_token_ms": reload_ft,
                "ratio_first_token": round(reload_ft / swap_ft, 1),
                "first_token_unchanged_ms": mean(unchanged),
                "swap_ops_ms": {k: mean([v[0] for v in vals]) for k, vals in ops.items()},
                "swap_ops_first_token_ms": {
                    k: mean([v[1] for v in vals]) for k, vals in ops.items()
                },
                "cold_add_ms": round(cold_add[0], 3),
                "cold_add_first_token_ms": round(cold_add[1], 3),
                "reload_rounds_ms": [round(v[0], 1) for v in reloads],
                "adapter_bytes": adapter_bytes,
                "adapter_rank": args.rank,
                "adapter_targets": len(TARGETS) * n_layers,
                "rounds": args.rounds,
                "warm_rounds": args.rounds - 1,
                "threads": args.threads,
                "n_ctx": N_CTX,
            }
        )
    )


if __name__ == "__main__":
    main()
