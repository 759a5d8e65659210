"""``QtEngineGateway``: the API server's way to the engine worker.

The server (``app.api``, Qt-free) runs on its own thread and sees the engine only
through the ``EngineGateway`` protocol. This adapter lives on the GUI thread. What the
model is comes from the worker's backend itself, the one owner of "what is loaded":
a copy kept from the worker's signals went stale at Model -> Unload (which has none),
and ``/v1/models`` went on listing a model that was gone. Whether a model is loading is
kept from the load signals, handled on the worker's thread as they are emitted (so the
API does not wait on the GUI thread), under a lock; while a load runs there is no model
to serve. A submitted job is posted to the worker's queue by a queued signal, so it
runs after the requests queued before it, the GUI's included, on the one engine thread.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.api.gateway import ApiJob
from app.engine.backend import ModelInfo
from ui.engine.worker import EngineClient, EngineWorker


class QtEngineGateway(QObject):
    """``EngineGateway`` over an ``EngineClient``; create it on the GUI thread.

    Every method may be called from any thread.
    """

    _apiRequested = Signal(object)

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._loading = False
        worker = client.worker
        self._worker: EngineWorker = worker
        # Queued whatever thread emits: an emit from the server's thread posts the job to
        # the worker's event queue (FIFO with the GUI's requests).
        self._apiRequested.connect(worker.generate_api, Qt.ConnectionType.QueuedConnection)
        direct = Qt.ConnectionType.DirectConnection  # the slots only set a flag, locked
        worker.modelLoaded.connect(self._on_load_ended, direct)
        worker.loadProgress.connect(self._on_load_progress, direct)
        worker.loadFailed.connect(self._on_load_ended, direct)

    def model(self) -> ModelInfo | None:
        with self._lock:
            if self._loading:  # the backend is being replaced: nothing to serve yet
                return None
        # The backend in use and its model are single attribute reads (atomic under
        # the GIL); the worker swaps them on its own thread, and a job that started
        # on a model that is gone fails there with a clear message.
        return self._worker._engine.model

    def loading(self) -> bool:
        with self._lock:
            return self._loading

    def submit(self, job: ApiJob) -> None:
        self._apiRequested.emit(job)

    @Slot()
    def _on_load_ended(self) -> None:
        with self._lock:
            self._loading = False

    @Slot(float, str)
    def _on_load_progress(self, _value: float, _what: str) -> None:
        with self._lock:
            self._loading = True
