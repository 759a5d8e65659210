"""Recommended models: the model manager's Recommended tab and the rows it shares with the
first-run welcome card.

Each row shows a curated model's download size, the RAM it needs at the current
context size and a fit badge against the memory free now (``app.util.sysinfo``,
read when the view is shown), with one button: "Download and use", "Use" when
the file is already on disk, "Cancel" while it downloads. Embedding models, listed
after them, offer "Download" (into ``<data>/embedders``), "Use for documents", and
show "In use" when documents are indexed with them. The work itself is
``HubServices.installs`` (``ui.models.hub_workers.RecommendedInstalls``).
"""

from __future__ import annotations

import html
import logging

from PySide6.QtCore import Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.models.recommended import (
    FITS,
    TIGHT,
    TOO_BIG,
    UNKNOWN,
    Recommended,
    RecommendedList,
    RecommendedListError,
    fit_badge,
    fit_text,
    load_list,
)
from app.util import sysinfo
from ui.common.resources import resources_dir
from ui.models.hub_workers import RecommendedInstalls

log = logging.getLogger(__name__)

LIST_FILE = "recommended_models.json"
# Readable on light and dark themes alike: white text on a saturated colour.
BADGE_COLOURS = {FITS: "#15803d", TIGHT: "#b45309", TOO_BIG: "#b91c1c", UNKNOWN: "#6b7280"}


def bundled_list() -> RecommendedList:
    """The list shipped in ``resources/`` (tests replace this function).

    Raises:
        RecommendedListError: the file is missing or unusable.
    """
    return load_list(resources_dir() / LIST_FILE)


def memory_line(free: int, total: int) -> str:
    """The free memory line ("9.8 GB of 16.0 GB memory free now"), or that it is unknown."""
    if free <= 0:
        return "The free memory of this computer is unknown, so no model is marked as fitting."
    of = f" of {total / 1e9:.1f} GB" if total > 0 else ""
    return f"{free / 1e9:.1f} GB{of} memory free now."


class FitBadge(QLabel):
    """A coloured "fits" / "tight" / "too big" label; the tooltip gives the figures."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fitBadge")
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setMinimumWidth(64)
        self.badge = UNKNOWN

    def set_fit(self, need: int, free: int) -> None:
        self.badge = fit_badge(need, free)
        figures = fit_text(need, free)
        self.setText("?" if self.badge == UNKNOWN else self.badge)
        self.setToolTip(figures)
        self.setAccessibleName(f"Memory fit: {self.badge}")
        self.setAccessibleDescription(figures)
        self.setStyleSheet(
            f"QLabel {{ background: {BADGE_COLOURS[self.badge]}; color: white; "
            "border-radius: 6px; padding: 2px 8px; font-weight: bold; }"
        )


def kind_badge(parent: QWidget, shown: bool) -> QLabel:
    """The "embedding model" badge of an embedder entry (hidden on chat models)."""
    kind = QLabel("embedding model", parent)
    kind.setObjectName("recommendedKind")
    kind.setToolTip("Turns documents into vectors for search; it does not chat.")
    kind.setAccessibleName("Kind: embedding model")
    kind.setStyleSheet(
        "QLabel { border: 1px solid palette(mid); border-radius: 6px; padding: 2px 8px; }"
    )
    kind.setVisible(shown)
    return kind


class EntryRow(QFrame):
    """One recommended model with its figures, status and action button (``compact``: on
    one line, the description in the tooltip, for the welcome card)."""

    def __init__(
        self,
        entry: Recommended,
        installs: RecommendedInstalls,
        n_ctx: int,
        kv_bytes: float = 2.0,
        parent: QWidget | None = None,
        compact: bool = False,
    ) -> None:
        super().__init__(parent)
        self.entry = entry
        self.setObjectName("recommendedRow")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._installs = installs
        self._n_ctx = n_ctx
        self.need = entry.ram_needed(n_ctx, kv_bytes)
        self._free = 0
        self._failed = False

        title = QLabel(self)
        title.setTextFormat(Qt.TextFormat.RichText)
        facts = f"{entry.params / 1e9:.1f}B parameters · {entry.quant} · {entry.license}"
        where = f"{entry.repo}/{entry.file}"
        self.kind_badge = kind_badge(self, entry.is_embedder)
        if compact:
            facts = f"{sysinfo.size_text(entry.size)} download · needs ~{self.need / 1e9:.1f} GB"
            title.setText(f"<b>{html.escape(entry.name)}</b> &nbsp;<small>{facts}</small>")
            title.setToolTip(f"{entry.description}\n{where}")
        else:
            title.setWordWrap(True)
            title.setText(
                f"<b>{html.escape(entry.name)}</b> &nbsp;<small>{html.escape(facts)}</small>"
                f"<br>{html.escape(entry.description)}"
            )
            title.setToolTip(where)
        self.status_label = QLabel("", self)
        self.status_label.setObjectName("recommendedStatus")
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)
        self.status_label.setWordWrap(True)
        self.status_label.hide()
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(6)
        self.progress.setAccessibleName(f"Download of {entry.name}")
        self.progress.hide()
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(title)
        text.addWidget(self.status_label)
        text.addWidget(self.progress)

        self.size_label = QLabel(f"{sysinfo.size_text(entry.size)}\ndownload", self)
        self.size_label.setToolTip("Approximate; the Hub gives the exact size when it starts.")
        self.ram_label = QLabel("", self)
        for label in (self.size_label, self.ram_label):
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            label.setMinimumWidth(96)
            label.setVisible(not compact)
        self.badge = FitBadge(self)
        self.button = QPushButton("", self)
        self.button.setObjectName("recommendedAction")
        self.button.setMinimumWidth(150)
        self.button.clicked.connect(self._on_clicked)

        row = QHBoxLayout(self)
        row.addLayout(text, 1)
        row.addWidget(self.size_label)
        row.addWidget(self.ram_label)
        row.addWidget(self.kind_badge, 0, Qt.AlignmentFlag.AlignVCenter)
        row.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignVCenter)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignVCenter)

        installs.status.connect(self._on_status)
        installs.failed.connect(self._on_failed)
        installs.embedderChosen.connect(self._on_embedder_chosen)
        self.set_free(0)
        self.update_button()

    # -- state -------------------------------------------------------------------------

    def set_free(self, free: int) -> None:
        """Show the fit against ``free`` bytes of RAM."""
        self._free = free
        self.ram_label.setText(f"needs ~{self.need / 1e9:.1f} GB\nmemory")
        self.ram_label.setToolTip(
            f"Weights, the cache for {min(self._n_ctx, self.entry.context):,} tokens of "
            "context and llama.cpp's buffers."
        )
        self.badge.set_fit(self.need, free)

    def update_button(self) -> None:
        entry = self.entry
        state = self._installs.state(entry.id)
        if state in ("looking", "downloading"):
            text, tip = "Cancel", f"Stop downloading {entry.name}"
        elif state == "paused":
            text, tip = "Resume", f"Go on downloading {entry.name}, then load it"
        elif self._installs.local_path(entry) is not None:
            text, tip = "Use", f"Load {entry.name}, already downloaded"
        else:
            verb = "Retry" if self._failed else "Download and use"
            text, tip = verb, f"Download {entry.name} ({sysinfo.size_text(entry.size)}) and load it"
        if entry.is_embedder and text in ("Use", "Download and use", "Retry"):
            # Into the embedding models folder, then used for documents, not loaded to chat.
            text = "Use for documents" if text == "Use" else text.replace(" and use", "")
            tip = f"{entry.name} turns documents into vectors for search (it does not chat)"
        in_use = text == "Use for documents" and self._installs.in_use(entry)
        if in_use:
            text, tip = "In use", f"Documents are indexed with {entry.name}"
        self.button.setEnabled(not in_use)
        self.button.setText(text)
        self.button.setToolTip(tip)
        self.button.setAccessibleName(f"{text}: {entry.name}")

    @property
    def status_text(self) -> str:
        return "" if self.status_label.isHidden() else self.status_label.text()

    # -- events --------------------------------------------------------------------------

    def _on_clicked(self) -> None:
        entry = self.entry
        if self._installs.state(entry.id) in ("looking", "downloading"):
            self._installs.cancel(entry.id)
            self.update_button()
            return
        if self._installs.local_path(entry) is None and self.badge.badge == TOO_BIG:
            answer = QMessageBox.question(
                self,
                "Model may not fit",
                f"{entry.name} {fit_text(self.need, self._free)}. It may be very slow, or "
                "fail to load. Download it anyway?",
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        self._failed = False
        self._installs.start(entry)
        self.update_button()

    def _on_status(self, entry_id: str, text: str, fraction: float) -> None:
        if entry_id != self.entry.id:
            return
        self.status_label.setStyleSheet("")
        self.status_label.setText(text)
        self.status_label.show()
        downloading = 0.0 <= fraction < 1.0 and self._installs.busy(entry_id)
        looking = fraction < 0 and self._installs.busy(entry_id)
        self.progress.setVisible(downloading or looking)
        if looking:
            self.progress.setRange(0, 0)  # busy indicator
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * max(0.0, min(fraction, 1.0))))
        self.update_button()

    def _on_embedder_chosen(self, _path: str) -> None:
        if self.entry.is_embedder:
            self.update_button()

    def _on_failed(self, entry_id: str, message: str) -> None:
        if entry_id != self.entry.id:
            return
        self._failed = True
        self.progress.hide()
        self.status_label.setText(message)
        self.status_label.setStyleSheet(f"color: {BADGE_COLOURS[TOO_BIG]};")
        self.status_label.show()
        self.update_button()


class EmbedderLine(QWidget):
    """ "Embedding model: <name>" and a "Use built-in" button while another one is chosen."""

    def __init__(
        self, installs: RecommendedInstalls, names: dict[str, str], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._installs = installs
        self._names = names  # file name -> the recommended entry's name
        self.label = QLabel("", self)
        self.label.setObjectName("embedderInUse")
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.button = QPushButton("Use built-in", self)
        self.button.setObjectName("useBuiltinEmbedder")
        self.button.setToolTip("Index documents with the built-in all-MiniLM-L6-v2 model again")
        self.button.clicked.connect(self._on_builtin)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.button)
        installs.embedderChosen.connect(self.update_line)
        self.update_line()

    def update_line(self, _path: str = "") -> None:
        chosen = self._installs.chosen_embedder_file()
        if chosen is None:
            name = "built-in (all-MiniLM-L6-v2)"
        else:
            name = self._names.get(chosen.name, chosen.name)
        self.label.setText(f"Embedding model: {name}")
        self.button.setVisible(chosen is not None)

    def _on_builtin(self) -> None:
        try:
            self._installs.use_builtin_embedder()
        except OSError as exc:
            QMessageBox.warning(
                self, "Embedding model", f"The choice could not be changed: {exc}. Try again."
            )


class RecommendedView(QWidget):
    """The model manager's Recommended tab: every curated model, best first."""

    def __init__(
        self,
        installs: RecommendedInstalls,
        n_ctx: int,
        kv_bytes: float = 2.0,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("recommendedView")
        self.rows: dict[str, EntryRow] = {}  # chat models
        self.embedder_rows: dict[str, EntryRow] = {}  # embedding models, listed after them
        intro = QLabel(
            "Small chat models that run well on a CPU or a small GPU, best first. "
            "The badge compares what each needs with the memory free now.",
            self,
        )
        intro.setWordWrap(True)
        self.memory_label = QLabel("", self)
        self.memory_label.setObjectName("recommendedMemory")
        self.problem_label = QLabel("", self)
        self.problem_label.setObjectName("recommendedProblems")
        self.problem_label.setTextFormat(Qt.TextFormat.PlainText)
        self.problem_label.setWordWrap(True)
        self.problem_label.hide()
        body = QWidget(self)
        rows = QVBoxLayout(body)
        try:
            listing = bundled_list()
        except RecommendedListError as exc:
            log.warning("%s", exc)
            listing = RecommendedList(())
            self._show_problems([str(exc)])
        else:
            self._show_problems(list(listing.problems))
        for entry in listing.entries:
            row = EntryRow(entry, installs, n_ctx, kv_bytes, body)
            self.rows[entry.id] = row
            rows.addWidget(row)
        names = {e.file_name: e.name for e in listing.embedders}
        self.embedder_line = EmbedderLine(installs, names, body)
        if listing.embedders:
            heading = QLabel("<b>Embedding models</b> (for searching your documents)", body)
            heading.setObjectName("recommendedEmbeddersHeading")
            rows.addWidget(heading)
            rows.addWidget(self.embedder_line)
        else:
            self.embedder_line.hide()
        for entry in listing.embedders:
            row = EntryRow(entry, installs, n_ctx, kv_bytes, body)
            self.embedder_rows[entry.id] = row
            rows.addWidget(row)
        rows.addStretch(1)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.memory_label)
        layout.addWidget(self.problem_label)
        layout.addWidget(scroll, 1)
        self.refresh()

    def _show_problems(self, lines: list[str]) -> None:
        if lines:
            self.problem_label.setText("\n".join(lines[:5]))
            self.problem_label.show()

    def refresh(self) -> None:
        """Read the free memory again and update every badge and button."""
        free, total = sysinfo.available_memory(), sysinfo.physical_memory()
        self.memory_label.setText(memory_line(free, total))
        for row in (*self.rows.values(), *self.embedder_rows.values()):
            row.set_free(free)
            row.update_button()
        self.embedder_line.update_line()

    def showEvent(self, event: QShowEvent) -> None:
        self.refresh()
        super().showEvent(event)
