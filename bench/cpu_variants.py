"""Prefill and decode speed of the portable llama.cpp build, per CPU variant, against a
native (``-march=native``) build of the same llama.cpp, in one run.

Figures are llama.cpp's own timers (``llama_perf_context``: prompt-eval and eval
time and token counts), read in a fresh child process per configuration, so each
starts cold and can load another build (``LLAMA_CPP_LIB_PATH``) or force another
CPU variant (``LAMPLIGHT_CPU_VARIANT``). Configurations:

- ``native``: llama-cpp-python built with ``GGML_NATIVE=ON`` (what a plain
  ``pip install`` gives), built once into the user cache (``--native-lib DIR`` to
  use one you have; ``--no-native`` to skip; building takes ~8 minutes);
- ``auto``: the portable build, the variant the app picks for this CPU;
- ``auto-norepack``: the same with extra buffer types off (what the guard does
  where the repacked kernels crash);
- ``x64``: the portable build's baseline module (any x86-64 CPU).

Rounds interleave the configurations (this machine's speed drifts by ~30% within a
minute); the medians and each configuration's ratio to ``native`` are printed as
one JSON object.

Usage: python bench/cpu_variants.py [--rounds 3] [--prompt 512] [--decode 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.child import run_json  # noqa: E402


def measure(model: Path, n_prompt: int, n_decode: int, threads: int, extra_bufts: bool) -> dict:
    """In the child: load, evaluate ``n_prompt`` tokens in one batch, decode ``n_decode``."""
    from app.engine.native.libs import load_backends

    loaded = load_backends()
    import llama_cpp as lc

    from app.engine.native.path_probe import open_raw

    opened = open_raw(
        model,
        extra_bufts=extra_bufts,
        gpu=False,
        flash=False,
        n_ctx=n_prompt + n_decode + 16,
        n_batch=n_prompt,
        threads=threads,
        n_ids=n_prompt,
        perf=True,  # llama.cpp's own timers: what this bench reports
    )
    assert not isinstance(opened, str), opened
    model_p, ctx, ids = opened
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model_p))
    # Warm-up (first-touch of the weights, thread start), then reset the timers.
    warm = (lc.llama_token * 8)(*ids[:8])
    lc.llama_decode(ctx, lc.llama_batch_get_one(warm, 8))
    lc.llama_synchronize(ctx)
    lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
    lc.llama_perf_context_reset(ctx)
    tokens = (lc.llama_token * n_prompt)(*ids)
    # llama.cpp books a batch's time when it synchronizes: after each call, as a reply does.
    assert lc.llama_decode(ctx, lc.llama_batch_get_one(tokens, n_prompt)) == 0
    lc.llama_synchronize(ctx)
    for i in range(n_decode):
        one = (lc.llama_token * 1)((i * 31) % n_vocab)
        assert lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1)) == 0
        lc.llama_synchronize(ctx)
    perf = lc.llama_perf_context(ctx)
    return {
        "variant": loaded.cpu_variant,
        "prefill_tok_s": round(perf.n_p_eval / perf.t_p_eval_ms * 1000, 1),
        "decode_tok_s": round(perf.n_eval / perf.t_eval_ms * 1000, 1),
        "n_prompt": perf.n_p_eval,
        "n_decode": perf.n_eval,
    }


def native_lib(explicit: str | None) -> Path | None:
    """A native build's ``llama_cpp/lib``: ``explicit``, else built once into the cache."""
    if explicit:
        return Path(explicit)
    sys.path.insert(0, str(ROOT / "packaging"))
    import llama_build  # type: ignore[import-not-found]

    base = llama_build.user_cache_dir() / "bench" / f"native-{llama_build.VERSION}"
    lib = base / "llama_cpp" / "lib"
    if (lib / "libllama.so").is_file():
        return lib
    print("building a native llama-cpp-python for comparison (~8 min)...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = llama_build.pip_wheel(sys.executable, "-DGGML_NATIVE=ON", Path(tmp))
        base.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(base, [n for n in zf.namelist() if n.startswith("llama_cpp/lib/")])
    for so in lib.iterdir():
        so.chmod(0o755)
    return lib


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-repack", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--native-lib", default=None)
    parser.add_argument("--no-native", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                measure(
                    Path(args.model), args.prompt, args.decode, args.threads, not args.no_repack
                )
            )
        )
        return 0

    from app.models.default_model import ensure_default_model

    model = ensure_default_model(Path(tempfile.gettempdir()) / "lamplight-bench-models")
    configs: dict[str, tuple[dict[str, str], list[str]]] = {}
    clean = {k: v for k, v in os.environ.items() if k not in ("LAMPLIGHT_CPU_VARIANT",)}
    if not args.no_native:
        lib = native_lib(args.native_lib)
        if lib is not None:
            configs["native"] = ({**clean, "LLAMA_CPP_LIB_PATH": str(lib)}, [])
    configs["auto"] = (clean, [])
    configs["auto-norepack"] = (clean, ["--no-repack"])
    configs["x64"] = ({**clean, "LAMPLIGHT_CPU_VARIANT": "x64"}, [])
    common = ["--child", "--model", str(model), "--prompt", str(args.prompt)]
    common += ["--decode", str(args.decode), "--threads", str(args.threads)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    t0 = time.monotonic()
    for _ in range(args.rounds):
        for name, (env, extra) in configs.items():
            runs[name].append(run_json(__file__, [*common, *extra], name, env=env, timeout=600))
    out: dict[str, Any] = {
        "bench": "cpu_variants",
        "model": model.name,
        "threads": args.threads,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.decode,
        "rounds": args.rounds,
        "seconds": round(time.monotonic() - t0, 1),
        "configs": {},
    }
    for name, rs in runs.items():
        out["configs"][name] = {
            "variant": rs[0]["variant"],
            "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in rs),
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
        }
    if "native" in out["configs"]:
        base = out["configs"]["native"]
        for c in out["configs"].values():
            c["prefill_vs_native"] = round(c["prefill_tok_s"] / base["prefill_tok_s"], 3)
            c["decode_vs_native"] = round(c["decode_tok_s"] / base["decode_tok_s"], 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
