"""The main window: layout and wiring. The conversation's lifecycle is ``ChatSession``'s."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, QEventLoop, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QSplitter,
    QWidget,
)

from app.chat.conversation import Conversation
from app.chat.session import ChatSession
from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.params import ApiSettings, LoadConfig, SamplingParams
from app.config.paths import DataDirs
from app.config.presets import PresetStore
from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from app.engine.metrics import MessageMetrics
from app.engine.templates import ChatMessage
from app.gguf.lora import LoraStack
from app.util.sysinfo import size_text
from ui.api.api_status import ApiControl
from ui.chat import conversation_files
from ui.chat.chat_pane import ChatPane
from ui.chat.conversation_list import ConversationList
from ui.chat.prompt_controls import install as install_prompt_controls
from ui.chat.search_jump import SearchJump
from ui.chat.session_view import WindowView
from ui.common import accessibility, theme
from ui.engine.worker import DEFAULT_MODEL, EngineClient
from ui.models import model_drop
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager
from ui.models.model_status import ModelStatus
from ui.models.onboarding import install as install_onboarding
from ui.models.recent_models import RecentModels
from ui.remote.remote_control import RemoteControl
from ui.settings.draft_control import DraftControl
from ui.settings.draft_control import install as install_draft_control
from ui.window import docks, window_actions, window_state

log = logging.getLogger(__name__)


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

    # Made by ui.window.window_actions.build.
    new_chat_action: QAction
    open_model_action: QAction
    regenerate_action: QAction
    manager_action: QAction
    compact_cache_action: QAction
    connect_action: QAction
    api_action: QAction
    new_chat_button: QWidget
    chat_menu: QMenu
    view_menu: QMenu
    model_menu: QMenu
    recent_models: RecentModels
    backend_page: QDialog
    draft_control: DraftControl

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
        self._model: ModelInfo | None = None
        self._loading = False
        self._closing = False
        self._layout_restored = False
        self._restyle_pending = False
        self._reply_started = 0.0
        self.session_view = WindowView(self)
        self.session = ChatSession(self._store, client, self.session_view, settings.system_prompt)

        self._build_widgets()
        window_actions.build(self)
        self.onboarding = install_onboarding(self)
        self.prompt_controls = install_prompt_controls(self)
        self.draft_control = install_draft_control(self)
        self._connect_engine()
        self.refresh_sidebar()
        self._update_buttons()
        self.model_drop = model_drop.install(self)
        app = QApplication.instance()
        assert isinstance(app, QApplication)
        self.theme = theme.theme_for(app, settings.theme)
        self.theme.set_choice(settings.theme)
        self._dark = theme.is_dark(self.palette())
        self.replyEnded.connect(self._on_reply_ended_restyle)

    # -- construction ----------------------------------------------------------------

    def _build_widgets(self) -> None:
        self.chat = ChatPane(self)
        self.transcript = self.chat.transcript
        self.chat_input = self.chat.chat_input
        self.send_button = self.chat.send_button
        self.stop_button = self.chat.stop_button
        self.edit_banner = self.chat.edit_banner
        self.transcript.actionRequested.connect(self._on_message_action)
        self.chat_input.submitted.connect(self.send)
        self.chat_input.textChanged.connect(self._update_buttons)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.chat.flushed.connect(self._on_flushed)

        self.sidebar = ConversationList(self)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.renameRequested.connect(self.rename_conversation)
        self.sidebar.forkRequested.connect(self.session.fork_saved)
        self.sidebar.deleteRequested.connect(partial(conversation_files.ask_delete, self))
        self.sidebar.exportRequested.connect(partial(conversation_files.ask_export, self))
        self.sidebar.newChatRequested.connect(self.new_chat)
        self.search_jump = SearchJump(self)
        splitter = QSplitter(self)
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.sidebar)
        splitter.addWidget(self.chat)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([260, 920])
        self.setCentralWidget(splitter)

        self.presets = PresetStore(self._dirs.root / "presets.json")
        self.sampling_panel, self.perf_panel, self.lora_panel = docks.build(self)

        bar = self.statusBar()
        self.model_status = ModelStatus(self, bar, self._client.cancel_load)
        self.remote = RemoteControl(self, bar)
        self.api = ApiControl(self._client, bar, self)
        self.status_model = self.model_status.label
        self.status_backend = self.model_status.backend
        self.status_speed = self._label("", "statusSpeed")
        self.status_lora = self._label("", "statusLora")
        for w in (self.status_lora, self.status_speed, self.status_backend):
            bar.addPermanentWidget(w)

    def setVisible(self, visible: bool) -> None:
        """The first show restores the saved layout, after every panel was made."""
        if visible and not self._layout_restored:
            self._layout_restored = True
            problems = window_state.restore(self, self._settings.window_layout)
            if problems:
                self.statusBar().showMessage(
                    "The saved window layout could not be used in full; the default is used.",
                    8000,
                )
            window_actions.share_shortcuts(self)
            accessibility.name_controls(self)
            self.model_drop.watch(self)
        super().setVisible(visible)

    def _label(self, text: str, name: str) -> QLabel:
        label = QLabel(text, self)
        label.setObjectName(name)
        return label

    def _connect_engine(self) -> None:
        w = self._client.worker
        w.loadProgress.connect(self._on_load_progress)
        w.modelLoaded.connect(self._on_model_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.prefillProgress.connect(self._on_prefill_progress)
        w.tokens.connect(self._on_tokens)
        # Bound methods, never lambdas: a lambda would run on the worker's thread.
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
        return self.session.busy

    @property
    def conversation(self) -> Conversation:
        return self.session.conversation

    @property
    def messages(self) -> list[ChatMessage]:
        return [m.chat() for m in self.conversation.messages]

    @property
    def reply_metrics(self) -> list[MessageMetrics]:
        return self.session.reply_metrics()

    def _update_buttons(self) -> None:
        ready = self._model is not None and not self._loading
        self.send_button.setEnabled(ready and not self.busy and self.chat.has_text())
        self.stop_button.setEnabled(self.busy)
        # While a reply streams too: the load waits for it (``when_idle``).
        self.open_model_action.setEnabled(not self._loading)
        self.regenerate_action.setEnabled(ready and self.session.can_regenerate())

    # -- engine events ---------------------------------------------------------------

    def _on_tokens(self, request: int, text: str) -> None:
        if request != self.session.request_id:
            return
        self.session.on_tokens(request, text)
        self.chat.add_tokens(text)
        self.perf_panel.add_tokens()

    def _on_flushed(self, n_tokens: int) -> None:
        elapsed = time.perf_counter() - self._reply_started
        if elapsed > 0:
            self.status_speed.setText(f"{n_tokens / elapsed:.1f} tok/s")

    def _on_finished(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request == self.session.request_id:
            self.session.on_finished(request, text, metrics)
            self.replyEnded.emit("finished")

    def _on_cancelled(self, request: int, text: str, metrics: MessageMetrics) -> None:
        if request == self.session.request_id:
            self.session.on_cancelled(request, text, metrics)
            self.replyEnded.emit("cancelled")

    def _on_failed(self, request: int, message: str) -> None:
        if request == self.session.request_id:
            self.session.on_failed(request, message)
            self.replyEnded.emit("failed")

    def _on_snapshot_failed(self, _conv_id: str, message: str) -> None:
        self.statusBar().showMessage(message, 10000)

    def _on_prefill_progress(self, request: int, done: int, total: int) -> None:
        if request == self.session.request_id and total > 0:
            self.status_speed.setText(f"reading prompt {done}/{total}")

    def _on_snapshot_saved(self, conv_id: str, size: int, dropped: list[str]) -> None:
        if dropped:
            self.statusBar().showMessage(
                f"Dropped {len(dropped)} old conversation cache(s) to stay within "
                f"{size_text(self._store.budget_bytes)}",
                6000,
            )
        for changed in (conv_id, *dropped):
            if self._store.transcript_path(changed).exists():
                self.session_view.row_saved(changed)
        self.sidebar.set_usage(self._store.total_snapshot_bytes(), self._store.budget_bytes)
        self.snapshotSaved.emit(conv_id)

    def _on_restored(self, result: RestoreResult) -> None:
        self.session_view.restored(result)

    # -- chat commands ---------------------------------------------------------------

    def send(self) -> None:
        if not self.chat.has_text() or self.busy or self._model is None or self._loading:
            return
        waiting = self.api.waiting_note()
        if waiting:
            self.transcript.add_notice(waiting)
        # The box is emptied only once the message is the session's (nothing is dropped).
        if self.session.send(self.chat.text(), self._settings.sampling):
            self.chat.clear_text()
        if waiting:  # until the reply's first words replace it
            self.status_speed.setText("waiting for the API request…")

    def send_dropping_older(self) -> None:
        """Answer the message left unanswered (or send the box's text) once, with older
        messages dropped to make room."""
        if self.busy or self._model is None or self._loading:
            return
        once = replace(self._settings.sampling, overflow="truncate_middle")
        if self.session.answer_pending(once):
            return
        if self.chat.has_text() and self.session.send(self.chat.text(), once):
            self.chat.clear_text()

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the prompt's KV cache is reused)."""
        if self._model is not None and not self._loading:
            self.session.regenerate(self._settings.sampling)

    def answer_pending(self) -> bool:
        """Reply to the conversation's last message if it has no reply (after a crash)."""
        if self._model is None or self._loading:
            return False
        return self.session.answer_pending(self._settings.sampling)

    def edit_message(self, index: int) -> None:
        """Put user message ``index`` in the input box; sending replaces it and what follows."""
        text = self.session.begin_edit(index)
        if text is not None:
            self.chat.show_edit(index, text)

    def stop(self) -> None:
        if self.busy:
            self.session.stop()
            self.status_speed.setText("stopping…")
        elif self.session.edit_index is not None:
            self.session.cancel_edit()
            self.chat.show_edit(None)
            self.chat_input.clear()

    def new_chat(self) -> None:
        self.session.new_chat()

    def fork_at(self, index: int) -> None:
        """Continue from message ``index`` in a new conversation; this one stays as it is."""
        self.session.fork(index)

    def open_conversation(self, conv_id: str, restore: bool = True) -> None:
        """Show a saved conversation and load its KV cache (stopping a running reply)."""
        self.session.open(conv_id, restore)

    def rename_conversation(self, conv_id: str, title: str) -> None:
        self.session.rename(conv_id, title)

    def delete_conversation(self, conv_id: str) -> None:
        self.session.delete(conv_id)

    def _on_message_action(self, action: str, index: int) -> None:
        if action == "edit":
            self.edit_message(index)
        elif action == "fork":
            self.fork_at(index)
        elif action == "regenerate":
            self.regenerate()
        elif action == "answer":
            self.answer_pending()
        elif action in ("prev-version", "next-version"):
            self.session.switch_version(index, -1 if action == "prev-version" else 1)
        elif action == "drop-older":
            self.send_dropping_older()

    def export_conversation(self, conv: Conversation, path: Path, fmt: str) -> None:
        conversation_files.export_conversation(self, conv, path, fmt)

    def export_metrics(self, path: Path) -> None:
        conversation_files.export_metrics(self, self.conversation, path)

    def refresh_sidebar(self) -> None:
        rows = self._store.list()
        self.sidebar.set_conversations(
            rows,
            self.conversation.id,
            sum(r.snapshot_bytes for r in rows),
            self._store.budget_bytes,
        )

    # -- model -----------------------------------------------------------------------

    def start_engine(self, model: str | Path | None) -> None:
        """At start: reconnect to the server in use at the last quit, else load ``model``;
        then the local API server, if it is switched on."""
        if not self.remote.start():
            self.load_model(model)
        if self._settings.api.enabled:
            problem = self.api.start(self._settings.api)
            if problem:
                self.session_view.notice(f"The local API server did not start: {problem}")

    def set_api_settings(self, api: ApiSettings) -> None:
        """The API server's settings, as the dialog applied them."""
        self._settings.api = api
        self._save_settings()

    def load_model(self, path: str | Path | None) -> None:
        """Load ``path``, or the embedded default model when None."""
        self.begin_loading("Loading model…")
        self._client.load(DEFAULT_MODEL if path is None else path, self._settings.load)

    def begin_loading(self, what: str) -> None:
        """A load or connect is under way: the model may change when it ends."""
        self._loading = True
        self.model_status.loading(what)
        self._update_buttons()

    def reload_model(self) -> None:
        """Load the current model again with the current settings, once the reply is settled."""
        if self._model is not None and self._model.server:
            conn = self.remote.current
            if conn is not None:
                self.session.when_idle(lambda: self.remote.connect_to(conn))
        elif self._model is not None:
            path = self._model.path
            self.session.when_idle(lambda: self.load_model(path))

    def unload_model(self) -> None:
        def unload() -> None:
            self._client.unload()
            self._model = self.session.model = None
            self.model_status.none()
            self._update_buttons()

        self.session.when_idle(unload)

    def show_model_manager(self) -> None:
        if self._services is not None:
            window_actions.show_model_manager(self, self._services)

    def _on_sampling_changed(self, params: SamplingParams) -> None:
        self._settings.sampling = params
        self._save_settings()

    def _on_reload_requested(self, load: LoadConfig) -> None:
        self._settings.load = load
        self._save_settings()
        self.reload_model()

    def _on_compact_cache_toggled(self) -> None:
        kv_type = "q8_0" if self.compact_cache_action.isChecked() else "f16"
        self._settings.load = replace(self._settings.load, kv_type=kv_type)
        self._save_settings()
        self.reload_model()

    def _on_load_progress(self, value: float, what: str) -> None:
        self.model_status.advanced(value, what)

    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._loading = False
        self._model = self.session.model = info
        self.model_status.loaded(info)
        self.setWindowTitle(f"Lamplight — {info.name}")
        if self.model_manager is not None:
            self.model_manager.loaded_model = str(info.path)
        if not info.server:
            self._settings.model_path = str(info.path)
            self._settings.remember_model(str(info.path))
            self._save_settings()
        self.sampling_panel.set_load(self._settings.load)
        self.remote.loaded(info)
        key = f"{info.name}:{info.file_size}"
        self.sampling_panel.model_key = key
        if key in self.presets.model_defaults and not self.conversation.sampling:
            self.sampling_panel.select_preset(self.presets.default_for(key))
        if self.conversation.messages:
            # Resume from the saved cache if it was made with this model; else re-read.
            self._client.restore_snapshot(self.conversation.id)
        self._update_buttons()
        self.chat_input.setFocus()
        self.modelReady.emit(info)

    def _on_load_failed(self, message: str, previous_still_loaded: bool) -> None:
        self._loading = False
        self.remote.failed()
        if not previous_still_loaded:
            self._model = self.session.model = None
        self.model_status.failed(self._model)
        self.transcript.add_notice(message)
        self._update_buttons()
        self.modelFailed.emit(message)
        if not self._closing and self.isVisible():
            QMessageBox.warning(self, "Could not load the model", message)

    def _on_load_note(self, message: str) -> None:
        self.session_view.notice(message)

    def _on_lora_applied(self, stack: LoraStack) -> None:
        self.lora_panel.set_applied(stack)
        self.status_lora.setText(stack.summary())

    def _on_lora_failed(self, message: str, still: LoraStack) -> None:
        self.lora_panel.show_error(message)
        self.lora_panel.set_applied(still)
        self.status_lora.setText(still.summary())

    def set_theme(self, choice: str) -> None:
        """View -> Appearance: ``system``, ``light`` or ``dark``."""
        self._settings.theme = choice
        self._save_settings()
        self.theme.set_choice(choice)

    def changeEvent(self, event: QEvent) -> None:
        """A light/dark switch: the transcript's HTML has its colours baked in, so it is
        drawn again (after the reply that is streaming, if any)."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "_dark"):
            dark = theme.is_dark(self.palette())
            if dark != self._dark:
                self._dark = dark
                self._restyle_pending = True
                if not self.busy:
                    QTimer.singleShot(0, self._restyle_transcript)

    def _on_reply_ended_restyle(self, _how: str) -> None:
        if self._restyle_pending:
            QTimer.singleShot(0, self._restyle_transcript)

    def _restyle_transcript(self) -> None:
        if not self._restyle_pending or self.busy or self._closing:
            return
        self._restyle_pending = False
        if self.conversation.messages:
            self.transcript.show_messages(self.conversation.messages)
        else:
            self.transcript.clear_conversation()

    def _save_settings(self) -> None:
        try:
            self._settings.save(self._dirs.settings_file)
        except OSError as exc:
            self.statusBar().showMessage(f"Could not save settings: {exc}", 8000)

    # -- shutdown ------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        self._closing = True
        # First: API requests end and none reaches the worker while the chat is saved.
        self.api.stop()
        if self.busy:
            # Stop the reply and let it be recorded and saved like any stopped reply.
            loop = QEventLoop()
            self.replyEnded.connect(loop.quit)
            QTimer.singleShot(5000, loop.quit)
            self.stop()
            loop.exec()
        self.chat.end_stream()
        self.perf_panel.stop_timers()
        self.remote.shutdown()
        self.session.save()
        if self.conversation.messages:
            self._settings.last_conversation = self.conversation.id
        if self._layout_restored:  # never shown: nothing worth keeping
            self._settings.window_layout = window_state.capture(self)
        self._save_settings()
        self._client.shutdown()
        if self._services is not None:
            self._services.shutdown()
        super().closeEvent(event)
