"""A project's header menu in the sidebar, its fold kept across starts, and a project
exported and imported (issue 44) on the fake window: the export holds the project and
its chats (JSON to import again, Markdown to read); an import is a new project whose
paths, tools and API switch are listed and used only after Attach."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.chat.projects import Project
from app.config.settings import AppSettings
from app.documents.sources import Source
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory
from ui.chat import import_review_dialog
from ui.chat.project_tree import is_header
from ui.window.main_window import MainWindow

SPEC = {"name": "tides", "description": "Tide table.", "parameters": {"type": "object"}}


def harbour(win: MainWindow, tmp_path: Path) -> tuple[Project, str]:
    """A project with a pinned file, a tool and the API switch, and one saved chat."""
    doc = Source(1, str(tmp_path / "tides.md"), "tides.md", "High water.", None, 1, 1, -1, True)
    made = Project(
        name="Harbour",
        instructions="Answer as the harbour master.",
        pinned=[{**doc.to_dict(), "stamp": [], "sha256": ""}],
        mcp_tools=["tides"],
        tool_specs=[SPEC],
        api=True,
    )
    win.projects.store.save(made)
    conv = Conversation(title="Tides today", project_id=made.id)
    conv.messages = [Message("user", "When is high water?"), Message("assistant", "At six.")]
    win.store.save(conv)
    win.projects.refresh()
    win.refresh_sidebar()
    return made, conv.id


def header_menu(win: MainWindow, project_id: str) -> dict[str, object]:
    header = win.sidebar.list.header_for(project_id)
    assert header is not None and is_header(header)
    menu = win.sidebar.menu_for(header)
    return {a.text(): a for a in menu.actions() if a.text()}


def test_a_projects_header_menu_starts_edits_and_deletes(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, _conv_id = harbour(window, tmp_path)
    actions = header_menu(window, made.id)
    assert list(actions) == [
        "Collapse",
        "New chat in project",
        "Edit project…",
        "Export as JSON…",
        "Export as Markdown…",
        "Delete project…",
    ]
    actions["New chat in project"].trigger()  # type: ignore[attr-defined]
    qtbot.waitUntil(lambda: window.conversation.project_id == made.id, timeout=5000)
    other = Project(name="Kitchen")
    window.projects.store.save(other)
    window.projects.refresh()
    window.refresh_sidebar()
    header_menu(window, made.id)["Edit project…"].trigger()  # type: ignore[attr-defined]
    dialog = window.projects.dialog
    assert dialog is not None and dialog.isVisible() and dialog.selected_id() == made.id
    asked: list[str] = []
    monkeypatch.setattr(dialog, "ask_delete", lambda: asked.append(dialog.selected_id()))
    dialog.list.setCurrentRow(1)  # Kitchen, then Delete from Harbour's header
    header_menu(window, made.id)["Delete project…"].trigger()  # type: ignore[attr-defined]
    assert asked == [made.id]


def test_a_fold_is_kept_for_the_next_start(
    make_window: WindowFactory, fake: FakeEngine, window: MainWindow, tmp_path: Path
) -> None:
    made, conv_id = harbour(window, tmp_path)
    header_menu(window, made.id)["Collapse"].trigger()  # type: ignore[attr-defined]
    assert window.ctx.settings.value.folded_projects == [made.id]
    assert conv_id not in window.sidebar.visible_ids()
    again = make_window(FakeEngine(), settings=AppSettings(folded_projects=[made.id]))
    again.refresh_sidebar()
    assert conv_id not in again.sidebar.visible_ids()
    assert "Expand" in header_menu(again, made.id)


@pytest.mark.parametrize("attach", [False, True])
def test_a_project_exported_and_imported_asks_before_using_paths_and_tools(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attach: bool
) -> None:
    made, _conv_id = harbour(window, tmp_path)
    out = tmp_path / "harbour.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(out), ""))
    header_menu(window, made.id)["Export as JSON…"].trigger()  # type: ignore[attr-defined]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["project"]["name"] == "Harbour" and len(data["conversations"]) == 1
    md = tmp_path / "harbour.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(md), ""))
    header_menu(window, made.id)["Export as Markdown…"].trigger()  # type: ignore[attr-defined]
    text = md.read_text(encoding="utf-8")
    assert "# Project: Harbour" in text and "When is high water?" in text

    shown: list[list[str]] = []

    def review(lines: list[str], title: str, intro: str, parent: object) -> bool:
        shown.append(list(lines))
        return attach

    monkeypatch.setattr(import_review_dialog, "confirm_lines", review)
    monkeypatch.setattr("ui.chat.project_files.confirm_lines", review)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(out), ""))
    dialog = window.projects.show_dialog()
    dialog.import_button.click()
    assert shown == [
        [
            f"Pinned document: {tmp_path / 'tides.md'}",
            "Tools: replies may call tides",
            "Reachable through the local API server",
        ]
    ]
    rows = {r.name: r for r in window.projects.rows()}
    assert set(rows) == {"Harbour", "Harbour (2)"}
    imported = window.projects.store.load(rows["Harbour (2)"].id)
    assert dialog.selected_id() == imported.id
    if attach:
        assert imported.mcp_tools == ["tides"] and imported.api and imported.pinned
    else:
        assert (imported.mcp_tools, imported.api, imported.pinned) == ([], False, [])
    chats = [r for r in window.store.list() if r.project_id == imported.id]
    assert [c.title for c in chats] == ["Tides today"]


def test_a_file_that_is_not_a_project_is_refused_with_a_message(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "chat.json"
    bad.write_text(json.dumps({"format": 2, "messages": []}), encoding="utf-8")
    warned: list[str] = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(bad), ""))
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text: warned.append(text))
    window.projects.ask_import()
    assert warned == ["The file is not a Lamplight project export."]
    assert window.projects.rows() == []
