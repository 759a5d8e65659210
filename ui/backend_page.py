"""Hardware and backends: what this llama.cpp build can run on, and how to get more."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.engine.hardware import HardwareInfo
from app.engine.offload import accelerator_hint
from app.util.sysinfo import size_text


class BackendPage(QDialog):
    """Devices llama.cpp reports, GPU offload support, and the system info line."""

    def __init__(
        self, backend: HardwareInfo, system_info: str, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("backendPage")
        self.setWindowTitle("Hardware and backends")
        self.resize(720, 420)
        offload = "yes" if backend.gpu_offload else "no (this build runs on the CPU)"
        self.summary = QLabel(
            f"<b>Backend:</b> {backend.label} &nbsp; <b>GPU offload:</b> {offload}", self
        )
        self.summary.setObjectName("backendSummary")
        self.devices = QTableWidget(len(backend.devices), 4, self)
        self.devices.setObjectName("backendDevices")
        self.devices.setHorizontalHeaderLabels(["Device", "Type", "Description", "Free / total"])
        self.devices.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        for row, d in enumerate(backend.devices):
            memory = (
                f"{size_text(d.free_bytes)} / {size_text(d.total_bytes)}" if d.total_bytes else ""
            )
            for col, text in enumerate((d.name, d.kind, d.description, memory)):
                self.devices.setItem(row, col, QTableWidgetItem(text))
        self.hint = QLabel(accelerator_hint(backend), self)
        self.hint.setObjectName("acceleratorHint")
        self.hint.setWordWrap(True)
        self.hint.setVisible(bool(self.hint.text()))
        info = QLabel(f"<small>{system_info}</small>", self)
        info.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.devices, 1)
        layout.addWidget(self.hint)
        layout.addWidget(info)
        layout.addWidget(buttons)


def system_info() -> str:
    import llama_cpp

    try:
        return str(llama_cpp.llama_print_system_info().decode("utf-8", "replace")).strip()
    except (AttributeError, OSError):
        return ""
