"""Chat → Projects…: make, rename and delete projects, and edit what their new chats
start from (instructions, pinned documents) and what its chats run with (model, preset,
adapters, tools: ``ProjectSettingsBox``, when the window offers its choices). Saved
through ``ProjectStore``.

A pinned document is read whole, as attaching one reads it (``parse_bounded`` in a
bounded child, off the GUI thread), and kept as a copy in the project. Deleting a project
asks what becomes of its chats: kept, moved out of the project (the default), or deleted
with it after a second yes that lists them; the chats themselves are the window's
(``ProjectChats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.project_chat import system_text
from app.chat.project_pins import read_pinned_file
from app.chat.projects import (
    INSTRUCTIONS_MAX,
    MAX_PINNED,
    Project,
    ProjectError,
    ProjectStore,
    name_problem,
)
from app.documents.sources import source_from_dict
from app.engine.token_estimate import estimate_tokens
from app.util.errors import DocumentError
from ui.chat.document_attach import file_filter
from ui.chat.project_settings_box import ProjectChoices, ProjectSettingsBox
from ui.common.background import run_in_background

ID_ROLE = Qt.ItemDataRole.UserRole
KEEP, DELETE = "keep", "delete"  # what ``ask_delete`` answers ("" for Cancel)
TITLES_SHOWN = 20  # chats named in the second question; the rest are counted


class ProjectChats(Protocol):
    """The chats of a project, as the window has them."""

    def titles(self, project_id: str) -> list[str]: ...
    def release(self, project_id: str) -> None: ...
    def delete_chats(self, project_id: str) -> None: ...
    def deleted(self, project_id: str) -> None: ...


def ask_delete(parent: QWidget, name: str, n_chats: int) -> str:
    """What to do with project ``name`` and its ``n_chats`` chats: ``KEEP`` (the default),
    ``DELETE`` (still to be confirmed) or "" (Cancel)."""
    chats = f"{n_chats} chat{'s' if n_chats != 1 else ''}"
    box = QMessageBox(parent)
    box.setObjectName("projectDeleteBox")
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Delete the project")
    box.setText(f"Delete the project {name}?")
    box.setInformativeText(
        "Its chats can stay, moved out of the project, with everything in them."
        if n_chats
        else "It has no chats."
    )
    keep = box.addButton(
        f"Keep its {chats} (moved out of the project)", QMessageBox.ButtonRole.AcceptRole
    )
    drop = box.addButton(
        f"Delete the project and its {chats}…", QMessageBox.ButtonRole.DestructiveRole
    )
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(keep)
    box.exec()
    clicked = box.clickedButton()
    return KEEP if clicked is keep else DELETE if clicked is drop else ""


def confirm_delete_chats(parent: QWidget, name: str, titles: Sequence[str]) -> bool:
    """The second yes before chats are deleted: they are listed by title."""
    shown = [f"• {t}" for t in titles[:TITLES_SHOWN]]
    if len(titles) > TITLES_SHOWN:
        shown.append(f"… and {len(titles) - TITLES_SHOWN} more")
    answer = QMessageBox.question(
        parent,
        "Delete the chats too",
        f"Delete the project {name} and these {len(titles)} chats for good?\n\n" + "\n".join(shown),
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    return answer == QMessageBox.StandardButton.Yes


class ProjectsDialog(QDialog):
    """The projects, and the one selected: its instructions and pinned documents.

    Instructions are saved with Save, and when another project is picked or the dialog
    closes. Signals:
        changed(): a project was made, renamed, edited or deleted.
    """

    changed = Signal()
    exportRequested = Signal(str, str)  # project id, "json" or "markdown"
    importRequested = Signal()

    def __init__(
        self,
        store: ProjectStore,
        chats: ProjectChats,
        parent: QWidget,
        choices: ProjectChoices | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("projectsDialog")
        self.setWindowTitle("Projects")
        self.resize(760, 520)
        self.store, self.chats = store, chats
        self.project: Project | None = None  # the one selected, as saved
        self.reading = 0  # pinned documents being read
        self.list = QListWidget(self)
        self.list.setObjectName("projectList")
        self.list.currentItemChanged.connect(lambda _now, _before: self._follow())
        self.new_button = QPushButton("New…", self)
        self.rename_button = QPushButton("Rename…", self)
        self.delete_button = QPushButton("Delete…", self)
        self.new_button.clicked.connect(self.ask_new)
        self.rename_button.clicked.connect(self.ask_rename)
        self.delete_button.clicked.connect(self.ask_delete)
        self.export_button = QPushButton("Export…", self)
        self.export_button.setObjectName("projectExport")
        export_menu = QMenu(self.export_button)
        export_menu.addAction("As JSON (to import again)…", lambda: self._export("json"))
        export_menu.addAction("As Markdown (to read)…", lambda: self._export("markdown"))
        self.export_button.setMenu(export_menu)
        self.import_button = QPushButton("Import…", self)
        self.import_button.setObjectName("projectImport")
        self.import_button.clicked.connect(self.importRequested.emit)
        self.instructions = QPlainTextEdit(self)
        self.instructions.setObjectName("projectInstructions")
        self.instructions.setPlaceholderText("What every new chat in this project starts from")
        self.instructions.setAccessibleName("Instructions of the project")
        self.instructions.textChanged.connect(self._on_text_changed)
        self.estimate = QLabel(self)
        self.estimate.setObjectName("projectEstimate")
        self.save_button = QPushButton("Save", self)
        self.save_button.setObjectName("projectSave")
        self.save_button.clicked.connect(self.save_instructions)
        self.pinned = QListWidget(self)
        self.pinned.setObjectName("projectPinned")
        self.pinned.setAccessibleName("Pinned documents")
        self.add_button = QPushButton("Add…", self)
        self.remove_button = QPushButton("Remove", self)
        self.add_button.clicked.connect(self.ask_add)
        self.remove_button.clicked.connect(self.remove_selected)
        self.pinned.currentRowChanged.connect(lambda _row: self._enable())
        self.api_box = QCheckBox("Reachable through the local API server", self)
        self.api_box.setObjectName("projectApi")
        self.api_box.setToolTip(
            'API clients may name this project ("project": its name or id) to be '
            "answered with its instructions and documents, starting from its warm opening."
        )
        self.api_box.toggled.connect(self._on_api_toggled)
        self.note = QLabel(self)
        self.note.setObjectName("projectNote")
        self.note.setWordWrap(True)
        # Model, preset, adapters and tools, when the window offers them (saved at once).
        self.settings = ProjectSettingsBox(choices, self) if choices is not None else None
        if self.settings is not None:
            self.settings.edited.connect(self._on_settings_edited)
            self.settings.failed.connect(self.note.setText)
        self._lay_out()
        self.reload()

    def _lay_out(self) -> None:
        left = QVBoxLayout()
        left.addWidget(QLabel("Projects:", self))
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        for button in (self.new_button, self.rename_button, self.delete_button):
            row.addWidget(button)
        left.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(self.export_button)
        row.addWidget(self.import_button)
        left.addLayout(row)
        right = QVBoxLayout()
        right.addWidget(QLabel("Instructions (the system prompt of its new chats):", self))
        right.addWidget(self.instructions, 2)
        row = QHBoxLayout()
        row.addWidget(self.estimate, 1)
        row.addWidget(self.save_button)
        right.addLayout(row)
        right.addWidget(QLabel("Pinned documents (given whole after the instructions):", self))
        right.addWidget(self.pinned, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        row.addStretch(1)
        right.addLayout(row)
        if self.settings is not None:
            right.addWidget(QLabel("Its chats run with:", self))
            right.addWidget(self.settings)
        right.addWidget(self.api_box)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addLayout(right, 2)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(body, 1)
        layout.addWidget(self.note)
        layout.addWidget(buttons)

    # -- the list --------------------------------------------------------------------

    def reload(self, select: str = "") -> None:
        """List the projects again; ``select`` (an id) or the one selected stays selected."""
        select = select or (self.project.id if self.project else "")
        self.list.blockSignals(True)
        self.list.clear()
        for row in self.store.list():
            item = QListWidgetItem(row.name, self.list)
            item.setData(ID_ROLE, row.id)
            item.setToolTip(row.error or row.name)
            if row.error:
                item.setForeground(Qt.GlobalColor.gray)
            if row.id == select:
                self.list.setCurrentItem(item)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        self.list.blockSignals(False)
        self._follow()

    def pins_read_again(self, project: Project) -> None:
        """``project``'s pinned files were read again and saved: shown, if it is the one
        shown (its copy here takes them, so a later save keeps them)."""
        if self.project is not None and self.project.id == project.id:
            self.project.pinned = list(project.pinned)
            self._show_pinned()

    def _export(self, fmt: str) -> None:
        if self.project is not None:
            self.save_instructions()  # what was typed goes with it
            self.exportRequested.emit(self.project.id, fmt)

    def selected_id(self) -> str:
        item = self.list.currentItem()
        return str(item.data(ID_ROLE)) if item is not None else ""

    def _follow(self) -> None:
        """Show the project now selected (what was typed for the last one is saved)."""
        if self.project is not None and self.project.id != self.selected_id():
            self.save_instructions()
        self.project = None
        project_id = self.selected_id()
        if project_id:
            try:
                self.project = self.store.load(project_id)
            except ProjectError as exc:
                self.note.setText(str(exc))
        self.instructions.blockSignals(True)
        self.instructions.setPlainText(self.project.instructions if self.project else "")
        self.instructions.blockSignals(False)
        self.api_box.blockSignals(True)
        self.api_box.setChecked(self.project.api if self.project else False)
        self.api_box.blockSignals(False)
        self._show_pinned()
        if self.settings is not None:
            self.settings.show_project(self.project)
        self._on_text_changed()
        if not self.list.count():
            self.note.setText("No projects yet: New… makes one.")

    def _show_pinned(self) -> None:
        self.pinned.clear()
        for entry in self.project.pinned if self.project else []:
            source = source_from_dict(entry)
            if source is None:
                continue
            item = QListWidgetItem(
                f"{source.name}  (about {estimate_tokens(source.text)} tokens)", self.pinned
            )
            item.setData(ID_ROLE, source.path)
            item.setToolTip(source.path)

    def _enable(self) -> None:
        has = self.project is not None
        for w in (self.rename_button, self.delete_button, self.instructions, self.add_button):
            w.setEnabled(has)
        self.export_button.setEnabled(has)
        self.api_box.setEnabled(has)
        self.save_button.setEnabled(has and self.dirty())
        self.remove_button.setEnabled(has and self.pinned.currentRow() >= 0)

    # -- instructions ----------------------------------------------------------------

    def dirty(self) -> bool:
        """The instructions typed differ from the project's."""
        project = self.project
        return project is not None and self.instructions.toPlainText() != project.instructions

    def _on_text_changed(self) -> None:
        project = self.project
        if project is None:
            self.estimate.setText("")
        else:
            typed = replace(project, instructions=self.instructions.toPlainText())
            n = estimate_tokens(system_text(typed))
            self.estimate.setText(f"A new chat starts from about {n} tokens.")
        self._enable()

    def save_instructions(self) -> bool:
        """Save the instructions typed; False (and a note) when they were not saved."""
        project = self.project
        if project is None or not self.dirty():
            return True
        text = self.instructions.toPlainText()
        if len(text) > INSTRUCTIONS_MAX:
            self.note.setText(
                f"Not saved: instructions can be at most {INSTRUCTIONS_MAX} characters long."
            )
            return False
        project.instructions = text
        return self._save(project, "Instructions saved.")

    def _on_api_toggled(self, on: bool) -> None:
        project = self.project
        if project is None or project.api == on:
            return
        project.api = on
        self._save(project, "Shared with the API." if on else "No longer shared with the API.")

    def _on_settings_edited(self, done: str) -> None:
        if self.project is not None:
            self._save(self.project, done)

    def _save(self, project: Project, done: str) -> bool:
        try:
            self.store.save(project)
        except (ProjectError, OSError) as exc:
            self.note.setText(f"Not saved: {exc}")
            return False
        self.note.setText(done)
        self.changed.emit()
        self._enable()
        return True

    # -- commands ----------------------------------------------------------------------

    def _ask_name(self, title: str, text: str = "") -> str:
        """A name from the user ("" when cancelled); a bad one is asked again, saying why."""
        label = "Name of the project:"
        while True:
            name, ok = QInputDialog.getText(self, title, label, text=text)
            if not ok:
                return ""
            name = name.strip()
            problem = name_problem(name)
            if not problem:
                return name
            self.note.setText(problem)
            label, text = f"{problem}\nName of the project:", name

    def ask_new(self) -> None:
        if not self.save_instructions():
            return
        name = self._ask_name("New project")
        if not name:
            return
        project = Project(name=name)
        if self._save(project, f"Project {name} made."):
            self.reload(project.id)

    def ask_rename(self) -> None:
        project = self.project
        if project is None or not self.save_instructions():
            return
        name = self._ask_name("Rename the project", project.name)
        if name and name != project.name:
            project.name = name
            if self._save(project, f"Renamed to {name}."):
                self.reload(project.id)

    def ask_delete(self) -> None:
        project = self.project
        if project is None:
            return
        titles = self.chats.titles(project.id)
        choice = ask_delete(self, project.name, len(titles))
        if not choice:
            return
        if choice == DELETE and titles and not confirm_delete_chats(self, project.name, titles):
            return
        if choice == DELETE:
            self.chats.delete_chats(project.id)
        else:
            self.chats.release(project.id)
        try:
            self.store.delete(project.id)
        except OSError as exc:
            self.note.setText(f"The project was not deleted: {exc}")
            return
        self.chats.deleted(project.id)
        self.project = None
        self.note.setText(f"Project {project.name} deleted.")
        self.changed.emit()
        self.reload()

    # -- pinned documents ----------------------------------------------------------------

    def ask_add(self) -> None:
        if self.project is None:
            return
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Pin documents to the project", str(Path.home()), file_filter()
        )
        for path in paths:
            self.add_file(Path(path))

    def add_file(self, path: Path) -> None:
        """Read ``path`` whole (off the GUI thread) and pin it to the selected project."""
        project = self.project
        if project is None:
            return
        self.reading += 1
        self.note.setText(f"Reading {path.name}…")
        run_in_background(
            lambda: read_pinned_file(path),
            lambda entry: self._on_read(project.id, entry),
            lambda exc: self._on_read_failed(path, exc),
            owner=self,
        )

    def _on_read(self, project_id: str, entry: dict[str, Any]) -> None:
        self.reading -= 1
        if self.project is not None and self.project.id == project_id:
            project = self.project
        else:  # another project was picked meanwhile: it goes to the one it was for
            try:
                project = self.store.load(project_id)
            except ProjectError as exc:
                self.note.setText(str(exc))
                return
        kept = [e for e in project.pinned if e.get("path") != entry["path"]]
        if len(kept) >= MAX_PINNED:
            self.note.setText(f"A project can pin at most {MAX_PINNED} documents.")
            return
        before, project.pinned = project.pinned, [*kept, {**entry, "n": len(kept) + 1}]
        if not self._save(project, f"{entry['name']} pinned."):
            project.pinned = before
        elif project is self.project:
            self._show_pinned()
            self._on_text_changed()

    def _on_read_failed(self, path: Path, exc: Exception) -> None:
        self.reading -= 1
        why = str(exc) if isinstance(exc, DocumentError | OSError) else repr(exc)
        self.note.setText(f"{path.name} was not pinned: {why}")

    def remove_selected(self) -> None:
        project, item = self.project, self.pinned.currentItem()
        if project is None or item is None:
            return
        path = str(item.data(ID_ROLE))
        project.pinned = [e for e in project.pinned if e.get("path") != path]
        for n, entry in enumerate(project.pinned, 1):
            entry["n"] = n
        if self._save(project, f"{Path(path).name} is no longer pinned."):
            self._show_pinned()
            self._on_text_changed()

    def done(self, result: int) -> None:
        self.save_instructions()  # what was typed is kept
        super().done(result)
