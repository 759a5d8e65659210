"""GPU support through the app's engine: detection, auto offload, CPU fallback, speed.

Runs on any machine; without a GPU build and a device it prints a JSON note and
stops (``--allow-cpu`` runs the CPU parts anyway, to test the script). Checks:

- ``detect``: what ``detect_hardware`` and ``load_backends`` report (devices, free memory);
- ``auto``: the layer count ``auto`` picks, that llama.cpp really offloads it (its
  ``offloaded N/M layers`` log line, device memory before and after), and the native
  guard's GPU-offload probe (``path_probe`` in a child);
- ``partial``: auto with most of the GPU memory held by another process (torch);
- ``fallback``: all layers asked for with too little GPU memory: the load fails on the
  GPU and ``load_with_fallback`` retries on the CPU with a note;
- ``no_device``: a child with ``CUDA_VISIBLE_DEVICES=`` (a GPU build, no device);
- ``speed``: prefill and decode tok/s through ``Engine.generate`` (the app's metrics)
  and llama.cpp's own timers (``llama_perf_context``), GPU and CPU interleaved.

Without ``--model`` it builds a random-weights llama model (F16) with the ``gguf``
package and the tokenizer of ``--vocab`` (a vocab-only GGUF, such as llama.cpp's
``models/ggml-vocab-llama-spm.gguf``): random weights are fine for speed and memory.

Usage: python bench/gpu.py --vocab VOCAB.gguf [--out result.json] [--small] [--allow-cpu]

On the H100 machine of docs/notes/gpu.md every model load segfaulted in llama.cpp
(``print_info``) until the system libstdc++ was preloaded
(``LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6``); the figures there were taken so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.native.hardware import HardwareInfo, _devices, detect_hardware

GIB = 1024**3
# n_embd, n_layer, n_ff, n_head, n_head_kv: about 1.1 B parameters (2.2 GB in F16), or tiny.
FULL = (2048, 16, 8192, 32, 8)
SMALL = (256, 4, 768, 4, 2)
SENTENCE = (
    "The keeper climbed the stairs of the lighthouse at dusk, trimmed the wick, "
    "and watched the ships pass the reef while the sea rose against the rocks. "
)
PROMPT = (SENTENCE * 13).strip()  # about 450 tokens with a llama tokenizer


class LogLines(logging.Handler):
    """Keeps llama.cpp's log lines that tell where the model went."""

    KEYS = ("offload", "CUDA", "buffer size", "MiB free", "failed", "error", "unable")
    SKIP = ("CUDA Graph", "graph warmup", "assigned to device", ": dev = ")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if any(k in msg for k in self.KEYS) and not any(k in msg for k in self.SKIP):
            self.lines.append(msg[:300])

    def take(self) -> list[str]:
        out, self.lines = self.lines, []
        return out


LOG = LogLines()


def make_model(path: Path, vocab: Path, dims: tuple[int, int, int, int, int]) -> Path:
    """A llama-architecture GGUF with random F16 weights and ``vocab``'s tokenizer."""
    import gguf
    import numpy as np

    n_embd, n_layer, n_ff, n_head, n_kv = dims
    reader = gguf.GGUFReader(str(vocab))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-llama-{n_layer}x{n_embd}")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, field.contents(), field.types[0], sub)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(n_vocab * n_embd + 4096, dtype=np.float32) * 0.02).astype(
        np.float16
    )

    def rand(*shape: int) -> Any:
        n = int(np.prod(shape))
        start = int(rng.integers(0, len(pool) - n))
        return pool[start : start + n].reshape(shape)

    ones = np.ones(n_embd, dtype=np.float32)
    head = n_embd // n_head * n_kv
    w.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", ones)
    out = rand(n_vocab, n_embd).copy()
    out[[1, 2]] = 0  # BOS/EOS never win the greedy pick: replies run to max_tokens
    w.add_tensor("output.weight", out)
    for i in range(n_layer):
        for name, shape in (
            ("attn_q", (n_embd, n_embd)),
            ("attn_k", (head, n_embd)),
            ("attn_v", (head, n_embd)),
            ("attn_output", (n_embd, n_embd)),
            ("ffn_gate", (n_ff, n_embd)),
            ("ffn_up", (n_ff, n_embd)),
            ("ffn_down", (n_embd, n_ff)),
        ):
            w.add_tensor(f"blk.{i}.{name}.weight", rand(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def device_list(hw: HardwareInfo | None = None) -> list[dict[str, Any]]:
    devices = hw.devices if hw is not None else tuple(_devices())
    return [
        {
            "name": d.name,
            "description": d.description,
            "kind": d.kind,
            "free_gib": round(d.free_bytes / GIB, 2),
            "total_gib": round(d.total_bytes / GIB, 2),
        }
        for d in devices
    ]


def gpu_free() -> int:
    return max((d.free_bytes for d in _devices() if d.kind in ("GPU", "iGPU")), default=0)


def detect() -> dict[str, Any]:
    import llama_cpp

    from app.engine.local.offload import accelerator_hint
    from app.engine.native.libs import lib_dir, load_backends

    loaded = load_backends()
    hw = detect_hardware()
    return {
        "llama_cpp": llama_cpp.__version__,
        "modules": sorted(p.name for p in lib_dir().glob("libggml-*.so")),
        "gpu_offload": hw.gpu_offload,
        "label": hw.label,
        "devices": device_list(hw),
        "cpu_variant": loaded.cpu_variant,
        "gpu_modules": list(loaded.gpu_modules),
        "failed_modules": list(loaded.failed),
        "accelerator_hint": accelerator_hint(hw),
    }


def loaded_summary(engine: Any, info: Any, free_before: int) -> dict[str, Any]:
    return {
        "n_gpu_layers": info.n_gpu_layers,
        "backend": info.backend,
        "load_ms": round(info.load_ms),
        "notes": list(info.notes),
        "gpu_free_gib_before": round(free_before / GIB, 2),
        "gpu_free_gib_after": round(gpu_free() / GIB, 2),
        "log": LOG.take(),
    }


def check_auto(model: Path) -> tuple[dict[str, Any], Any]:
    """Load with ``auto`` through the engine, with the native guard on a fresh store."""
    LOG.take()
    from app.engine.local.engine import Engine
    from app.engine.local.offload import auto_gpu_layers, fit_report
    from app.engine.native.guard import NativeGuard
    from app.gguf.info import read_gguf_info

    store = Path(tempfile.mkdtemp(prefix="lamplight-gpu-")) / "native_paths.json"
    guard = NativeGuard(store)
    engine = Engine(guard=guard)
    config = LoadConfig()
    hw = engine.hardware()
    gguf = read_gguf_info(model)
    fit = fit_report(model, config, hw)
    free = gpu_free()
    t0 = time.perf_counter()
    info = engine.load(model, config)
    out = {
        "auto_layers": auto_gpu_layers(gguf, config, hw),
        "model_layers": gguf.n_layers,
        "fit": {"fits": fit.fits, "vram_needed_gib": round(fit.vram_needed / GIB, 2)},
        "load_s_with_probe": round(time.perf_counter() - t0, 2),
        **loaded_summary(engine, info, free),
        "guard": {p.value: [v.ok, v.reason] for p, v in guard.store.verdicts().items()},
    }
    return out, engine


class Hog:
    """Another process holding GPU memory (torch), so that ``free`` is what we want."""

    def __init__(self, leave_free: int) -> None:
        code = (
            "import sys, torch; torch.cuda.init(); free = torch.cuda.mem_get_info()[0]; "
            "x = torch.empty(max(1, free - int(sys.argv[1])), dtype=torch.uint8, device='cuda'); "
            "print('ready', flush=True); sys.stdin.read()"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(leave_free)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("the memory-holding process did not start (torch missing?)")

    def __enter__(self) -> Hog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def check_partial(model: Path, size: int) -> dict[str, Any]:
    """``auto`` with room for about half the model: some layers go to the GPU."""
    LOG.take()
    from app.engine.local.engine import Engine
    from app.engine.local.offload import MARGIN_BYTES, MARGIN_FRACTION, load_with_fallback

    leave = int((size / 2 + MARGIN_BYTES) / (1 - MARGIN_FRACTION))
    with Hog(leave):
        engine = Engine(guard=None)
        free = gpu_free()
        info, note = load_with_fallback(engine, model, LoadConfig())
        out = {"fallback_note": note, **loaded_summary(engine, info, free)}
        out["reply"] = one_reply(engine, 32)  # the margin leaves room to compute too
        engine.unload()
    return out


def check_fallback(model: Path) -> dict[str, Any]:
    """Every layer asked for, 0.6 GiB free: the GPU load fails, the CPU load works."""
    LOG.take()
    from app.engine.local.engine import Engine
    from app.engine.local.offload import load_with_fallback

    with Hog(int(0.6 * GIB)):
        engine = Engine(guard=None)
        free = gpu_free()
        info, note = load_with_fallback(engine, model, LoadConfig(n_gpu_layers=-1))
        out = {"fallback_note": note, **loaded_summary(engine, info, free)}
        engine.unload()
    return out


def no_device_child(model: Path) -> dict[str, Any]:
    """In this process (started with ``CUDA_VISIBLE_DEVICES=``): detect, then load."""
    from app.engine.local.engine import Engine
    from app.engine.local.offload import load_with_fallback

    out = detect()
    for name, layers in (("auto", -2), ("all", -1)):
        engine = Engine(guard=None)
        info, note = load_with_fallback(engine, model, LoadConfig(n_gpu_layers=layers))
        out[name] = {"fallback_note": note, **loaded_summary(engine, info, 0)}
        engine.unload()
    return out


def check_no_device(model: Path) -> dict[str, Any]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, __file__, "--no-device-child", str(model)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        return {"rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def one_reply(engine: Any, tokens: int) -> dict[str, float]:
    import llama_cpp

    engine.reset()
    # A reply that ends at max_tokens leaves its last llama_decode unsynchronized, and
    # llama_perf_context_reset keeps that pending start time: without this, the next
    # reply's llama.cpp prefill time includes everything in between (docs/notes/gpu.md).
    llama_cpp.llama_synchronize(engine.native.ctx)
    params = SamplingParams.greedy(tokens)
    finished = None
    for event in engine.generate([ChatMessage("user", PROMPT)], params):
        if isinstance(event, Finished):
            finished = event
    assert finished is not None
    m = finished.metrics
    return {
        "prompt_tokens": m.evaluated_tokens,
        "generated": m.generated_tokens,
        "app_prefill": m.prefill_tok_s,
        "native_prefill": m.native_prefill_tok_s,
        "app_decode": m.decode_tok_s,
        "native_decode": m.native_decode_tok_s,
        "ttft_ms": m.ttft_ms,
    }


def check_speed(engines: dict[str, tuple[Any, int]], rounds: int) -> dict[str, Any]:
    """Medians over ``rounds``, the configurations interleaved so drift hits all alike."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for name, (engine, tokens) in engines.items():
            runs[name].append(one_reply(engine, tokens))
    out: dict[str, Any] = {}
    for name, rows in runs.items():
        rows = rows[1:]
        med = {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}
        med["decode_app_vs_native"] = round(med["app_decode"] / med["native_decode"], 3)
        med["prefill_app_vs_native"] = round(med["app_prefill"] / med["native_prefill"], 3)
        med["n_gpu_layers"] = engines[name][0].model.n_gpu_layers
        med["threads"] = engines[name][0].model.n_threads
        out[name] = med
    return out


def section(result: dict[str, Any], name: str, fn: Callable[[], Any], out: Path | None) -> Any:
    """Run one check; its error is recorded, not raised; the JSON so far is saved."""
    t0 = time.perf_counter()
    value = None
    try:
        value = fn()
        result[name] = value[0] if isinstance(value, tuple) else value
    except Exception as exc:  # a failed check must not hide the others
        result[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "log": LOG.take()}
    result.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
    if out is not None:
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return value


def run_checks(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from app.engine.local.engine import Engine

    out = Path(args.out) if args.out else None
    model = Path(args.model) if args.model else None
    if model is None:
        target = Path(tempfile.mkdtemp(prefix="lamplight-gpu-")) / "random-llama.gguf"
        dims = SMALL if args.small else FULL
        section(result, "make_model", lambda: str(make_model(target, Path(args.vocab), dims)), out)
        model = target
    size = model.stat().st_size
    result["model"] = {"path": model.name, "gib": round(size / GIB, 2)}
    gpu = result["detect"]["gpu_offload"]
    auto = section(result, "auto", lambda: check_auto(model), out)
    engines: dict[str, tuple[Any, int]] = {}
    if gpu and auto is not None:
        engines["gpu"] = (auto[1], args.tokens)
        fa = Engine(guard=None)
        fa.load(model, LoadConfig(flash_attn=True))
        engines["gpu_flash_attn"] = (fa, args.tokens)
    cpu = Engine(guard=None)
    cpu.load(model, replace(LoadConfig(), n_gpu_layers=0))
    engines["cpu"] = (cpu, args.cpu_tokens)
    LOG.take()
    section(result, "speed", lambda: check_speed(engines, args.rounds), out)
    for engine, _ in engines.values():
        engine.unload()
    if gpu:
        section(result, "partial", lambda: check_partial(model, size), out)
        section(result, "fallback", lambda: check_fallback(model), out)
        section(result, "no_device", lambda: check_no_device(model), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a GGUF to use instead of a random one")
    parser.add_argument("--vocab", help="vocab-only GGUF for the random model's tokenizer")
    parser.add_argument("--out", help="also write the JSON here, after each check")
    parser.add_argument("--small", action="store_true", help="a tiny random model")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256, help="reply length on the GPU")
    parser.add_argument("--cpu-tokens", type=int, default=48, help="reply length on the CPU")
    parser.add_argument("--verbose", action="store_true", help="llama.cpp's log to stderr")
    parser.add_argument("--no-device-child", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.verbose:
        logging.getLogger("llama.cpp").addHandler(logging.StreamHandler())
    logging.getLogger("llama.cpp").setLevel(logging.DEBUG)
    logging.getLogger("llama.cpp").addHandler(LOG)
    logging.getLogger("llama.cpp").propagate = False
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"skipped": f"llama_cpp is not installed ({exc})"}))
        return
    if args.no_device_child:
        print(json.dumps(no_device_child(Path(args.no_device_child))))
        return
    if not args.model and not args.vocab:
        parser.error("give --model or --vocab")
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    result["detect"] = detect()
    if not result["detect"]["gpu_offload"] and not args.allow_cpu:
        result["skipped"] = "this llama.cpp build has no GPU device to offload to"
        print(json.dumps(result))
        return
    run_checks(args, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
