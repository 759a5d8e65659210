"""The LoRA dock: the ordered adapter stack, each with enable, scale, move and remove.

The panel edits a ``LoraStack`` and reports it; it never touches the engine. The
window sends each reported stack to the engine thread and shows the engine's
answer (``set_applied`` / ``show_error``). Adapters are checked with ``app.gguf.lora``
when added, and again when the model changes, so a file llama.cpp would refuse
is explained here in plain words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from PySide6.QtCore import Qt, Signal, SignalInstance
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QCheckBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMenu,
    QScrollArea,
    QSlider,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gguf.lora import (
    SCALE_MAX,
    SCALE_MIN,
    AdapterInfo,
    LoraError,
    LoraStack,
    read_adapter,
    validate_adapter,
)
from app.util.sysinfo import size_text
from ui.common.qt_util import blocked

log = logging.getLogger(__name__)

SLIDER_STEPS = 100  # slider positions per unit of scale: 0.01 steps
SPIN_STEP = 0.05
ADAPTER_FILTER = "LoRA adapters (*.gguf);;All files (*)"
ERROR_STYLE = "color: #c62828;"
MUTED_STYLE = "color: palette(mid);"


def describe(info: AdapterInfo) -> str:
    """``rank 8 · alpha 16 · 658.0 KB`` (a mixed-rank adapter shows its range)."""
    ranks = info.ranks
    if not ranks:
        return "loaded by the server"
    rank = f"rank {ranks[0]}" if len(ranks) == 1 else f"rank {ranks[0]}–{ranks[-1]}"
    alpha = f"alpha {info.alpha:g}" if info.alpha else "no alpha"
    return f"{rank} · {alpha} · {size_text(info.size)}"


class AdapterRow(QFrame):
    """One adapter's controls.

    Signals:
        enabledToggled(bool): the checkbox changed.
        scaleEdited(float): the scale was set (slider released, key, wheel or spin box).
        moveRequested(int): -1 for up, +1 for down.
        removeRequested(): the remove button was clicked.
    """

    enabledToggled = Signal(bool)
    scaleEdited = Signal(float)
    moveRequested = Signal(int)
    removeRequested = Signal()

    def __init__(
        self, name: str, details: str, problem: str, path: Path, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setObjectName("loraRow")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.enable = QCheckBox(name, self)
        self.enable.setObjectName("loraEnable")
        self.enable.setToolTip(str(path))
        self.enable.toggled.connect(self.enabledToggled)
        self.details = QLabel(problem or details, self)
        self.details.setObjectName("loraDetails")
        self.details.setWordWrap(True)
        self.details.setStyleSheet(ERROR_STYLE if problem else MUTED_STYLE)
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setObjectName("loraScaleSlider")
        self.slider.setRange(round(SCALE_MIN * SLIDER_STEPS), round(SCALE_MAX * SLIDER_STEPS))
        self.slider.setPageStep(SLIDER_STEPS // 10)
        self.slider.setToolTip("Scale: 0 switches the adapter off, negative values invert it")
        self.slider.valueChanged.connect(self._on_slider_moved)
        self.slider.sliderReleased.connect(self._on_slider_released)
        self.spin = QDoubleSpinBox(self)
        self.spin.setObjectName("loraScaleSpin")
        self.spin.setRange(SCALE_MIN, SCALE_MAX)
        self.spin.setDecimals(2)
        self.spin.setSingleStep(SPIN_STEP)
        self.spin.setKeyboardTracking(False)  # a typed number applies on Enter or leaving
        self.spin.valueChanged.connect(self._on_spin_changed)
        self.up = self._button("▲", "loraUp", "Move up", lambda: self.moveRequested.emit(-1))
        self.down = self._button("▼", "loraDown", "Move down", lambda: self.moveRequested.emit(1))
        self.remove = self._button("✕", "loraRemove", "Remove from the stack", self.removeRequested)

        grid = QGridLayout(self)
        grid.setContentsMargins(6, 4, 6, 4)
        grid.addWidget(self.enable, 0, 0, 1, 2)
        buttons = QHBoxLayout()
        buttons.setSpacing(0)
        for b in (self.up, self.down, self.remove):
            buttons.addWidget(b)
        grid.addLayout(buttons, 0, 2)
        grid.addWidget(self.details, 1, 0, 1, 3)
        grid.addWidget(self.slider, 2, 0, 1, 2)
        grid.addWidget(self.spin, 2, 2)
        grid.setColumnStretch(0, 1)

    def _button(
        self, text: str, name: str, tip: str, slot: Callable[[], object] | SignalInstance
    ) -> QToolButton:
        b = QToolButton(self)
        b.setObjectName(name)
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def show_entry(self, scale: float, enabled: bool, first: bool, last: bool) -> None:
        """Show an entry's state without reporting it as an edit."""
        with blocked(self.enable, self.slider, self.spin):
            self.enable.setChecked(enabled)
            self.slider.setValue(round(scale * SLIDER_STEPS))
            self.spin.setValue(scale)
        self.up.setEnabled(not first)
        self.down.setEnabled(not last)

    def _on_slider_moved(self, position: int) -> None:
        with blocked(self.spin):
            self.spin.setValue(position / SLIDER_STEPS)
        if not self.slider.isSliderDown():  # keys and wheel apply at once; a drag on release
            self.scaleEdited.emit(position / SLIDER_STEPS)

    def _on_slider_released(self) -> None:
        self.scaleEdited.emit(self.slider.value() / SLIDER_STEPS)

    def _on_spin_changed(self, value: float) -> None:
        with blocked(self.slider):
            self.slider.setValue(round(value * SLIDER_STEPS))
        self.scaleEdited.emit(round(value, 2))


class LoraPanel(QDockWidget):
    """The ``loraPanel`` dock.

    Signals:
        stackChanged(object): a copy of the edited ``LoraStack``, once per change.
    """

    stackChanged = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("LoRA adapters", parent)
        self.setObjectName("loraPanel")
        self._stack = LoraStack()
        self._reported = LoraStack()
        self._infos: dict[Path, AdapterInfo] = {}
        self._problems: dict[Path, str] = {}
        self._model: Path | None = None
        self._library: list[Path] = []
        self._server: list[Path] | None = None  # a server's adapters (None: this computer's)
        self._last_dir = ""
        self.rows: list[AdapterRow] = []

        body = QWidget(self)
        layout = QVBoxLayout(body)
        self.add_menu = QMenu(self)
        self.add_menu.setObjectName("loraAddMenu")
        self.add_button = QToolButton(body)
        self.add_button.setObjectName("loraAddButton")
        self.add_button.setText("Add adapter…")
        self.add_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.add_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.add_button.setMenu(self.add_menu)
        self.file_action = QAction("From file…", self)
        self.file_action.triggered.connect(self._on_add_from_file)
        self.status = QLabel("", body)
        self.status.setObjectName("loraStatus")
        self.status.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(self.add_button)
        top.addStretch(1)
        layout.addLayout(top)
        self.error = QLabel("", body)
        self.error.setObjectName("loraError")
        self.error.setWordWrap(True)
        self.error.setStyleSheet(ERROR_STYLE)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.hide()
        layout.addWidget(self.error)
        self.empty = QLabel(
            "No adapters. A LoRA adapter (.gguf) changes the model's style or task "
            "without reloading it; several can be stacked, each with its own scale.",
            body,
        )
        self.empty.setObjectName("loraEmpty")
        self.empty.setWordWrap(True)
        self.empty.setStyleSheet(MUTED_STYLE)
        layout.addWidget(self.empty)
        holder = QWidget()
        self._rows_layout = QVBoxLayout(holder)
        self._rows_layout.setContentsMargins(0, 0, 0, 0)
        self._rows_layout.addStretch(1)
        scroll = QScrollArea(body)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(holder)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.status)
        self.setWidget(body)
        self._rebuild_menu()

    # -- what the window calls -------------------------------------------------------

    def stack(self) -> LoraStack:
        """A copy of the stack as edited."""
        return self._stack.copy()

    def summary(self) -> str:
        """For the status bar: ``LoRA: style×0.8, tone×1.0`` (empty without adapters)."""
        return self._stack.summary()

    def set_model(self, path: str | Path | None) -> None:
        """Check the adapters against the model at ``path``; ones that do not fit are switched
        off with the reason shown (the stack is reported if that changed it)."""
        self._model = Path(path) if path is not None else None
        switched_off = []
        for i, entry in enumerate(self._stack):
            problem = self._check(entry.path)
            if problem and entry.enabled:
                self._stack.enable(i, False)
                switched_off.append(problem)
        self._rebuild_rows()
        self.show_error(
            "Switched off: " + " ".join(switched_off) if switched_off else "", keep_status=True
        )
        self._report()

    def set_server_adapters(self, paths: Iterable[str] | None, why_not: str = "") -> None:
        """Offer only the adapters a server loaded (None: back to files on this computer).

        A server's adapters are its files: they are not read here, only scaled. With
        none, the panel is disabled and its tooltip says ``why_not``.
        """
        if paths is None:
            self._server = None
        else:
            self._server = [Path(p) for p in paths]
            self._stack.clear()
            self._reported = LoraStack()
            self._infos.clear()
            self._problems.clear()
            self._rebuild_rows()
        self.widget().setEnabled(self._server is None or bool(self._server))
        self.widget().setToolTip(why_not if self._server == [] else "")
        self._rebuild_menu()

    def set_library_adapters(self, paths: Iterable[str | Path]) -> None:
        """Offer these files (say, the library's adapters) in the Add menu."""
        self._library = [Path(p) for p in paths]
        self._rebuild_menu()

    def set_stack(self, stack: LoraStack) -> None:
        """Show ``stack`` (the engine's, after opening a conversation) without reporting it."""
        self._stack = stack.copy()
        self._reported = stack.copy()
        for entry in self._stack:
            self._check(entry.path)
        self._rebuild_rows()

    def add_adapter(self, path: str | Path, scale: float = 1.0) -> bool:
        """Check ``path`` and append it; on a refusal the reason is shown and False returned."""
        p = Path(path)
        try:
            info = self._validate(p)
            self._stack.push(p, scale)
        except (LoraError, ValueError) as exc:
            self.show_error(str(exc))
            return False
        self._infos[p] = info
        self._problems.pop(p, None)
        self.show_error("")
        self._rebuild_rows()
        self._report()
        return True

    def show_error(self, message: str, keep_status: bool = False) -> None:
        """Show why something was refused (empty hides the message)."""
        self.error.setText(message)
        self.error.setVisible(bool(message))
        if message and not keep_status:
            self.status.setText("")

    def set_applied(self, stack: LoraStack) -> None:
        """The engine's answer: the stack it now uses."""
        text = stack.summary() or "LoRA: none"
        pending = "" if stack == self._stack else " (your latest change is not applied)"
        self.status.setText(f"Applied — {text}{pending}")

    # -- internals -------------------------------------------------------------------

    def _validate(self, path: Path) -> AdapterInfo:
        if self._server is not None:
            if path not in self._server:
                raise LoraError(f"The server did not load {path.name}.")
            return AdapterInfo(path, path.name, 0, 0.0, 0, "", 0, ())
        if self._model is None:
            return read_adapter(path)  # checked against the model once one is loaded
        return validate_adapter(path, self._model)

    def _check(self, path: Path) -> str:
        """Re-read ``path`` (against the model, when known); returns the problem, if any."""
        try:
            self._infos[path] = self._validate(path)
        except LoraError as exc:
            self._problems[path] = str(exc)
            return str(exc)
        self._problems.pop(path, None)
        return ""

    def _rebuild_menu(self) -> None:
        self.add_menu.clear()
        if self._server is not None:
            self.add_menu.addSection("Loaded by the server")
            for path in self._server:
                action = self.add_menu.addAction(path.name)
                action.setToolTip(f"{path} (on the server)")
                action.triggered.connect(lambda _checked=False, p=path: self.add_adapter(p))
            return
        self.add_menu.addAction(self.file_action)
        self.add_menu.addSection("Library")
        if not self._library:
            none = self.add_menu.addAction("No adapters in the library")
            none.setEnabled(False)
        for path in self._library:
            action = self.add_menu.addAction(path.name)
            action.setToolTip(str(path))
            action.setData(str(path))
            action.triggered.connect(lambda _checked=False, p=path: self.add_adapter(p))

    def _rebuild_rows(self) -> None:
        for row in self.rows:
            self._rows_layout.removeWidget(row)
            row.hide()  # deleted on return to the event loop; not drawn meanwhile
            row.deleteLater()
        self.rows = []
        last = len(self._stack) - 1
        for i, entry in enumerate(self._stack):
            info = self._infos.get(entry.path)
            problem = self._problems.get(entry.path, "")
            details = describe(info) if info is not None else ""
            row = AdapterRow(entry.name, details, problem, entry.path)
            row.show_entry(entry.scale, entry.enabled, i == 0, i == last)
            row.enabledToggled.connect(lambda on, r=row: self._on_enabled(r, on))
            row.scaleEdited.connect(lambda value, r=row: self._on_scale(r, value))
            row.moveRequested.connect(lambda delta, r=row: self._on_move(r, delta))
            row.removeRequested.connect(lambda r=row: self._on_remove(r))
            self._rows_layout.insertWidget(i, row)
            self.rows.append(row)
        self.empty.setVisible(not self.rows)

    def _report(self) -> None:
        if self._stack != self._reported:
            self._reported = self._stack.copy()
            self.stackChanged.emit(self._stack.copy())

    def _on_add_from_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Add a LoRA adapter", self._last_dir, ADAPTER_FILTER
        )
        if path:
            self._last_dir = str(Path(path).parent)
            self.add_adapter(path)

    def _on_enabled(self, row: AdapterRow, on: bool) -> None:
        i = self.rows.index(row)
        path = self._stack[i].path
        if on and self._check(path):
            with blocked(row.enable):
                row.enable.setChecked(False)
            self.show_error(self._problems[path])
            return
        self._stack.enable(i, on)
        self._report()

    def _on_scale(self, row: AdapterRow, value: float) -> None:
        self._stack.set_scale(self.rows.index(row), max(SCALE_MIN, min(SCALE_MAX, value)))
        self._report()

    def _on_move(self, row: AdapterRow, delta: int) -> None:
        i = self.rows.index(row)
        if 0 <= i + delta < len(self._stack):
            self._stack.reorder(i, i + delta)
            self._rebuild_rows()
            self._report()

    def _on_remove(self, row: AdapterRow) -> None:
        entry = self._stack.remove(self.rows.index(row))
        self._infos.pop(entry.path, None)
        self._problems.pop(entry.path, None)
        self._rebuild_rows()
        self._report()
