"""The processes of stdio servers: their stderr kept in a bounded log, and their whole
tree ended.

The SDK starts each server in a new session (process group) and kills the group
only when the server outlives the grace period after its stdin closes; a server that
exits at once leaves its children running. So the host finds the server's process
(by a marker in its environment), and after the SDK's shutdown ends whatever of its
group, or of the tree seen while it ran, is still alive.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
import uuid
from typing import TextIO

import psutil

MARKER = "LAMPLIGHT_MCP_SERVER"
MAX_LINES = 200
MAX_LINE = 500


class StderrLog:
    """A pipe for a server's stderr and a thread keeping its last lines."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        self.writer: TextIO = open(write_fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._lines: collections.deque[str] = collections.deque(maxlen=MAX_LINES)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="mcp-stderr", daemon=True)
        self._thread.start()

    def spawned(self) -> None:
        """The child has its copy of the pipe: close ours, so EOF comes when it exits."""
        with contextlib.suppress(OSError):
            self.writer.close()

    def join(self, timeout: float) -> None:
        """Wait for the reader to see the end of the pipe (the server's tree is gone)."""
        self._thread.join(timeout)

    def tail(self, n: int = 5) -> list[str]:
        with self._lock:
            return list(self._lines)[-n:]

    def _read(self) -> None:
        partial = b""
        try:
            while True:
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    break
                *lines, partial = (partial + chunk).split(b"\n")
                partial = partial[-MAX_LINE * 4 :]
                with self._lock:
                    for line in lines:
                        text = line.decode("utf-8", "replace").rstrip()[:MAX_LINE]
                        if text:
                            self._lines.append(text)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)


class ProcessTree:
    """The server process of one start, found by its marker, and what it started."""

    def __init__(self) -> None:
        self.marker = uuid.uuid4().hex
        self.root: psutil.Process | None = None
        self._seen: dict[int, psutil.Process] = {}
        self._started = time.time()

    def env(self) -> dict[str, str]:
        return {MARKER: self.marker}

    def find(self) -> None:
        """Look for the server among our children (after the SDK spawned it)."""
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.environ().get(MARKER) == self.marker:
                    self.root = child
                    self._seen[child.pid] = child
                    return

    def pid(self) -> int | None:
        return self.root.pid if self.root is not None else None

    def remember(self) -> None:
        """Note the server's descendants now (an orphan cannot be found later)."""
        if self.root is None:
            return
        with contextlib.suppress(psutil.Error):
            for p in self.root.children(recursive=True):
                self._seen.setdefault(p.pid, p)

    def kill(self) -> None:
        """End every process of the tree seen and of the server's group still alive."""
        self.remember()
        doomed = [p for p in self._seen.values() if _alive(p)]
        doomed.extend(self._group_members())
        for p in doomed:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(doomed, timeout=2.0)

    def _group_members(self) -> list[psutil.Process]:
        # A grandchild orphaned by a server that exited keeps the server's group id;
        # only processes started after this server count (a reused id is not ours).
        if self.root is None or sys.platform == "win32":
            return []  # on Windows the SDK's job object ends the tree
        pgid = self.root.pid
        members = []
        for p in psutil.process_iter(["create_time"]):
            if p.pid in self._seen or p.info["create_time"] is None:
                continue
            with contextlib.suppress(OSError, psutil.Error):
                if p.info["create_time"] >= self._started - 1 and os.getpgid(p.pid) == pgid:
                    members.append(p)
        return members


def _alive(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    return False
