"""The model manager's Downloads tab: each download of the queue with its progress, and
Pause, Resume and Cancel for the selected ones."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models.downloads import DownloadJob
from app.util.sysinfo import size_text
from ui.models.hub_workers import HubServices, job_summary

ROLE = Qt.ItemDataRole.UserRole


class DownloadsPage(QWidget):
    """The downloads table (``table``), kept up to date by the download thread's reports.

    Signals:
        finished(): a download completed (the library has a new file).
    """

    finished = Signal()

    def __init__(self, services: HubServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._queue = services.queue
        self._rows: dict[str, int] = {}  # job id -> its row
        self.table = QTableWidget(0, 4, self)
        self.table.setObjectName("downloadsTable")
        self.table.setHorizontalHeaderLabels(["Model", "Progress", "Status", "Size"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        buttons = QHBoxLayout()
        self._button("Pause", "pauseButton", lambda: self._control("pause"), buttons)
        self._button("Resume", "resumeButton", lambda: self._control("resume"), buttons)
        self._button("Cancel", "cancelDownloadButton", lambda: self._control("cancel"), buttons)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        services.downloads.progress.connect(self.show_job)
        services.downloads.jobEnded.connect(self._on_job_ended)
        for job in services.queue.jobs:
            self.show_job(job, 0.0, None)

    def _button(
        self, text: str, name: str, slot: Callable[[], None], layout: QHBoxLayout
    ) -> QPushButton:
        b = QPushButton(text, self)
        b.setObjectName(name)
        b.clicked.connect(slot)
        layout.addWidget(b)
        return b

    def show_job(self, job: DownloadJob, rate: float, eta: object) -> None:
        """Add ``job``'s row, or update it (``rate`` and ``eta``: its speed, time left)."""
        row = self._rows.get(job.id)
        table = self.table
        if row is None:
            row = table.rowCount()
            table.insertRow(row)
            self._rows[job.id] = row
            name = QTableWidgetItem(f"{job.repo_id} · {job.name}")
            name.setData(ROLE, job.id)
            table.setItem(row, 0, name)
            new_bar = QProgressBar(table)
            new_bar.setRange(0, 1000)
            table.setCellWidget(row, 1, new_bar)
            table.setItem(row, 2, QTableWidgetItem(""))
            table.setItem(row, 3, QTableWidgetItem(size_text(job.total_bytes)))
        bar = table.cellWidget(row, 1)
        if isinstance(bar, QProgressBar):
            bar.setValue(int(1000 * job.done_bytes / job.total_bytes) if job.total_bytes else 0)
        status = table.item(row, 2)
        if status is not None:
            status.setText(job_summary(job, rate, eta))
            status.setToolTip(job.error)

    def _on_job_ended(self, job: DownloadJob) -> None:
        self.show_job(job, 0.0, None)
        if job.state == "done":
            self.finished.emit()

    def _control(self, action: str) -> None:
        rows = {i.row() for i in self.table.selectedItems()}
        for row in rows:
            item = self.table.item(row, 0)
            if item is None:
                continue
            job_id = str(item.data(ROLE))
            getattr(self._queue, action)(job_id)
            job = next((j for j in self._queue.jobs if j.id == job_id), None)
            if job is not None:
                self.show_job(job, 0.0, None)
