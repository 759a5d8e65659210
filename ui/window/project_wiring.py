"""Projects in the window (issue 44): the store on the data folder, Chat → Projects…
(``ProjectsDialog``), Chat → New chat in project (its pinned files read again first when
they changed), Move chat to project and Remove chat from project (on the open chat, or
any chat from the sidebar), and the project's name on its chats' rows. What a project's
chats run with follows them: ``ui.window.project_settings``; the sidebar's grouping:
``ui.chat.project_tree``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QMenuBar

from app.chat import project_pins
from app.chat.conversation import ConversationError
from app.chat.project_chat import opening_request
from app.chat.projects import Project, ProjectError, ProjectStore, ProjectSummary
from app.util.errors import DocumentError
from ui.api.api_status import ApiControl
from ui.chat import project_files
from ui.chat.conversation_list import ConversationList
from ui.chat.project_dialog import ProjectsDialog
from ui.common.background import run_in_background
from ui.common.context import Context
from ui.settings.sampling_panel import SamplingPanel
from ui.window.project_settings import ProjectSettings, SettingsHost

CHAT_MENU = "&Chat"
NO_PROJECTS = "No projects yet: Chat → Projects… makes one."


class ProjectsHost(SettingsHost, Protocol):
    """What of the window this needs (the window itself)."""

    @property
    def ctx(self) -> Context: ...
    @property
    def sidebar(self) -> ConversationList: ...
    @property
    def api(self) -> ApiControl: ...
    @property
    def sampling_panel(self) -> SamplingPanel: ...
    def refresh_sidebar(self) -> None: ...
    def menuBar(self) -> QMenuBar: ...


class WindowProjects:
    """The window's projects: its ``ProjectStore``, the Chat menu's entries, the dialog,
    and the chats of a project (``ProjectChats``: what a deleted project leaves)."""

    def __init__(self, win: ProjectsHost) -> None:
        self.ctx = win.ctx
        self._win = win
        self.store = ProjectStore(self.ctx.dirs.root)  # <data>/projects
        win.api.gateway.projects = self.store  # API requests may name the shared ones
        self.dialog: ProjectsDialog | None = None
        self._gone_said: set[tuple[str, str]] = set()  # (project, path) said to be gone
        self.settings = ProjectSettings(win, self.store)  # what its chats run with
        self.settings.choicesChanged.connect(self._on_choices_changed)
        self.ctx.session.project_of = self.project_of  # its tools narrow what chats offer
        win.sidebar.moveRequested.connect(self.move_chat)  # a drop, or a row's menu
        menu = _chat_menu(win.menuBar())
        menu.setToolTipsVisible(True)  # a disabled submenu says why
        menu.aboutToShow.connect(self.update_menus)
        parent = self.ctx.parent
        menu.addSeparator()
        self.dialog_action = QAction("Projects…", parent)
        self.dialog_action.setToolTip("Make and edit projects: what their new chats start from")
        self.dialog_action.triggered.connect(self.show_dialog)
        menu.addAction(self.dialog_action)
        self.new_menu = menu.addMenu("New chat in project")
        self.new_menu.setObjectName("newChatInProjectMenu")
        self.move_menu = menu.addMenu("Move chat to project")
        self.move_menu.setObjectName("moveChatToProjectMenu")
        self.remove_action = QAction("Remove chat from project", parent)
        self.remove_action.triggered.connect(lambda: self.move_open(""))
        menu.addAction(self.remove_action)
        win.sidebar.projectsRequested.connect(self.show_dialog)
        win.sidebar.projectActionRequested.connect(self.on_header_action)
        win.sidebar.list.collapsed.update(self.ctx.settings.value.folded_projects)
        win.sidebar.list.foldChanged.connect(self._on_fold)
        self.refresh(redraw=False)  # the window lists the chats next

    # -- what is shown ---------------------------------------------------------------

    def rows(self) -> list[ProjectSummary]:
        """The projects that can be used now, by name (notes about damaged files shown)."""
        rows = [r for r in self.store.list() if not r.error]
        for note in self.store.take_notes():
            self.ctx.notice(note)
        return rows

    def refresh(self, redraw: bool = True) -> None:
        """The projects changed: the rows name them anew, the menus list them."""
        self._win.sidebar.set_project_names({r.id: r.name for r in self.rows()})
        if redraw:
            self._win.refresh_sidebar()
        self.update_menus()

    def update_menus(self) -> None:
        rows = self.rows()
        current = self.ctx.session.conversation.project_id
        _fill(self.new_menu, rows, self.new_chat)
        _fill(self.move_menu, [r for r in rows if r.id != current], self.move_open)
        self.remove_action.setEnabled(bool(current))
        names = {r.id: r.name for r in rows}
        self.remove_action.setToolTip(
            f"Take this chat out of {names.get(current, 'its project')}"
            if current
            else "This chat is in no project."
        )

    def show_dialog(self) -> ProjectsDialog:
        """Chat → Projects…: the dialog (one at a time)."""
        if self.dialog is not None and self.dialog.isVisible():
            self.dialog.raise_()
            self.dialog.activateWindow()
            return self.dialog
        if self.dialog is not None:
            self.dialog.deleteLater()
        self.dialog = ProjectsDialog(self.store, self, self.ctx.parent, self.settings)
        self.dialog.changed.connect(self.refresh)
        self.dialog.changed.connect(self._read_ahead)
        self.dialog.exportRequested.connect(partial(project_files.ask_export, self.ctx, self.store))
        self.dialog.importRequested.connect(self.ask_import)
        self.dialog.show()
        self.settings.scan_library()  # listed in the dialog when the scan answers
        return self.dialog

    def ask_import(self) -> None:
        """Import an exported project (what it uses only once confirmed); shown."""
        project_id = project_files.ask_import(self.ctx, self.store)
        if project_id:
            self.refresh()
            self.show_dialog().reload(project_id)

    def on_header_action(self, what: str, project_id: str) -> None:
        """A project header's menu in the sidebar: "new", "edit", "json", "markdown" or
        "delete" (the dialog asks what becomes of its chats, as its button does)."""
        if what == "new":
            self.new_chat(project_id)
        elif what in ("json", "markdown"):
            project_files.ask_export(self.ctx, self.store, project_id, what)
        else:
            dialog = self.show_dialog()
            dialog.reload(project_id)
            if what == "delete":
                dialog.ask_delete()

    def _on_fold(self, _project_id: str) -> None:
        """Which projects are folded in the sidebar, kept for the next start (ids of
        projects that exist now only)."""
        known = {row.id for row in self.store.list()}
        folded = sorted(pid for pid in self._win.sidebar.list.collapsed if pid in known)
        self.ctx.settings.update(folded_projects=folded)

    def _read_ahead(self) -> None:
        """A project was saved: read its opening now (the engine keeps it when nothing
        it holds changed), so its next new chat starts warm; not for another model."""
        project = self.dialog.project if self.dialog is not None else None
        info = self.ctx.model.info
        if project is None or info is None:
            return
        wanted = str(project.model.get("path", ""))
        if wanted and wanted != str(info.path):
            return  # its opening is read once that model is loaded, at its next new chat
        params = self._win.sampling_panel.params()
        tools = opening_request(project, self.settings.app_tools(), params)
        self.ctx.client.build_prefix(project, params, tools)

    def project_of(self, project_id: str) -> Project | None:
        """The saved project ``project_id`` (None: gone or unreadable)."""
        try:
            return self.store.load(project_id)
        except ProjectError:
            return None

    def _on_choices_changed(self) -> None:
        box = self.dialog.settings if self.dialog is not None else None
        if box is not None:
            box.refresh()

    # -- the open chat -------------------------------------------------------------------

    def new_chat(self, project_id: str) -> None:
        """A new chat in the project: it starts from its instructions and documents,
        those whose files changed read again first (``app.chat.project_pins``)."""
        try:
            project = self.store.load(project_id)
        except ProjectError as exc:
            self.ctx.notice(f"Could not start a chat in the project: {exc}")
            return
        changed, gone = project_pins.stale(project)
        for path in gone:
            if (project.id, str(path)) not in self._gone_said:
                self._gone_said.add((project.id, str(path)))
                self.ctx.notice(
                    f"{path.name}, pinned to {project.name}, is no longer at {path}: its "
                    "chats use the copy read before."
                )
        if not changed:
            self.ctx.session.new_chat(project)
            return
        names = ", ".join(p.name for p in changed)
        self.ctx.status(f"Reading {names} again: changed since it was pinned…", 5000)
        run_in_background(
            lambda: _read_again(changed),
            lambda got: self._start_refreshed(project, got),
            lambda exc: self._start_refreshed(project, ([], [repr(exc)])),
            owner=self.dialog_action,
        )

    def _start_refreshed(
        self, project: Project, got: tuple[list[dict[str, Any]], list[str]]
    ) -> None:
        """The changed pinned files were read again: saved in the project (a new opening
        follows), then the new chat starts from them."""
        entries, failures = got
        for why in failures:
            self.ctx.notice(f"A pinned document of {project.name} was not read again: {why}")
        if entries:
            try:  # as saved now: the dialog may have changed it while the files were read
                project = self.store.load(project.id)
                project_pins.refreshed(project, entries)
                self.store.save(project)
            except ProjectError as exc:
                self.ctx.notice(f"The project {project.name} could not be saved: {exc}")
            if self.dialog is not None:
                self.dialog.pins_read_again(project)
        self.ctx.session.new_chat(project)

    def move_chat(self, conv_id: str, project_id: str) -> None:
        """Put chat ``conv_id`` in ``project_id`` ("" takes it out of its project)."""
        if conv_id == self.ctx.session.conversation.id:
            self.move_open(project_id)
            return
        try:
            self.ctx.store.set_project(conv_id, project_id)
        except (ConversationError, OSError) as exc:
            self.ctx.notice(f"Could not move the chat: {exc}")
            return
        self._win.refresh_sidebar()

    def move_open(self, project_id: str) -> None:
        """Put the open chat in ``project_id`` ("" takes it out). It keeps its own system
        prompt and documents; a chat being answered is saved with its reply."""
        session = self.ctx.session
        conv = session.conversation
        if conv.project_id == project_id:
            return
        conv.project_id = project_id
        if conv.messages and not session.busy:
            session.save()  # its row follows
        self.update_menus()
        names = {r.id: r.name for r in self.rows()}
        self.ctx.status(
            f"Moved to {names.get(project_id, 'the project')}."
            if project_id
            else "Taken out of its project.",
            5000,
        )

    # -- a project's chats (``ProjectChats``) ----------------------------------------------

    def _chat_ids(self, project_id: str) -> list[tuple[str, str]]:
        rows = self.ctx.store.list()
        return [(r.id, r.title) for r in rows if r.project_id == project_id and not r.error]

    def titles(self, project_id: str) -> list[str]:
        return [title for _id, title in self._chat_ids(project_id)]

    def release(self, project_id: str) -> None:
        """Move the project's chats out of it (they stay, with everything in them)."""
        session = self.ctx.session
        for conv_id, _title in self._chat_ids(project_id):
            if conv_id == session.conversation.id:
                continue
            try:
                self.ctx.store.set_project(conv_id, "")
            except (ConversationError, OSError) as exc:
                self.ctx.notice(f"Could not move a chat out of the project: {exc}")
        if session.conversation.project_id == project_id:
            self.move_open("")
        self._win.refresh_sidebar()

    def delete_chats(self, project_id: str) -> None:
        """Delete the project's chats (the window asked twice)."""
        session = self.ctx.session
        for conv_id, _title in self._chat_ids(project_id):
            session.delete(conv_id)
        if session.conversation.project_id == project_id:  # an empty chat, never saved
            session.conversation.project_id = ""
        self._win.refresh_sidebar()

    def deleted(self, project_id: str) -> None:
        """The project is gone: so are its saved openings (``<data>/prefixes``)."""
        self.ctx.client.forget_prefix(project_id)


def _chat_menu(bar: QMenuBar) -> QMenu:
    for action in bar.actions():
        menu = action.menu()
        if action.text() == CHAT_MENU and isinstance(menu, QMenu):
            return menu
    return bar.addMenu(CHAT_MENU)


def _fill(menu: QMenu, rows: list[ProjectSummary], act: Callable[[str], None]) -> None:
    """``menu`` lists ``rows``, each calling ``act(project_id)``; disabled, saying why,
    when there are none."""
    menu.clear()
    for row in rows:
        menu.addAction(row.name.replace("&", "&&"), partial(act, row.id))
    menu.menuAction().setEnabled(bool(rows))
    menu.menuAction().setToolTip("" if rows else NO_PROJECTS)


def wire_projects(win: ProjectsHost) -> WindowProjects:
    return WindowProjects(win)


def _read_again(paths: list[Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each of ``paths`` read whole (off the GUI thread): the entries, and why any failed."""
    entries: list[dict[str, Any]] = []
    failures: list[str] = []
    for path in paths:
        try:
            entries.append(project_pins.read_pinned_file(path))
        except (DocumentError, OSError) as exc:
            failures.append(f"{path.name}: {exc}")
    return entries, failures
