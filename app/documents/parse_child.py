"""Reading a document in a short-lived child process, so a hostile file can only crash,
stall or bloat the child, which is then killed.

The parent (:func:`parse_bounded`) starts ``python -m app.documents.parse_child PATH``
(in the frozen app: ``lamplight parse-document PATH``, see ``ui/main.py``); the child
limits its own memory and CPU time, runs :func:`app.documents.parse.parse_file` and
prints one JSON object. The parent reads a bounded amount of it, watches the clock, the
cancel event and the child's memory, and kills the child when any runs out.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from app.documents.parse import Block, ParsedDocument, parse_file
from app.util.errors import DocumentCancelled, DocumentError

log = logging.getLogger(__name__)

CHILD_ARG = "parse-document"  # ui/main.py's sub-command in the frozen app
MAX_MEMORY_BYTES = 1536 * 1024 * 1024  # the child's address space (Linux) / RSS (elsewhere)
MAX_OUTPUT_BYTES = 64 * 1024 * 1024  # JSON of at most 4 M characters of text, escaped
POLL_S = 0.05
_KINDS = frozenset({"text", "markdown", "code", "html", "pdf", "docx"})


def child_command() -> list[str]:
    """The command that runs the child: this interpreter, or the frozen app itself."""
    if getattr(sys, "frozen", False):
        return [sys.executable, CHILD_ARG]
    return [sys.executable, "-m", "app.documents.parse_child"]


def parse_bounded(
    path: Path, cancel: threading.Event | None = None, timeout_s: float = 30.0
) -> ParsedDocument:
    """:func:`parse_file` in a child process; raises DocumentError or DocumentCancelled."""
    path = path.absolute()
    name = path.name
    cpu = str(max(1, int(timeout_s) + 2))
    root = Path(__file__).resolve().parents[2]  # where ``app`` imports from, in development
    try:
        proc = subprocess.Popen(
            [*child_command(), str(path), "--cpu-seconds", cpu],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=None if getattr(sys, "frozen", False) else root,
        )
    except OSError as exc:
        raise DocumentError(
            f"Lamplight could not read {name}: the reader could not start ({exc})."
        ) from exc
    out = _Drain(proc.stdout, MAX_OUTPUT_BYTES)
    err = _Drain(proc.stderr, 8192, keep_tail=True)
    try:
        why = _watch(proc, out, cancel, timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        out.join()
        err.join()
    if why == "cancel":
        raise DocumentCancelled(f"Reading {name} was cancelled.")
    if why == "timeout":
        raise DocumentError(
            f"Lamplight could not read {name}: it took longer than {timeout_s:g} s."
        )
    if why == "memory" or out.overflow:
        raise DocumentError(f"Lamplight could not read {name}: it needs too much memory.")
    return _result(name, proc.returncode, out.data(), err.data())


class _Drain:
    """Reads a pipe on a thread, keeping at most ``limit`` bytes (the head, or the tail)."""

    def __init__(self, pipe: IO[bytes] | None, limit: int, keep_tail: bool = False) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._limit = limit
        self._tail = keep_tail
        self.overflow = False
        self._thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self._thread.start()

    def _run(self, pipe: IO[bytes] | None) -> None:
        if pipe is None:
            return
        with pipe:
            while chunk := os.read(pipe.fileno(), 65536):
                self._chunks.append(chunk)
                self._size += len(chunk)
                if self._size > self._limit:
                    if not self._tail:
                        self.overflow = True  # keep draining so the child never blocks
                        self._chunks.clear()
                    else:
                        joined = b"".join(self._chunks)[-self._limit :]
                        self._chunks, self._size = [joined], len(joined)

    def join(self) -> None:
        self._thread.join(5.0)

    def data(self) -> bytes:
        return b"" if self.overflow else b"".join(self._chunks)


def _watch(
    proc: subprocess.Popen[bytes], out: _Drain, cancel: threading.Event | None, timeout_s: float
) -> str:
    """'' once the child ends, else why it must be killed: timeout, cancel or memory."""
    deadline = time.monotonic() + timeout_s
    try:
        watched: psutil.Process | None = psutil.Process(proc.pid)
    except psutil.Error:
        watched = None
    while True:
        try:
            proc.wait(POLL_S)
            return ""
        except subprocess.TimeoutExpired:
            pass
        if cancel is not None and cancel.is_set():
            return "cancel"
        if time.monotonic() > deadline:
            return "timeout"
        if out.overflow:
            return "memory"
        try:
            if watched is not None and watched.memory_info().rss > MAX_MEMORY_BYTES:
                return "memory"
        except psutil.Error:
            watched = None  # it is ending


def _result(name: str, code: int, raw: bytes, err: bytes) -> ParsedDocument:
    report = _last_json(raw)
    if code == 0 and report.get("ok") is True:
        try:
            return doc_from_dict(report["doc"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("%s: the reader's answer was malformed: %s", name, exc)
    elif code in (0, 3) and isinstance(report.get("error"), str) and report["error"]:
        raise DocumentError(str(report["error"])[:500])
    log.warning("%s: reader ended with %s: %s", name, code, err[-2000:].decode("utf-8", "replace"))
    raise DocumentError(f"Lamplight could not read {name}: the reader stopped unexpectedly.")


def _last_json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def doc_to_dict(doc: ParsedDocument) -> dict[str, Any]:
    """The JSON form the child prints."""
    return {
        "path": doc.path,
        "kind": doc.kind,
        "title": doc.title,
        "pages": doc.pages,
        "blocks": [[b.text, b.page, b.line] for b in doc.blocks],
    }


def doc_from_dict(raw: Any) -> ParsedDocument:
    """A ParsedDocument from the child's JSON; ValueError/TypeError when malformed."""
    if not isinstance(raw, dict) or raw.get("kind") not in _KINDS:
        raise ValueError("not a parsed document")
    pages = raw.get("pages")
    if not (pages is None or (isinstance(pages, int) and pages >= 0)):
        raise ValueError("bad page count")
    blocks: list[Block] = []
    for item in raw["blocks"]:
        text, page, line = item
        if not isinstance(text, str) or not isinstance(line, int):
            raise ValueError("bad block")
        if not (page is None or isinstance(page, int)):
            raise ValueError("bad block page")
        blocks.append(Block(text, page, line))
    return ParsedDocument(str(raw["path"]), raw["kind"], str(raw["title"]), tuple(blocks), pages)


# -- the child ------------------------------------------------------------------


def _limit_self(cpu_seconds: int) -> None:
    """Cap this process's memory and CPU time where the OS can (Linux; CPU on macOS);
    the parent also watches the memory, for the systems that do not enforce this."""
    sys.setrecursionlimit(3000)
    try:
        import resource
    except ImportError:  # Windows
        return
    for limit, value in (
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_AS, MAX_MEMORY_BYTES),
    ):
        try:
            hard = resource.getrlimit(limit)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, hard))
        except (ValueError, OSError):  # macOS refuses RLIMIT_AS
            pass


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cpu = 30
    if "--cpu-seconds" in args:
        at = args.index("--cpu-seconds")
        cpu = int(args[at + 1]) if at + 1 < len(args) and args[at + 1].isdigit() else cpu
        del args[at : at + 2]
    if len(args) != 1:
        os.write(2, f"usage: {CHILD_ARG} PATH [--cpu-seconds N]\n".encode())
        return 2
    _limit_self(cpu)
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # "incorrect startxref" and the like
    warnings.simplefilter("ignore")
    try:
        report: dict[str, Any] = {"ok": True, "doc": doc_to_dict(parse_file(Path(args[0])))}
    except DocumentError as exc:
        report = {"ok": False, "error": str(exc)}
    except MemoryError:
        report = {
            "ok": False,
            "error": f"Lamplight could not read {Path(args[0]).name}: it needs too much memory.",
        }
    # To the descriptor: a windowed frozen app may have no ``sys.stdout`` object.
    data = json.dumps(report, ensure_ascii=True).encode("ascii")
    while data:
        data = data[os.write(1, data) :]
    # Skip interpreter teardown: nothing to flush, and it is the slow part.
    os._exit(0 if report["ok"] else 3)


if __name__ == "__main__":
    sys.exit(main())
