"""The main window's actions, menus and toolbar (declared as data), and the dialogs they open.

The window's actions are ``ActionSpec`` rows (``specs``); ``MENUS`` and ``TOOLBAR`` say
where each goes, by name; ``build`` makes them. The window is seen through ``ActionHost``,
what the actions call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QMainWindow,
    QMenu,
    QSplitter,
    QToolBar,
    QWidget,
)

from app.chat.conversation import Conversation
from app.config.setting_records import ApiSettings
from app.engine.native.hardware import detect_hardware
from app.models.library import LibraryEntry
from ui.api.api_status import ApiControl
from ui.chat import conversation_files
from ui.chat.conversation_list import ConversationList
from ui.common.context import Context
from ui.models import projector_choice
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager
from ui.models.model_status import memory_text
from ui.models.recent_models import RecentModels
from ui.perf.backend_page import BackendPage, system_info
from ui.remote.remote_control import RemoteControl
from ui.tools.mcp_window import McpWindow
from ui.window.session_view import WindowView

if TYPE_CHECKING:
    from ui.api.api_dialog import ApiDialog

Shortcut = QKeySequence | QKeySequence.StandardKey | str | None

RECENT = "recent_models"  # where Model -> Recent models goes in ``MENUS``
DOCK_KEYS = ("Ctrl+Shift+S", "Ctrl+Shift+P", "Ctrl+Shift+L")  # sampling, charts, LoRA

# Menu title -> action names in order (None: a separator).
MENUS: dict[str, list[str | None]] = {
    "&File": ["new_chat", "open_model", None, "import", "export_json", "export_md", None, "quit"],
    "&Chat": ["regenerate", "find", None, "allow_tool", "deny_tool", "edit_tool"],
    "&View": [],  # the panels' toggles and Appearance (``build``)
    "&Model": ["manager", "open_model", RECENT, "connect", "api", "compact_cache"],
    "&Tools": ["mcp"],
    "&Help": ["backend_page"],
}
TOOLBAR = ["new_chat", "manager", "open_model", "regenerate"]


class ApiHost(Protocol):
    """What the API dialog needs of the window."""

    @property
    def ctx(self) -> Context: ...
    @property
    def api(self) -> ApiControl: ...
    def set_api_settings(self, api: ApiSettings) -> None: ...


class ActionHost(ApiHost, Protocol):
    """What the window's actions call."""

    @property
    def chat_input(self) -> QWidget: ...
    @property
    def sidebar(self) -> ConversationList: ...
    @property
    def conversation(self) -> Conversation: ...
    @property
    def remote(self) -> RemoteControl: ...
    def new_chat(self) -> None: ...
    def regenerate(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> bool: ...
    def show_model_manager(self) -> object: ...
    def show_backend_page(self) -> None: ...
    def toggle_compact_cache(self) -> None: ...
    @property
    def mcp(self) -> McpWindow: ...
    @property
    def session_view(self) -> WindowView: ...
    def activateWindow(self) -> None: ...
    def raise_(self) -> None: ...


@dataclass(frozen=True)
class ActionSpec:
    """One window action: ``name`` places it (``MENUS``, ``TOOLBAR``) and names it."""

    name: str
    text: str
    slot: Callable[[], object]
    keys: Shortcut = None
    tip: str = ""
    checkable: bool = False
    checked: bool = False


@dataclass
class Built:
    """What ``build`` made: actions by name, menus by title, the New chat button."""

    actions: dict[str, QAction]
    menus: dict[str, QMenu]
    new_chat_button: QWidget
    recent_models: RecentModels


def specs(host: ActionHost, compact_cache: bool) -> list[ActionSpec]:
    """The window's actions (``compact_cache``: the KV cache is q8_0 now)."""
    ctx, files = host.ctx, conversation_files
    key = QKeySequence.StandardKey
    return [
        ActionSpec("new_chat", "New chat", host.new_chat, key.New, "Start a new conversation"),
        ActionSpec(
            "open_model",
            "Open model…",
            partial(ask_open_model, ctx),
            key.Open,
            "Load a GGUF model file (Ctrl+O)",
        ),
        ActionSpec(
            "regenerate",
            "Regenerate last reply",
            host.regenerate,
            "Ctrl+R",
            "Ask for another reply (Ctrl+R)",
        ),
        ActionSpec("import", "Import conversation…", partial(files.ask_import, ctx)),
        ActionSpec(
            "export_json",
            "Export conversation as JSON…",
            lambda: files.ask_export(ctx, host.conversation.id, "json"),
        ),
        ActionSpec(
            "export_md",
            "Export conversation as Markdown…",
            lambda: files.ask_export(ctx, host.conversation.id, "markdown"),
        ),
        # Not StandardKey.Quit: it has no keys on Windows and some Linux desktops.
        ActionSpec("quit", "Quit", host.close, "Ctrl+Q"),
        ActionSpec("stop", "Stop", host.stop, QKeySequence(Qt.Key.Key_Escape)),
        ActionSpec("focus_input", "Focus input", partial(focus_input, host), "Ctrl+L"),
        ActionSpec(
            "find",
            "Search conversations",
            partial(focus_search, host),
            "Ctrl+F",
            "Search the titles and messages of every chat (Ctrl+F)",
        ),
        ActionSpec(
            "manager",
            "Model manager…",
            host.show_model_manager,
            "Ctrl+M",
            "Find, download and manage models (Ctrl+M)",
        ),
        ActionSpec(
            "compact_cache",
            "Compact KV cache (q8_0, half-size snapshots)",
            host.toggle_compact_cache,
            checkable=True,
            checked=compact_cache,
        ),
        ActionSpec(
            "connect",
            "Connect to a server…",
            host.remote.show_dialog,
            "Ctrl+Shift+K",
            "Chat with a model on llama-server, vLLM, Ollama or another OpenAI-compatible "
            "server (Ctrl+Shift+K)",
        ),
        ActionSpec(
            "api",
            "Local API server…",
            partial(show_api_dialog, host),
            tip="Let other programs use the loaded model through an OpenAI-compatible API",
        ),
        ActionSpec("backend_page", "Hardware and backends…", host.show_backend_page),
        *_tool_specs(host),
    ]


def _tool_specs(host: ActionHost) -> list[ActionSpec]:
    """The tool calls' actions: answer the call waiting for approval; the MCP page."""
    return [
        ActionSpec(
            "allow_tool",
            "Allow tool call",
            lambda: host.session_view.decide_waiting("once"),
            "Ctrl+Shift+A",
            "Run the tool call waiting for approval, once",
        ),
        ActionSpec(
            "deny_tool",
            "Deny tool call",
            lambda: host.session_view.decide_waiting("deny"),
            "Ctrl+Shift+D",
            "Refuse the tool call waiting for approval (the model reads an error)",
        ),
        ActionSpec(
            "edit_tool",
            "Edit tool call arguments…",
            lambda: host.session_view.decide_waiting("edit"),
        ),
        ActionSpec(
            "mcp",
            "Tools (MCP servers)…",
            lambda: host.mcp.show_page(),  # made after the actions
            tip="The tool servers the model may call, their tools, and what they cost",
        ),
    ]


def _action(host: QMainWindow, spec: ActionSpec) -> QAction:
    action = QAction(spec.text, host)
    if spec.keys is not None:
        action.setShortcut(QKeySequence(spec.keys))
        # Window-wide: the shortcut works wherever focus is (the message box included).
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    if spec.tip:
        action.setToolTip(spec.tip)
    if spec.checkable:
        action.setCheckable(True)
        action.setChecked(spec.checked)
    action.triggered.connect(spec.slot)
    host.addAction(action)
    return action


def build(
    host: QMainWindow,
    ctx: Context,
    specs: Sequence[ActionSpec],
    docks: Sequence[QDockWidget],
    set_theme: Callable[[str], None],
) -> Built:
    """Make the window's actions, menus and toolbar; ``docks`` get View menu toggles."""
    actions = {spec.name: _action(host, spec) for spec in specs}
    menus: dict[str, QMenu] = {}
    recent: RecentModels | None = None
    for title, names in MENUS.items():
        menu = menus[title] = host.menuBar().addMenu(title)
        for name in names:
            if name is None:
                menu.addSeparator()
            elif name == RECENT:
                recent = RecentModels(ctx, menu)
            else:
                menu.addAction(actions[name])
    view = menus["&View"]
    for dock, keys in zip(docks, DOCK_KEYS, strict=True):
        toggle = dock.toggleViewAction()
        toggle.setShortcut(QKeySequence(keys))
        toggle.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        host.addAction(toggle)  # works with the menu bar hidden, or in a floating dock
        view.addAction(toggle)
    view.addSeparator()
    _appearance_menu(view.addMenu("Appearance"), ctx.settings.value.theme, set_theme)

    toolbar = QToolBar("Main", host)
    toolbar.setObjectName("mainToolbar")
    toolbar.setMovable(False)
    host.addToolBar(toolbar)
    for name in TOOLBAR:
        toolbar.addAction(actions[name])
    button = toolbar.widgetForAction(actions["new_chat"])
    button.setObjectName("newChatButton")
    assert recent is not None
    return Built(actions, menus, button, recent)


def add_to_menu(host: QMainWindow, title: str, action: QAction) -> None:
    """Put ``action`` in the menu ``title`` (made if the window has none yet)."""
    for a in host.menuBar().actions():
        menu = a.menu()
        if a.text() == title and isinstance(menu, QMenu):
            menu.addAction(action)
            return
    host.menuBar().addMenu(title).addAction(action)


def focus_input(host: ActionHost) -> None:
    """Ctrl+L: the message box, from anywhere (a floating panel too)."""
    host.activateWindow()
    host.raise_()
    host.chat_input.setFocus(Qt.FocusReason.ShortcutFocusReason)


def focus_search(host: ActionHost) -> None:
    """Ctrl+F: the sidebar's search box, from anywhere; a sidebar dragged shut opens."""
    host.activateWindow()
    host.raise_()
    sidebar = host.sidebar
    splitter = sidebar.parentWidget()
    if isinstance(splitter, QSplitter):
        sizes, at = splitter.sizes(), splitter.indexOf(sidebar)
        if 0 <= at < len(sizes) and sizes[at] == 0:
            wanted = max(sidebar.minimumSizeHint().width(), 230)
            sizes = [max(0, n - wanted) if i != at else wanted for i, n in enumerate(sizes)]
            splitter.setSizes(sizes)
    sidebar.show()
    sidebar.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
    sidebar.search.selectAll()


def share_shortcuts(host: QMainWindow) -> None:
    """Make the window's shortcuts work in its floating panels: an action's window-wide
    shortcut reaches only the windows it was added to. Docked, a panel is part of the
    window and nothing changes."""
    keyed = [a for a in host.actions() if not a.shortcut().isEmpty()]
    for dock in host.findChildren(QDockWidget):
        have = set(dock.actions())
        dock.addActions([a for a in keyed if a not in have])


def _appearance_menu(menu: QMenu, current: str, set_theme: Callable[[str], None]) -> None:
    """View -> Appearance: follow the system's light/dark scheme, or force one."""
    menu.setObjectName("appearanceMenu")
    group = QActionGroup(menu)
    for choice, text in (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark")):
        action = menu.addAction(text)
        action.setObjectName(f"theme_{choice}")
        action.setCheckable(True)
        action.setChecked(current == choice)
        action.triggered.connect(partial(set_theme, choice))
        group.addAction(action)


# -- the dialogs ---------------------------------------------------------------------


def ask_open_model(ctx: Context) -> None:
    settings = ctx.settings.value
    start = str(Path(settings.model_path).parent) if settings.model_path else str(ctx.dirs.models)
    path, _ = QFileDialog.getOpenFileName(
        ctx.parent, "Open a GGUF model", start, "GGUF models (*.gguf);;All files (*)"
    )
    if path:
        ctx.open_model(path)


def show_api_dialog(host: ApiHost) -> ApiDialog:
    """Model -> Local API server…: one dialog per window, kept until quit."""
    from ui.api.api_dialog import ApiDialog  # on first use: it brings the API server in

    ctx = host.ctx
    dialog = ctx.parent.findChild(ApiDialog, "apiDialog")
    if dialog is None:
        dialog = ApiDialog(host.api, ctx.settings.value.api, host.set_api_settings, ctx.parent)
    else:
        dialog.refresh(ctx.settings.value.api)
    dialog.show()
    dialog.raise_()
    return dialog


def show_backend_page(ctx: Context) -> BackendPage:
    from app.engine.native.guard import store_file
    from app.engine.native.libs import machine_key
    from app.engine.native.paths import PathVerdicts

    verdicts = PathVerdicts(store_file(ctx.dirs.root), machine_key())
    memory = memory_text(ctx.model.info)
    page = BackendPage(detect_hardware(), system_info(), ctx.parent, verdicts, memory=memory)
    page.show()
    return page


def make_model_manager(
    ctx: Context,
    services: HubServices,
    unload: Callable[[], None],
    adapters_found: Callable[[list[Path]], None],
) -> ModelManager:
    """The model manager, wired: ``unload`` frees the model before its file is deleted;
    ``adapters_found`` gets the library's LoRA adapters each time it is read."""
    m = ModelManager(services, ctx.model, ctx.settings.value.load.n_ctx, ctx.parent)
    m.imported = [Path(p) for p in ctx.settings.value.imported_models]
    m.loadRequested.connect(ctx.open_model)
    m.defaultRequested.connect(partial(_set_default_model, ctx))
    m.unloadRequested.connect(unload)
    m.projectorRequested.connect(partial(projector_choice.ask, ctx, m))

    def on_library_changed(entries: list[LibraryEntry]) -> None:
        adapters_found([e.path for e in entries if e.valid and e.is_adapter])
        ctx.settings.update(imported_models=[str(p) for p in m.imported])

    m.libraryChanged.connect(on_library_changed)
    m.refresh_library()
    return m


def _set_default_model(ctx: Context, path: str) -> None:
    ctx.settings.update(model_path=path)
    ctx.status(f"{Path(path).name} opens at start.", 5000)
