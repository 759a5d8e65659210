"""``lamplight serve`` in a child process, for the end-to-end tests and ``bench/api.py``."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180


@dataclass
class Served:
    """A running ``lamplight serve``: its process, base URL (``.../v1``) and model id."""

    proc: subprocess.Popen[str]
    url: str
    model: str
    stderr_path: Path

    @property
    def root(self) -> str:
        """``http://127.0.0.1:PORT`` (no ``/v1``)."""
        return self.url.removesuffix("/v1")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def status(self, key: str = "") -> Any:
        """``GET /lamplight/status`` as JSON."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        request = urllib.request.Request(self.root + "/lamplight/status", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())


def serve_command(data_dir: Path, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "ui", "serve", "--data-dir", str(data_dir), *args]


def start(data_dir: Path, args: Sequence[str], env: dict[str, str] | None = None) -> Served:
    """Start ``lamplight serve`` and wait for its ready line (raises with its stderr if
    it exits or stays silent)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = data_dir / "serve-stderr.txt"
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(
            serve_command(data_dir, args),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "QT_QPA_PLATFORM": "offscreen", **(env or {})},
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = proc.stdout.readline()
                if not line:
                    break  # it exited
                data = json.loads(line)
                assert data["ready"] is True
                return Served(proc, data["url"], data["model"], stderr_path)
            if proc.poll() is not None:
                break
    stop(proc)
    raise AssertionError(
        f"lamplight serve did not get ready (exit {proc.returncode}):\n"
        + stderr_path.read_text(errors="replace")[-4000:]
    )


def stop(proc: subprocess.Popen[str], timeout: float = 30) -> int:
    """SIGTERM, then SIGKILL if it does not exit in ``timeout`` s; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


@contextlib.contextmanager
def running(
    data_dir: Path, args: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[Served]:
    """``start`` ... ``stop``, whatever happens in between."""
    served = start(data_dir, args, env)
    try:
        yield served
    finally:
        stop(served.proc)
