"""Trying one risky native path in a short-lived child process, so a crash kills only the child.

The parent (:func:`run_probe`) starts ``python -m app.engine.native.path_probe`` (in the
frozen app: ``lamplight probe-native-path``, see ``ui/main.py``); the child
loads the CPU variant the app would use, opens the model with only the path
under test switched on, evaluates one small prompt batch (the matrix-matrix
kernels, where the AMX crash is) and two single tokens (the matrix-vector
ones), prints one JSON line and exits. A child killed by a signal (or, on
Windows, ending with an exception code) crashed in that path; a child that
reports an error without crashing says nothing against the path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.native.paths import RiskyPath

PROBE_TOKENS = 48  # more than "a few": llama.cpp takes the batched kernels
TIMEOUT_S = 60.0
CHILD_ARG = "probe-native-path"  # ui/main.py's sub-command in the frozen app
CONTROL = "none"  # the control run: every risky path off
_SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV"}


@dataclass(frozen=True)
class ProbeResult:
    """What one child said, or how it ended."""

    path: RiskyPath | None  # None: the control run, every risky path off
    crashed: bool  # killed by a signal / an exception code: the path is not safe here
    conclusive: bool  # False: timed out or could not start; try again another time
    detail: str  # one line for the user and the log
    seconds: float


def probe_command(
    child_arg: str = CHILD_ARG, module: str = "app.engine.native.path_probe"
) -> list[str]:
    """The command that runs a probe child: ``python -m module``, or the frozen app
    itself with its sub-command ``child_arg``."""
    if getattr(sys, "frozen", False):
        return [sys.executable, child_arg]
    return [sys.executable, "-m", module]


def crash_name(returncode: int) -> str:
    """``SIGSEGV`` for -11, ``exception 0xC0000005`` for a Windows crash; '' for an exit."""
    if returncode < 0:
        return _SIGNALS.get(-returncode, f"signal {-returncode}")
    if returncode >= 0xC0000000:  # NTSTATUS error codes: access violation, illegal instruction
        return f"exception {returncode:#010X}"
    return ""


def run_probe(
    path: RiskyPath | None,
    model: Path,
    *,
    threads: int = 2,
    command: Sequence[str] | None = None,
    timeout: float = TIMEOUT_S,
) -> ProbeResult:
    """Run the child for ``path`` (None: the control run) on ``model``; never raises.

    ``command`` replaces :func:`probe_command` (the tests run a child that crashes).
    """
    name = path.value if path is not None else CONTROL
    cmd = [*(command or probe_command()), "--path", name, "--model", str(model)]
    cmd += ["--threads", str(threads)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(
            path, False, False, f"the check did not finish in {timeout:.0f} s", timeout
        )
    except OSError as exc:
        return ProbeResult(path, False, False, f"the check could not start ({exc})", 0.0)
    seconds = time.monotonic() - t0
    crash = crash_name(proc.returncode)
    if crash:
        return ProbeResult(
            path, True, True, f"a test run in a separate process crashed ({crash})", seconds
        )
    report = _last_json(proc.stdout)
    if proc.returncode == 0 and report.get("ok") is True:
        return ProbeResult(path, False, True, "a test run in a separate process worked", seconds)
    error = str(report.get("error") or _tail(proc.stderr) or f"exit status {proc.returncode}")
    # A path llama.cpp refuses cleanly (no GPU memory, say) does not crash the app.
    return ProbeResult(path, False, True, f"no crash; the test run said: {error[:200]}", seconds)


def _last_json(raw: bytes) -> dict[str, object]:
    for line in reversed(raw[-4096:].decode("utf-8", "replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _tail(raw: bytes) -> str:
    lines = raw[-2000:].decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


# -- the child ------------------------------------------------------------------


def open_raw(
    model: Path,
    *,
    extra_bufts: bool,
    gpu: bool,
    flash: bool,
    n_ctx: int,
    n_batch: int,
    threads: int,
    n_ids: int,
    perf: bool = False,
) -> tuple[Any, Any, list[int]] | str:
    """A bare llama.cpp model and context (after ``load_backends``) and ``n_ids`` token
    ids to feed it (BOS, then ids spread over the vocabulary); or why not.

    Also used by ``bench/cpu_variants.py``; free with ``llama_free`` and
    ``llama_model_free``.
    """
    import llama_cpp as lc

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.use_extra_bufts = extra_bufts
    mparams.n_gpu_layers = 999 if gpu else 0
    llm_model = lc.llama_model_load_from_file(str(model).encode(), mparams)
    if not llm_model:
        return "llama.cpp could not load the model"
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = n_batch
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.flash_attn_type = (
        lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    cparams.no_perf = not perf
    ctx = lc.llama_init_from_model(llm_model, cparams)
    if not ctx:
        lc.llama_model_free(llm_model)
        return "llama.cpp could not create a context"
    vocab = lc.llama_model_get_vocab(llm_model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    ids = [lc.llama_vocab_bos(vocab)] + [(i * 7919) % n_vocab for i in range(1, n_ids)]
    return llm_model, ctx, ids


def _child(path: RiskyPath | None, model: Path, threads: int) -> dict[str, object]:
    from app.engine.native.libs import load_backends

    # The parent checked the model's header (read_gguf_info) before asking; a crash the
    # model causes anyway also kills the control run, and then nothing is blamed.
    load_backends()
    import llama_cpp as lc

    opened = open_raw(
        model,
        extra_bufts=path is RiskyPath.EXTRA_BUFTS,
        gpu=path is RiskyPath.GPU_OFFLOAD,
        flash=path is RiskyPath.FLASH_ATTN,
        n_ctx=256,
        n_batch=64,
        threads=threads,
        n_ids=PROBE_TOKENS,
    )
    if isinstance(opened, str):
        return {"ok": False, "error": opened}
    llm_model, ctx, ids = opened
    tokens = (lc.llama_token * len(ids))(*ids)
    rc = lc.llama_decode(ctx, lc.llama_batch_get_one(tokens, len(ids)))
    for _ in range(2):  # one-token steps: the matrix-vector kernels
        if rc != 0:
            break
        one = (lc.llama_token * 1)(ids[-1])
        rc = lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
    lc.llama_free(ctx)
    lc.llama_model_free(llm_model)
    if rc != 0:
        return {"ok": False, "error": f"llama_decode returned {rc}"}
    return {"ok": True}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=CHILD_ARG, description="check one native path")
    parser.add_argument("--path", required=True, choices=[CONTROL, *(p.value for p in RiskyPath)])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        path = None if args.path == CONTROL else RiskyPath(args.path)
        report = _child(path, Path(args.model), max(1, min(args.threads, 64)))
    except Exception as exc:  # reported to the parent, which decides
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    report["seconds"] = round(time.monotonic() - t0, 3)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    # Skip interpreter teardown: nothing to flush, and it is the slow part.
    os._exit(0 if report.get("ok") else 3)


if __name__ == "__main__":
    sys.exit(main())
