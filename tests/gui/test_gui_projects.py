"""Projects in the window (issue 44, first slice) on the fake engine: the dialog makes,
renames and edits a project (instructions, a pinned document read whole), Chat → New
chat in project starts from its system text, the open chat moves in and out, and a
project is deleted keeping its chats or, after a second yes only, with them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.conversation import new_id
from app.chat.project_chat import system_text
from app.chat.project_pins import read_pinned_file
from app.chat.projects import Project, ProjectError
from app.documents.sources import Source
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory, send
from ui.chat.project_dialog import ProjectsDialog
from ui.window.main_window import MainWindow
from ui.window.project_wiring import NO_PROJECTS


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> Iterator[MainWindow]:
    yield make_window(fake)


def chat(qtbot: QtBot, win: MainWindow, text: str) -> str:
    """Send ``text`` in the open chat and wait for the reply; the chat's id."""
    with qtbot.waitSignal(win.replyEnded, timeout=5000):
        send(qtbot, win, text)
    return win.conversation.id


def project(win: MainWindow, name: str, instructions: str = "", pinned: str = "") -> Project:
    """A saved project (``pinned``: the text of one pinned document), listed in the menus."""
    entries = []
    if pinned:
        doc = Source(1, "/docs/notes.md", "notes.md", pinned, None, 1, 1, -1, True)
        entries.append({**doc.to_dict(), "stamp": [], "sha256": ""})
    made = Project(name=name, instructions=instructions, pinned=entries)
    win.projects.store.save(made)
    win.projects.refresh()
    return win.projects.store.load(made.id)


def menu_action(menu: Any, text: str) -> Any:
    found = [a for a in menu.actions() if a.text() == text]
    assert found, f"{text!r} not in {[a.text() for a in menu.actions()]}"
    return found[0]


def answers(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """QInputDialog.getText answers ``names`` in turn ("" is Cancel)."""
    left = list(names)

    def get_text(*_a: Any, **_k: Any) -> tuple[str, bool]:
        name = left.pop(0)
        return (name, bool(name))

    monkeypatch.setattr(QInputDialog, "getText", get_text)


def click_in_box(monkeypatch: pytest.MonkeyPatch, starts: str, seen: list[str]) -> None:
    """Every QMessageBox.exec clicks the button whose text starts with ``starts``."""

    def exec_(box: QMessageBox) -> int:
        seen.append(box.text())
        buttons = [b for b in box.buttons() if b.text().startswith(starts)]
        assert len(buttons) == 1, [b.text() for b in box.buttons()]
        buttons[0].click()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", exec_)


def second_yes(monkeypatch: pytest.MonkeyPatch, reply: QMessageBox.StandardButton) -> list[str]:
    """QMessageBox.question answers ``reply``; the questions asked are returned."""
    asked: list[str] = []

    def question(_parent: Any, _title: str, text: str, *_a: Any) -> QMessageBox.StandardButton:
        asked.append(text)
        return reply

    monkeypatch.setattr(QMessageBox, "question", question)
    return asked


def open_dialog(win: MainWindow, select: str = "") -> ProjectsDialog:
    win.projects.dialog_action.trigger()
    dlg = win.projects.dialog
    assert dlg is not None and dlg.isVisible()
    if select:
        dlg.reload(select)
    return dlg


def test_without_projects_the_menus_say_why(window: MainWindow) -> None:
    p = window.projects
    p.update_menus()
    assert not p.new_menu.menuAction().isEnabled()
    assert p.new_menu.menuAction().toolTip() == NO_PROJECTS
    assert not p.move_menu.menuAction().isEnabled()
    assert not p.remove_action.isEnabled()
    assert (window.dirs.root / "projects").is_dir()


def test_the_dialog_makes_renames_and_edits_a_project(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    answers(monkeypatch, "   ", "Work")  # a bad name is asked again, saying why
    dlg = open_dialog(window)
    assert "No projects yet" in dlg.note.text()
    dlg.new_button.click()
    (row,) = window.projects.store.list()
    assert row.name == "Work" and dlg.selected_id() == row.id
    assert [a.text() for a in window.projects.new_menu.actions()] == ["Work"]

    answers(monkeypatch, "x" * 81, "Job")
    dlg.rename_button.click()
    assert window.projects.store.load(row.id).name == "Job"
    assert dlg.list.currentItem().text() == "Job"

    read_ahead: list[str] = []
    monkeypatch.setattr(
        window.client, "build_prefix", lambda p, _params, _tools=None: read_ahead.append(p.id)
    )
    dlg.instructions.setPlainText("Answer in one line.")
    assert dlg.save_button.isEnabled()
    assert "about 6 tokens" in dlg.estimate.text()
    dlg.save_button.click()
    assert window.projects.store.load(row.id).instructions == "Answer in one line."
    assert read_ahead[-1] == row.id  # its opening is read ahead for its next new chat
    assert not dlg.save_button.isEnabled()

    doc = tmp_path / "lamps.md"
    doc.write_text("# Lamps\n\nA lamp gives light.\n", encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *_a, **_k: ([str(doc)], ""))
    dlg.add_button.click()
    qtbot.waitUntil(lambda: dlg.reading == 0, timeout=30_000)
    (entry,) = window.projects.store.load(row.id).pinned
    assert entry["name"] == "lamps.md" and "A lamp gives light." in entry["text"]
    assert entry["whole"] and len(entry["sha256"]) == 64 and len(entry["stamp"]) == 2
    assert dlg.pinned.count() == 1 and "lamps.md" in dlg.pinned.item(0).text()
    assert "A lamp gives light." in system_text(window.projects.store.load(row.id))

    dlg.pinned.setCurrentRow(0)
    dlg.remove_button.click()
    assert window.projects.store.load(row.id).pinned == []

    assert not dlg.api_box.isChecked()  # private until shared
    dlg.api_box.setChecked(True)
    assert window.projects.store.load(row.id).api
    view = window.api.gateway.project("Job")  # what the window's API server answers
    assert view is not None and view.id == row.id
    dlg.instructions.setPlainText("Typed, then closed.")  # closing keeps what was typed
    dlg.close()
    assert window.projects.store.load(row.id).instructions == "Typed, then closed."


def test_a_new_chat_in_a_project_starts_from_its_system_text(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    p = project(window, "Lamps", "Be brief.", pinned="Lamps are bright.")
    menu_action(window.projects.new_menu, "Lamps").trigger()
    conv = window.conversation
    assert conv.project_id == p.id and conv.system_prompt == system_text(p)
    assert "Be brief." in conv.system_prompt and "Lamps are bright." in conv.system_prompt
    conv_id = chat(qtbot, window, "Hello")
    first = fake.requests[-1][0]
    assert first.role == "system" and first.content == system_text(p)
    assert window.store.load(conv_id).project_id == p.id
    item = window.sidebar.item_for(conv_id)
    assert item is not None and "in Lamps" in item.text() and "Lamps" in item.toolTip()


def test_the_open_chat_moves_in_and_out(qtbot: QtBot, window: MainWindow) -> None:
    p = project(window, "Desk")
    conv_id = chat(qtbot, window, "Hello")
    window.projects.update_menus()
    menu_action(window.projects.move_menu, "Desk").trigger()
    assert window.conversation.project_id == p.id
    assert window.store.load(conv_id).project_id == p.id
    assert window.projects.remove_action.isEnabled()
    chat(qtbot, window, "Still here?")  # the reply's save keeps the project
    assert window.store.load(conv_id).project_id == p.id
    item = window.sidebar.item_for(conv_id)
    assert item is not None and "in Desk" in item.text()
    window.projects.remove_action.trigger()
    assert window.conversation.project_id == ""
    assert window.store.load(conv_id).project_id == ""
    assert not window.projects.remove_action.isEnabled()


def two_chats(qtbot: QtBot, win: MainWindow) -> tuple[Project, str, str]:
    """A project with two saved chats: one moved in, one started in it (left open)."""
    p = project(win, "Garden", "Talk about plants.")
    moved = chat(qtbot, win, "Roses")
    win.projects.move_open(p.id)
    menu_action(win.projects.new_menu, "Garden").trigger()
    started = chat(qtbot, win, "Tulips")
    assert win.store.load(moved).project_id == p.id == win.store.load(started).project_id
    return p, moved, started


def test_delete_keeping_the_chats_moves_them_out(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, moved, started = two_chats(qtbot, window)
    forgotten: list[str] = []
    monkeypatch.setattr(window.client, "forget_prefix", forgotten.append)
    boxes: list[str] = []
    click_in_box(monkeypatch, "Keep its 2 chats", boxes)
    asked = second_yes(monkeypatch, QMessageBox.StandardButton.Yes)
    dlg = open_dialog(window, p.id)
    dlg.delete_button.click()
    assert boxes == ["Delete the project Garden?"] and asked == []
    with pytest.raises(ProjectError):
        window.projects.store.load(p.id)
    assert forgotten == [p.id]  # its saved openings go with it
    for conv_id in (moved, started):
        conv = window.store.load(conv_id)
        assert conv.project_id == "" and conv.messages  # kept, with everything in it
    assert window.conversation.id == started and window.conversation.project_id == ""
    assert dlg.list.count() == 0
    assert not window.projects.new_menu.menuAction().isEnabled()


def test_delete_with_the_chats_needs_both_yeses(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, moved, started = two_chats(qtbot, window)
    boxes: list[str] = []
    dlg = open_dialog(window, p.id)

    def still_there() -> None:
        assert window.projects.store.load(p.id).name == "Garden"
        assert {moved, started} <= set(window.sidebar.ids())
        assert window.store.load(moved).project_id == p.id

    click_in_box(monkeypatch, "Cancel", boxes)  # the first question, cancelled
    asked = second_yes(monkeypatch, QMessageBox.StandardButton.Yes)
    dlg.delete_button.click()
    assert asked == []
    still_there()

    click_in_box(monkeypatch, "Delete the project and its 2 chats", boxes)
    asked = second_yes(monkeypatch, QMessageBox.StandardButton.No)  # the second, refused
    dlg.delete_button.click()
    assert len(asked) == 1 and "Roses" in asked[0] and "Tulips" in asked[0]
    still_there()

    asked = second_yes(monkeypatch, QMessageBox.StandardButton.Yes)
    dlg.delete_button.click()
    assert len(asked) == 1
    with pytest.raises(ProjectError):
        window.projects.store.load(p.id)
    assert moved not in window.sidebar.ids() and started not in window.sidebar.ids()
    assert not window.store.transcript_path(moved).exists()
    assert not window.store.transcript_path(started).exists()
    qtbot.waitUntil(lambda: window.conversation.id != started, timeout=5000)
    assert window.conversation.project_id == "" and not window.conversation.messages


def test_a_damaged_project_file_is_set_aside_with_a_notice(
    make_window: WindowFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "data" / "projects"
    folder.mkdir(parents=True)
    bad = folder / f"{new_id()}.json"
    bad.write_text("[1, 2", encoding="utf-8")
    win = make_window()
    assert not bad.exists() and bad.with_name(bad.name + ".bad").exists()
    assert bad.name in win.transcript.toPlainText()
    assert win.projects.rows() == []


def test_a_chat_dropped_on_a_project_moves_into_it_and_out(
    qtbot: QtBot, window: MainWindow
) -> None:
    project = Project(name="Harbour")
    window.projects.store.save(project)
    window.projects.refresh()
    first = chat(qtbot, window, "An older chat")
    window.new_chat()
    qtbot.waitUntil(lambda: window.session.conversation.id != first, timeout=5000)
    # A chat that is not the open one, moved from the sidebar (a drop, or its menu).
    window.sidebar.moveRequested.emit(first, project.id)
    assert window.projects.ctx.store.load(first).project_id == project.id
    window.sidebar.moveRequested.emit(first, "")
    assert window.projects.ctx.store.load(first).project_id == ""


def test_a_pinned_file_changed_is_read_again_before_a_new_chat(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new chat in a project reads a changed pinned file again first (the project
    keeps the new text, so its opening is made anew); a file gone leaves the copy."""
    notes = tmp_path / "notes.md"
    notes.write_text("High water at six.\n", encoding="utf-8")
    gone = tmp_path / "gone.md"
    gone.write_text("Berths one to nine.\n", encoding="utf-8")
    made = Project(name="Harbour", instructions="Be brief.")
    made.pinned = [
        {**read_pinned_file(notes), "n": 1},
        {**read_pinned_file(gone), "n": 2},
    ]
    window.projects.store.save(made)
    window.projects.refresh()
    gone.unlink()
    notes.write_text("High water at seven.\n", encoding="utf-8")
    os.utime(notes, ns=(1, 2_000_000_000))  # a new stamp even on a coarse clock
    notices: list[str] = []
    ctx = dataclasses.replace(window.projects.ctx, notice=notices.append)
    monkeypatch.setattr(window.projects, "ctx", ctx)
    window.projects.new_chat(made.id)
    qtbot.waitUntil(lambda: window.conversation.project_id == made.id, timeout=10000)
    prompt = window.conversation.system_prompt
    assert "High water at seven." in prompt and "Berths one to nine." in prompt
    saved = window.projects.store.load(made.id)
    assert [e["name"] for e in saved.pinned] == ["notes.md", "gone.md"]
    assert saved.pinned[0]["stamp"] == [notes.stat().st_size, 2_000_000_000]
    assert notices == [
        f"gone.md, pinned to Harbour, is no longer at {gone}: its chats use the copy read before."
    ]
    window.projects.new_chat(made.id)  # nothing changed: at once, the gone file said once
    assert window.conversation.system_prompt == prompt and len(notices) == 1
