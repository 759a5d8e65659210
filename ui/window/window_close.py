"""Closing the main window: put off while the reply in progress is stopped, recorded and
saved (at most ``CLOSE_WAIT_MS``; no nested event loop), then everything shut down in
order: API requests first, the engine joined, the documents' jobs and library last."""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QCloseEvent

from ui.api.api_status import ApiControl
from ui.chat.chat_pane import ChatPane
from ui.common.context import Context
from ui.models.hub_workers import HubServices
from ui.perf.perf_panel import PerfPanel
from ui.remote.remote_control import RemoteControl
from ui.tools.mcp_control import McpControl
from ui.window.send_flow import Closeable, SendFlow

CLOSE_WAIT_MS = 5000  # how long a close waits for a stopped reply to be recorded


class CloseHost(Protocol):
    """What a close reaches: the main window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def api(self) -> ApiControl: ...
    @property
    def chat(self) -> ChatPane: ...
    @property
    def perf_panel(self) -> PerfPanel: ...
    @property
    def remote(self) -> RemoteControl: ...
    @property
    def tools(self) -> McpControl: ...
    @property
    def send_flow(self) -> SendFlow: ...
    @property
    def embedder(self) -> Closeable: ...
    @property
    def services(self) -> HubServices | None: ...
    def stop(self) -> None: ...
    def close(self) -> bool: ...
    def layout_to_save(self) -> dict[str, str] | None: ...


class WindowClose(QObject):
    """Owns the window's close: ``closing`` once asked for, ``closed`` once done."""

    def __init__(self, win: CloseHost) -> None:
        super().__init__(win.ctx.parent)
        self._win = win
        self.closing = False  # a close was asked for (it may wait for the reply to stop)
        self.closed = False  # closed for good: settings saved, engine joined
        self._waiting = False
        self._now = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._close_without_waiting)

    def close_event(self, event: QCloseEvent) -> bool:
        """The window's close event: True when it was shut down now (Qt's own handler
        then closes it); else accepted (closed already) or ignored (put off)."""
        if self.closed:
            event.accept()
            return False
        w, session = self._win, self._win.ctx.session
        if not self.closing:
            self.closing = True
            # First: API requests end and none reaches the worker while the chat is saved.
            w.api.stop()
        if session.busy and not self._now:
            event.ignore()
            if not self._waiting:
                self._waiting = True
                w.stop()  # recorded and saved like any stopped reply
                session.when_idle(self._close_again)
                self._timer.start(CLOSE_WAIT_MS)
            return False
        self.closed = True
        self._timer.stop()
        self._shut_down()
        return True

    def _shut_down(self) -> None:
        w, ctx = self._win, self._win.ctx
        w.chat.end_stream()
        w.perf_panel.stop_timers()
        w.remote.shutdown()
        w.tools.close()  # the servers' process trees end with the app
        ctx.session.save()
        changes: dict[str, object] = {}
        if ctx.session.conversation.messages:
            changes["last_conversation"] = ctx.session.conversation.id
        layout = w.layout_to_save()
        if layout is not None:  # never shown: nothing worth keeping
            changes["window_layout"] = layout
        ctx.settings.mark_dirty()  # what is in use is kept, also what was not saved
        ctx.settings.update(**changes)
        ctx.client.shutdown()
        w.send_flow.shutdown(w.embedder)  # documents: jobs cancelled, library closed
        if w.services is not None:
            w.services.shutdown()

    def _close_again(self) -> None:
        self._win.close()

    def _close_without_waiting(self) -> None:
        """The stopped reply did not settle in time: close anyway."""
        if not self.closed:
            self._now = True
            self._win.close()
