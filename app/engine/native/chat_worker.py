"""llama.cpp's template calls in a long-lived child process, so a hostile template can only
hang, bloat or crash the child, which is then killed and started again.

llama.cpp's Jinja engine has no limits (a ``range`` of a billion, a string repeated
without end, macros that recurse until the stack ends). :class:`ChatWorker` starts
``python -m app.engine.native.chat_worker`` (in the frozen app: ``lamplight
chat-format-worker``, see ``ui/main.py``) once, on first use; the child caps its own
address space, loads the shim and answers one JSON line per request on a private copy
of its stdout. Every call has a deadline. A template that ran out of time or took the
child down gets a verdict: it is never sent again in this run, and the caller formats
it the Python way instead (``app/engine/templates``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from app.engine.native.chat_shim import ShimError, library_path, load_shim, utf8_json
from app.engine.native.path_probe import crash_name, probe_command

log = logging.getLogger(__name__)

CHILD_ARG = "chat-format-worker"  # ui/main.py's sub-command in the frozen app
START_S = 20.0  # the child's start (a cold interpreter, the libraries read from disk)
INIT_S = 5.0  # read one template
APPLY_S = 5.0  # one render with its analysis (llama.cpp renders ~20 variants)
MAX_MEMORY_BYTES = 2048 * 1024 * 1024
MAX_LINE = 16 * 1024 * 1024
MAX_TEMPLATES = 16  # held in the child; the least recently used is freed


class TemplateRefused(ShimError):
    """The template hung or crashed the worker before; it is formatted the Python way."""


@dataclass
class NativeTemplate:
    """One template as the worker holds it: its key and what llama.cpp says it can do."""

    key: str
    source: str
    bos: str
    eos: str
    caps: dict[str, Any] = field(default_factory=dict)


class ChatWorker:
    """The client: one request at a time, each with a deadline; restarts on demand."""

    def __init__(
        self,
        command: Sequence[str] | None = None,
        lib: Path | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self._command = list(command) if command else None
        self._init_s = deadline_s or INIT_S
        self._apply_s = deadline_s or APPLY_S
        self._lib = lib or library_path()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: _Lines | None = None
        self._held: list[str] = []  # template keys the current child holds, oldest first
        self._refused: dict[str, str] = {}  # template key -> why
        self._caps: dict[str, dict[str, Any]] = {}  # template key -> what llama.cpp says
        self._next = 0

    def template(
        self, source: str, bos: str = "", eos: str = "", deadline_s: float | None = None
    ) -> NativeTemplate:
        """Read ``source`` in the worker; raises ShimError when llama.cpp cannot."""
        key = hashlib.sha256(
            "\0".join((source, bos, eos)).encode("utf-8", "surrogatepass")
        ).hexdigest()
        found = NativeTemplate(key, source, bos, eos)
        with self._lock:
            found.caps = self._ensure(found, deadline_s or self._init_s)
        return found

    def apply(
        self, template: NativeTemplate, request: dict[str, Any], deadline_s: float | None = None
    ) -> dict[str, Any]:
        """``common_chat_templates_apply`` on ``request``: prompt, grammar, parser..."""
        with self._lock:
            self._ensure(template, self._init_s)
            answer = self._call(
                {"op": "apply", "key": template.key, "request": request},
                deadline_s or self._apply_s,
                template.key,
            )
        return dict(answer["result"])

    def refused(self, template: NativeTemplate) -> bool:
        """Whether ``template`` hung or crashed the worker (it is not sent again)."""
        return template.key in self._refused

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure(self, template: NativeTemplate, deadline_s: float) -> dict[str, Any]:
        if template.key in self._refused:
            raise TemplateRefused(self._refused[template.key])
        if template.key in self._held:
            self._held.remove(template.key)
            self._held.append(template.key)
            return self._caps[template.key]
        if len(self._held) >= MAX_TEMPLATES:
            self._call({"op": "free", "key": self._held.pop(0)}, self._init_s, None)
        req = {"op": "init", "key": template.key, "source": template.source}
        req |= {"bos": template.bos, "eos": template.eos}
        answer = self._call(req, deadline_s, template.key)
        self._held.append(template.key)
        self._caps[template.key] = dict(answer["caps"])
        return self._caps[template.key]

    def _call(self, req: dict[str, Any], deadline: float, key: str | None) -> dict[str, Any]:
        """Send one request and wait for its answer; kill the child when it runs out."""
        proc = self._start()
        self._next += 1
        req["n"] = self._next
        assert proc.stdin is not None
        try:
            proc.stdin.write(utf8_json(req) + b"\n")
            proc.stdin.flush()
            line = self._lines.get(deadline) if self._lines is not None else None
        except OSError:
            line = None
        if line is None:
            why = self._dead_why(proc, deadline)
            self._stop()
            if key is not None:
                self._refused[key] = why
            raise TemplateRefused(why)
        answer = json.loads(line)
        if not answer.get("ok"):
            raise ShimError(str(answer.get("error", "the chat formatter failed"))[:2000])
        return dict(answer)

    def _dead_why(self, proc: subprocess.Popen[bytes], deadline: float) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)
        code = proc.poll()
        if code is None:
            return f"llama.cpp's template engine took more than {deadline:g} s on this template"
        name = crash_name(code)
        return f"llama.cpp's template engine crashed on this template ({name or f'exit {code}'})"

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        cmd = self._command or probe_command(CHILD_ARG, "app.engine.native.chat_worker")
        root = Path(__file__).resolve().parents[3]  # where ``app`` imports from
        frozen = getattr(sys, "frozen", False)
        self._proc = subprocess.Popen(
            [*cmd, "--lib", str(self._lib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=None if frozen else root,
        )
        assert self._proc.stdout is not None
        self._lines = _Lines(self._proc.stdout)
        ready = self._lines.get(START_S)
        if ready is None or not json.loads(ready).get("ok"):
            why = self._dead_why(self._proc, START_S)
            self._stop()
            raise ShimError(f"the chat formatter did not start: {why}")
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        self._held = []
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
        if self._lines is not None:
            self._lines.close()
            self._lines = None


class _Lines:
    """The child's answers, one line each, read with a deadline. On POSIX ``select`` on
    the pipe (no thread); on Windows, where pipes cannot be selected, a reader thread."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._buf = b""
        self._queue: queue.Queue[bytes | None] | None = None
        if sys.platform == "win32":
            self._queue = queue.Queue()
            threading.Thread(target=self._pump, daemon=True, name="chat-worker-reader").start()

    def get(self, deadline_s: float) -> bytes | None:
        """The next line; None when the child ended, wrote too much, or ran out of time."""
        if self._queue is not None:
            try:
                return self._queue.get(timeout=deadline_s)
            except queue.Empty:
                return None
        end = time.monotonic() + deadline_s
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or len(self._buf) > MAX_LINE:
                return None
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _pump(self) -> None:
        assert self._queue is not None
        try:
            while line := self._stream.readline(MAX_LINE + 1):
                if len(line) > MAX_LINE or not line.endswith(b"\n"):
                    break
                self._queue.put(line)
        except (OSError, ValueError):
            pass
        self._queue.put(None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.close()


# The child.


def _limit_memory() -> None:
    try:
        import resource
    except ImportError:  # Windows
        return
    try:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        value = MAX_MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(MAX_MEMORY_BYTES, hard)
        resource.setrlimit(resource.RLIMIT_AS, (value, hard))
    except (ValueError, OSError):  # macOS refuses RLIMIT_AS
        pass


def _private_stdout() -> IO[bytes]:
    """A private copy of stdout for the answers; fd 1 then goes to stderr, so nothing
    the native side prints can break a line."""
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "wb")


def serve(lib: Path, stdin: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until stdin ends."""
    shim = load_shim(lib)

    def say(answer: dict[str, Any]) -> None:
        out.write(json.dumps(answer, ensure_ascii=False).encode("utf-8") + b"\n")
        out.flush()

    if shim is None:
        say({"ok": False, "error": "the chat shim is not in this build"})
        return
    say({"ok": True})
    held: dict[str, int] = {}
    for line in iter(lambda: stdin.readline(MAX_LINE), b""):
        try:
            say({"ok": True, **_answer(shim, held, json.loads(line))})
        except (ShimError, ValueError, KeyError, TypeError) as exc:
            say({"ok": False, "error": str(exc)[:2000]})


def _answer(shim: Any, held: dict[str, int], req: dict[str, Any]) -> dict[str, Any]:
    op, key = req["op"], str(req["key"])
    if op == "init":
        if key not in held:
            held[key] = shim.templates_new(str(req["source"]), str(req["bos"]), str(req["eos"]))
        caps = shim.caps(held[key])
        caps.pop("source", None)  # the caller has it
        return {"caps": caps}
    if op == "apply":
        if key not in held:
            raise KeyError(f"template {key[:12]} is not held")
        return {"result": shim.apply(held[key], dict(req["request"]))}
    if op == "free":
        if key in held:
            shim.templates_free(held.pop(key))
        return {}
    raise ValueError(f"unknown request {op!r}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    lib = Path(args[args.index("--lib") + 1]) if "--lib" in args else library_path()
    out = _private_stdout()
    _limit_memory()
    serve(lib, sys.stdin.buffer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
