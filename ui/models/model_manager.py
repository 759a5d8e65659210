"""The model manager: Discover (Hub search, repo page, download), Library (local models),
Downloads (``ui.models.downloads_view``), and Recommended (a curated list of small chat
models, ``ui.models.recommended_view``)."""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.models.hub import ModelHit, RepoDetails
from app.models.library import LibraryEntry
from app.models.quant import GgufChoice
from app.models.recommended import UNKNOWN, default_model_name, fit_badge
from app.util.errors import LamplightError
from app.util.sysinfo import available_memory, size_text
from ui.common.context import LoadedModel
from ui.common.open_path import open_path
from ui.models.downloads_view import DownloadsPage
from ui.models.hub_workers import HubServices
from ui.models.recommended_view import RecommendedView

log = logging.getLogger(__name__)

PAGE = 30
ROLE = Qt.ItemDataRole.UserRole


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def fits_hint(size: int, available: int) -> str:
    """Whether a model of ``size`` bytes fits the free RAM, with a margin for its cache
    (the Recommended tab's badge; "" when the free memory is unknown)."""
    badge = fit_badge(int(size * 1.2 + 300e6), available)
    return "" if badge == UNKNOWN else badge


def only_default_model(entries: list[LibraryEntry]) -> bool:
    """Whether the embedded default model is the only usable model in the library."""
    default = default_model_name()
    usable = [e.path.name for e in entries if e.valid and not e.is_adapter]
    return bool(default) and default in usable and all(n == default for n in usable)


class ModelManager(QDialog):
    """Find, download and manage models.

    Signals:
        loadRequested(str): the user chose a model to load.
        defaultRequested(str): the user chose the model to open at start.
        unloadRequested(): a model about to be deleted is in use (its files are deleted
            once the loaded model says it is gone).
        libraryChanged(object): a fresh list of ``LibraryEntry``.
        projectorRequested(str): "Vision projector…" for the model at this path.
    """

    loadRequested = Signal(str)
    defaultRequested = Signal(str)
    unloadRequested = Signal()
    libraryChanged = Signal(object)
    projectorRequested = Signal(str)

    def __init__(
        self,
        services: HubServices,
        model: LoadedModel | None = None,
        n_ctx: int = 4096,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("modelManager")
        self.setWindowTitle("Models")
        self.resize(980, 640)
        self._services = services
        self._model = model
        self._delete_after_unload: tuple[str, Sequence[Path]] | None = None  # (model, files)
        if model is not None:
            model.changed.connect(self._on_model_changed)
        self.n_ctx = n_ctx
        self.imported: list[Path] = []
        self._query = ""
        self._sort = "downloads"
        self._results = 0
        self._search_request = -1
        self._details_request = -1
        self._details: RepoDetails | None = None
        self._entries: list[LibraryEntry] = []
        self._scanned = False  # a first scan with only the default model opens Recommended
        self._scans_pending = 0
        self._tab_chosen = False
        self.path_note: QMessageBox | None = None  # where nothing opened the folder

        self.tabs = QTabWidget(self)
        self.tabs.setObjectName("modelTabs")
        self.tabs.addTab(self._build_discover(), "Discover")
        self.tabs.addTab(self._build_library(), "Library")
        self.downloads_page = DownloadsPage(services, self)
        self.downloads_page.finished.connect(self.refresh_library)
        self.tabs.addTab(self.downloads_page, "Downloads")
        self.recommended = RecommendedView(services.installs, n_ctx, parent=self)
        self.tabs.addTab(self.recommended, "Recommended")
        self.tabs.setTabToolTip(
            self.tabs.indexOf(self.recommended), "Small chat models that run well on this computer"
        )
        self.tabs.tabBarClicked.connect(self._on_tab_clicked)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.setObjectName("modelManagerButtons")
        close.rejected.connect(self.reject)  # Close, like Esc, only hides the window
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(close)

        hub = services.hub
        hub.searchDone.connect(self._on_search_done)
        hub.detailsDone.connect(self._on_details_done)
        hub.libraryDone.connect(self._on_library_done)
        hub.failed.connect(self._on_failed)
        self.refresh_library()

    # -- construction ----------------------------------------------------------------

    def _build_discover(self) -> QWidget:
        page = QWidget(self)
        self.search_box = QLineEdit(page)
        self.search_box.setObjectName("hubSearch")
        self.search_box.setPlaceholderText("Search GGUF models on the Hugging Face Hub…")
        self.search_box.returnPressed.connect(self.search)
        self.sort_box = QComboBox(page)
        self.sort_box.setObjectName("hubSort")
        self.sort_box.addItem("Most downloaded", "downloads")
        self.sort_box.addItem("Recently updated", "recent")
        self.sort_box.addItem("Most liked", "likes")
        self.sort_box.currentIndexChanged.connect(lambda _i: self.search())
        search_button = QPushButton("Search", page)
        search_button.clicked.connect(self.search)
        top = QHBoxLayout()
        top.addWidget(self.search_box, 1)
        top.addWidget(self.sort_box)
        top.addWidget(search_button)

        self.results = QListWidget(page)
        self.results.setObjectName("hubResults")
        self.results.currentItemChanged.connect(self._on_result_selected)
        self.more_button = QPushButton("More results", page)
        self.more_button.setObjectName("moreResults")
        self.more_button.clicked.connect(self.more)
        self.more_button.setEnabled(False)
        left = QWidget(page)
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.results, 1)
        left_layout.addWidget(self.more_button)

        self.repo_title = QLabel("Pick a model on the left.", page)
        self.repo_title.setObjectName("repoTitle")
        # Rich text for the bold name; every value from the Hub in it is escaped.
        self.repo_title.setTextFormat(Qt.TextFormat.RichText)
        self.repo_title.setWordWrap(True)
        self.repo_files = QTableWidget(0, 4, page)
        self.repo_files.setObjectName("repoFiles")
        self.repo_files.setHorizontalHeaderLabels(["File", "Quantization", "Size", "Memory"])
        self.repo_files.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.repo_files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.repo_files.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.repo_files.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.repo_files.itemSelectionChanged.connect(self._update_download_button)
        self.download_button = QPushButton("Download", page)
        self.download_button.setObjectName("downloadButton")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        right = QWidget(page)
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.repo_title)
        right_layout.addWidget(self.repo_files, 1)
        right_layout.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)

        split = QSplitter(page)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([380, 600])
        self.discover_status = QLabel("", page)
        self.discover_status.setObjectName("discoverStatus")
        self.discover_status.setTextFormat(Qt.TextFormat.PlainText)
        self.discover_status.setWordWrap(True)
        layout = QVBoxLayout(page)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        layout.addWidget(self.discover_status)
        return page

    def _build_library(self) -> QWidget:
        page = QWidget(self)
        self.library_table = QTableWidget(0, 8, page)
        self.library_table.setObjectName("libraryTable")
        self.library_table.setHorizontalHeaderLabels(
            [
                "Model",
                "Architecture",
                "Parameters",
                "Quantization",
                "Context",
                "Size",
                "RAM needed",
                "Status",
            ]
        )
        self.library_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.library_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.library_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.library_table.horizontalHeader().setSectionResizeMode(
            0, QHeaderView.ResizeMode.Stretch
        )
        self.library_table.itemSelectionChanged.connect(self._update_library_buttons)
        self.library_table.itemDoubleClicked.connect(lambda _i: self.load_selected())
        buttons = QHBoxLayout()
        self.load_button = self._button("Load", "loadButton", self.load_selected, buttons)
        self.default_button = self._button(
            "Open at start", "defaultButton", self.default_selected, buttons
        )
        self.folder_button = self._button(
            "Show in folder", "showInFolderButton", self.show_selected, buttons
        )
        self.delete_button = self._button("Delete…", "deleteButton", self.delete_selected, buttons)
        self.projector_button = self._button(
            "Vision projector…", "projectorButton", self.projector_selected, buttons
        )
        self.projector_button.setToolTip("Pair the model with its mmproj file so it sees images")
        buttons.addStretch(1)
        self._button("Import…", "importButton", self._on_import, buttons)
        self._button("Rescan", "rescanButton", self.refresh_library, buttons)
        layout = QVBoxLayout(page)
        layout.addWidget(self.library_table, 1)
        layout.addLayout(buttons)
        self._update_library_buttons()
        return page

    def _button(self, text: str, name: str, slot: object, layout: QHBoxLayout) -> QPushButton:
        b = QPushButton(text, self)
        b.setObjectName(name)
        b.clicked.connect(slot)
        layout.addWidget(b)
        return b

    # -- discover --------------------------------------------------------------------

    def search(self) -> None:
        self._query = self.search_box.text()
        self._sort = str(self.sort_box.currentData())
        self.results.clear()
        self._results = 0
        self.discover_status.setText("Searching…")
        self.more_button.setEnabled(False)
        self._search_request = self._services.search(self._query, self._sort, 0, PAGE)

    def more(self) -> None:
        self.more_button.setEnabled(False)
        self.discover_status.setText("Loading more…")
        self._search_request = self._services.search(self._query, self._sort, self._results, PAGE)

    def _on_search_done(self, request: int, hits: list[ModelHit]) -> None:
        if request != self._search_request:
            return
        for hit in hits:
            updated = hit.updated.strftime("%Y-%m-%d") if hit.updated else ""
            lock = (" 🔒" if hit.gated else "") + (" · vision" if hit.vision else "")
            when = f"  · updated {updated}" if updated else ""
            item = QListWidgetItem(
                f"{hit.repo_id}{lock}\n↓ {_count(hit.downloads)}  ♥ {_count(hit.likes)}{when}"
            )
            item.setData(ROLE, hit.repo_id)
            self.results.addItem(item)
        self._results += len(hits)
        self.more_button.setEnabled(len(hits) == PAGE)
        self.discover_status.setText(
            f"{self._results} model{'s' if self._results != 1 else ''}"
            if self._results
            else "No GGUF models match."
        )

    def _on_result_selected(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is None:
            return
        repo_id = str(item.data(ROLE))
        self.repo_title.setText(f"<b>{html.escape(repo_id)}</b> — loading files…")
        self.repo_files.setRowCount(0)
        self._details = None
        self._update_download_button()
        self._details_request = self._services.details(repo_id)

    def _on_details_done(self, request: int, details: RepoDetails) -> None:
        if request != self._details_request:
            return
        self._details = details
        notes = []
        if details.gated:
            notes.append("gated: accept its terms on the Hub and sign in with a token")
        if details.license:
            notes.append(f"license {details.license}")
        projector = self._projector(details)
        if projector is not None:
            notes.append(f"vision: {projector.name} is downloaded with the model")
        if details.refused:
            n = len(details.refused)
            notes.append(f"{n} GGUF file{'s' if n != 1 else ''} with unsafe names or data left out")
        extra = f" <small>({html.escape('; '.join(notes))})</small>" if notes else ""
        title = html.escape(details.repo_id)
        self.repo_title.setText(f"<b>{title}</b>{extra}")
        available = available_memory()
        choices = [c for c in details.choices if c.kind == "model"]
        self.repo_files.setRowCount(len(choices))
        for row, choice in enumerate(choices):
            parts = f" ({len(choice.files)} parts)" if choice.split else ""
            cells = [
                choice.name + parts,
                choice.quant or "?",
                size_text(choice.size),
                fits_hint(choice.size, available),
            ]
            for col, text in enumerate(cells):
                cell = QTableWidgetItem(text)
                cell.setData(ROLE, row)
                self.repo_files.setItem(row, col, cell)
        if not choices:
            self.repo_title.setText(f"<b>{title}</b> has no GGUF model files.{extra}")
        self._choices = choices
        self._update_download_button()

    def _update_download_button(self) -> None:
        self.download_button.setEnabled(
            self._details is not None and bool(self.repo_files.selectedItems())
        )

    def selected_choice(self) -> GgufChoice | None:
        rows = {i.row() for i in self.repo_files.selectedItems()}
        if self._details is None or len(rows) != 1:
            return None
        return self._choices[rows.pop()]

    def download_selected(self) -> None:
        choice = self.selected_choice()
        if choice is None or self._details is None:
            return
        try:
            job = self._services.queue.add(self._details.repo_id, choice, self._details.sha)
        except LamplightError as exc:
            QMessageBox.warning(self, "Cannot download", str(exc))
            return
        self.downloads_page.show_job(job, 0.0, None)
        projector = self._projector(self._details, choice)
        if projector is not None:
            try:  # same folder, so pairing finds it; a finished file is not fetched again
                self.downloads_page.show_job(
                    self._services.queue.add(self._details.repo_id, projector, self._details.sha),
                    0.0,
                    None,
                )
            except LamplightError as exc:
                QMessageBox.warning(self, "Vision projector not downloaded", str(exc))
        self.tabs.setCurrentWidget(self.downloads_page)

    @staticmethod
    def _projector(details: RepoDetails, choice: GgufChoice | None = None) -> GgufChoice | None:
        """The projector downloaded with ``choice`` (or with a model of ``details``)."""
        models = [c for c in details.choices if c.kind == "model"]
        chosen = choice or (models[0] if models else None)
        return details.projector_for(chosen) if chosen is not None else None

    def _on_failed(self, request: int, message: str) -> None:
        if request == self._details_request:
            self.repo_title.setText(html.escape(message))
        elif request == self._search_request:
            self.discover_status.setText(message)
            self.more_button.setEnabled(self._results > 0)
        # Other requests (a Recommended lookup) report where they were made.

    # -- recommended ---------------------------------------------------------------------

    def show_recommended(self) -> None:
        """Open the Recommended tab (Help → Recommended models…, the welcome card)."""
        self._tab_chosen = True
        self.tabs.setCurrentWidget(self.recommended)

    def _on_tab_clicked(self, _index: int) -> None:
        self._tab_chosen = True

    # -- library -------------------------------------------------------------------------

    def refresh_library(self) -> None:
        self._scans_pending += 1
        self._services.scan(self.imported)

    def _on_library_done(self, entries: list[LibraryEntry]) -> None:
        self._entries = entries
        self.recommended.refresh()  # "Use" for what is on disk now
        self._scans_pending = max(0, self._scans_pending - 1)
        if not self._scanned and self._scans_pending == 0:
            # The answer to the latest request (with the imported models) decides, once.
            self._scanned = True
            if not self._tab_chosen and only_default_model(entries):
                self.tabs.setCurrentWidget(self.recommended)
        table = self.library_table
        table.setRowCount(len(entries))
        for row, e in enumerate(entries):
            info = e.info
            params = f"{info.n_params / 1e9:.2f}B" if info and info.n_params else ""
            cells = [
                e.name + (" (loaded)" if str(e.path) == self.loaded_model else ""),
                info.architecture if info else "",
                params,
                (info.file_type or "") if info else "",
                str(info.context_length or "") if info else "",
                size_text(e.size),
                size_text(e.ram_estimate(self.n_ctx)) if info else "",
                ("adapter" if e.is_adapter else "ok") if e.valid else f"invalid: {e.error}",
            ]
            for col, text in enumerate(cells):
                cell = QTableWidgetItem(text)
                cell.setToolTip(f"{e.path}\n{e.error}" if e.error else str(e.path))
                table.setItem(row, col, cell)
        self._update_library_buttons()
        self.libraryChanged.emit(entries)

    def selected_entry(self) -> LibraryEntry | None:
        rows = {i.row() for i in self.library_table.selectedItems()}
        if len(rows) != 1:
            return None
        row = rows.pop()
        return self._entries[row] if row < len(self._entries) else None

    def _update_library_buttons(self) -> None:
        e = self.selected_entry() if hasattr(self, "_entries") else None
        usable = e is not None and e.valid and not e.is_adapter
        self.load_button.setEnabled(usable)
        self.default_button.setEnabled(usable)
        self.folder_button.setEnabled(e is not None)
        self.delete_button.setEnabled(e is not None and e.source == "models")
        self.projector_button.setEnabled(usable)

    def load_selected(self) -> None:
        e = self.selected_entry()
        if e is not None and e.valid and not e.is_adapter:
            self.loadRequested.emit(str(e.path))

    def projector_selected(self) -> None:
        e = self.selected_entry()
        if e is not None and e.valid and not e.is_adapter:
            self.projectorRequested.emit(str(e.path))

    def default_selected(self) -> None:
        e = self.selected_entry()
        if e is not None and e.valid:
            self.defaultRequested.emit(str(e.path))

    def show_selected(self) -> None:
        e = self.selected_entry()
        if e is not None:
            self.path_note = open_path(self, e.path.parent, "the model's folder")

    def delete_selected(self) -> None:
        e = self.selected_entry()
        if e is None or e.source != "models":
            return
        files = e.files
        what = (
            e.path.name
            if len(files) == 1
            else f"{e.path.name} and its other {len(files) - 1} parts"
        )
        answer = QMessageBox.question(
            self,
            "Delete model",
            f"Delete {what} ({size_text(e.size)}) from disk? This cannot be undone.",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        if str(e.path) == self.loaded_model:
            # The file is deleted once the engine let go of it, never while the unload
            # is still queued behind a reply.
            self._delete_after_unload = (str(e.path), files)
            self.unloadRequested.emit()
            return
        self._delete(files)

    @property
    def loaded_model(self) -> str | None:
        """The in-process model's file (None: none, or a server)."""
        return self._model.local_path if self._model is not None else None

    def _on_model_changed(self, _info: object) -> None:
        pending = self._delete_after_unload
        if pending is not None and self.loaded_model != pending[0]:
            self._delete_after_unload = None
            self._delete(pending[1])

    def _delete(self, files: Sequence[Path]) -> None:
        for path in files:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                QMessageBox.warning(self, "Could not delete", f"{path}: {exc.strerror}")
                break
        self.refresh_library()

    def _on_import(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Import GGUF models", str(Path.home()), "GGUF models (*.gguf)"
        )
        self.import_paths([Path(p) for p in paths])

    def import_paths(self, paths: list[Path]) -> None:
        """List files where they are (no copy)."""
        for p in paths:
            if p not in self.imported:
                self.imported.append(p)
        self.refresh_library()
