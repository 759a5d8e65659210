"""The engine's thread: one worker QObject owns the engine; the GUI talks to it by signals."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from app.default_model import ensure_default_model
from app.engine import Engine, Finished, PrefillProgress, Token
from app.errors import LamplightError
from app.settings import LoadConfig, SamplingParams
from app.templates import ChatMessage

log = logging.getLogger(__name__)

# A load request with this path prepares and loads the embedded default model.
DEFAULT_MODEL = ""

_THREADS: weakref.WeakSet[QThread] = weakref.WeakSet()


def live_engine_threads() -> list[QThread]:
    """Engine threads not yet garbage-collected (tests check none is left running)."""
    return list(_THREADS)


class EngineWorker(QObject):
    """Runs engine calls on its own thread.

    Signals:
        loadProgress(float, str): load fraction 0..1 and what is happening.
        modelLoaded(object): the ``ModelInfo`` of the loaded model.
        loadFailed(str, bool): why the model could not be loaded, and whether the
            previous model is still loaded.
        prefillProgress(int, int, int): request id, prompt tokens done, total.
        tokens(int, str): request id and reply text.
        finished(int, str, object): request id, full reply, ``MessageMetrics``.
        cancelled(int, str, object): as finished, for a reply stopped by the user.
        failed(int, str): request id and a message for the user.

    Exactly one of finished, cancelled, failed ends every request.
    """

    loadProgress = Signal(float, str)
    modelLoaded = Signal(object)
    loadFailed = Signal(str, bool)
    prefillProgress = Signal(int, int, int)
    tokens = Signal(int, str)
    finished = Signal(int, str, object)
    cancelled = Signal(int, str, object)
    failed = Signal(int, str)

    def __init__(self, engine: Any, models_dir: Path) -> None:
        super().__init__()
        self._engine = engine
        self._models_dir = models_dir

    @Slot(str, object, object)
    def load_model(self, path: str, config: LoadConfig, cancel: threading.Event) -> None:
        last = [-1.0]

        def progress(value: float) -> bool:
            # llama.cpp reports thousands of steps; the GUI needs a few dozen.
            if value - last[0] >= 0.02 or value >= 1.0:
                last[0] = value
                self.loadProgress.emit(value, "Loading model")
            return not cancel.is_set()

        try:
            if path == DEFAULT_MODEL:
                self.loadProgress.emit(0.0, "Preparing the default model")
                path = str(ensure_default_model(self._models_dir))
            info = self._engine.load(path, config, progress)
        except LamplightError as exc:
            self.loadFailed.emit(str(exc), self._engine.model is not None)
        except Exception as exc:  # the app must survive any loader failure
            log.exception("model load failed")
            self.loadFailed.emit(f"Could not load the model: {exc}", self._engine.model is not None)
        else:
            self.modelLoaded.emit(info)

    @Slot(int, object, object, object)
    def generate(
        self,
        request: int,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event,
    ) -> None:
        try:
            with contextlib.closing(self._engine.generate(messages, params, stop)) as events:
                self._relay(request, events)
        except LamplightError as exc:
            self.failed.emit(request, str(exc))
        except Exception as exc:  # one terminal signal per request, whatever happens
            log.exception("generation failed")
            self.failed.emit(request, f"Generation failed: {exc}")

    def _relay(self, request: int, events: Iterator[Any]) -> None:
        for event in events:
            if isinstance(event, Token):
                self.tokens.emit(request, event.text)
            elif isinstance(event, PrefillProgress):
                self.prefillProgress.emit(request, event.done, event.total)
            elif isinstance(event, Finished):
                if event.metrics.stop_reason == "cancelled":
                    self.cancelled.emit(request, event.text, event.metrics)
                else:
                    self.finished.emit(request, event.text, event.metrics)
                return
        self.failed.emit(request, "The engine ended the reply without a result.")

    @Slot()
    def reset(self) -> None:
        try:
            if self._engine.model is not None:
                self._engine.reset()
        except LamplightError as exc:
            log.warning("reset failed: %s", exc)

    @Slot()
    def unload(self) -> None:
        self._engine.unload()


class EngineClient(QObject):
    """The GUI side: starts the worker thread, sends requests, stops and joins it.

    Signals are re-exported from the worker (see ``EngineWorker``).
    """

    _loadRequested = Signal(str, object, object)
    _generateRequested = Signal(int, object, object, object)
    _resetRequested = Signal()

    def __init__(
        self,
        models_dir: Path,
        engine_factory: Callable[[], Any] = Engine,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("lamplight-engine")
        _THREADS.add(self._thread)
        self.worker = EngineWorker(engine_factory(), models_dir)
        self.worker.moveToThread(self._thread)
        self._loadRequested.connect(self.worker.load_model)
        self._generateRequested.connect(self.worker.generate)
        self._resetRequested.connect(self.worker.reset)
        # The model is freed on its own thread as that thread ends, after any running request.
        self._thread.finished.connect(self.worker.unload, Qt.ConnectionType.DirectConnection)
        self._next_request = 0
        self._stop = threading.Event()
        self._cancel_load = threading.Event()
        self._thread.start()

    @property
    def engine_thread(self) -> QThread:
        return self._thread

    def load(self, path: str | Path, config: LoadConfig) -> None:
        """Load ``path`` (``DEFAULT_MODEL`` for the embedded one) on the worker."""
        self._cancel_load = threading.Event()
        self._loadRequested.emit(str(path), config, self._cancel_load)

    def cancel_load(self) -> None:
        self._cancel_load.set()

    def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> int:
        """Queue a reply; returns its request id."""
        self._next_request += 1
        self._stop = threading.Event()
        self._generateRequested.emit(self._next_request, list(messages), params, self._stop)
        return self._next_request

    def stop(self) -> None:
        """Ask the running reply to stop; its cancelled signal follows promptly."""
        self._stop.set()

    def reset(self) -> None:
        self._resetRequested.emit()

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Stop any work, free the model on its thread, and join the thread."""
        if not self._thread.isRunning():
            return True
        self._stop.set()
        self._cancel_load.set()
        self._thread.quit()
        t0 = time.monotonic()
        ok = self._thread.wait(timeout_ms)
        log.info("engine thread joined in %.0f ms (ok=%s)", (time.monotonic() - t0) * 1000, ok)
        return bool(ok)
