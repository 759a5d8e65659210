"""Pausing or cancelling a running download from any thread."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Control:
    """Set from any thread to pause or cancel a running download.

    ``request_pause`` and ``request_cancel`` also shut down the sockets of the
    running transfer, so a read blocked on a stalled server returns at once
    instead of after the read timeout.
    """

    pause: threading.Event
    cancel: threading.Event
    _sockets: set[socket.socket] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def new(cls) -> Control:
        return cls(threading.Event(), threading.Event())

    def stopped(self) -> bool:
        return self.pause.is_set() or self.cancel.is_set()

    def request_pause(self) -> None:
        self.pause.set()
        self.interrupt()

    def request_cancel(self) -> None:
        self.cancel.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Wake the downloading thread out of any blocking read (any thread)."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def attach(self, sock: socket.socket) -> None:
        """The download thread uses ``sock`` now; a stop already asked for closes it."""
        with self._lock:
            self._sockets.add(sock)
        if self.stopped():
            _shutdown(sock)

    def detach_all(self) -> None:
        with self._lock:
            self._sockets.clear()


def _shutdown(sock: socket.socket) -> None:
    # shutdown(), not close(): it wakes a recv() blocked in another thread on every OS,
    # and leaves the file descriptor to its owner (httpcore) to close.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
