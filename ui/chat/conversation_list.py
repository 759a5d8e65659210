"""The sidebar of saved conversations: search, open, rename, fork, delete, export, and
move between projects (grouped under folding headers: ``ui.chat.project_tree``, which
says why it stays a ``QListWidget``)."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from functools import partial

from PySide6.QtCore import QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.search_index import HIT_END, HIT_START, SearchHit
from app.chat.store import ConversationSummary
from app.util.sysinfo import size_text
from ui.chat.project_tree import (
    GROUP_ROLE,
    ID_ROLE,
    NO_PROJECT,
    PROJECT_ROLE,
    TITLE_ROLE,
    ProjectList,
    group_rows,
    is_header,
)

__all__ = ["ID_ROLE", "TITLE_ROLE", "ConversationList", "hit_html", "human_time"]

INDEX_ROLE = Qt.ItemDataRole.UserRole + 2
SEARCH_DELAY_MS = 200  # typing pauses this long before the messages are searched
SEARCH_MIN_CHARS = 2

Searcher = Callable[[str, str | None], list[SearchHit]]  # text, project (None: all)


def hit_html(hit: SearchHit) -> str:
    """A search result as two lines of rich text: the chat's title, then the snippet with
    the matched words in bold. Everything from the files is escaped first."""
    snippet = html.escape(hit.snippet).replace(HIT_START, "<b>").replace(HIT_END, "</b>")
    who = "You" if hit.role == "user" else "Assistant (thinking)" if hit.thinking else "Assistant"
    return f"<b>{html.escape(hit.title)}</b><br><span style='color:#888888'>{who}:</span> {snippet}"


def human_time(ts: float) -> str:
    """The time today ("14:05"), else the date ("03 Mar 2024"); "unknown date" for a value
    no clock shows (NaN, 1e20: a damaged file's times are repaired, but this is total)."""
    try:
        t = time.localtime(ts)
        now = time.localtime()
        if t.tm_year == now.tm_year and t.tm_yday == now.tm_yday:
            return time.strftime("%H:%M", t)
        return time.strftime("%d %b %Y", t)
    except (OverflowError, OSError, ValueError, TypeError):
        return "unknown date"


class ConversationList(QWidget):
    """Saved conversations, newest first.

    Signals:
        openRequested(str): conversation id.
        renameRequested(str, str): id and new title.
        forkRequested(str): id (fork at its last message).
        deleteRequested(str): id (the window confirms).
        exportRequested(str, str): id and "json" or "markdown".
        newChatRequested(): the New chat button.
        openAtRequested(str, int, str): id, message index and the search text (a hit
            of the full-text search was chosen).
        projectsRequested(): Projects… (the window's dialog).
        moveRequested(str, str): a chat's id and the project to move it into ("": out
            of its project), dragged there or chosen in its menu; the window moves it
            and draws the list again.

    Typing in the search box filters the list by title at once and, after a short
    pause, lists the messages of every saved chat that contain all the words
    (``set_searcher``), best first. With projects, "in:" beside the box limits both
    to one project's chats.
    """

    openRequested = Signal(str)
    renameRequested = Signal(str, str)
    forkRequested = Signal(str)
    deleteRequested = Signal(str)
    exportRequested = Signal(str, str)
    newChatRequested = Signal()
    openAtRequested = Signal(str, int, str)
    projectsRequested = Signal()
    moveRequested = Signal(str, str)
    projectActionRequested = Signal(str, str)  # "new", "edit", "json", "markdown", "delete"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationSidebar")
        self.search = QLineEdit(self)
        self.search.setObjectName("conversationSearch")
        self.search.setPlaceholderText("Search titles and messages…")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._apply_filter)
        self.search.textChanged.connect(self._schedule_search)
        self.scope = QComboBox(self)
        self.scope.setObjectName("searchScope")
        self.scope.setAccessibleName("Search in")
        self.scope.setToolTip("Search and list the chats of one project only")
        self.scope.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.scope.currentIndexChanged.connect(self._on_scope)
        self.scope.hide()  # until there are projects
        self._scope_ids: list[str | None] = [None]
        self._searcher: Searcher | None = None
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self.run_search)
        self.hits_label = QLabel(self)
        self.hits_label.setObjectName("searchHitsLabel")
        self.hits = QListWidget(self)
        self.hits.setObjectName("searchHits")
        self.hits.setAccessibleName("Messages that match the search")
        self.hits.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.hits.setVerticalScrollMode(QListWidget.ScrollMode.ScrollPerPixel)
        self.hits.itemActivated.connect(self._on_hit)
        self.hits.itemClicked.connect(self._on_hit)
        self.hits_label.hide()
        self.hits.hide()
        self.list = ProjectList(self)
        self.list.setObjectName("conversationList")
        self.list.moveDropped.connect(self.moveRequested)
        self.list.foldChanged.connect(lambda _pid: self._apply_filter(self.search.text()))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_context_menu)
        self.list.itemActivated.connect(self._on_activated)
        self.list.itemClicked.connect(self._on_activated)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.setWordWrap(True)
        # A title with a word wider than the sidebar (an unbroken 200 characters) made every
        # row that wide, with a scroll bar: now it ends in "…", whole in its tooltip.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.usage = QLabel(self)
        self.usage.setObjectName("snapshotUsage")
        self.usage.setWordWrap(True)
        new_button = QPushButton("New chat", self)
        new_button.setObjectName("sidebarNewChat")
        new_button.clicked.connect(self.newChatRequested)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(new_button)
        search_row = QHBoxLayout()
        search_row.addWidget(self.search, 1)
        search_row.addWidget(self.scope)
        layout.addLayout(search_row)
        layout.addWidget(self.hits_label)
        layout.addWidget(self.hits, 1)
        layout.addWidget(self.list, 2)
        layout.addWidget(self.usage)
        self._current = ""
        self._filling = False
        self._project_names: dict[str, str] = {}  # a chat's row names its project
        self._rows: list[ConversationSummary] = []  # as shown, newest first

    def set_project_names(self, names: dict[str, str]) -> None:
        """The projects by id, in the order of their headers, for the rows drawn from
        now on (the window draws them next); the "in:" choice lists them."""
        self._project_names = dict(names)
        chosen = self._scope_ids[self.scope.currentIndex()] if self.scope.count() else None
        self._scope_ids = [None, *names, ""]
        self.scope.blockSignals(True)
        self.scope.clear()
        self.scope.addItems(["in: All", *(f"in: {n}" for n in names.values()), "in: No project"])
        self.scope.setCurrentIndex(
            self._scope_ids.index(chosen) if chosen in self._scope_ids else 0
        )
        self.scope.blockSignals(False)
        self.scope.setVisible(bool(names))

    def project_scope(self) -> str | None:
        """The project that the list and search are limited to ("": no project; None: all)."""
        return self._scope_ids[self.scope.currentIndex()] if self.scope.count() else None

    def set_project_scope(self, project_id: str | None) -> None:
        if project_id in self._scope_ids:
            self.scope.setCurrentIndex(self._scope_ids.index(project_id))

    def set_conversations(
        self, rows: list[ConversationSummary], current: str, used: int, budget: int
    ) -> None:
        """Show ``rows``; ``current`` is highlighted."""
        self._rows = list(rows)
        self._current = current
        self._redraw()
        self.set_usage(used, budget)

    def _redraw(self) -> None:
        self._filling = True
        self.list.clear()
        for group, rows in group_rows(self._rows, self._project_names):
            if group is not None:
                self.list.add_header(group, self._project_names.get(group, NO_PROJECT), len(rows))
            for row in rows:
                item = QListWidgetItem()
                self._fill_item(item, row)
                self.list.addItem(item)
                if row.id == self._current:
                    item.setSelected(True)
                    self.list.setCurrentItem(item)
        self._filling = False
        self._apply_filter(self.search.text())

    def _group_of(self, row: ConversationSummary) -> str | None:
        if not self._project_names:
            return None
        return row.project_id if row.project_id in self._project_names else ""

    def update_row(self, row: ConversationSummary, current: str) -> None:
        """Show one conversation's new state (added at the top when it is new)."""
        self._current = current
        old = next((i for i, r in enumerate(self._rows) if r.id == row.id), None)
        if old is None:
            self._rows.insert(0, row)
        else:
            self._rows[old] = row
        item = self.item_for(row.id)
        if item is None or item.data(GROUP_ROLE) != self._group_of(row):
            self._redraw()  # new, or moved: the headers' counts change
            return
        self._filling = True
        self._fill_item(item, row)
        for it in self._chat_items():
            it.setSelected(it.data(ID_ROLE) == current)
            if it.data(ID_ROLE) == current:
                self.list.setCurrentItem(it)
        self._filling = False
        self._apply_filter(self.search.text())

    def remove_row(self, conv_id: str) -> None:
        self._rows = [r for r in self._rows if r.id != conv_id]
        item = self.item_for(conv_id)
        if item is not None and self._project_names:
            self._redraw()
        elif item is not None:
            self.list.takeItem(self.list.row(item))

    def set_usage(self, used: int, budget: int) -> None:
        self.usage.setText(f"Saved caches: {size_text(used)} of {size_text(budget)}")

    def _fill_item(self, item: QListWidgetItem, row: ConversationSummary) -> None:
        meta = [human_time(row.updated)]
        project = self._project_names.get(row.project_id, "")
        if project:
            meta.append(f"in {project}")
        if row.model_name:
            meta.append(row.model_name)
        if row.n_tokens:
            meta.append(f"{row.n_tokens} tokens")
        meta.append(f"cache {size_text(row.snapshot_bytes)}" if row.snapshot_bytes else "no cache")
        item.setText(f"{row.title}\n{' · '.join(meta)}")
        item.setData(ID_ROLE, row.id)
        item.setData(TITLE_ROLE, row.title)
        item.setData(GROUP_ROLE, self._group_of(row))
        if row.error:
            item.setToolTip(row.error)
            item.setForeground(Qt.GlobalColor.gray)
        else:
            item.setToolTip(f"{row.title}\nProject: {project}" if project else row.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)

    def _chat_items(self) -> list[QListWidgetItem]:
        """The chats' rows (not the projects' headers), top to bottom."""
        items = (self.list.item(i) for i in range(self.list.count()))
        return [item for item in items if not is_header(item)]

    def ids(self) -> list[str]:
        return [str(item.data(ID_ROLE)) for item in self._chat_items()]

    def visible_ids(self) -> list[str]:
        return [str(item.data(ID_ROLE)) for item in self._chat_items() if not item.isHidden()]

    def item_for(self, conv_id: str) -> QListWidgetItem | None:
        for item in self._chat_items():
            if item.data(ID_ROLE) == conv_id:
                return item
        return None

    def start_rename(self, conv_id: str) -> None:
        item = self.item_for(conv_id)
        if item is not None:
            self._filling = True
            item.setText(str(item.data(TITLE_ROLE)))
            self._filling = False
            self.list.editItem(item)

    def _apply_filter(self, text: str) -> None:
        """Rows whose title holds ``text``, in the chosen project; a folded project's
        rows are hidden unless a search is typed. A header with nothing shown under it
        is hidden while a search or a project is chosen."""
        needle = text.strip().lower()
        scope = self.project_scope()
        shown: set[str] = set()
        for item in self._chat_items():
            group = item.data(GROUP_ROLE)
            match = (not needle or needle in str(item.data(TITLE_ROLE)).lower()) and (
                scope is None or group == scope
            )
            if match and group is not None:
                shown.add(str(group))
            item.setHidden(not match or (not needle and group in self.list.collapsed))
        for i in range(self.list.count()):
            header = self.list.item(i)
            if is_header(header):
                pid = str(header.data(PROJECT_ROLE))
                wanted = scope is None or pid == scope
                header.setHidden(not wanted or (bool(needle) and pid not in shown))

    def _on_scope(self, _index: int) -> None:
        self._apply_filter(self.search.text())
        if self.hits.isVisible() or self.hits_label.isVisible():
            self.run_search()

    def set_searcher(self, searcher: Searcher | None) -> None:
        """Where message search asks (``ConversationStore.search``); None: titles only."""
        self._searcher = searcher

    def _schedule_search(self, _text: str) -> None:
        self._search_timer.start()

    def run_search(self) -> None:
        """Search the messages for the box's text now and show the hits."""
        self._search_timer.stop()
        text = self.search.text().strip()
        self.hits.clear()
        if self._searcher is None or len(text) < SEARCH_MIN_CHARS:
            self.hits_label.hide()
            self.hits.hide()
            return
        found = self._searcher(text, self.project_scope())
        self.hits_label.setText(
            f"In messages: {len(found)}{'+' if len(found) >= 50 else ''} found"
            if found
            else "No message contains these words."
        )
        self.hits_label.show()
        self.hits.setVisible(bool(found))
        width = max(120, self.hits.viewport().width() - 4)
        for hit in found:
            item = QListWidgetItem()
            item.setData(ID_ROLE, hit.conv_id)
            item.setData(INDEX_ROLE, hit.index)
            label = QLabel(hit_html(hit))
            label.setTextFormat(Qt.TextFormat.RichText)
            label.setWordWrap(True)
            label.setContentsMargins(4, 2, 4, 4)
            item.setToolTip(hit.title)
            item.setSizeHint(QSize(width, label.heightForWidth(width)))
            self.hits.addItem(item)
            self.hits.setItemWidget(item, label)

    def _on_hit(self, item: QListWidgetItem) -> None:
        self.openAtRequested.emit(
            str(item.data(ID_ROLE)), int(item.data(INDEX_ROLE)), self.search.text().strip()
        )

    def _on_activated(self, item: QListWidgetItem) -> None:
        if is_header(item):
            return  # a click folds it (``ProjectList``)
        conv_id = str(item.data(ID_ROLE))
        if conv_id != self._current:
            self.openRequested.emit(conv_id)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if self._filling or is_header(item):
            return
        title = item.text().split("\n")[0].strip()
        if title and title != item.data(TITLE_ROLE):
            self.renameRequested.emit(str(item.data(ID_ROLE)), title)

    def _on_context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is not None:
            menu = self.menu_for(item)
            menu.exec(self.list.viewport().mapToGlobal(pos))
            menu.deleteLater()

    def menu_for(self, item: QListWidgetItem) -> QMenu:
        """A row's menu: a chat's (open, rename, …, move to a project) or a header's."""
        menu = QMenu(self)
        if is_header(item):
            pid = str(item.data(PROJECT_ROLE))
            fold = "Expand" if pid in self.list.collapsed else "Collapse"
            menu.addAction(fold, lambda: self.list.toggle(pid))
            if pid:
                self._project_actions(menu, pid)
            else:
                menu.addAction("Projects…", self.projectsRequested.emit)
            return menu
        conv_id = str(item.data(ID_ROLE))
        menu.addAction("Open", lambda: self.openRequested.emit(conv_id))
        menu.addAction("Rename", lambda: self.start_rename(conv_id))
        menu.addAction("Fork", lambda: self.forkRequested.emit(conv_id))
        menu.addSeparator()
        menu.addAction("Export as JSON…", lambda: self.exportRequested.emit(conv_id, "json"))
        menu.addAction(
            "Export as Markdown…", lambda: self.exportRequested.emit(conv_id, "markdown")
        )
        self.add_move_actions(menu, conv_id, item.data(GROUP_ROLE))
        menu.addAction("Projects…", self.projectsRequested.emit)
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.deleteRequested.emit(conv_id))
        return menu

    def _project_actions(self, menu: QMenu, pid: str) -> None:
        """A project header's menu, below its fold."""
        ask = self.projectActionRequested.emit
        menu.addAction("New chat in project", lambda: ask("new", pid))
        menu.addAction("Edit project…", lambda: ask("edit", pid))
        menu.addSeparator()
        menu.addAction("Export as JSON…", lambda: ask("json", pid))
        menu.addAction("Export as Markdown…", lambda: ask("markdown", pid))
        menu.addSeparator()
        menu.addAction("Delete project…", lambda: ask("delete", pid))

    def add_move_actions(self, menu: QMenu, conv_id: str, group: str | None) -> None:
        """The menu's moves: into each project it is not in, and out of its own."""
        menu.addSeparator()
        move = menu.addMenu("Move to project")
        move.setObjectName("moveToProjectMenu")
        for pid, name in self._project_names.items():
            if pid != group:
                move.addAction(
                    name.replace("&", "&&"), partial(self.moveRequested.emit, conv_id, pid)
                )
        move.menuAction().setEnabled(not move.isEmpty())
        remove = menu.addAction("Remove from project", lambda: self.moveRequested.emit(conv_id, ""))
        remove.setEnabled(bool(group))
