"""The main window: layout and wiring. The conversation's lifecycle is ``ChatSession``'s."""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from pathlib import Path

from PySide6.QtCore import QEvent, Signal
from PySide6.QtGui import QAction, QCloseEvent
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QLabel,
    QMainWindow,
    QMenu,
    QSplitter,
    QWidget,
)

from app.chat.conversation import Conversation
from app.chat.session import ChatSession
from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.paths import DataDirs
from app.config.presets import PresetStore
from app.config.setting_records import ApiSettings, LoadConfig, SamplingParams
from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.host.core import DEFAULT_MODEL
from ui.api.api_status import ApiControl
from ui.chat import conversation_files
from ui.chat.chat_pane import ChatPane
from ui.chat.conversation_list import ConversationList
from ui.chat.document_attach import DocumentAttach
from ui.chat.image_attach import ImageAttach
from ui.chat.prompt_controls import PromptControls
from ui.chat.search_jump import SearchJump
from ui.common import accessibility, theme
from ui.common.context import Context, LoadedModel, SettingsStore
from ui.engine.worker import EngineClient
from ui.models.hub_workers import HubServices
from ui.models.model_drop import ModelDrop
from ui.models.model_manager import ModelManager
from ui.models.model_status import ModelStatus
from ui.models.onboarding import Onboarding
from ui.models.projector_choice import load_config
from ui.models.recent_models import RecentModels
from ui.perf.perf_panel import PerfPanel
from ui.remote.remote_control import RemoteControl
from ui.settings.draft_control import DraftControl
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel
from ui.tools.mcp_control import McpControl
from ui.tools.mcp_window import McpWindow
from ui.window import docks, reply_events, send_flow, window_actions, window_state
from ui.window.compaction_wiring import WindowCompaction
from ui.window.documents_wiring import wire_documents
from ui.window.load_events import LoadEvents
from ui.window.project_wiring import wire_projects
from ui.window.restyle import TranscriptRestyle
from ui.window.session_view import WindowView
from ui.window.thinking_controls import ThinkingControls
from ui.window.window_close import WindowClose

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

    # Made by _build_actions (ui.window.window_actions.build).
    new_chat_action: QAction
    open_model_action: QAction
    regenerate_action: QAction
    manager_action: QAction
    compact_cache_action: QAction
    new_chat_button: QWidget
    view_menu: QMenu
    recent_models: RecentModels
    backend_page: QDialog
    # Made by ui.window.docks.build.
    sampling_panel: SamplingPanel
    perf_panel: PerfPanel
    lora_panel: LoraPanel

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
        self.settings_store = SettingsStore(settings, dirs.settings_file, self._show_status)
        self.client = client
        self.dirs = dirs
        self.store = store or ConversationStore(dirs.root)
        self.store.budget_bytes = settings.snapshot_budget_mb * 1024 * 1024
        self.services = services
        self.model_manager: ModelManager | None = None
        # The one copy of the model in use: every view observes it.
        self.loaded_model = LoadedModel(self)
        self._layout_restored = False
        self.session_view = WindowView(self, self)
        self.session = self._make_session(settings.system_prompt)
        self.ctx = Context(
            client=client,
            settings=self.settings_store,
            dirs=dirs,
            session=self.session,
            model=self.loaded_model,
            parent=self,
            status=self._show_status,
            notice=self.session_view.notice,
            open_model=self.open_model,
        )
        self.loaded_model.changed.connect(self._on_model_changed)
        self.closer = WindowClose(self)  # put off while a reply stops, then shut down

        self._build_widgets()
        self._build_actions()
        self.onboarding = Onboarding(
            self.ctx,
            self.services,
            self.transcript,
            self.modelReady,
            partial(window_actions.add_to_menu, self),
            self.session_view.conversation_listeners.append,
            self.show_model_manager,
        )
        self.prompt_controls = PromptControls(
            self.ctx, self.chat, partial(window_actions.add_to_menu, self), self.modelReady
        )
        self.send_flow = send_flow.SendFlow(self)  # documents searched, then sent
        self.images = ImageAttach(self.ctx, self.chat, self.update_buttons)  # pictures
        self.embedder, self.documents_library = send_flow.make_documents(self.dirs.root)
        self.documents = DocumentAttach(self.ctx, self.chat, self.images, self.documents_library)
        self.draft_control = DraftControl(self.ctx, self.sampling_panel)
        self.thinking = ThinkingControls(self)  # the Think button, Stop thinking
        self.mcp = McpWindow(self.ctx, self.tools)  # its page, consent notes, status
        shown = (self.prompt_controls.on_conversation_shown, self.draft_control.on_conversation)
        self.session_view.conversation_listeners.extend(shown)
        self._connect_engine()
        wire_documents(self)  # its bar per chat, the viewer, API embeddings, embedder choice
        self.projects = wire_projects(self)  # <data>/projects, Chat → Projects…, the moves
        self.compaction = WindowCompaction(self, self)  # Chat → Compact chat…, Undo, policy
        self.refresh_sidebar()
        self.update_buttons()
        self.model_drop = ModelDrop(self.ctx, self._add_dropped_adapter, lambda: self.model_manager)
        app = QApplication.instance()
        assert isinstance(app, QApplication)
        self.theme = theme.theme_for(app, settings.theme)
        self.theme.set_choice(settings.theme)
        self.restyle = TranscriptRestyle(
            self, lambda: self.busy or self.closing, self._redraw_transcript, self.replyEnded
        )

    # -- construction ----------------------------------------------------------------

    def _make_session(self, system_prompt: str) -> ChatSession:
        """The window's chat, with the MCP host (made when first needed) for its tools."""
        self.tools = t = McpControl(self.dirs.root, self)
        return ChatSession(
            self.store,
            self.client,
            self.session_view,
            system_prompt,
            tool_host=t.proxy,
            approvals=t.approvals,
            post=t.post,
        )

    def _build_widgets(self) -> None:
        self.chat = ChatPane(self)
        self.transcript = self.chat.transcript
        self.chat_input = self.chat.chat_input
        self.send_button = self.chat.send_button
        self.stop_button = self.chat.stop_button
        self.edit_banner = self.chat.edit_banner
        self.transcript.actionRequested.connect(self._on_message_action)
        self.chat_input.submitted.connect(self.send)
        self.chat.textChanged.connect(self.update_buttons)  # typed, or a long paste held
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)

        self.sidebar = ConversationList(self)
        self.sidebar.openRequested.connect(self.open_conversation)
        self.sidebar.renameRequested.connect(self.rename_conversation)
        self.sidebar.forkRequested.connect(self.session.fork_saved)
        self.sidebar.deleteRequested.connect(partial(conversation_files.ask_delete, self.ctx))
        self.sidebar.exportRequested.connect(partial(conversation_files.ask_export, self.ctx))
        self.sidebar.newChatRequested.connect(self.new_chat)
        self.search_jump = SearchJump(
            self.ctx, self.sidebar, self.transcript, self.conversationOpened
        )
        splitter = QSplitter(self)
        splitter.setObjectName("mainSplitter")
        splitter.addWidget(self.sidebar)
        splitter.addWidget(self.chat)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([230, 950])  # the conversation gets the width (issue 27)
        self.setCentralWidget(splitter)

        self.presets = PresetStore(self.dirs.root / "presets.json")
        self.sampling_panel, self.perf_panel, self.lora_panel = docks.build(
            self, self.ctx, self.presets, self._on_sampling_changed, self._on_reload_requested
        )

        bar = self.statusBar()
        self.model_status = ModelStatus(self, bar, self.client.cancel_load)
        self.remote = RemoteControl(self.ctx, bar, self.begin_loading)
        self.api = ApiControl(self.client, bar, self)
        self.status_model = self.model_status.label
        self.status_backend = self.model_status.backend
        self.status_speed, self.status_lora = QLabel(self), QLabel(self)
        self.status_speed.setObjectName("statusSpeed")
        self.status_lora.setObjectName("statusLora")
        for w in (self.status_lora, self.status_speed, self.status_backend):
            bar.addPermanentWidget(w)

    def _build_actions(self) -> None:
        built = window_actions.build(
            self,
            self.ctx,
            window_actions.specs(self, self.settings.load.kv_type == "q8_0"),
            (self.sampling_panel, self.perf_panel, self.lora_panel),
            self.set_theme,
        )
        a = self.actions_by_name = built.actions  # every window action, by its spec's name
        self.new_chat_action = a["new_chat"]
        self.open_model_action = a["open_model"]
        self.regenerate_action = a["regenerate"]
        self.manager_action = a["manager"]
        self.manager_action.setEnabled(self.services is not None)
        self.compact_cache_action = a["compact_cache"]
        self.view_menu = built.menus["&View"]
        self.new_chat_button = built.new_chat_button
        self.recent_models = built.recent_models

    def show_backend_page(self) -> None:
        """Help -> Hardware and backends…."""
        self.backend_page = window_actions.show_backend_page(self.ctx)

    def setVisible(self, visible: bool) -> None:
        """The first show restores the saved layout, after every panel was made."""
        if visible and not self._layout_restored:
            self._layout_restored = True
            problems = window_state.restore(self, self.settings.window_layout)
            if problems:
                self.statusBar().showMessage(
                    "The saved window layout could not be used in full; the default is used.",
                    8000,
                )
            window_actions.share_shortcuts(self)
            accessibility.name_controls(self)
            self.model_drop.watch(self)
            self.documents.watch_drops()  # before the model drop's filter
            self.tools.start()  # reads mcp.json off the GUI thread, if there is one
        super().setVisible(visible)

    def _connect_engine(self) -> None:
        w = self.client.worker
        self.load_events = LoadEvents(self)  # loaded, failed, unloaded, notes, LoRA stacks
        self.reply_events = reply_events.ReplyEvents(self)  # prompt read, tokens, the end
        w.snapshotSaved.connect(self._on_snapshot_saved)
        w.snapshotFailed.connect(self._on_snapshot_failed)
        w.restored.connect(self._on_restored)

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

    @property
    def settings(self) -> AppSettings:
        return self.settings_store.value

    def _show_status(self, text: str, ms: int = 0) -> None:
        self.statusBar().showMessage(text, ms)

    def conversation_opened(self, result: RestoreResult) -> None:
        self.conversationOpened.emit(result)

    def update_buttons(self) -> None:
        ready = self.loaded_model.ready
        loading = self.loaded_model.loading
        message = self.chat.has_text() or bool(self.images.chips)
        searching = self.send_flow.searching  # documents searched before a send
        self.send_button.setEnabled(ready and not self.busy and message and not searching)
        self.stop_button.setEnabled(self.busy or searching)
        # While a reply streams too: the load waits for it (``when_idle``).
        self.open_model_action.setEnabled(not loading)
        self.regenerate_action.setEnabled(ready and self.session.can_regenerate())

    # -- engine events ---------------------------------------------------------------

    def _on_snapshot_failed(self, _conv_id: str, message: str) -> None:
        self.statusBar().showMessage(message, 10000)

    def _on_snapshot_saved(self, conv_id: str, _size: int, dropped: list[str]) -> None:
        self.session_view.snapshot_saved(conv_id, dropped)
        self.snapshotSaved.emit(conv_id)

    def _on_restored(self, result: RestoreResult) -> None:
        self.session_view.restored(result)

    # -- chat commands ---------------------------------------------------------------

    def send(self) -> None:
        self.send_flow.send()  # documents searched first, if the chat has any

    def send_dropping_older(self) -> None:
        """Answer the message left unanswered (or send the box's text) once, with older
        messages dropped to make room."""
        if self.busy or not self.loaded_model.ready:
            return
        once = replace(self.settings.sampling, overflow="truncate_middle")
        if self.session.answer_pending(once):
            return
        if self.chat.has_text() and self.session.send(self.chat.text(), once):
            self.chat.clear_text()

    def regenerate(self) -> None:
        """Replace the last reply with a new one (the prompt's KV cache is reused)."""
        if self.loaded_model.ready:
            self.session.regenerate(self.settings.sampling)

    def answer_pending(self) -> bool:
        """Reply to the conversation's last message if it has no reply (after a crash)."""
        if not self.loaded_model.ready:
            return False
        return self.session.answer_pending(self.settings.sampling)

    def edit_message(self, index: int) -> None:
        """Put user message ``index`` in the input box; sending replaces it and what follows."""
        text = self.session.begin_edit(index)
        if text is not None:
            self.chat.show_edit(index, text)

    def stop(self) -> None:
        if self.send_flow.stop():  # a document search: the typed text stays
            return
        if self.busy:
            self.session.stop()
            if self.session.busy:
                self.status_speed.setText("stopping…")
            else:  # ended at once: it was still listing the tools, the engine had nothing
                self.replyEnded.emit("cancelled")
        elif self.session.edit_index is not None:
            self.session.cancel_edit()
            self.chat.show_edit(None)
            self.chat.clear_text()

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
        conversation_files.export_conversation(self.ctx, conv, path, fmt)

    def export_metrics(self, path: Path) -> None:
        conversation_files.export_metrics(self.ctx, self.conversation, path)

    def _add_dropped_adapter(self, path: Path) -> bool:
        self.lora_panel.show()
        self.lora_panel.raise_()
        return self.lora_panel.add_adapter(path)

    def refresh_sidebar(self) -> None:
        rows = self.store.list()
        self.sidebar.set_conversations(
            rows,
            self.conversation.id,
            sum(r.snapshot_bytes for r in rows),
            self.store.budget_bytes,
        )

    # -- model -----------------------------------------------------------------------

    def start_engine(self, model: str | Path | None) -> None:
        """At start: reconnect to the server in use at the last quit, else load ``model``;
        then the local API server, if it is switched on."""
        if not self.remote.start():
            self.load_model(model)
        if self.settings.api.enabled:
            problem = self.api.start(self.settings.api)
            if problem:
                self.session_view.notice(f"The local API server did not start: {problem}")

    def set_api_settings(self, api: ApiSettings) -> None:
        """The API server's settings, as the dialog applied them."""
        self.settings_store.update(api=api)

    def load_model(self, path: str | Path | None) -> None:
        """Load ``path``, or the embedded default model when None."""
        self.begin_loading("Loading model…")
        # The embedded default is assembled on the engine thread; it has no projector.
        config = self.settings.load if path is None else load_config(self.ctx, Path(path))
        self.client.load(DEFAULT_MODEL if path is None else path, config)

    def open_model(self, path: str | Path | None) -> None:
        """Load ``path`` (None: the embedded default) once the reply in progress is settled."""
        self.session.when_idle(partial(self.load_model, path))

    def begin_loading(self, what: str) -> None:
        """A load or connect is under way: the model may change when it ends."""
        self.loaded_model.set_loading(True)
        self.model_status.loading(what)
        self.update_buttons()

    def reload_model(self) -> None:
        """Load the current model again with the current settings, once the reply is settled."""
        model = self.loaded_model.info
        if model is not None and model.server:
            conn = self.remote.current
            if conn is not None:
                self.session.when_idle(lambda: self.remote.connect_to(conn))
        elif model is not None:
            self.open_model(model.path)

    def unload_model(self) -> None:
        """Free the model once the reply is settled; ``_on_unloaded`` says when it is gone
        (the model manager deletes a file only then)."""
        self.session.when_idle(self.client.unload)

    def show_model_manager(self) -> ModelManager | None:
        if self.services is None:
            return None
        if self.model_manager is None:
            self.model_manager = window_actions.make_model_manager(
                self.ctx, self.services, self.unload_model, self.lora_panel.set_library_adapters
            )
        self.model_manager.show()
        self.model_manager.raise_()
        return self.model_manager

    def _on_sampling_changed(self, params: SamplingParams) -> None:
        self.settings_store.update(sampling=params)

    def _on_reload_requested(self, load: LoadConfig) -> None:
        self.settings_store.update(load=load)
        self.reload_model()

    def toggle_compact_cache(self) -> None:
        """Model -> Compact KV cache was switched: reload with the other cache type."""
        kv_type = "q8_0" if self.compact_cache_action.isChecked() else "f16"
        self.settings_store.update(load=replace(self.settings.load, kv_type=kv_type))
        self.reload_model()

    def _on_model_changed(self, info: ModelInfo | None) -> None:
        self.session.model = info  # the session's copy is fed from here only
        if info is not None and not self.loaded_model.loading:
            self.model_status.loaded(info)
        self.update_buttons()

    def set_theme(self, choice: str) -> None:
        """View -> Appearance: ``system``, ``light`` or ``dark``."""
        self.settings_store.update(theme=choice)
        self.theme.set_choice(choice)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "restyle"):
            self.restyle.palette_changed()

    def _redraw_transcript(self) -> None:
        if self.conversation.messages:
            self.transcript.show_messages(self.conversation.messages)
        else:
            self.transcript.clear_conversation()

    # -- shutdown ------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """A close was asked for (it may wait for the reply to stop)."""
        return self.closer.closing

    @property
    def closed(self) -> bool:
        """Closed for good: settings saved, engine joined."""
        return self.closer.closed

    def layout_to_save(self) -> dict[str, str] | None:
        """The window's layout, once it was shown (else nothing worth keeping)."""
        return window_state.capture(self) if self._layout_restored else None

    def closeEvent(self, event: QCloseEvent) -> None:
        """Close once the reply in progress is stopped, recorded and saved (``WindowClose``)."""
        if self.closer.close_event(event):
            super().closeEvent(event)
