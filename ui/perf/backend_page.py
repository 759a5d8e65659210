"""Hardware and backends: what this llama.cpp build can run on, which of its CPU modules
runs here, the native paths switched off on this machine, and how to get more."""

from __future__ import annotations

import html
import logging
from collections.abc import Callable

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.engine.local.offload import accelerator_hint
from app.engine.native.hardware import HardwareInfo
from app.engine.native.libs import BUILT_IN, VARIANT_ENV
from app.engine.native.paths import PathVerdicts, RiskyPath
from app.util.datafiles import os_reason
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)


class BackendPage(QDialog):
    """Devices llama.cpp reports, GPU offload support, and the system info line."""

    def __init__(
        self,
        backend: HardwareInfo,
        system_info: str,
        parent: QWidget | None = None,
        verdicts: PathVerdicts | None = None,
        on_change: Callable[[], None] | None = None,
        memory: str = "",
    ) -> None:
        """``memory``: how the model in use remembers the conversation (``memory_text``)."""
        super().__init__(parent)
        self.setObjectName("backendPage")
        self.setWindowTitle("Hardware and backends")
        self.resize(760, 560)
        self._verdicts = verdicts
        self._on_change = on_change
        offload = "yes" if backend.gpu_offload else "no (this build runs on the CPU)"
        self.summary = QLabel(
            f"<b>Backend:</b> {backend.label} &nbsp; <b>GPU offload:</b> {offload}", self
        )
        self.summary.setObjectName("backendSummary")
        self.cpu = QLabel(cpu_text(backend), self)
        self.cpu.setObjectName("cpuVariant")
        self.cpu.setWordWrap(True)
        self.memory = QLabel(memory, self)
        self.memory.setObjectName("modelMemory")
        self.memory.setWordWrap(True)
        self.memory.setVisible(bool(memory))
        self.paths = QTableWidget(len(RiskyPath), 4, self)
        self.paths.setObjectName("nativePaths")
        self.paths.setHorizontalHeaderLabels(["Native path", "On this computer", "Why", ""])
        header = self.paths.horizontalHeader()
        for col in (0, 1, 3):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.paths.verticalHeader().setVisible(False)
        self.paths.setWordWrap(True)
        self.paths_note = QLabel(self)
        self.paths_note.setObjectName("nativePathsNote")
        self.paths_note.setWordWrap(True)
        self._fill_paths()
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
        layout.addWidget(self.cpu)
        layout.addWidget(self.memory)
        layout.addWidget(self.paths)
        layout.addWidget(self.paths_note)
        layout.addWidget(self.devices, 1)
        layout.addWidget(self.hint)
        layout.addWidget(info)
        layout.addWidget(buttons)

    def _fill_paths(self) -> None:
        known = self._verdicts.verdicts() if self._verdicts is not None else {}
        off = [p for p, v in known.items() if not v.ok]
        for row, path in enumerate(RiskyPath):
            v = known.get(path)
            if v is None:
                state, why = "on (not checked yet)", "checked before the first model that uses it"
            elif v.ok:
                state, why = "on", f"{v.reason} ({_SOURCES.get(v.source, v.source)})"
            else:
                state, why = "OFF", f"{v.reason} ({_SOURCES.get(v.source, v.source)})"
            self.paths.setItem(row, 0, QTableWidgetItem(path.label))
            self.paths.setItem(row, 1, QTableWidgetItem(state))
            item = QTableWidgetItem(why)
            item.setToolTip(f"Without it, {path.cost}.")
            self.paths.setItem(row, 2, item)
            button = self.paths.cellWidget(row, 3)
            if not isinstance(button, QPushButton):  # made once; its text follows the state
                button = QPushButton(self)
                button.setObjectName(f"nativePath_{path.value}")
                button.setEnabled(self._verdicts is not None)
                button.clicked.connect(lambda _=False, p=path: self._toggle(p))
                self.paths.setCellWidget(row, 3, button)
            button.setText("Check again" if v is not None and not v.ok else "Turn off")
        self.paths.resizeRowsToContents()
        rows = sum(self.paths.rowHeight(r) for r in range(self.paths.rowCount()))
        self.paths.setFixedHeight(rows + self.paths.horizontalHeader().height() + 4)
        if off:
            costs = "; ".join(f"without {p.label}, {p.cost}" for p in off)
            self.paths_note.setText(
                f"Switched off on this computer because they crashed here: {costs}. "
                "A change takes effect at the next model load."
            )
        else:
            self.paths_note.setText(
                "Paths that crash on this computer are switched off and listed here. "
                "A change takes effect at the next model load."
            )

    def _toggle(self, path: RiskyPath) -> None:
        if self._verdicts is None:
            return
        v = self._verdicts.verdict(path)
        try:
            if v is not None and not v.ok:
                self._verdicts.forget(path)  # probed again before its next use
            else:
                self._verdicts.record(path, False, "turned off in Help → Hardware", "user")
        except OSError as exc:
            self.paths_note.setText(f"The change could not be saved ({os_reason(exc)}).")
            return
        log.info("native path %s changed by the user", path.value)
        self._fill_paths()
        if self._on_change is not None:
            self._on_change()


_SOURCES = {"probe": "checked at start", "crash": "after a crash", "user": "by you"}


def cpu_text(backend: HardwareInfo) -> str:
    """The processor, its instruction sets and the llama.cpp CPU module that runs on it."""
    name = html.escape(backend.cpu_name or "unknown processor")
    flags = html.escape(" ".join(backend.cpu_flags) or "not known")
    if backend.cpu_variant == BUILT_IN or not backend.cpu_variant:
        module = "built into this llama.cpp build (made for one CPU type)"
    elif backend.cpu_forced:
        module = f"<b>{backend.cpu_variant}</b>, forced by {VARIANT_ENV}"
    else:
        module = (
            f"<b>{backend.cpu_variant}</b>, the best of this build's "
            f"{len(backend.cpu_variants)} for this processor"
        )
    return (
        f"<b>CPU:</b> {name}<br><b>llama.cpp CPU module:</b> {module}<br>"
        f"<small>Instruction sets: {flags}. Modules in this build: "
        f"{html.escape(', '.join(backend.cpu_variants) or 'one')}.</small>"
    )


def system_info() -> str:
    import llama_cpp

    try:
        return str(llama_cpp.llama_print_system_info().decode("utf-8", "replace")).strip()
    except (AttributeError, OSError):
        return ""
