"""The main window's actions, menus and toolbar, and the dialogs they open."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QDockWidget, QFileDialog, QMenu, QToolBar

from app.engine.hardware import detect_hardware
from app.models.library import LibraryEntry
from ui.chat import conversation_files
from ui.models import recent_models
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager
from ui.perf.backend_page import BackendPage, system_info

if TYPE_CHECKING:
    from ui.api.api_dialog import ApiDialog
    from ui.window.main_window import MainWindow

Shortcut = QKeySequence | QKeySequence.StandardKey | str | None


def _action(
    win: MainWindow, text: str, slot: Callable[[], object], keys: Shortcut = None, tip: str = ""
) -> QAction:
    action = QAction(text, win)
    if keys is not None:
        action.setShortcut(QKeySequence(keys))
        # Window-wide: the shortcut works wherever focus is (the message box included).
        action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    if tip:
        action.setToolTip(tip)
    action.triggered.connect(slot)
    win.addAction(action)
    return action


def build(win: MainWindow) -> None:
    """Create the window's actions (as attributes of ``win``), menus and toolbar."""
    new = QKeySequence.StandardKey.New
    win.new_chat_action = _action(win, "New chat", win.new_chat, new, "Start a new conversation")
    win.open_model_action = _action(
        win,
        "Open model…",
        lambda: ask_open_model(win),
        QKeySequence.StandardKey.Open,
        "Load a GGUF model file (Ctrl+O)",
    )
    win.regenerate_action = _action(
        win, "Regenerate last reply", win.regenerate, "Ctrl+R", "Ask for another reply (Ctrl+R)"
    )
    import_action = _action(win, "Import conversation…", lambda: conversation_files.ask_import(win))
    export_json = _action(
        win,
        "Export conversation as JSON…",
        lambda: conversation_files.ask_export(win, win.conversation.id, "json"),
    )
    export_md = _action(
        win,
        "Export conversation as Markdown…",
        lambda: conversation_files.ask_export(win, win.conversation.id, "markdown"),
    )
    # Not StandardKey.Quit: it has no keys on Windows and some Linux desktops.
    quit_action = _action(win, "Quit", win.close, "Ctrl+Q")
    _action(win, "Stop", win.stop, QKeySequence(Qt.Key.Key_Escape))
    _action(win, "Focus input", lambda: focus_input(win), "Ctrl+L")
    win.manager_action = _action(
        win,
        "Model manager…",
        win.show_model_manager,
        "Ctrl+M",
        "Find, download and manage models (Ctrl+M)",
    )
    win.manager_action.setEnabled(win._services is not None)
    win.compact_cache_action = _action(
        win, "Compact KV cache (q8_0, half-size snapshots)", win._on_compact_cache_toggled
    )
    win.compact_cache_action.setCheckable(True)
    win.compact_cache_action.setChecked(win._settings.load.kv_type == "q8_0")

    menu = win.menuBar()
    file_menu = menu.addMenu("&File")
    for a in (win.new_chat_action, win.open_model_action, None, import_action, export_json):
        file_menu.addSeparator() if a is None else file_menu.addAction(a)
    file_menu.addAction(export_md)
    file_menu.addSeparator()
    file_menu.addAction(quit_action)
    win.chat_menu = menu.addMenu("&Chat")
    win.chat_menu.addAction(win.regenerate_action)
    win.view_menu = menu.addMenu("&View")
    for dock, keys in (
        (win.sampling_panel, "Ctrl+Shift+S"),
        (win.perf_panel, "Ctrl+Shift+P"),
        (win.lora_panel, "Ctrl+Shift+L"),
    ):
        toggle = dock.toggleViewAction()
        toggle.setShortcut(QKeySequence(keys))
        toggle.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        win.addAction(toggle)  # works with the menu bar hidden, or in a floating dock
        win.view_menu.addAction(toggle)
    win.view_menu.addSeparator()
    _appearance_menu(win, win.view_menu.addMenu("Appearance"))
    win.connect_action = _action(
        win,
        "Connect to a server…",
        win.remote.show_dialog,
        "Ctrl+Shift+K",
        "Chat with a model on llama-server, vLLM, Ollama or another OpenAI-compatible "
        "server (Ctrl+Shift+K)",
    )
    win.api_action = _action(
        win,
        "Local API server…",
        lambda: show_api_dialog(win),
        tip="Let other programs use the loaded model through an OpenAI-compatible API",
    )
    model_menu = win.model_menu = menu.addMenu("&Model")
    for a in (win.manager_action, win.open_model_action):
        model_menu.addAction(a)
    win.recent_models = recent_models.install(win, model_menu)
    for a in (win.connect_action, win.api_action, win.compact_cache_action):
        model_menu.addAction(a)
    menu.addMenu("&Help").addAction(
        _action(win, "Hardware and backends…", lambda: show_backend_page(win))
    )

    toolbar = QToolBar("Main", win)
    toolbar.setObjectName("mainToolbar")
    toolbar.setMovable(False)
    win.addToolBar(toolbar)
    toolbar.addAction(win.new_chat_action)
    win.new_chat_button = toolbar.widgetForAction(win.new_chat_action)
    win.new_chat_button.setObjectName("newChatButton")
    for a in (win.manager_action, win.open_model_action, win.regenerate_action):
        toolbar.addAction(a)


def focus_input(win: MainWindow) -> None:
    """Ctrl+L: the message box, from anywhere (a floating panel too)."""
    win.activateWindow()
    win.raise_()
    win.chat_input.setFocus(Qt.FocusReason.ShortcutFocusReason)


def share_shortcuts(win: MainWindow) -> None:
    """Make the window's shortcuts work in its floating panels: an action's window-wide
    shortcut reaches only the windows it was added to. Docked, a panel is part of the
    window and nothing changes."""
    keyed = [a for a in win.actions() if not a.shortcut().isEmpty()]
    for dock in win.findChildren(QDockWidget):
        have = set(dock.actions())
        dock.addActions([a for a in keyed if a not in have])


def _appearance_menu(win: MainWindow, menu: QMenu) -> None:
    """View -> Appearance: follow the system's light/dark scheme, or force one."""
    menu.setObjectName("appearanceMenu")
    group = QActionGroup(menu)
    for choice, text in (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark")):
        action = menu.addAction(text)
        action.setObjectName(f"theme_{choice}")
        action.setCheckable(True)
        action.setChecked(win._settings.theme == choice)
        action.triggered.connect(partial(win.set_theme, choice))
        group.addAction(action)


def ask_open_model(win: MainWindow) -> None:
    settings = win._settings
    start = str(Path(settings.model_path).parent) if settings.model_path else str(win._dirs.models)
    path, _ = QFileDialog.getOpenFileName(
        win, "Open a GGUF model", start, "GGUF models (*.gguf);;All files (*)"
    )
    if path:
        win.session.when_idle(lambda: win.load_model(path))


def show_api_dialog(win: MainWindow) -> ApiDialog:
    """Model -> Local API server…: one dialog per window, kept until quit."""
    from ui.api.api_dialog import ApiDialog

    dialog = win.findChild(ApiDialog, "apiDialog")
    if dialog is None:
        dialog = ApiDialog(win.api, win._settings.api, win.set_api_settings, win)
    else:
        dialog.refresh(win._settings.api)
    dialog.show()
    dialog.raise_()
    return dialog


def show_backend_page(win: MainWindow) -> None:
    from app.engine.native_guard import store_file
    from app.engine.native_libs import machine_key
    from app.engine.native_paths import PathVerdicts

    verdicts = PathVerdicts(store_file(win._dirs.root), machine_key())
    page = BackendPage(detect_hardware(), system_info(), win, verdicts)
    page.show()
    win.backend_page = page


def show_model_manager(win: MainWindow, services: HubServices) -> None:
    if win.model_manager is None:
        model = win.session.model
        m = ModelManager(
            services, str(model.path) if model else None, win._settings.load.n_ctx, win
        )
        m.imported = [Path(p) for p in win._settings.imported_models]
        m.loadRequested.connect(lambda path: win.session.when_idle(lambda: win.load_model(path)))
        m.defaultRequested.connect(lambda path: _set_default_model(win, path))
        m.unloadRequested.connect(win.unload_model)
        m.libraryChanged.connect(lambda entries: _on_library_changed(win, entries))
        win.model_manager = m
        m.refresh_library()
    win.model_manager.show()
    win.model_manager.raise_()


def _set_default_model(win: MainWindow, path: str) -> None:
    win._settings.model_path = path
    win._save_settings()
    win.statusBar().showMessage(f"{Path(path).name} opens at start.", 5000)


def _on_library_changed(win: MainWindow, entries: list[LibraryEntry]) -> None:
    win.lora_panel.set_library_adapters([e.path for e in entries if e.valid and e.is_adapter])
    if win.model_manager is not None:
        imported = [str(p) for p in win.model_manager.imported]
        if imported != win._settings.imported_models:
            win._settings.imported_models = imported
            win._save_settings()
