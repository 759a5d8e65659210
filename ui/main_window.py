"""The main window: transcript, input, Send/Stop, New chat, model status."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.engine import ModelInfo
from app.metrics import MessageMetrics
from app.paths import DataDirs
from app.settings import AppSettings
from app.templates import ChatMessage
from ui.transcript import TranscriptView
from ui.worker import DEFAULT_MODEL, EngineClient

log = logging.getLogger(__name__)

FLUSH_INTERVAL_MS = 40  # streamed text reaches the view at most 25 times a second


class ChatInput(QPlainTextEdit):
    """Enter sends; Shift+Enter inserts a line break.

    Signals:
        submitted(): the user pressed Enter.
    """

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class MainWindow(QMainWindow):
    """One chat with the loaded model.

    Signals:
        replyEnded(str): ``finished``, ``cancelled`` or ``failed``, after the view updated.
        modelReady(object): the ``ModelInfo`` once a model is loaded.
        modelFailed(str): why a model could not be loaded, after the view updated.
    """

    replyEnded = Signal(str)
    modelReady = Signal(object)
    modelFailed = Signal(str)

    def __init__(self, client: EngineClient, settings: AppSettings, dirs: DataDirs) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Lamplight")
        self.resize(960, 720)
        self._client = client
        self._settings = settings
        self._dirs = dirs
        self._messages: list[ChatMessage] = []
        self.reply_metrics: list[MessageMetrics] = []
        self._request: int | None = None
        self._pending: list[str] = []
        self._reply_started = 0.0
        self._reply_tokens = 0
        self._new_chat_after_stop = False
        self._model: ModelInfo | None = None
        self._loading = False
        self._closing = False

        self._build_widgets()
        self._build_actions()
        self._connect_engine()
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush)
        self._update_buttons()

    # -- construction ----------------------------------------------------------------

    def _build_widgets(self) -> None:
        self.transcript = TranscriptView(self)
        self.chat_input = ChatInput(self)
        self.chat_input.setObjectName("chatInput")
        self.chat_input.setPlaceholderText(
            "Message the model…  (Enter sends, Shift+Enter: new line)"
        )
        self.chat_input.setMaximumHeight(120)
        self.chat_input.submitted.connect(self.send)
        self.chat_input.textChanged.connect(self._update_buttons)
        self.send_button = QPushButton("Send", self)
        self.send_button.setObjectName("sendButton")
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop the reply (Esc)")
        self.stop_button.clicked.connect(self.stop)

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.chat_input, 1)
        row.addLayout(buttons)
        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(row)
        self.setCentralWidget(central)

        bar = self.statusBar()
        self.status_model = QLabel("No model", self)
        self.status_model.setObjectName("statusModel")
        self.status_backend = QLabel("", self)
        self.status_backend.setObjectName("statusBackend")
        self.status_speed = QLabel("", self)
        self.status_speed.setObjectName("statusSpeed")
        self.load_progress = QProgressBar(self)
        self.load_progress.setObjectName("loadProgress")
        self.load_progress.setRange(0, 100)
        self.load_progress.setMaximumWidth(180)
        self.load_progress.hide()
        self.cancel_load_button = QPushButton("Cancel", self)
        self.cancel_load_button.setObjectName("cancelLoadButton")
        self.cancel_load_button.clicked.connect(self._client.cancel_load)
        self.cancel_load_button.hide()
        bar.addWidget(self.status_model, 1)
        bar.addPermanentWidget(self.load_progress)
        bar.addPermanentWidget(self.cancel_load_button)
        bar.addPermanentWidget(self.status_speed)
        bar.addPermanentWidget(self.status_backend)

    def _build_actions(self) -> None:
        toolbar = QToolBar("Main", self)
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)

        self.new_chat_action = QAction("New chat", self)
        self.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_chat_action.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_chat_action.triggered.connect(self.new_chat)
        toolbar.addAction(self.new_chat_action)
        new_button = toolbar.widgetForAction(self.new_chat_action)
        new_button.setObjectName("newChatButton")
        self.new_chat_button = new_button

        self.open_model_action = QAction("Open model…", self)
        self.open_model_action.setShortcut(QKeySequence.StandardKey.Open)
        self.open_model_action.setToolTip("Load a GGUF model file (Ctrl+O)")
        self.open_model_action.triggered.connect(self._on_open_model)
        toolbar.addAction(self.open_model_action)

        stop_action = QAction("Stop", self)
        stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        stop_action.triggered.connect(self.stop)
        self.addAction(stop_action)
        focus_action = QAction("Focus input", self)
        focus_action.setShortcut(QKeySequence("Ctrl+L"))
        focus_action.triggered.connect(lambda: self.chat_input.setFocus())
        self.addAction(focus_action)
        quit_action = QAction("Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        self.addAction(quit_action)

    def _connect_engine(self) -> None:
        w = self._client.worker
        w.loadProgress.connect(self._on_load_progress)
        w.modelLoaded.connect(self._on_model_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.prefillProgress.connect(self._on_prefill_progress)
        w.tokens.connect(self._on_tokens)
        w.finished.connect(self._on_finished)
        w.cancelled.connect(self._on_cancelled)
        w.failed.connect(self._on_failed)

    # -- state ---------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._request is not None

    @property
    def messages(self) -> list[ChatMessage]:
        return list(self._messages)

    def _update_buttons(self) -> None:
        has_text = bool(self.chat_input.toPlainText().strip())
        ready = self._model is not None and not self._loading
        self.send_button.setEnabled(ready and not self.busy and has_text)
        self.stop_button.setEnabled(self.busy)
        self.open_model_action.setEnabled(not self.busy and not self._loading)

    # -- model ---------------------------------------------------------------------

    def load_model(self, path: str | Path | None) -> None:
        """Load ``path``, or the embedded default model when None."""
        self._loading = True
        self.load_progress.setValue(0)
        self.load_progress.show()
        self.cancel_load_button.show()
        self.status_model.setText("Loading model…")
        self._update_buttons()
        self._client.load(DEFAULT_MODEL if path is None else path, self._settings.load)

    def _on_open_model(self) -> None:
        start = (
            str(Path(self._settings.model_path).parent)
            if self._settings.model_path
            else str(self._dirs.models)
        )
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a GGUF model", start, "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.load_model(path)

    def _on_load_progress(self, value: float, what: str) -> None:
        self.load_progress.setValue(int(value * 100))
        self.status_model.setText(f"{what}… {value:.0%}")

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._loading = False
        self._model = info
        self.load_progress.hide()
        self.cancel_load_button.hide()
        size = (
            f"{info.n_params / 1e6:.0f}M" if info.n_params < 1e9 else f"{info.n_params / 1e9:.1f}B"
        )
        self.status_model.setText(
            f"{info.name} · {size} · ctx {info.n_ctx} · template {info.template}"
        )
        self.status_model.setToolTip(str(info.path))
        self.status_backend.setText(info.backend)
        self.setWindowTitle(f"Lamplight — {info.name}")
        if str(info.path) != self._settings.model_path:
            self._settings.model_path = str(info.path)
            self._save_settings()
        if self._messages:
            # The conversation stays; the new model reads it afresh on the next reply.
            self.transcript.add_notice(
                f"Now using {info.name}. The next reply re-reads the conversation."
            )
        self._update_buttons()
        self.chat_input.setFocus()
        self.modelReady.emit(info)

    def _on_load_failed(self, message: str, previous_still_loaded: bool) -> None:
        self._loading = False
        self.load_progress.hide()
        self.cancel_load_button.hide()
        if not previous_still_loaded:
            self._model = None
            self.status_backend.setText("")
        if self._model is not None:
            self.status_model.setText(f"{self._model.name} (still loaded)")
        else:
            self.status_model.setText("No model loaded: open one with Ctrl+O")
        self.transcript.add_notice(message)
        self._update_buttons()
        self.modelFailed.emit(message)
        if not self._closing and self.isVisible():
            QMessageBox.warning(self, "Could not load the model", message)

    def _save_settings(self) -> None:
        try:
            self._settings.save(self._dirs.settings_file)
        except OSError as exc:
            self.statusBar().showMessage(f"Could not save settings: {exc}", 8000)

    # -- chat ----------------------------------------------------------------------

    def send(self) -> None:
        text = self.chat_input.toPlainText().strip()
        if not text or self.busy or self._model is None or self._loading:
            return
        self.chat_input.clear()
        self._messages.append(ChatMessage("user", text))
        self.transcript.add_user_message(text)
        self.transcript.begin_reply()
        conversation = list(self._messages)
        if self._settings.system_prompt.strip():
            conversation.insert(0, ChatMessage("system", self._settings.system_prompt))
        self._pending.clear()
        self._reply_tokens = 0
        self._reply_started = time.perf_counter()
        self._request = self._client.generate(conversation, self._settings.sampling)
        self.status_speed.setText("thinking…")
        self._flush_timer.start()
        self._update_buttons()

    def stop(self) -> None:
        if self.busy:
            self._client.stop()
            self.status_speed.setText("stopping…")

    def new_chat(self) -> None:
        if self.busy:
            self._new_chat_after_stop = True
            self.stop()
            return
        self._messages.clear()
        self.reply_metrics.clear()
        self.transcript.clear_conversation()
        self._client.reset()
        self.status_speed.setText("")
        self.chat_input.setFocus()

    def _on_prefill_progress(self, request: int, done: int, total: int) -> None:
        if request == self._request and total > 0:
            self.status_speed.setText(f"reading prompt {done}/{total}")

    def _on_tokens(self, request: int, text: str) -> None:
        if request != self._request:
            return
        self._pending.append(text)
        self._reply_tokens += 1

    def _on_flush(self) -> None:
        if not self._pending:
            return
        self.transcript.append_stream("".join(self._pending))
        self._pending.clear()
        elapsed = time.perf_counter() - self._reply_started
        if elapsed > 0:
            self.status_speed.setText(f"{self._reply_tokens / elapsed:.1f} tok/s")

    def _end_request(self, text: str, metrics: MessageMetrics | None, error: str = "") -> None:
        self._flush_timer.stop()
        self._pending.clear()
        footer = metrics.short_text() if metrics is not None else ""
        self.transcript.end_reply(text, footer=footer, error=error)
        if metrics is not None:
            self.reply_metrics.append(metrics)
            self.status_speed.setText(
                f"{metrics.decode_tok_s:.1f} tok/s · TTFT {metrics.ttft_ms:.0f} ms"
            )
        self._request = None
        self._update_buttons()
        if self._new_chat_after_stop:
            self._new_chat_after_stop = False
            self.new_chat()

    def _on_finished(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request != self._request:
            return
        self._messages.append(ChatMessage("assistant", text))
        self._end_request(text, metrics)
        self.replyEnded.emit("finished")

    def _on_cancelled(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request != self._request:
            return
        if text.strip():
            # A stopped reply stays in the conversation, as the user saw it.
            self._messages.append(ChatMessage("assistant", text))
        self._end_request(text, metrics)
        self.replyEnded.emit("cancelled")

    def _on_failed(self, request: int, message: str) -> None:
        if request != self._request:
            return
        # The message did not get a reply: take it back out and return it to the input box.
        if self._messages and self._messages[-1].role == "user":
            unsent = self._messages.pop().content
            if not self.chat_input.toPlainText().strip():
                self.chat_input.setPlainText(unsent)
        self._end_request("", None, error=message)
        self.status_speed.setText("error")
        self.replyEnded.emit("failed")

    # -- shutdown ------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        self._closing = True
        self._flush_timer.stop()
        self._client.shutdown()
        super().closeEvent(event)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        return super().eventFilter(watched, event)
