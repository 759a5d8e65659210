"""One Lamplight per data folder: an exclusive OS lock on ``<root>/lamplight.lock``.

Two processes on one data folder overwrite each other's settings, conversations and
download queue (last writer wins), so the window, ``lamplight serve`` and
``--smoke-test`` each take this lock before they read or write anything there.

The lock is the operating system's (``fcntl.flock`` on POSIX, ``msvcrt.locking`` on
Windows) and belongs to the open file: the OS drops it when the process ends, however
it ends. A folder held by a crashed process is therefore taken over simply by locking
it again; no pid is ever trusted to decide whether the holder is alive. The file is
never deleted (deleting a lock file lets a third process lock a new file while the
second still holds the old one).

The file also records the holder's pid, mode and start time as JSON, for messages
only ("already running: a window, pid 4242"). Read back, it is untrusted: a bounded
read through ``app.util.datafiles`` and typed checks; anything odd reads as unknown.
On Windows locks are mandatory, so the lock covers one byte far past that JSON and
others can still read it.

A folder whose file system cannot lock (or a lock file that cannot be made) does not
stop the app: ``InstanceLock.note`` says why it runs unprotected.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from app.util.datafiles import DataFileError, os_reason, read_json, set_aside
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

LOCK_NAME = "lamplight.lock"
MAX_INFO_BYTES = 4096
MODES = {"window": "a window", "serve": "lamplight serve", "smoke-test": "a --smoke-test run"}
_WINDOWS_LOCK_OFFSET = 1 << 20  # past the JSON: Windows locks keep others from reading


@dataclass(frozen=True)
class Holder:
    """Who holds a data folder, as its lock file says (each field may be unknown)."""

    pid: int | None = None
    mode: str = ""
    started: float | None = None

    def describe(self) -> str:
        """For messages: "a window, pid 4242", "lamplight serve, pid 17", "another Lamplight"."""
        what = MODES.get(self.mode, "another Lamplight")
        return f"{what}, pid {self.pid}" if self.pid else what


class AlreadyRunning(LamplightError):
    """Another live process holds the data folder ``root``."""

    def __init__(self, root: Path, holder: Holder) -> None:
        self.root = root
        self.holder = holder
        super().__init__(f"Lamplight is already running on {root} ({holder.describe()}).")


class InstanceLock:
    """The held lock on a data folder (``held`` False: running unprotected, see ``note``)."""

    def __init__(self, root: Path, mode: str, fd: int | None, note: str = "") -> None:
        self.root = root
        self.mode = mode
        self.note = note
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close (the file stays); calling it again does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            _unlock(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self,
        _kind: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.release()


def acquire(root: Path, mode: str) -> InstanceLock:
    """Lock the data folder ``root`` for this process, as ``mode`` (a key of ``MODES``).

    Raises:
        AlreadyRunning: another live process holds it.
    """
    path = root / LOCK_NAME
    try:
        fd = _open(path)
    except OSError as exc:
        return _unprotected(root, mode, exc)
    try:
        _lock(fd)
    except OSError as exc:
        os.close(fd)
        if _contended(exc):
            raise AlreadyRunning(root, read_holder(root)) from None
        return _unprotected(root, mode, exc)
    _write_info(fd, mode)
    log.info("data folder %s locked (%s, pid %d)", root, mode, os.getpid())
    return InstanceLock(root, mode, fd)


def read_holder(root: Path) -> Holder:
    """What ``root``'s lock file says about its holder; ``Holder()`` when it says nothing
    usable (missing, damaged, being written)."""
    try:
        data = read_json(root / LOCK_NAME, MAX_INFO_BYTES, max_depth=2)
    except (FileNotFoundError, DataFileError):
        return Holder()
    if not isinstance(data, dict):
        return Holder()
    pid = data.get("pid")
    mode = data.get("mode")
    started = data.get("started")
    return Holder(
        pid=pid if type(pid) is int and 0 < pid < 2**31 else None,
        mode=mode if isinstance(mode, str) and mode in MODES else "",
        started=(
            float(started)
            if isinstance(started, (int, float))
            and not isinstance(started, bool)
            and math.isfinite(started)
            else None
        ),
    )


def channel_name(root: Path) -> str:
    """A short name for the data folder's message channel (a local socket or pipe),
    the same in every process of this user for the same folder."""
    try:
        where = str(root.resolve())
    except (OSError, RuntimeError):
        where = str(root.absolute())
    if sys.platform == "win32":
        where = where.lower()  # one folder, however its name is cased
    user = os.environ.get("USERNAME", "") if sys.platform == "win32" else str(os.getuid())
    digest = hashlib.sha256(f"{user}\0{where}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"lamplight-{digest[:16]}"


def _unprotected(root: Path, mode: str, exc: OSError) -> InstanceLock:
    note = (
        f"The data folder could not be locked ({os_reason(exc)}); a second Lamplight "
        "on it would not be stopped from overwriting this one's files."
    )
    log.warning("%s", note)
    return InstanceLock(root, mode, None, note)


def _open(path: Path) -> int:
    """The lock file, opened read-write (made if missing). A symlink, folder or other
    non-file in its place is set aside as ``.bad`` once and a fresh file made."""
    flags = (
        os.O_RDWR
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_NONBLOCK", 0)  # a FIFO in its place must not block the start
        | getattr(os, "O_NOCTTY", 0)
        | getattr(os, "O_BINARY", 0)
    )
    for attempt in (1, 2):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG
        if stat.S_ISREG(mode):
            try:
                fd = os.open(path, flags, 0o600)  # not inherited by children (PEP 446)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EISDIR) or attempt == 2:
                    raise
            else:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
        if attempt == 1:
            aside = set_aside(path)
            log.warning("%s was not a file; set aside as %s", path.name, aside.name)
    raise OSError(errno.EEXIST, f"{path.name} is not a file")


if sys.platform == "win32":
    import msvcrt

    def _lock(fd: int) -> None:
        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def _contended(exc: OSError) -> bool:
        return exc.errno in (errno.EACCES, errno.EDEADLK)

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

    def _contended(exc: OSError) -> bool:
        return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def _write_info(fd: int, mode: str) -> None:
    """Record this process in the locked file (for messages; a failure only logs)."""
    info = json.dumps({"pid": os.getpid(), "mode": mode, "started": round(time.time(), 3)})
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, info.encode())
    except OSError as exc:
        log.warning("could not record this process in %s: %s", LOCK_NAME, os_reason(exc))
