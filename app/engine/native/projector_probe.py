"""Loading a vision projector in a short-lived child process, so an abort kills only the child.

libmtmd ends the process on some projector files whose headers look right (a
``GGML_ASSERT`` while it builds its warm-up graph, or at the first image). The
parent (:func:`run_projector_probe`) starts ``python -m app.engine.native.projector_probe``
(in the frozen app: ``lamplight probe-projector``, see ``ui/main.py``); the child
opens the text model's vocabulary and header only (``vocab_only``: what libmtmd
reads of it), loads the projector as the engine would (warm-up on), prints one
JSON line, then encodes one small picture within :data:`ENCODE_S` seconds and
prints another. A child killed by a signal crashed on the file; one that loaded
but ran out of time on the picture proved the load.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.native.path_probe import crash_name, probe_command
from app.gguf.header import shown

TIMEOUT_S = 120.0  # the whole check (a 1.7 GB F32 projector read from a slow disk)
ENCODE_S = 10.0  # the child's budget for the picture, after the load
CHILD_ARG = "probe-projector"  # ui/main.py's sub-command in the frozen app
_ABORT_LINE = re.compile(r"\S+\.(?:c|cc|cpp|h):\d+: (.+)")  # ggml_abort's "%s:%d: %s"
_SIDE = 32  # the picture's side in pixels (libmtmd resizes it to the projector's size)


@dataclass(frozen=True)
class ProjectorProbe:
    """How the child ended."""

    crashed: bool  # killed by a signal (or a Windows exception code): refuse the file
    conclusive: bool  # False: timed out or could not start; decide nothing
    loaded: bool  # llama.cpp loaded it (and, unless ``detail`` says, encoded a picture)
    detail: str  # one line for the user and the log
    seconds: float


def run_projector_probe(
    model: Path,
    projector: Path,
    *,
    threads: int = 2,
    gpu: bool = False,
    command: Sequence[str] | None = None,
    timeout: float = TIMEOUT_S,
) -> ProjectorProbe:
    """Load ``projector`` for ``model`` in the child; never raises.

    ``command`` replaces :func:`probe_command` (the tests run a child that crashes).
    """
    cmd = [
        *(command or probe_command(CHILD_ARG, "app.engine.native.projector_probe")),
        "--model",
        str(model),
        "--projector",
        str(projector),
    ]
    cmd += ["--threads", str(threads), *(["--gpu"] if gpu else [])]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env={**os.environ, "GGML_NO_BACKTRACE": "1"},  # ggml would attach gdb to print one
        )
    except subprocess.TimeoutExpired:
        return ProjectorProbe(False, False, False, f"the check took over {timeout:.0f} s", timeout)
    except OSError as exc:
        return ProjectorProbe(False, False, False, f"the check could not start ({exc})", 0.0)
    seconds = time.monotonic() - t0
    reports = _json_lines(proc.stdout)
    loaded = any(r.get("loaded") is True for r in reports)
    crash = crash_name(proc.returncode)
    if crash:
        why = _assert_line(proc.stderr)
        what = "reading a picture" if loaded else "loading it"
        detail = f"llama.cpp ended a test process while {what} ({crash}{why})"
        return ProjectorProbe(True, True, loaded, detail, seconds)
    if reports and reports[-1].get("ok") is True:
        return ProjectorProbe(False, True, True, "it loaded in a test process", seconds)
    if loaded and proc.returncode == 1:  # faulthandler's watchdog: out of time on the picture
        detail = f"it loaded in a test process (its first picture took over {ENCODE_S:.0f} s)"
        return ProjectorProbe(False, True, True, detail, seconds)
    said = next((str(r["error"]) for r in reversed(reports) if "error" in r), "")
    error = _error_line(proc.stderr) or said or f"exit status {proc.returncode}"
    return ProjectorProbe(False, True, loaded, f"llama.cpp refused it ({error})", seconds)


def _json_lines(raw: bytes) -> list[dict[str, object]]:
    out = []
    for line in raw[-8192:].decode("utf-8", "replace").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _assert_line(raw: bytes) -> str:
    """``: <message>`` from ggml's last words (``<file>.c:<line>: GGML_ASSERT(...) failed``,
    or a ``GGML_ABORT``'s message), or ''."""
    for line in reversed(raw[-16384:].decode("utf-8", "replace").splitlines()):
        found = _ABORT_LINE.match(line.strip())
        if found:
            return ": " + shown(found.group(1), 200)
    return ""


def _error_line(raw: bytes) -> str:
    """Why llama.cpp refused the file, from its log: clip's reason (``clip_init: failed to
    load model '<path>': <reason>``), else the last ``error: <this>``; or ''."""
    lines = raw[-16384:].decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        if "failed to load model '" in line and "': " in line:
            return shown(line.split("': ", 1)[1].strip(), 300)
    for line in reversed(lines):
        if "error: " in line:
            return shown(line.split("error: ", 1)[1].strip(), 300)
    return ""


# -- the child ------------------------------------------------------------------


def _child(model: Path, projector: Path, threads: int, gpu: bool) -> dict[str, object]:
    from app.engine.native.libs import load_backends

    load_backends()
    import llama_cpp as lc
    from llama_cpp import mtmd_cpp as m

    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    mparams.vocab_only = True  # libmtmd reads the width, the RoPE type and the vocabulary
    text = lc.llama_model_load_from_file(str(model).encode(), mparams)
    if not text:
        return {"ok": False, "error": "llama.cpp could not read the model"}
    params = m.mtmd_context_params_default()
    params.use_gpu = gpu
    params.n_threads = threads
    params.print_timings = False
    params.warmup = True  # as the engine loads it: the warm-up graph is where asserts fire
    ctx = m.mtmd_init_from_file(str(projector).encode(), text, params)
    if not ctx:
        return {"ok": False, "error": "llama.cpp could not load the projector"}
    _say({"loaded": True})
    with open(os.devnull, "w") as quiet:
        faulthandler.dump_traceback_later(ENCODE_S, exit=True, file=quiet)
        rc = _encode_one(m, ctx)
        faulthandler.cancel_dump_traceback_later()
    if rc != 0:
        return {"ok": False, "error": f"the projector could not read a picture (code {rc})"}
    return {"ok": True}


def _encode_one(m: Any, ctx: Any) -> int:
    """Tokenize and encode one grey picture (``m``: ``llama_cpp.mtmd_cpp``); libmtmd's code."""
    pixels = (ctypes.c_ubyte * (_SIDE * _SIDE * 3))(*([128] * (_SIDE * _SIDE * 3)))
    bitmap = m.mtmd_bitmap_init(_SIDE, _SIDE, pixels)
    chunks = m.mtmd_input_chunks_init()
    part = m.mtmd_input_part()
    part.bitmap = bitmap
    parts = (ctypes.POINTER(m.mtmd_input_part) * 1)(ctypes.pointer(part))
    rc = int(m.mtmd_tokenize_from_parts(ctx, chunks, parts, 1, False))
    if rc != 0:
        return rc
    for i in range(m.mtmd_input_chunks_size(chunks)):
        chunk = m.mtmd_input_chunks_get(chunks, i)
        if m.mtmd_input_chunk_get_type(chunk) != 0:  # not text: the picture
            return int(m.mtmd_encode_chunk(ctx, chunk))
    return -1


def _say(report: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=CHILD_ARG, description="load one vision projector")
    parser.add_argument("--model", required=True)
    parser.add_argument("--projector", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    threads = max(1, min(args.threads, 64))
    try:
        report = _child(Path(args.model), Path(args.projector), threads, args.gpu)
    except Exception as exc:  # reported to the parent, which decides
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    report["seconds"] = round(time.monotonic() - t0, 3)
    _say(report)
    # Skip interpreter teardown (and libmtmd's): nothing to flush, and it is the slow part.
    os._exit(0 if report.get("ok") else 3)


if __name__ == "__main__":
    sys.exit(main())
