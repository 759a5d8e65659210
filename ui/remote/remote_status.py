"""Where the model runs, in the window: the connection line, reconnects, and what is off.

``RemoteStatus`` owns the status bar's connection label and the automatic
reconnect: after a connection is lost it asks the worker to ping the server
with growing pauses (1 s, 2 s, 4 s … 30 s) until it answers.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from ui.engine.worker import EngineClient

BACKOFF_S = (1, 2, 4, 8, 15, 30)
CONNECTED_STYLE = "color: #2e7d32;"
LOST_STYLE = "color: #c62828;"


class RemoteStatus(QObject):
    """The connection label (hidden in-process) and the reconnect timer.

    Signals:
        stateChanged(str): ``local``, ``connected`` or ``lost``.
    """

    stateChanged = Signal(str)

    def __init__(self, client: EngineClient, bar: QStatusBar, parent: QWidget) -> None:
        super().__init__(parent)
        self._client = client
        self._bar = bar
        self.state = "local"
        self.attempt = 0
        self.label = QLabel("", parent)
        self.label.setObjectName("statusConnection")
        self.label.setAccessibleName("Connection to the model's server")
        self.label.hide()
        bar.addPermanentWidget(self.label)
        self.timer = QTimer(self)
        self.timer.setObjectName("reconnectTimer")
        self.timer.setSingleShot(True)
        self.timer.timeout.connect(client.check_connection)
        client.worker.connectionState.connect(self._on_state)

    def _on_state(self, state: str, detail: str) -> None:
        was = self.state
        self.state = state
        if state == "local":
            self.timer.stop()
            self.attempt = 0
            self.label.hide()
        elif state == "connected":
            self.timer.stop()
            self.attempt = 0
            self.label.setText("● connected")  # where: the model label beside it says
            self.label.setStyleSheet(CONNECTED_STYLE)
            self.label.setToolTip(f"Connected: {detail}")
            self.label.show()
            if was == "lost":
                self._bar.showMessage(f"Reconnected: {detail}", 8000)
        else:
            pause = BACKOFF_S[min(self.attempt, len(BACKOFF_S) - 1)]
            self.attempt += 1
            self.label.setText(f"● Connection lost — trying again in {pause} s")
            self.label.setStyleSheet(LOST_STYLE)
            self.label.setToolTip(detail or "The server does not answer.")
            self.label.show()
            self.timer.start(pause * 1000)
        self.stateChanged.emit(state)
