"""``QtEngineGateway``: the API server's way to the engine worker.

The server (``app.api``, Qt-free) runs on its own thread and sees the engine only
through the ``EngineGateway`` protocol. This adapter lives on the GUI thread: what the
model is and whether one is loading are kept from the worker's signals and read under a
lock, and a submitted job is posted to the worker's queue by a queued signal, so it runs
after the requests queued before it, the GUI's included, on the one engine thread.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.api.gateway import ApiJob
from app.engine.backend import ModelInfo
from ui.worker import EngineClient


class QtEngineGateway(QObject):
    """``EngineGateway`` over an ``EngineClient``; create it on the GUI thread.

    Every method may be called from any thread.

    Args:
        client: the window's (or ``serve``'s) engine client.
        model: the model already loaded, if any (later loads are followed by signal).
    """

    _apiRequested = Signal(object)

    def __init__(
        self,
        client: EngineClient,
        model: ModelInfo | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._model = model
        self._loading = False
        worker = client.worker
        # Queued whatever thread emits: an emit from the server's thread posts the job to
        # the worker's event queue (FIFO with the GUI's requests).
        self._apiRequested.connect(worker.generate_api, Qt.ConnectionType.QueuedConnection)
        worker.modelLoaded.connect(self._on_model_loaded)
        worker.loadProgress.connect(self._on_load_progress)
        worker.loadFailed.connect(self._on_load_failed)

    def model(self) -> ModelInfo | None:
        with self._lock:
            return self._model

    def loading(self) -> bool:
        with self._lock:
            return self._loading

    def submit(self, job: ApiJob) -> None:
        self._apiRequested.emit(job)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        with self._lock:
            self._model = info
            self._loading = False

    @Slot(float, str)
    def _on_load_progress(self, _value: float, _what: str) -> None:
        with self._lock:
            self._loading = True

    @Slot(str, bool)
    def _on_load_failed(self, _why: str, still_loaded: bool) -> None:
        with self._lock:
            self._loading = False
            if not still_loaded:
                self._model = None
