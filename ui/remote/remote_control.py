"""The window's side of server connections: which engine is in use, and switching it.

The connection list and the active connection are ``ConnectionStore``'s; the
engine switch happens on the worker (``EngineClient.connect_remote`` or a local
``load``). A connection becomes the active one only once it connected, so a
failed connect leaves the app on what it was using, and the next start reopens
whatever worked last.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QStatusBar

from app.engine.backend import ModelInfo
from app.remote import keys
from app.remote.connection import Connection
from app.remote.connection_store import ConnectionStore
from app.remote.factory import backend_for
from app.util.errors import LamplightError
from ui.common.context import Context
from ui.remote.remote_status import RemoteStatus

if TYPE_CHECKING:
    from ui.remote.connections_dialog import ConnectionsDialog

log = logging.getLogger(__name__)


class RemoteControl(QObject):
    """Connects the window to a saved server, or back to this computer.

    ``begin_loading(what)`` tells the window a connect is under way.
    """

    def __init__(self, ctx: Context, bar: QStatusBar, begin_loading: Callable[[str], None]) -> None:
        super().__init__(ctx.parent)
        self._ctx = ctx
        self._begin_loading = begin_loading
        self.store = ConnectionStore.in_dir(ctx.dirs.root)
        self.status = RemoteStatus(ctx.client, bar, ctx.parent)
        self.pending: Connection | None = None  # connecting, not yet in use
        self.current: Connection | None = None
        self.dialog: ConnectionsDialog | None = None

    def start(self) -> bool:
        """Reconnect to the server in use at the last quit; False when it was this computer."""
        conn = self.store.active_connection
        if conn is None:
            return False
        self.connect_to(conn)
        return True

    def connect_to(self, conn: Connection) -> None:
        """Connect to ``conn`` on the worker; the engine in use stays until it succeeds."""
        try:
            key = keys.get_key(conn.id)
            backend = backend_for(conn, key)
        except LamplightError as exc:
            self._ctx.notice(str(exc))
            return
        self.pending = conn
        self._begin_loading(f"Connecting to {conn.name}")
        self._ctx.client.connect_remote(backend)

    def use_local(self) -> None:
        """Back to the in-process engine with the model last used here."""
        self._ctx.open_model(self._ctx.settings.value.model_path or None)

    def show_dialog(self) -> None:
        from ui.remote.connections_dialog import ConnectionsDialog

        if self.dialog is None:
            self.dialog = ConnectionsDialog(self.store, self._ctx.parent)
            self.dialog.connectRequested.connect(self._on_connect_requested)
            self.dialog.localRequested.connect(self._on_local_requested)
        self.dialog.show()
        self.dialog.raise_()

    def _on_connect_requested(self, conn: Connection) -> None:
        self._ctx.session.when_idle(lambda: self.connect_to(conn))

    def _on_local_requested(self) -> None:
        self._ctx.session.when_idle(self.use_local)

    def loaded(self, info: ModelInfo) -> Connection | None:
        """A model is in use: remember where; the connection it came through (None:
        this computer)."""
        # A reconnect after a lost connection loads again without a pending connect.
        conn = (self.pending or self.current) if info.server else None
        self.pending = None
        self.current = conn
        active = conn.id if conn is not None else ""
        if active != self.store.active:
            try:
                self.store.set_active(active)
            except LamplightError as exc:
                log.warning("could not remember the connection in use: %s", exc)
        return conn

    def shutdown(self) -> None:
        """Stop the reconnect timer and any connection test the dialog runs."""
        self.status.timer.stop()
        if self.dialog is not None:
            self.dialog.shutdown()

    def failed(self) -> None:
        """A connect or load failed: nothing changed."""
        self.pending = None
