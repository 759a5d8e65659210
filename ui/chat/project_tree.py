"""The sidebar's chats grouped by project (issue 44): a header row per project (its
name and how many chats it holds; click, Enter or Space folds it), its chats under it,
then "No project" and the chats in none. Chats are dragged onto a project's header (or
any of its chats) to move them in, onto "No project" or the empty space below to move
them out; the drop only asks (``moveDropped``): the window changes the store and draws
the list again, Qt never moves a row itself.

Why a ``QListWidget`` with header rows and not a ``QTreeWidget``: the chat rows stay the
``QListWidgetItem`` every caller and test uses (``item.text()``, ``item.toolTip()``,
``list.item(i)``, ``takeItem``), a tree's items take a column in each of these; the
grouping is one level deep, so a header row and hidden rows under it are all a fold
needs. With no project at all there are no headers: the flat list of before.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QMimeData, QPoint, Qt, Signal
from PySide6.QtGui import QDrag, QDragEnterEvent, QDragMoveEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem, QWidget

from app.chat.store import ConversationSummary

ID_ROLE = Qt.ItemDataRole.UserRole  # a chat row: the chat's id
TITLE_ROLE = Qt.ItemDataRole.UserRole + 1
PROJECT_ROLE = Qt.ItemDataRole.UserRole + 3  # a header row: its project's id ("": none)
GROUP_ROLE = Qt.ItemDataRole.UserRole + 4  # a chat row: the header it is under
NAME_ROLE = Qt.ItemDataRole.UserRole + 5
COUNT_ROLE = Qt.ItemDataRole.UserRole + 6
CHAT_MIME = "application/x-lamplight-chat-ids"
NO_PROJECT = "No project"

Groups = list[tuple[str | None, list[ConversationSummary]]]


def group_rows(rows: list[ConversationSummary], names: dict[str, str]) -> Groups:
    """``rows`` by project, in the order of ``names`` (every project, empty ones too),
    then ``""``: the chats in none or in a project that is gone. No projects: one group,
    ``None``, with every row (no headers)."""
    if not names:
        return [(None, list(rows))]
    groups: Groups = [(pid, [r for r in rows if r.project_id == pid]) for pid in names]
    groups.append(("", [r for r in rows if r.project_id not in names]))
    return groups


def is_header(item: QListWidgetItem | None) -> bool:
    return item is not None and item.data(PROJECT_ROLE) is not None


class ProjectList(QListWidget):
    """Chat rows under folding project headers; chats are dragged between them.

    Signals:
        moveDropped(str, str): a chat's id and the project it was dropped on ("": out).
        foldChanged(str): a project's header was folded or unfolded (its id).
    """

    moveDropped = Signal(str, str)
    foldChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.collapsed: set[str] = set()  # kept for the session, through every redraw
        self.setDragEnabled(True)
        self.setAcceptDrops(True)
        self.setDropIndicatorShown(True)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.itemClicked.connect(self._on_clicked)

    # -- headers and folding ---------------------------------------------------------

    def add_header(self, project_id: str, name: str, count: int) -> QListWidgetItem:
        item = QListWidgetItem()
        item.setData(PROJECT_ROLE, project_id)
        item.setData(NAME_ROLE, name)
        item.setData(COUNT_ROLE, count)
        item.setFlags(
            Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDropEnabled
        )
        font = item.font()
        font.setBold(True)
        item.setFont(font)
        item.setToolTip(f"{name}: {count} chat{'' if count == 1 else 's'}")
        self._label(item)
        self.addItem(item)
        return item

    def _label(self, item: QListWidgetItem) -> None:
        pid = str(item.data(PROJECT_ROLE))
        arrow = "▸" if pid in self.collapsed else "▾"
        item.setText(f"{arrow} {item.data(NAME_ROLE)} ({item.data(COUNT_ROLE)})")

    def header_for(self, project_id: str) -> QListWidgetItem | None:
        for i in range(self.count()):
            item = self.item(i)
            if is_header(item) and item.data(PROJECT_ROLE) == project_id:
                return item
        return None

    def set_collapsed(self, project_id: str, collapsed: bool) -> None:
        """Fold (or unfold) a project's chats under its header."""
        if collapsed:
            self.collapsed.add(project_id)
        else:
            self.collapsed.discard(project_id)
        item = self.header_for(project_id)
        if item is not None:
            self._label(item)
        self.foldChanged.emit(project_id)

    def toggle(self, project_id: str) -> None:
        self.set_collapsed(project_id, project_id not in self.collapsed)

    def _on_clicked(self, item: QListWidgetItem) -> None:
        if is_header(item):
            self.toggle(str(item.data(PROJECT_ROLE)))

    def keyPressEvent(self, event: QKeyEvent) -> None:
        item = self.currentItem()
        if item is None or not is_header(item):
            super().keyPressEvent(event)
            return
        pid = str(item.data(PROJECT_ROLE))
        key = event.key()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter, Qt.Key.Key_Space):
            self.toggle(pid)
        elif key == Qt.Key.Key_Left and pid not in self.collapsed:
            self.set_collapsed(pid, True)
        elif key == Qt.Key.Key_Right and pid in self.collapsed:
            self.set_collapsed(pid, False)
        else:
            super().keyPressEvent(event)

    # -- dragging chats ----------------------------------------------------------------

    def mimeTypes(self) -> list[str]:
        return [CHAT_MIME]

    def mimeData(self, items: Sequence[QListWidgetItem]) -> QMimeData:
        ids = [str(i.data(ID_ROLE)) for i in items if not is_header(i)]
        mime = QMimeData()
        mime.setData(CHAT_MIME, "\n".join(ids).encode())
        return mime

    def startDrag(self, supportedActions: Qt.DropAction) -> None:
        """Our own drag: Qt's would take the rows out of the list after a move."""
        items = [i for i in self.selectedItems() if not is_header(i)]
        if not items or self.header_for("") is None:  # no projects: nowhere to drop
            return
        drag = QDrag(self)
        drag.setMimeData(self.mimeData(items))
        drag.exec(Qt.DropAction.MoveAction)

    def target_at(self, pos: QPoint) -> str | None:
        """The project a drop at ``pos`` moves chats into ("": out of any; None: no
        projects, nothing to move into)."""
        if self.header_for("") is None:
            return None
        item = self.itemAt(pos)
        if item is None:
            return ""  # below the rows: the chats in no project are last
        if is_header(item):
            return str(item.data(PROJECT_ROLE))
        group = item.data(GROUP_ROLE)
        return None if group is None else str(group)

    def _accepts(self, event: QDragMoveEvent | QDropEvent) -> str | None:
        if not event.mimeData().hasFormat(CHAT_MIME):
            return None  # the ids are checked against the rows: another source moves none
        return self.target_at(event.position().toPoint())

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasFormat(CHAT_MIME):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        if self._accepts(event) is None:
            event.ignore()
            return
        event.setDropAction(Qt.DropAction.MoveAction)
        event.accept()

    def dropEvent(self, event: QDropEvent) -> None:
        target = self._accepts(event)
        if target is None:
            event.ignore()
            return
        event.setDropAction(Qt.DropAction.MoveAction)
        event.accept()
        self.drop_ids(bytes(event.mimeData().data(CHAT_MIME).data()).decode(), target)

    def drop_ids(self, payload: str, target: str) -> None:
        """Ask to move the chats named in ``payload`` (one id a line) into ``target``;
        the ones already there stay."""
        groups = {
            str(self.item(i).data(ID_ROLE)): self.item(i).data(GROUP_ROLE)
            for i in range(self.count())
            if not is_header(self.item(i))
        }
        for conv_id in payload.split("\n"):
            if conv_id in groups and groups[conv_id] != target:
                self.moveDropped.emit(conv_id, target)
