"""The main window: conversation sidebar, transcript, input, Send/Stop, model status."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QEventLoop, Qt, QTimer, Signal
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
    QSplitter,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.chat.conversation import (
    Conversation,
    ConversationError,
    Message,
    metrics_to_dict,
    to_markdown,
)
from app.chat.metrics_csv import metrics_csv
from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.params import (
    LoadConfig,
    SamplingParams,
    SettingError,
    sampling_to_dict,
    validate_sampling,
)
from app.config.paths import DataDirs
from app.config.presets import PresetStore
from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from app.engine.hardware import detect_hardware
from app.engine.metrics import MessageMetrics
from app.engine.templates import ChatMessage
from app.gguf.lora import LoraStack
from app.util.atomic import atomic_write_text
from app.util.sysinfo import size_text
from ui.backend_page import BackendPage, system_info
from ui.conversation_list import ConversationList
from ui.hub_workers import HubServices
from ui.lora_panel import LoraPanel
from ui.model_manager import ModelManager
from ui.perf_panel import PerfPanel
from ui.sampling_panel import SamplingPanel
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
    """Chats with the loaded model; every conversation is saved with its KV cache.

    Signals:
        replyEnded(str): ``finished``, ``cancelled`` or ``failed``, after the view updated.
        modelReady(object): the ``ModelInfo`` once a model is loaded.
        modelFailed(str): why a model could not be loaded, after the view updated.
        conversationOpened(object): the ``RestoreResult`` once an opened chat is ready.
        snapshotSaved(str): conversation id whose cache was just written.
    """

    replyEnded = Signal(str)
    modelReady = Signal(object)
    modelFailed = Signal(str)
    conversationOpened = Signal(object)
    snapshotSaved = Signal(str)

    def __init__(
        self,
        client: EngineClient,
        settings: AppSettings,
        dirs: DataDirs,
        store: ConversationStore | None = None,
        services: HubServices | None = None,
    ) -> None:
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle("Lamplight")
        self.resize(1280, 860)
        self._client = client
        self._settings = settings
        self._dirs = dirs
        self._store = store or ConversationStore(dirs.root)
        self._store.budget_bytes = settings.snapshot_budget_mb * 1024 * 1024
        self._services = services
        self.model_manager: ModelManager | None = None
        self._conv = self._fresh_conversation()
        self.reply_metrics: list[MessageMetrics] = []
        self._request: int | None = None
        self._pending: list[str] = []
        self._reply_started = 0.0
        self._reply_tokens = 0
        self._after_stop: list[object] = []  # callables to run once the reply has ended
        self._editing: int | None = None
        self._model: ModelInfo | None = None
        self._loading = False
        self._closing = False

        self._build_widgets()
        self._build_actions()
        self._connect_engine()
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush)
        self.refresh_sidebar()
        self._update_buttons()

    # -- construction ----------------------------------------------------------------

    def _build_widgets(self) -> None:
        self.transcript = TranscriptView(self)
        self.transcript.actionRequested.connect(self._on_message_action)
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
        self.edit_banner = QLabel(self)
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setStyleSheet("color: palette(highlight);")
        self.edit_banner.hide()

        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.chat_input, 1)
        row.addLayout(buttons)
        chat = QWidget(self)
        layout = QVBoxLayout(chat)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.edit_banner)
        layout.addLayout(row)

        self.sidebar = ConversationList(self)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.renameRequested.connect(self.rename_conversation)
        self.sidebar.forkRequested.connect(self._on_fork_from_sidebar)
        self.sidebar.deleteRequested.connect(self._on_delete_requested)
        self.sidebar.exportRequested.connect(self._on_export_requested)
        self.sidebar.newChatRequested.connect(self.new_chat)
        splitter = QSplitter(self)
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.sidebar)
        splitter.addWidget(chat)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([260, 920])
        self.setCentralWidget(splitter)

        self.presets = PresetStore(self._dirs.root / "presets.json")
        self.sampling_panel = SamplingPanel(
            self.presets, self._settings.sampling, self._settings.load, self
        )
        self.sampling_panel.samplingChanged.connect(self._on_sampling_changed)
        self.sampling_panel.reloadRequested.connect(self._on_reload_requested)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.sampling_panel)
        self.perf_panel = PerfPanel(self)
        self.perf_panel.exportRequested.connect(self._on_export_metrics)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.perf_panel)
        self.lora_panel = LoraPanel(self)
        self.lora_panel.stackChanged.connect(self._on_lora_stack_changed)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.lora_panel)
        self.tabifyDockWidget(self.sampling_panel, self.lora_panel)
        self.sampling_panel.raise_()
        self.resizeDocks([self.perf_panel], [250], Qt.Orientation.Vertical)
        self.resizeDocks([self.sampling_panel], [380], Qt.Orientation.Horizontal)

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
        self.status_lora = QLabel("", self)
        self.status_lora.setObjectName("statusLora")
        bar.addPermanentWidget(self.status_lora)
        bar.addPermanentWidget(self.status_speed)
        bar.addPermanentWidget(self.status_backend)

    def _action(
        self,
        text: str,
        slot: object,
        shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None,
        tip: str = "",
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if tip:
            action.setToolTip(tip)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _build_actions(self) -> None:
        self.new_chat_action = self._action(
            "New chat",
            self.new_chat,
            QKeySequence.StandardKey.New,
            "Start a new conversation (Ctrl+N)",
        )
        self.open_model_action = self._action(
            "Open model…",
            self._on_open_model,
            QKeySequence.StandardKey.Open,
            "Load a GGUF model file (Ctrl+O)",
        )
        self.regenerate_action = self._action(
            "Regenerate last reply", self.regenerate, "Ctrl+R", "Ask for another reply (Ctrl+R)"
        )
        import_action = self._action("Import conversation…", self._on_import)
        export_json = self._action(
            "Export conversation as JSON…", lambda: self._on_export_requested(self._conv.id, "json")
        )
        export_md = self._action(
            "Export conversation as Markdown…",
            lambda: self._on_export_requested(self._conv.id, "markdown"),
        )
        quit_action = self._action("Quit", self.close, QKeySequence.StandardKey.Quit)
        self._action("Stop", self.stop, QKeySequence(Qt.Key.Key_Escape))
        self._action("Focus input", lambda: self.chat_input.setFocus(), "Ctrl+L")
        self.manager_action = self._action(
            "Model manager…",
            self.show_model_manager,
            "Ctrl+M",
            "Find, download and manage models (Ctrl+M)",
        )
        self.manager_action.setEnabled(self._services is not None)
        self.compact_cache_action = self._action(
            "Compact KV cache (q8_0, half-size snapshots)", self._on_compact_cache_toggled
        )
        self.compact_cache_action.setCheckable(True)
        self.compact_cache_action.setChecked(self._settings.load.kv_type == "q8_0")

        menu = self.menuBar()
        file_menu = menu.addMenu("&File")
        for a in (
            self.new_chat_action,
            self.open_model_action,
            None,
            import_action,
            export_json,
            export_md,
            None,
            quit_action,
        ):
            if a is None:
                file_menu.addSeparator()
            else:
                file_menu.addAction(a)
        chat_menu = menu.addMenu("&Chat")
        chat_menu.addAction(self.regenerate_action)
        self.view_menu = menu.addMenu("&View")
        for dock, keys in (
            (self.sampling_panel, "Ctrl+Shift+S"),
            (self.perf_panel, "Ctrl+Shift+P"),
        ):
            toggle = dock.toggleViewAction()
            toggle.setShortcut(QKeySequence(keys))
            self.view_menu.addAction(toggle)
        help_menu_actions = [self._action("Hardware and backends…", self.show_backend_page)]
        model_menu = menu.addMenu("&Model")
        model_menu.addAction(self.manager_action)
        model_menu.addAction(self.open_model_action)
        model_menu.addAction(self.compact_cache_action)

        help_menu = menu.addMenu("&Help")
        for a in help_menu_actions:
            help_menu.addAction(a)

        toolbar = QToolBar("Main", self)
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        toolbar.addAction(self.new_chat_action)
        self.new_chat_button = toolbar.widgetForAction(self.new_chat_action)
        self.new_chat_button.setObjectName("newChatButton")
        toolbar.addAction(self.manager_action)
        toolbar.addAction(self.open_model_action)
        toolbar.addAction(self.regenerate_action)

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
        w.snapshotSaved.connect(self._on_snapshot_saved)
        w.snapshotFailed.connect(self._on_snapshot_failed)
        w.restored.connect(self._on_restored)
        w.loadNote.connect(self._on_load_note)
        w.loraApplied.connect(self._on_lora_applied)
        w.loraFailed.connect(self._on_lora_failed)

    # -- state ---------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._request is not None

    @property
    def conversation(self) -> Conversation:
        return self._conv

    @property
    def messages(self) -> list[ChatMessage]:
        return [m.chat() for m in self._conv.messages]

    def _fresh_conversation(self) -> Conversation:
        return Conversation(system_prompt=self._settings.system_prompt)

    def _update_buttons(self) -> None:
        has_text = bool(self.chat_input.toPlainText().strip())
        ready = self._model is not None and not self._loading
        self.send_button.setEnabled(ready and not self.busy and has_text)
        self.stop_button.setEnabled(self.busy)
        self.open_model_action.setEnabled(not self.busy and not self._loading)
        self.regenerate_action.setEnabled(
            ready and not self.busy and any(m.role == "assistant" for m in self._conv.messages)
        )

    def _run_when_idle(self, action: object) -> bool:
        """Run ``action`` now, or after stopping the running reply. True if deferred."""
        if self.busy:
            self._after_stop.append(action)
            self.stop()
            return True
        action()  # type: ignore[operator]
        return False

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

    def show_model_manager(self) -> None:
        if self._services is None:
            return
        if self.model_manager is None:
            m = ModelManager(
                self._services,
                str(self._model.path) if self._model else None,
                self._settings.load.n_ctx,
                self,
            )
            m.imported = [Path(p) for p in self._settings.imported_models]
            m.loadRequested.connect(self._on_manager_load)
            m.defaultRequested.connect(self._on_manager_default)
            m.unloadRequested.connect(self._on_manager_unload)
            m.libraryChanged.connect(self._on_library_changed)
            m.libraryChanged.connect(
                lambda entries: self.lora_panel.set_library_adapters(
                    [e.path for e in entries if e.valid and e.is_adapter]
                )
            )
            self.model_manager = m
            m.refresh_library()
        self.model_manager.show()
        self.model_manager.raise_()

    def _on_manager_load(self, path: str) -> None:
        if self.busy:
            self.statusBar().showMessage("Stop the reply before loading another model.", 5000)
            return
        self.load_model(path)

    def _on_manager_default(self, path: str) -> None:
        self._settings.model_path = path
        self._save_settings()
        self.statusBar().showMessage(f"{Path(path).name} opens at start.", 5000)

    def _on_manager_unload(self) -> None:
        self._run_when_idle(self._unload_model)

    def _unload_model(self) -> None:
        self._client.unload()
        self._model = None
        self.status_model.setText("No model loaded: open one with Ctrl+O or Ctrl+M")
        self.status_backend.setText("")
        self._update_buttons()

    def _on_library_changed(self, _entries: object) -> None:
        if self.model_manager is not None:
            imported = [str(p) for p in self.model_manager.imported]
            if imported != self._settings.imported_models:
                self._settings.imported_models = imported
                self._save_settings()

    def _on_lora_stack_changed(self, stack: LoraStack) -> None:
        # Queued after any running reply; the next message uses the new stack.
        self._client.set_lora_stack(stack)

    def _on_lora_applied(self, stack: LoraStack) -> None:
        self.lora_panel.set_applied(stack)
        self.status_lora.setText(stack.summary())

    def _on_lora_failed(self, message: str, still: LoraStack) -> None:
        self.lora_panel.show_error(message)
        self.lora_panel.set_applied(still)
        self.status_lora.setText(still.summary())

    def _on_load_note(self, message: str) -> None:
        self.transcript.add_notice(message)
        self.statusBar().showMessage(message, 10000)

    def show_backend_page(self) -> None:
        page = BackendPage(detect_hardware(), system_info(), self)
        page.show()
        self.backend_page = page

    def _on_sampling_changed(self, params: SamplingParams) -> None:
        self._settings.sampling = params
        self._save_settings()

    def _on_reload_requested(self, load: LoadConfig) -> None:
        self._settings.load = load
        self._save_settings()
        if self._model is not None:
            self._run_when_idle(lambda: self.load_model(self._model.path if self._model else None))

    def _on_compact_cache_toggled(self) -> None:
        kv_type = "q8_0" if self.compact_cache_action.isChecked() else "f16"
        self._settings.load = replace(self._settings.load, kv_type=kv_type)
        self._save_settings()
        if self._model is not None and not self.busy:
            self.load_model(self._model.path)

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
        if self.model_manager is not None:
            self.model_manager.loaded_model = str(info.path)
        if str(info.path) != self._settings.model_path:
            self._settings.model_path = str(info.path)
            self._save_settings()
        self.sampling_panel.set_load(self._settings.load)
        self.lora_panel.set_model(info.path)
        key = f"{info.name}:{info.file_size}"
        self.sampling_panel.model_key = key
        if key in self.presets.model_defaults and not self._conv.sampling:
            self.sampling_panel.select_preset(self.presets.default_for(key))
        if self._conv.messages:
            # Resume from the saved cache if it was made with this model; else re-read.
            self._client.restore_snapshot(self._conv.id)
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

    # -- conversations -----------------------------------------------------------------

    def refresh_sidebar(self) -> None:
        rows = self._store.list()
        self.sidebar.set_conversations(
            rows, self._conv.id, sum(r.snapshot_bytes for r in rows), self._store.budget_bytes
        )

    def open_conversation(self, conv_id: str, restore: bool = True) -> None:
        """Show a saved conversation and load its KV cache (stopping a running reply)."""
        if conv_id == self._conv.id and not self.busy:
            return
        self._run_when_idle(lambda: self._open(conv_id, restore))

    def _open(self, conv_id: str, restore: bool) -> None:
        try:
            conv = self._store.load(conv_id)
        except ConversationError as exc:
            QMessageBox.warning(self, "Could not open the conversation", str(exc))
            self.refresh_sidebar()
            return
        self._cancel_edit()
        self._conv = conv
        if conv.sampling:
            try:
                params = validate_sampling(conv.sampling)
            except SettingError as exc:
                log.info("conversation %s: stored settings not used: %s", conv.id, exc)
            else:
                self._settings.sampling = params
                self.sampling_panel.set_params(params)
        self.reply_metrics = [m for m in (x.message_metrics() for x in conv.messages) if m]
        self.transcript.show_messages(conv.messages)
        self.perf_panel.set_history(self.reply_metrics)
        self.refresh_sidebar()
        self._update_buttons()
        if restore and self._model is not None:
            self._client.restore_snapshot(conv.id)
        else:
            self.conversationOpened.emit(RestoreResult(conv.id, False, 0, 0.0, ""))

    def _on_restored(self, result: RestoreResult) -> None:
        if result.conv_id != self._conv.id:
            return
        if result.lora_stack is not None:
            self.lora_panel.set_stack(result.lora_stack)
            self.status_lora.setText(result.lora_stack.summary())
            if result.lora_changed:
                self.transcript.add_notice(
                    f"Using this conversation's adapters: {result.lora_stack.summary()}."
                )
        if result.restored:
            self.status_speed.setText(f"resumed {result.n_tokens} tokens in {result.ms:.0f} ms")
        elif self._conv.messages:
            self.transcript.add_notice(
                f"Saved cache not used: {result.note}. "
                "It will be rebuilt from the transcript when you continue."
            )
        self.conversationOpened.emit(result)

    def rename_conversation(self, conv_id: str, title: str) -> None:
        try:
            conv = self._store.rename(conv_id, title)
        except ConversationError as exc:
            self.statusBar().showMessage(str(exc), 8000)
            return
        if conv_id == self._conv.id:
            self._conv.title = conv.title
            self._conv.title_is_custom = True
        self.refresh_sidebar()

    def delete_conversation(self, conv_id: str) -> None:
        self._store.delete(conv_id)
        if conv_id == self._conv.id:
            self._run_when_idle(self._start_new_chat)
        self.refresh_sidebar()

    def _on_delete_requested(self, conv_id: str) -> None:
        row = next((r for r in self._store.list() if r.id == conv_id), None)
        title = row.title if row else conv_id
        answer = QMessageBox.question(
            self,
            "Delete conversation",
            f"Delete “{title}” and its saved cache? This cannot be undone.",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_conversation(conv_id)

    def fork_at(self, index: int) -> None:
        """Continue from message ``index`` in a new conversation; this one stays as it is."""
        if not self._conv.messages:
            return

        def fork() -> None:
            self._persist()
            try:
                fork = self._store.fork(self._conv, index)
            except ConversationError as exc:
                self.statusBar().showMessage(str(exc), 8000)
                return
            # No restore: the engine's cache holds the shared prefix already.
            self.open_conversation(fork.id, restore=False)

        self._run_when_idle(fork)

    def _on_fork_from_sidebar(self, conv_id: str) -> None:
        try:
            conv = self._store.load(conv_id)
        except ConversationError as exc:
            self.statusBar().showMessage(str(exc), 8000)
            return
        if conv.messages:
            fork = self._store.fork(conv, len(conv.messages) - 1)
            self.open_conversation(fork.id)

    def _on_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a conversation", str(Path.home()), "Lamplight JSON (*.json)"
        )
        if not path:
            return
        try:
            conv = self._store.import_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ConversationError) as exc:
            QMessageBox.warning(self, "Could not import", f"{Path(path).name}: {exc}")
            return
        self.open_conversation(conv.id)

    def _on_export_requested(self, conv_id: str, fmt: str) -> None:
        try:
            conv = self._conv if conv_id == self._conv.id else self._store.load(conv_id)
        except ConversationError as exc:
            QMessageBox.warning(self, "Could not export", str(exc))
            return
        suffix, kind = (
            (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
        )
        stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title)[:60] or "chat"
        path, _ = QFileDialog.getSaveFileName(
            self, "Export conversation", str(Path.home() / f"{stem}{suffix}"), kind
        )
        if path:
            self.export_conversation(conv, Path(path), fmt)

    def export_conversation(self, conv: Conversation, path: Path, fmt: str) -> None:
        import json

        text = to_markdown(conv) if fmt == "markdown" else json.dumps(conv.to_dict(), indent=1)
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            QMessageBox.warning(self, "Could not export", f"{path}: {exc.strerror or exc}")
            return
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    def _on_export_metrics(self) -> None:
        stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in self._conv.title)[:60]
        path, _ = QFileDialog.getSaveFileName(
            self, "Export metrics", str(Path.home() / f"{stem or 'metrics'}.csv"), "CSV (*.csv)"
        )
        if path:
            self.export_metrics(Path(path))

    def export_metrics(self, path: Path) -> None:
        try:
            atomic_write_text(path, metrics_csv(self._conv.messages))
        except OSError as exc:
            QMessageBox.warning(self, "Could not export", f"{path}: {exc.strerror or exc}")
            return
        self.statusBar().showMessage(f"Metrics exported to {path}", 5000)

    def _persist(self) -> None:
        """Save the transcript (small, on this thread) if it has anything in it."""
        if not self._conv.messages:
            return
        self._conv.auto_title()
        if self._model is not None:
            self._conv.model_name = self._model.name
            self._conv.model_path = str(self._model.path)
        try:
            self._store.save(self._conv)
        except OSError as exc:
            self.transcript.add_notice(f"The conversation could not be saved: {exc}")

    def _autosave(self) -> None:
        self._persist()
        if self._conv.messages:
            self._client.save_snapshot(self._conv.id, frozenset({self._conv.id}))
        self.refresh_sidebar()

    def _on_snapshot_saved(self, conv_id: str, size: int, dropped: list[str]) -> None:
        if dropped:
            self.statusBar().showMessage(
                f"Dropped {len(dropped)} old conversation cache(s) to stay within "
                f"{size_text(self._store.budget_bytes)}",
                6000,
            )
        self.refresh_sidebar()
        self.snapshotSaved.emit(conv_id)

    def _on_snapshot_failed(self, conv_id: str, message: str) -> None:
        self.statusBar().showMessage(message, 10000)

    # -- chat ----------------------------------------------------------------------

    def send(self) -> None:
        text = self.chat_input.toPlainText().strip()
        if not text or self.busy or self._model is None or self._loading:
            return
        self.chat_input.clear()
        if self._editing is not None:
            # Replace the edited message and drop everything after it.
            del self._conv.messages[self._editing :]
            self._cancel_edit()
            self.transcript.show_messages(self._conv.messages)
        self._conv.messages.append(Message("user", text))
        self.transcript.add_user_message(text, len(self._conv.messages) - 1)
        self._start_reply()

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the prompt's KV cache is reused)."""
        if self.busy or self._model is None:
            return
        msgs = self._conv.messages
        last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
        if last < 0:
            return
        del msgs[last:]
        if self.reply_metrics:
            self.reply_metrics.pop()
        self.perf_panel.set_history(self.reply_metrics)
        self.transcript.show_messages(msgs)
        self._start_reply()

    def edit_message(self, index: int) -> None:
        """Put user message ``index`` in the input box; sending replaces it and what follows."""
        if self.busy or not 0 <= index < len(self._conv.messages):
            return
        message = self._conv.messages[index]
        if message.role != "user":
            return
        self._editing = index
        self.edit_banner.setText(
            f"Editing message {index + 1}: sending replaces it and the messages after it. "
            "Esc cancels."
        )
        self.edit_banner.show()
        self.chat_input.setPlainText(message.content)
        self.chat_input.setFocus()

    def _cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.edit_banner.hide()

    def _on_message_action(self, action: str, index: int) -> None:
        if action == "edit":
            self.edit_message(index)
        elif action == "fork":
            self.fork_at(index)
        elif action == "regenerate":
            self.regenerate()

    def _start_reply(self) -> None:
        self._conv.sampling = sampling_to_dict(self._settings.sampling)
        self.transcript.begin_reply(len(self._conv.messages))
        self.perf_panel.start_reply()
        self._pending.clear()
        self._reply_tokens = 0
        self._reply_started = time.perf_counter()
        self._request = self._client.generate(self._conv.chat(), self._settings.sampling)
        self.status_speed.setText("thinking…")
        self._flush_timer.start()
        self._update_buttons()

    def stop(self) -> None:
        if self.busy:
            self._client.stop()
            self.status_speed.setText("stopping…")
        elif self._editing is not None:
            self._cancel_edit()
            self.chat_input.clear()

    def new_chat(self) -> None:
        self._run_when_idle(self._start_new_chat)

    def _start_new_chat(self) -> None:
        self._cancel_edit()
        self._conv = self._fresh_conversation()
        self.reply_metrics.clear()
        self.perf_panel.set_history([])
        self.transcript.clear_conversation()
        self._client.reset()
        self.status_speed.setText("")
        self.refresh_sidebar()
        self._update_buttons()
        self.chat_input.setFocus()

    def _on_prefill_progress(self, request: int, done: int, total: int) -> None:
        if request == self._request and total > 0:
            self.status_speed.setText(f"reading prompt {done}/{total}")

    def _on_tokens(self, request: int, text: str) -> None:
        if request != self._request:
            return
        self._pending.append(text)
        self._reply_tokens += 1
        self.perf_panel.add_tokens()

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
        self.transcript.end_reply(text, footer=footer, error=error, kept=metrics is not None)
        if metrics is not None:
            self.reply_metrics.append(metrics)
            self.perf_panel.end_reply(metrics)
            self.status_speed.setText(
                f"{metrics.decode_tok_s:.1f} tok/s · TTFT {metrics.ttft_ms:.0f} ms"
            )
            if metrics.cache_note:
                self.transcript.add_notice(f"Cache rebuilt: {metrics.cache_note}.")
            for note in metrics.notes:
                self.transcript.add_notice(note[:1].upper() + note[1:] + ".")
        self._request = None
        self._update_buttons()
        pending, self._after_stop = self._after_stop, []
        for action in pending:
            action()  # type: ignore[operator]

    def _record_reply(self, text: str, metrics: MessageMetrics) -> None:
        msgs = self._conv.messages
        if msgs and msgs[-1].role == "user":
            msgs[-1].token_offset = metrics.turn_offset
        msgs.append(
            Message(
                "assistant",
                text,
                token_offset=metrics.prompt_tokens,
                metrics=metrics_to_dict(metrics),
            )
        )
        self._conv.n_tokens = metrics.context_used

    def _on_finished(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request != self._request:
            return
        self._record_reply(text, metrics)
        self._end_request(text, metrics)
        self._autosave()
        self.replyEnded.emit("finished")

    def _on_cancelled(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request != self._request:
            return
        if text.strip():
            # A stopped reply stays in the conversation, as the user saw it.
            self._record_reply(text, metrics)
        self._end_request(text, metrics)
        self._autosave()
        self.replyEnded.emit("cancelled")

    def _on_failed(self, request: int, message: str) -> None:
        if request != self._request:
            return
        # The message did not get a reply: take it back out and return it to the input box.
        if self._conv.messages and self._conv.messages[-1].role == "user":
            unsent = self._conv.messages.pop().content
            if not self.chat_input.toPlainText().strip():
                self.chat_input.setPlainText(unsent)
        self._end_request("", None, error=message)
        self.status_speed.setText("error")
        self.replyEnded.emit("failed")

    # -- shutdown ------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        self._closing = True
        if self.busy:
            # Stop the reply and let it be saved like any stopped reply.
            loop = QEventLoop()
            self.replyEnded.connect(loop.quit)
            QTimer.singleShot(5000, loop.quit)
            self.stop()
            loop.exec()
        self._flush_timer.stop()
        self.perf_panel.stop_timers()
        self._persist()
        if self._conv.messages:
            self._settings.last_conversation = self._conv.id
            self._save_settings()
        self._client.shutdown()
        if self._services is not None:
            self._services.shutdown()
        super().closeEvent(event)
