"""One window per data folder: a second launch hands over to the first and exits.

The folder lock (``app.util.instance_lock``) decides who runs. The window that holds
it also listens on a local socket (a named pipe on Windows) named after the folder
(``server_name``), which only this user can connect to. A second ``lamplight`` on the same
folder fails to get the lock, connects, sends one JSON line::

    {"activate": true, "model": "/abs/path/model.gguf"}     ("model": null: none given)

and waits for ``{"ok": true}``. The first window comes to the front and opens the
model as a dropped file would (a LoRA adapter joins the stack). The second prints one
line and exits 0 without a window.

Nothing else is trusted: a request is one line of at most ``MAX_REQUEST`` bytes read
within ``READ_MS``, a JSON object whose ``model`` is an absolute path or null; any
other bytes are answered ``{"ok": false}`` and the connection is dropped.

A folder held by ``lamplight serve`` or a ``--smoke-test`` run (nothing listens), or
by a window that does not answer, is refused with a message naming the folder and the
holder, and exit code ``EXIT_HELD``. While the holder is a window that has not begun
to listen yet (it is starting), or is closing, the second launch retries for up to
``WAIT_S``; if the lock comes free meanwhile, it takes the folder and starts normally.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.util.datafiles import DataFileError, parse_json
from app.util.instance_lock import (
    AlreadyRunning,
    Holder,
    InstanceLock,
    acquire,
    channel_name,
)

if TYPE_CHECKING:
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)

EXIT_HELD = 3  # the data folder is held by another process that did not take the request
MAX_REQUEST = 16 * 1024
MAX_PATH = 4096
MAX_CONNECTIONS = 8
READ_MS = 3000  # the first window's patience with one connection
REPLY_MS = 5000  # the second launch's patience for the answer
WAIT_S = 10.0  # ... for a starting (or closing) window to listen (or let go)
RETRY_S = 0.2
MESSAGE_BOX_MS = 60_000  # a refusal shown in a box closes itself after a minute


@dataclass(frozen=True)
class Activation:
    """A second launch's request: come to the front, and open ``model`` if given."""

    model: Path | None = None


def encode_request(model: Path | None) -> bytes:
    """The one line a second launch sends."""
    body = {"activate": True, "model": None if model is None else str(model)}
    return json.dumps(body).encode() + b"\n"


def parse_request(line: bytes) -> Activation:
    """The request in ``line`` (without its newline).

    Raises:
        ValueError: not a request this version understands.
    """
    if len(line) > MAX_REQUEST:
        raise ValueError("too long")
    try:
        data = parse_json(line, max_depth=2)
    except DataFileError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict) or data.get("activate") is not True:
        raise ValueError("not an activation request")
    model = data.get("model")
    if model is None:
        return Activation()
    if not isinstance(model, str) or not model or len(model) > MAX_PATH or "\0" in model:
        raise ValueError("the model is not a path")
    path = Path(model)
    if not path.is_absolute():
        raise ValueError("the model path is not absolute")
    return Activation(path)


def server_name(root: Path) -> str:
    """The window's local server name for the data folder ``root``: ``channel_name``, in
    the user's private runtime folder where there is one (``$XDG_RUNTIME_DIR``, mode
    0700: no other user can take the name first), else where Qt puts it (the temp
    folder, per user on macOS; a pipe name on Windows)."""
    name = channel_name(root)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if sys.platform != "win32" and os.path.isabs(runtime) and os.path.isdir(runtime):
        return os.path.join(runtime, name)
    return name


# -- the first window's side ------------------------------------------------------------


class InstanceServer(QObject):
    """Listens for later launches on the same data folder.

    Signals:
        activated(object): a launch asked for the window; its ``Activation``.
    """

    activated = Signal(object)

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.setMaxPendingConnections(MAX_CONNECTIONS)
        self._server.newConnection.connect(self._on_new_connection)
        self._open: set[_Connection] = set()
        # False while the window closes: a launch then waits for the folder to come free.
        self.accepting: Callable[[], bool] = lambda: True

    def listen(self) -> str:
        """Start listening; an empty string, or why not (then launches are refused)."""
        # The folder lock proves no live window owns the name: a socket file left there
        # by a crashed one would make listen() fail.
        QLocalServer.removeServer(self.name)
        if self._server.listen(self.name):
            log.info("listening for later launches on %s", self._server.fullServerName())
            return ""
        problem = self._server.errorString()
        log.warning("cannot listen for later launches on %s: %s", self.name, problem)
        return problem

    def close(self) -> None:
        self._server.close()
        for conn in list(self._open):
            conn.drop()

    def _on_new_connection(self) -> None:
        while self._server.hasPendingConnections():
            socket = self._server.nextPendingConnection()
            if len(self._open) >= MAX_CONNECTIONS:
                socket.abort()
                socket.deleteLater()
                continue
            conn = _Connection(socket, self)
            self._open.add(conn)
            conn.done.connect(partial(self._on_connection_done, conn))
            conn.request.connect(self.activated)
            conn.start(self.accepting)

    def _on_connection_done(self, conn: _Connection) -> None:
        self._open.discard(conn)
        conn.deleteLater()


class _Connection(QObject):
    """One connected launch: read one bounded line in time, answer, close.

    Signals:
        request(object): the ``Activation`` it asked for.
        done(): the connection is closed.
    """

    request = Signal(object)
    done = Signal()

    def __init__(self, socket: QLocalSocket, parent: QObject) -> None:
        super().__init__(parent)
        self._socket = socket
        socket.setParent(self)
        self._buffer = bytearray()
        self._finished = False
        self._accepting: Callable[[], bool] = lambda: True
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.drop)

    def start(self, accepting: Callable[[], bool]) -> None:
        """Read (once the signals are connected); ``accepting`` False: answer "closing"."""
        self._accepting = accepting
        self._timer.start(READ_MS)
        self._socket.readyRead.connect(self._on_ready_read)
        self._socket.disconnected.connect(self._finish)
        self._on_ready_read()  # bytes may have come with the connection

    def _on_ready_read(self) -> None:
        if self._finished:
            return
        chunk = bytes(self._socket.read(MAX_REQUEST + 1 - len(self._buffer)).data())
        self._buffer += chunk
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_REQUEST:
                log.warning("a launch sent more than %d bytes; dropped", MAX_REQUEST)
                self.drop()
            return
        try:
            activation = parse_request(bytes(self._buffer[:end]))
        except ValueError as exc:
            log.warning("a launch sent a request that is not understood (%s); dropped", exc)
            self._answer({"ok": False, "error": "not understood"})
            return
        if not self._accepting():
            self._answer({"ok": False, "closing": True})
            return
        self._answer({"ok": True})
        self.request.emit(activation)

    def _answer(self, reply: dict[str, object]) -> None:
        self._timer.stop()
        self._socket.write(json.dumps(reply).encode() + b"\n")
        self._socket.flush()
        self._socket.disconnectFromServer()  # after the answer is written
        if self._socket.state() == QLocalSocket.LocalSocketState.UnconnectedState:
            self._finish()

    def drop(self) -> None:
        """Close at once, without an answer."""
        self._timer.stop()
        self._socket.abort()
        self._finish()

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._timer.stop()
            self.done.emit()


def install(win: MainWindow, server: InstanceServer) -> None:
    """Let later launches bring ``win`` to the front and hand it a model."""
    server.accepting = lambda: not win.closing
    server.activated.connect(partial(_on_activated, win))


def _on_activated(win: MainWindow, activation: Activation) -> None:
    log.info("a later launch on this data folder asked for the window")
    bring_to_front(win)
    if activation.model is not None:
        log.info("a later launch handed over the model %s", activation.model)
        open_handed_model(win, activation.model)


def bring_to_front(win: MainWindow) -> None:
    """Show ``win`` (restoring it if minimized), raise it and ask for the focus."""
    if win.isMinimized():
        win.showNormal()
    else:
        win.show()
    win.raise_()
    win.activateWindow()


def open_handed_model(win: MainWindow, path: Path) -> None:
    """Open ``path`` as a dropped file would; after the load under way, if any."""
    if not win.loaded_model.loading:
        win.model_drop.open(path)
        return

    def after_load(*_args: object) -> None:
        win.modelReady.disconnect(after_load)
        win.modelFailed.disconnect(after_load)
        win.model_drop.open(path)

    win.modelReady.connect(after_load)
    win.modelFailed.connect(after_load)
    win.statusBar().showMessage(f"{path.name} opens when the current load ends.", 6000)


# -- a later launch's side ---------------------------------------------------------------


def claim(root: Path, model: Path | None) -> InstanceLock | int:
    """For a window on ``root``: the folder lock, or (another process holds it) hand
    ``model`` over to the window there and return the exit code."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return acquire(root, "window")
        except AlreadyRunning as exc:
            held = exc
        if held.holder.mode in ("serve", "smoke-test"):
            return refuse(held_message(held, "window"))
        outcome = hand_over(server_name(root), model, held.holder)
        if outcome is not None:
            if outcome:
                return refuse(
                    f"{held} It did not take the request ({outcome}); "
                    f"close it{_pid_hint(held.holder)} and try again."
                )
            print(activated_message(root, model), flush=True)
            return 0
        if time.monotonic() > deadline:
            return refuse(
                f"{held} It does not answer; close it{_pid_hint(held.holder)} and try again."
            )
        time.sleep(RETRY_S)


def hand_over(name: str, model: Path | None, holder: Holder) -> str | None:
    """Send the request to the window listening on ``name``: "" when it took it, a
    reason when it refused or fell silent, None when nothing listens there (yet)."""
    socket = QLocalSocket()
    socket.connectToServer(name)
    if not socket.waitForConnected(500):
        socket.abort()
        return None
    if sys.platform == "win32" and holder.pid:
        import ctypes

        # Windows lets a process take the foreground only if the one in front allows it.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.windll.user32.AllowSetForegroundWindow(holder.pid)
    socket.write(encode_request(model))
    socket.waitForBytesWritten(REPLY_MS)
    reply = bytearray()
    deadline = time.monotonic() + REPLY_MS / 1000
    while True:
        reply += bytes(socket.readAll().data())  # it may have come while writing
        if b"\n" in reply or len(reply) > MAX_REQUEST:
            break
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0 or not socket.waitForReadyRead(left):
            reply += bytes(socket.readAll().data())
            break
    socket.abort()
    try:
        answer = parse_json(bytes(reply.partition(b"\n")[0]), max_depth=2)
    except DataFileError:
        return "no answer" if not reply else "an answer that is not understood"
    if isinstance(answer, dict) and answer.get("ok") is True:
        return ""
    if isinstance(answer, dict) and answer.get("closing") is True:
        return None  # the window is closing: the folder comes free soon
    return "it refused it"


def held_message(exc: AlreadyRunning, mode: str) -> str:
    """Why ``mode`` ("window", "serve", "smoke-test") cannot run on the held folder."""
    holder = exc.holder
    if mode == "serve":
        if holder.mode == "window":
            return (
                f"{exc} Use its local API server (Model → Local API server…), "
                "or give serve another --data-dir."
            )
        return f"{exc} Stop it{_pid_hint(holder)}, or give serve another --data-dir."
    if mode == "smoke-test":
        return f"{exc} Close it, or give --smoke-test another --data-dir."
    return f"{exc} Stop it{_pid_hint(holder)}, or start the window with another --data-dir."


def activated_message(root: Path, model: Path | None) -> str:
    what = f" and asked it to open {model}" if model is not None else ""
    return f"Lamplight is already running on {root}: brought its window to the front{what}."


def refuse(message: str) -> int:
    """Say why the window does not start (stderr, and a message box where there is
    no terminal to read it); the exit code."""
    print(f"lamplight: {message}", file=sys.stderr, flush=True)
    if _needs_a_box():
        _message_box(message)
    return EXIT_HELD


def _pid_hint(holder: Holder) -> str:
    return f" (process {holder.pid})" if holder.pid else ""


def _needs_a_box() -> bool:
    """A launch from a file manager or menu has no terminal; a headless one no screen."""
    if os.environ.get("QT_QPA_PLATFORM", "") in ("offscreen", "minimal"):
        return False
    try:
        return sys.stderr is None or not sys.stderr.isatty()
    except (OSError, ValueError):
        return True


def _message_box(message: str) -> None:
    from PySide6.QtWidgets import QApplication, QMessageBox

    _app = QApplication.instance() or QApplication(sys.argv[:1])  # kept until the box ends
    box = QMessageBox(QMessageBox.Icon.Information, "Lamplight", message)
    QTimer.singleShot(MESSAGE_BOX_MS, box.reject)
    box.exec()
