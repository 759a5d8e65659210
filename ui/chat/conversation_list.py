"""The sidebar of saved conversations: search, open, rename, fork, delete, export."""

from __future__ import annotations

import html
import time
from collections.abc import Callable

from PySide6.QtCore import QPoint, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import (
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

ID_ROLE = Qt.ItemDataRole.UserRole
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1
INDEX_ROLE = Qt.ItemDataRole.UserRole + 2
SEARCH_DELAY_MS = 200  # typing pauses this long before the messages are searched
SEARCH_MIN_CHARS = 2

Searcher = Callable[[str], list[SearchHit]]


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

    Typing in the search box filters the list by title at once and, after a short
    pause, lists the messages of every saved chat that contain all the words
    (``set_searcher``), best first.
    """

    openRequested = Signal(str)
    renameRequested = Signal(str, str)
    forkRequested = Signal(str)
    deleteRequested = Signal(str)
    exportRequested = Signal(str, str)
    newChatRequested = Signal()
    openAtRequested = Signal(str, int, str)
    projectsRequested = Signal()

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
        self.list = QListWidget(self)
        self.list.setObjectName("conversationList")
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
        layout.addWidget(self.search)
        layout.addWidget(self.hits_label)
        layout.addWidget(self.hits, 1)
        layout.addWidget(self.list, 2)
        layout.addWidget(self.usage)
        self._current = ""
        self._filling = False
        self._project_names: dict[str, str] = {}  # a chat's row names its project

    def set_project_names(self, names: dict[str, str]) -> None:
        """The projects' names by id, for the rows drawn from now on."""
        self._project_names = dict(names)

    def set_conversations(
        self, rows: list[ConversationSummary], current: str, used: int, budget: int
    ) -> None:
        """Show ``rows``; ``current`` is highlighted."""
        self._filling = True
        self._current = current
        self.list.clear()
        for row in rows:
            item = QListWidgetItem()
            self._fill_item(item, row)
            self.list.addItem(item)
            if row.id == current:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        self.set_usage(used, budget)
        self._filling = False
        self._apply_filter(self.search.text())

    def update_row(self, row: ConversationSummary, current: str) -> None:
        """Show one conversation's new state (added at the top when it is new)."""
        self._filling = True
        self._current = current
        item = self.item_for(row.id)
        if item is None:
            item = QListWidgetItem()
            self.list.insertItem(0, item)
        self._fill_item(item, row)
        for i in range(self.list.count()):
            it = self.list.item(i)
            it.setSelected(it.data(ID_ROLE) == current)
            if it.data(ID_ROLE) == current:
                self.list.setCurrentItem(it)
        self._filling = False
        self._apply_filter(self.search.text())

    def remove_row(self, conv_id: str) -> None:
        item = self.item_for(conv_id)
        if item is not None:
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
        if row.error:
            item.setToolTip(row.error)
            item.setForeground(Qt.GlobalColor.gray)
        else:
            item.setToolTip(f"{row.title}\nProject: {project}" if project else row.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)

    def ids(self) -> list[str]:
        return [str(self.list.item(i).data(ID_ROLE)) for i in range(self.list.count())]

    def visible_ids(self) -> list[str]:
        return [
            str(self.list.item(i).data(ID_ROLE))
            for i in range(self.list.count())
            if not self.list.item(i).isHidden()
        ]

    def item_for(self, conv_id: str) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if self.list.item(i).data(ID_ROLE) == conv_id:
                return self.list.item(i)
        return None

    def start_rename(self, conv_id: str) -> None:
        item = self.item_for(conv_id)
        if item is not None:
            self._filling = True
            item.setText(str(item.data(TITLE_ROLE)))
            self._filling = False
            self.list.editItem(item)

    def _apply_filter(self, text: str) -> None:
        needle = text.strip().lower()
        for i in range(self.list.count()):
            item = self.list.item(i)
            item.setHidden(bool(needle) and needle not in str(item.data(TITLE_ROLE)).lower())

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
        found = self._searcher(text)
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
        conv_id = str(item.data(ID_ROLE))
        if conv_id != self._current:
            self.openRequested.emit(conv_id)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        title = item.text().split("\n")[0].strip()
        if title and title != item.data(TITLE_ROLE):
            self.renameRequested.emit(str(item.data(ID_ROLE)), title)

    def _on_context_menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conv_id = str(item.data(ID_ROLE))
        menu = QMenu(self)
        menu.addAction("Open", lambda: self.openRequested.emit(conv_id))
        menu.addAction("Rename", lambda: self.start_rename(conv_id))
        menu.addAction("Fork", lambda: self.forkRequested.emit(conv_id))
        menu.addSeparator()
        menu.addAction("Export as JSON…", lambda: self.exportRequested.emit(conv_id, "json"))
        menu.addAction(
            "Export as Markdown…", lambda: self.exportRequested.emit(conv_id, "markdown")
        )
        menu.addAction("Projects…", self.projectsRequested.emit)
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.deleteRequested.emit(conv_id))
        menu.exec(self.list.viewport().mapToGlobal(pos))
