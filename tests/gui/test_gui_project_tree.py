"""The sidebar grouped by project (issue 44, the tree slice) on the fake window: a folding
header per project with its chats and their count, then the chats in none; a chat
dropped on a header, or moved from its menu, asks the window to move it (the list never
moves a row itself); "in:" limits the title filter and the message search to a project,
the hit limit applying within it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QListWidgetItem, QMenu
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.chat.projects import Project
from app.chat.store import ConversationStore
from ui.chat.conversation_list import ConversationList
from ui.chat.project_tree import CHAT_MIME, is_header
from ui.window.main_window import MainWindow


def saved(win: MainWindow, title: str, words: str, project_id: str = "") -> str:
    conv = Conversation(title=title, project_id=project_id)
    conv.messages = [Message("user", words), Message("assistant", "Noted.")]
    win.store.save(conv)
    return conv.id


def project(win: MainWindow, name: str) -> str:
    made = Project(name=name)
    win.projects.store.save(made)
    win.projects.refresh()
    return made.id


def headers(sidebar: ConversationList) -> list[str]:
    items = [sidebar.list.item(i) for i in range(sidebar.list.count())]
    return [i.text() for i in items if is_header(i) and not i.isHidden()]


def move_in_window(win: MainWindow, conv_id: str, project_id: str) -> None:
    """What the window does with ``moveRequested`` (``WindowProjects``)."""
    win.store.set_project(conv_id, project_id)
    win.refresh_sidebar()


def garden(win: MainWindow) -> tuple[str, str, str, str]:
    """Projects Garden (two chats) and Kitchen (none yet), and one chat in no project."""
    g = project(win, "Garden")
    k = project(win, "Kitchen")
    roses = saved(win, "Roses", "roses need sun", g)
    tulips = saved(win, "Tulips", "tulips need sun", g)
    saved(win, "Taxes", "taxes need sun")
    win.refresh_sidebar()
    return g, k, roses, tulips


def test_chats_are_grouped_under_their_projects_with_counts(window: MainWindow) -> None:
    sidebar = window.sidebar
    assert not sidebar.scope.isVisibleTo(window)  # no projects: the flat list of before
    g, _k, roses, tulips = garden(window)
    assert headers(sidebar) == ["▾ Garden (2)", "▾ Kitchen (0)", "▾ No project (1)"]
    rows = [sidebar.list.item(i) for i in range(sidebar.list.count())]
    under_garden = rows[1:3]
    assert {str(i.data(Qt.ItemDataRole.UserRole)) for i in under_garden} == {roses, tulips}
    assert len(sidebar.ids()) == 3 and sidebar.item_for(g) is None  # headers aren't chats
    assert sidebar.scope.isVisibleTo(window)
    assert [sidebar.scope.itemText(i) for i in range(sidebar.scope.count())] == [
        "in: All",
        "in: Garden",
        "in: Kitchen",
        "in: No project",
    ]


def test_a_project_folds_and_stays_folded_across_redraws(qtbot: QtBot, window: MainWindow) -> None:
    sidebar = window.sidebar
    g, _k, roses, tulips = garden(window)
    header = sidebar.list.header_for(g)
    assert header is not None
    sidebar.list.itemClicked.emit(header)  # a click folds it
    assert roses not in sidebar.visible_ids() and tulips not in sidebar.visible_ids()
    assert headers(sidebar)[0] == "▸ Garden (2)"
    window.refresh_sidebar()
    assert roses not in sidebar.visible_ids()
    sidebar.search.setText("rose")  # a search shows what it finds, folded or not
    assert sidebar.visible_ids() == [roses]
    assert headers(sidebar) == ["▸ Garden (2)"]
    sidebar.search.clear()
    sidebar.list.setCurrentItem(sidebar.list.header_for(g))
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Right)
    assert {roses, tulips} <= set(sidebar.visible_ids())
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Space)
    assert roses not in sidebar.visible_ids()
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Space)
    assert roses in sidebar.visible_ids()


def drop(sidebar: ConversationList, ids: list[str], on: QListWidgetItem | None) -> None:
    mime = QMimeData()
    mime.setData(CHAT_MIME, "\n".join(ids).encode())
    view = sidebar.list
    if on is None:
        pos = QPointF(5, view.viewport().height() - 2)  # the empty space under the rows
    else:
        pos = QPointF(view.visualItemRect(on).center())
    event = QDropEvent(
        pos,
        Qt.DropAction.MoveAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    view.dropEvent(event)  # Qt's dispatch wants a drag under way: the handler itself


def test_a_chat_dropped_on_a_project_asks_to_move_it(qtbot: QtBot, window: MainWindow) -> None:
    sidebar = window.sidebar
    g, k, roses, _tulips = garden(window)
    asked: list[tuple[str, str]] = []
    sidebar.moveRequested.connect(lambda c, p: asked.append((c, p)))
    drop(sidebar, [roses], sidebar.list.header_for(k))
    assert asked == [(roses, k)]
    # The window moves it (``WindowProjects.move_chat``) and draws the list again.
    assert window.store.load(roses).project_id == k
    assert headers(sidebar) == ["▾ Garden (1)", "▾ Kitchen (1)", "▾ No project (1)"]
    drop(sidebar, [roses], sidebar.list.header_for(k))  # already there: nothing asked
    drop(sidebar, ["not-a-chat"], sidebar.list.header_for(g))
    assert asked == [(roses, k)]
    sidebar.resize(300, 800)
    drop(sidebar, [roses], None)  # below the rows: out of any project
    assert window.store.load(roses).project_id == ""
    drop(sidebar, [roses], sidebar.list.header_for(""))  # already out: nothing asked
    assert asked[1:] == [(roses, "")]


def menu_action(menu: QMenu, text: str) -> QMenu:
    found = [a for a in menu.actions() if a.text() == text]
    assert found, f"{text!r} not in {[a.text() for a in menu.actions()]}"
    sub = found[0].menu()
    assert isinstance(sub, QMenu)
    return sub


def test_a_chats_menu_moves_it_in_and_out(window: MainWindow) -> None:
    sidebar = window.sidebar
    g, k, roses, _tulips = garden(window)
    asked: list[tuple[str, str]] = []
    sidebar.moveRequested.connect(lambda c, p: asked.append((c, p)))
    item = sidebar.item_for(roses)
    assert item is not None
    menu = sidebar.menu_for(item)
    into = menu_action(menu, "Move to project")
    assert [a.text() for a in into.actions()] == ["Kitchen"]  # not the one it is in
    into.actions()[0].trigger()
    [remove] = [a for a in menu.actions() if a.text() == "Remove from project"]
    assert remove.isEnabled()
    remove.trigger()
    assert asked == [(roses, k), (roses, "")]
    move_in_window(window, roses, "")
    item = sidebar.item_for(roses)
    assert item is not None
    menu = sidebar.menu_for(item)
    [remove] = [a for a in menu.actions() if a.text() == "Remove from project"]
    assert not remove.isEnabled()
    assert [a.text() for a in menu_action(menu, "Move to project").actions()] == [
        "Garden",
        "Kitchen",
    ]
    assert g


def test_search_in_a_project_finds_only_its_chats(qtbot: QtBot, window: MainWindow) -> None:
    sidebar = window.sidebar
    g, _k, roses, tulips = garden(window)
    sidebar.search.setText("sun")
    sidebar.run_search()
    assert sidebar.hits.count() == 3
    sidebar.set_project_scope(g)  # the search runs again
    found = {sidebar.hits.item(i).data(Qt.ItemDataRole.UserRole) for i in range(2)}
    assert sidebar.hits.count() == 2 and found == {roses, tulips}
    sidebar.search.clear()
    assert set(sidebar.visible_ids()) == {roses, tulips}  # the list too
    assert headers(sidebar) == ["▾ Garden (2)"]
    sidebar.set_project_scope("")
    assert len(sidebar.visible_ids()) == 1
    sidebar.set_project_scope(None)
    assert len(sidebar.visible_ids()) == 3


def test_the_hit_limit_applies_within_the_project(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    for n in range(6):
        store.save(Conversation(title=f"Other {n}", messages=[Message("user", "lamp oil")]))
    inside = Conversation(title="Mine", project_id="p1", messages=[Message("user", "lamp")])
    store.save(inside)
    assert len(store.search("lamp")) == 7
    assert [h.conv_id for h in store.search("lamp", project_id="p1")] == [inside.id]
    assert len(store.search("lamp", project_id="")) == 6
    assert store.search("lamp", project_id="nothing") == []
    assert [h.conv_id for h in store.index.search("lamp", limit=1, within=[inside.id])] == [
        inside.id
    ]
