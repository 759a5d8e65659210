"""Two llama.cpp contexts in one process: idle spinning and decode swings, with and
without one shared ggml thread pool (``app/engine/native/threadpool.py``).

Loads the default model (target) and its 4-block test draft, ``--threads`` each.
Each configuration runs in a fresh process (OpenMP reads its environment once):

- ``same``: target and draft decode in turns on one OS thread (as the engine's
  worker does with a draft model loaded);
- ``two``: in turns, but the draft on a second OS thread (as a benchmark that
  compares the app's worker thread with a bare ``Llama`` on the main thread does);
- ``spec``: the speculative pattern on one thread: 4 one-token draft steps, then
  one 5-token target batch.

Reported per configuration: the target's decode tok/s per round (and its first 8
tokens right after the other model ran), and the CPU time the process burns while
every Python thread sleeps for 1, 10 and 100 ms right after a decode: non-zero
means worker threads spin waiting for work (libgomp's spin-wait under OpenMP,
ggml's ``poll`` without it).
Usage: python bench/threadpool.py [--threads 2] [--rounds 6] [--configs same,spec]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.guarded import use_native_guard  # noqa: E402 (after the path above)

PROMPT = b"Once upon a time, in a small village by the sea,"
CONFIGS = {
    # name: (pattern, shared pool, extra environment)
    "same": ("same", False, {}),
    "same+pool": ("same", True, {}),
    "same+pool(poll=0)": ("same", 0, {}),
    "same+passive": ("same", False, {"OMP_WAIT_POLICY": "passive"}),
    "two": ("two", False, {}),
    "two+pool": ("two", True, {}),
    "two+passive": ("two", False, {"OMP_WAIT_POLICY": "passive"}),
    "spec": ("spec", False, {}),
    "spec+pool": ("spec", True, {}),
    "spec+passive": ("spec", False, {"OMP_WAIT_POLICY": "passive"}),
}


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _idle_cpu_ms(ms: float) -> float:
    start = _cpu_s()
    time.sleep(ms / 1000)
    return (_cpu_s() - start) * 1000


def measure(pattern: str, pool_poll: bool | int, threads: int, rounds: int) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    from app.engine.native.libs import load_backends
    from app.engine.native.threadpool import SharedThreadPool, uses_openmp
    from app.models.default_model import ensure_default_model
    from tests.draft_model import draft_model_path
    from tests.native import llama as guarded_llama

    load_backends()  # the CPU variant for this processor, before any model

    def load(path: Path) -> Any:
        return guarded_llama(  # the native guard's verdicts, as the app's engine
            path, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False
        )

    def argmax(m: Any) -> int:
        logits = llama_cpp.llama_get_logits_ith(m.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(m.n_vocab(),))))

    def decode(m: Any, n: int) -> list[float]:
        m.reset()
        m.eval(m.tokenize(PROMPT))
        times = []
        for _ in range(n):
            t = time.perf_counter()
            m.eval([argmax(m)])
            times.append(time.perf_counter() - t)
        return times

    target = load(ensure_default_model(ROOT / ".cache" / "test-models"))
    draft = load(draft_model_path())
    pool = None
    if pool_poll is not False:
        pool = SharedThreadPool(threads, poll=None if pool_poll is True else int(pool_poll))
        pool.attach(target.ctx)
        pool.attach(draft.ctx)
    other = ThreadPoolExecutor(1)
    rates: list[float] = []
    first8: list[float] = []
    idle: dict[str, list[float]] = {"1ms": [], "10ms": [], "100ms": []}
    try:
        for _ in range(rounds):
            if pattern == "spec":
                target.reset()
                draft.reset()
                prompt = target.tokenize(PROMPT)
                target.eval(prompt)
                draft.eval(prompt)
                start, n = time.perf_counter(), 0
                for _ in range(8):
                    guess = []
                    for _ in range(4):
                        guess.append(argmax(draft))
                        draft.eval([guess[-1]])
                    target.eval([argmax(target), *guess])
                    n += 5
                rates.append(n / (time.perf_counter() - start))
            else:
                times = decode(target, 24)
                rates.append(24 / sum(times))
                first8.append(8 / sum(times[:8]))
            for key, ms in (("1ms", 1), ("10ms", 10), ("100ms", 100)):
                target.eval([argmax(target)])
                idle[key].append(_idle_cpu_ms(ms))
            if pattern == "two":
                other.submit(decode, draft, 24).result()
            elif pattern == "same":
                decode(draft, 24)
    finally:
        other.shutdown()
        if pool is not None:
            pool.close()
        target.close()
        draft.close()
    return {
        "openmp": uses_openmp(),
        "target_tok_s": [round(x, 1) for x in rates],
        "median_tok_s": round(statistics.median(rates), 1),
        "first8_tok_s": [round(x, 1) for x in first8],
        "idle_cpu_ms": {k: round(statistics.median(v), 2) for k, v in idle.items()},
    }


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--config", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:
        pattern, pool, _env = CONFIGS[args.config]
        print(json.dumps(measure(pattern, pool, args.threads, args.rounds)))
        return
    out: dict[str, Any] = {"threads": args.threads, "rounds": args.rounds}
    for name in args.configs.split(","):
        from bench.child import run_json

        env = {**os.environ, **CONFIGS[name][2]}
        command = ["--config", name, "--threads", str(args.threads), "--rounds", str(args.rounds)]
        out[name] = run_json(__file__, command, name, env=env)
        print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
    out["load_average"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
