"""A project's model, preset, adapters and tools (issue 44) on the fake engine: the
Projects dialog stores them at once; a chat of the project shown asks to load its model
(Yes loads it, No leaves the one in use), takes its preset when new (an opened chat's
own settings win), takes its adapters hot (or a notice names a missing file); what the
user changes in the chat is never written back to the project."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.projects import Project
from app.config.params import validate_sampling
from app.config.presets import BUILTIN
from app.gguf.lora import LoraStack
from app.mcp.tool_host import McpTool, ServerStatus
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory, send
from tests.gui.test_gui_projects import second_yes
from ui.chat.project_dialog import ProjectsDialog
from ui.window.main_window import MainWindow
from ui.window.project_settings import file_model


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> Iterator[MainWindow]:
    yield make_window(fake)


def project(win: MainWindow, **fields: Any) -> Project:
    made = Project(name="Work", **fields)
    win.projects.store.save(made)
    win.projects.refresh()
    return win.projects.store.load(made.id)


def open_dialog(win: MainWindow, select: str) -> ProjectsDialog:
    win.projects.dialog_action.trigger()
    dlg = win.projects.dialog
    assert dlg is not None and dlg.isVisible() and dlg.settings is not None
    dlg.reload(select)
    return dlg


def adapter(tmp_path: Path, name: str = "style.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(b"not really an adapter")
    return path


def new_chat_in(qtbot: QtBot, win: MainWindow, project_id: str) -> None:
    win.projects.new_chat(project_id)
    qtbot.waitUntil(lambda: win.conversation.project_id == project_id, timeout=5000)


def test_the_dialog_stores_model_preset_adapters_and_tools(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = project(window)
    stack = LoraStack()
    stack.push(adapter(tmp_path), 0.5)
    monkeypatch.setattr(window.lora_panel, "stack", lambda: stack.copy())
    tool = McpTool("files", "search", "files__search", "Finds files", {"type": "object"})
    status = ServerStatus("files", "stdio", "files-server", True, "ready", tools=(tool,))
    monkeypatch.setattr(window.tools.proxy, "statuses", lambda: [status])
    dlg = open_dialog(window, made.id)
    box = dlg.settings
    assert box is not None
    in_use = next(
        i for i in range(box.model_box.count()) if "(in use now)" in box.model_box.itemText(i)
    )
    box.model_box.activated.emit(in_use)
    box.preset_box.activated.emit(box.preset_box.findData("Precise"))
    box.use_adapters.click()
    item = box.tools.item(0)
    assert item.text() == "files__search"
    item.setCheckState(Qt.CheckState.Checked)
    saved = window.projects.store.load(made.id)
    assert saved.model == file_model(tmp_path / "model.gguf", "model.gguf")
    assert saved.preset == "Precise"
    assert [(e["name"], e["scale"]) for e in saved.lora] == [("style.gguf", 0.5)]
    assert saved.mcp_tools == ["files__search"]
    assert saved.tool_specs == [
        {"name": "files__search", "description": "Finds files", "parameters": {"type": "object"}}
    ]
    box.no_adapters.click()
    item.setCheckState(Qt.CheckState.Unchecked)
    box.preset_box.activated.emit(0)
    saved = window.projects.store.load(made.id)
    assert (saved.lora, saved.mcp_tools, saved.tool_specs, saved.preset) == ([], [], [], "")
    dlg.reload(made.id)  # shown again as saved
    assert box.model_box.currentIndex() == in_use and box.preset_box.currentIndex() == 0


@pytest.mark.parametrize("reply", [QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No])
def test_a_project_chat_offers_its_model(
    qtbot: QtBot,
    window: MainWindow,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reply: QMessageBox.StandardButton,
) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another fake model")
    made = project(window, model=file_model(other) or {})
    asked = second_yes(monkeypatch, reply)
    new_chat_in(qtbot, window, made.id)
    qtbot.waitUntil(lambda: bool(asked), timeout=5000)
    assert asked == ["Load other.gguf for this project? The model reloads."]
    info = window.loaded_model.info
    if reply == QMessageBox.StandardButton.Yes:
        qtbot.waitUntil(
            lambda: (
                window.loaded_model.ready
                and window.loaded_model.info is not None
                and Path(window.loaded_model.info.path) == other
            ),
            timeout=5000,
        )
    else:
        qtbot.wait(50)
        assert window.loaded_model.info is info and not window.loaded_model.loading
    window.projects.new_chat(made.id)  # asked again for another chat only if it differs
    qtbot.wait(50)
    assert len(asked) == (1 if reply == QMessageBox.StandardButton.Yes else 2)


def test_a_chat_shown_while_a_model_loads_offers_its_model_after_the_load(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start-up the last chat is shown while the last model loads: the project's
    model is offered once that load ends, not during it (nor never)."""
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another fake model")
    made = project(window, model=file_model(other) or {})
    asked = second_yes(monkeypatch, QMessageBox.StandardButton.No)
    window.loaded_model.set_loading(True)
    new_chat_in(qtbot, window, made.id)
    qtbot.wait(50)
    assert asked == []
    window.loaded_model.set_loading(False)
    qtbot.waitUntil(lambda: bool(asked), timeout=5000)
    assert asked == ["Load other.gguf for this project? The model reloads."]
    window.loaded_model.set_loading(True)  # a later load: nothing is waiting for it
    window.loaded_model.set_loading(False)
    qtbot.wait(50)
    assert len(asked) == 1


def test_the_preset_goes_to_a_new_chat_not_to_an_opened_one(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = second_yes(monkeypatch, QMessageBox.StandardButton.No)
    made = project(window)
    new_chat_in(qtbot, window, made.id)
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "hello")
    conv_id = window.conversation.id
    own = window.settings.sampling
    assert own != BUILTIN["Creative"]
    made.preset = "Creative"
    window.projects.store.save(made)

    new_chat_in(qtbot, window, made.id)
    assert window.conversation.id != conv_id
    assert window.settings.sampling == BUILTIN["Creative"]
    assert window.sampling_panel.params() == BUILTIN["Creative"]
    assert window.sampling_panel.presets_bar.preset == "Creative"

    window.session.open(conv_id)
    qtbot.waitUntil(lambda: window.conversation.id == conv_id, timeout=5000)
    saved = window.conversation.sampling
    assert saved is not None and window.settings.sampling == validate_sampling(saved) == own
    assert asked == []  # no model named: nothing asked


def test_adapters_are_applied_hot_and_changes_stay_in_the_chat(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = LoraStack()
    stack.push(adapter(tmp_path), 0.75)
    made = project(window, lora=stack.signature(), preset="Precise")
    applied: list[LoraStack] = []
    monkeypatch.setattr(window.client, "set_lora_stack", applied.append)
    new_chat_in(qtbot, window, made.id)
    assert applied == [stack] and window.lora_panel.stack() == stack
    before = window.projects.store.load(made.id)
    window.sampling_panel.select_preset("Creative")  # the user changes the chat's settings
    window.lora_panel.set_stack(LoraStack())
    assert window.projects.store.load(made.id) == before  # nothing written back


def test_an_adapter_file_gone_gives_a_notice(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = LoraStack()
    path = adapter(tmp_path, "gone.gguf")
    stack.push(path)
    made = project(window, lora=stack.signature())
    path.unlink()
    applied: list[LoraStack] = []
    monkeypatch.setattr(window.client, "set_lora_stack", applied.append)
    new_chat_in(qtbot, window, made.id)
    assert applied == []
    assert window.statusBar().currentMessage() == (
        f"The adapters of Work were not applied: {path} is missing."
    )
