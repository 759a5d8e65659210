"""One row of controls per ``FieldSpec``: caption, editor, optional slider, reset button.

Sliders: floats and int ranges up to ``LOG_SLIDER_SPAN`` wide move one ``step`` per
position. Wider int ranges (max new tokens, penalty window, context size) get a slider
over "nice" stops (1, 2, 3, 4, 6, 8, 12, 16, ... inside the range), so the common values
get most of its travel; their spin box still takes any value, and the slider then sits at
the nearest stop. Ranges wider than ``NO_SLIDER_SPAN`` (the seed) have no slider at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QAbstractSlider,
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QPlainTextEdit,
    QSlider,
    QSpinBox,
    QToolButton,
    QWidget,
)

from app.config.field_spec import FieldSpec
from ui.common.qt_util import blocked

LOG_SLIDER_SPAN = 4096  # int ranges wider than this get a slider over nice stops
NO_SLIDER_SPAN = 2**20  # ... and wider than this none (a slider over seeds means nothing)
TEXT_HEIGHT = 84  # px: about four lines for schemas, grammars and stop strings
INVALID_STYLE = "border: 2px solid #d32f2f;"
RELOAD_STYLE = "color: #b26a00; font-weight: bold;"
# What a number field's lowest value means, shown instead of the number.
SPECIAL_TEXT = {"thinking_budget": "no limit"}


def nice_stops(lo: int, hi: int) -> list[int]:
    """``lo``, ``hi``, 0 and the values 1, 2, 3, 4, 6, 8, 12, ... that lie between."""
    stops = {lo, hi}
    if lo < 0 < hi:
        stops.add(0)
    k = 1
    while k < hi:
        stops.update(v for v in (k, k * 3 // 2) if lo < v < hi)
        k *= 2
    return sorted(stops)


def has_slider(spec: FieldSpec) -> bool:
    """Whether ``spec`` gets a slider: a bounded number no wider than ``NO_SLIDER_SPAN``."""
    if spec.kind not in ("float", "int") or spec.minimum is None or spec.maximum is None:
        return False
    return spec.maximum - spec.minimum <= NO_SLIDER_SPAN


class SliderMap:
    """Slider positions ``0 .. count - 1`` to a numeric field's values and back."""

    def __init__(self, spec: FieldSpec) -> None:
        assert spec.minimum is not None and spec.maximum is not None
        self.spec = spec
        self.lo, self.hi = spec.minimum, spec.maximum
        self.stops: list[int] | None = None
        if spec.kind == "int" and self.hi - self.lo > LOG_SLIDER_SPAN:
            self.stops = nice_stops(int(self.lo), int(self.hi))
            self.count = len(self.stops)
        else:
            self.count = round((self.hi - self.lo) / spec.step) + 1

    def value(self, position: int) -> float | int:
        """The field's value at slider ``position``."""
        if self.stops is not None:
            return self.stops[position]
        value = min(self.hi, self.lo + position * self.spec.step)
        return round(value) if self.spec.kind == "int" else round(value, self.spec.decimals)

    def position(self, value: float) -> int:
        """The slider position for ``value`` (the nearest stop when it lies between)."""
        if self.stops is None:
            return max(0, min(self.count - 1, round((value - self.lo) / self.spec.step)))
        # nearest stop on a log scale, shifted so the range starts at 1
        target = math.log(max(value, self.lo) - self.lo + 1)
        distances = [abs(math.log(s - self.lo + 1) - target) for s in self.stops]
        return distances.index(min(distances))


def format_value(value: Any, spec: FieldSpec | None = None) -> str:
    """``value`` as a reset button's tooltip names it."""
    if spec is not None and spec.name in SPECIAL_TEXT and value == spec.minimum:
        return SPECIAL_TEXT[spec.name]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(repr(v) for v in value) or "none"
    if value == "":
        return "empty"
    return str(value)


class WheelGuard(QObject):
    """Wheel events over an unfocused control scroll the panel instead of changing it."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (
            event.type() == QEvent.Type.Wheel
            and isinstance(watched, QWidget)
            and not watched.hasFocus()
        ):
            event.ignore()  # passed on to the parent: the scroll area
            return True
        return False


class FieldRow:
    """The controls of one ``FieldSpec``: caption, editor, optional slider, reset button.

    Args:
        spec: the setting the row edits.
        parent: the widget the controls go in.
        edited: called with the field's name after each user edit (not after ``set_value``).
        guard: event filter installed on wheel-sensitive controls (a ``WheelGuard``).
    """

    def __init__(
        self, spec: FieldSpec, parent: QWidget, edited: Callable[[str], None], guard: QObject
    ) -> None:
        self.spec = spec
        self._edited = edited
        self.note = ""  # a line added to the tooltip: what works only in part, and why
        self.slider: QSlider | None = None
        self.map: SliderMap | None = None
        self.editor = self._make_editor(parent)
        self.editor.setObjectName(f"field_{spec.name}")
        self.editor.setToolTip(spec.help)
        if isinstance(self.editor, QCheckBox):
            self.caption: QLabel | QCheckBox = self.editor
        else:
            self.caption = QLabel(spec.label, parent)
            self.caption.setToolTip(spec.help)
            self.caption.setBuddy(self.editor)
        if has_slider(spec):
            self.map = SliderMap(spec)
            self.slider = QSlider(Qt.Orientation.Horizontal, parent)
            self.slider.setObjectName(f"slider_{spec.name}")
            self.slider.setToolTip(spec.help)
            self.slider.setRange(0, self.map.count - 1)
            self.slider.setMinimumWidth(60)
            self.slider.valueChanged.connect(self._on_slider_moved)
        for w in (self.editor, self.slider):
            if isinstance(w, QAbstractSlider | QAbstractSpinBox | QComboBox):
                w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
                w.installEventFilter(guard)
        self.reset = QToolButton(parent)
        self.reset.setObjectName(f"reset_{spec.name}")
        self.reset.setText("↺")
        self.reset.setAutoRaise(True)
        self.reset.setToolTip(
            f"Reset {spec.label} to its default ({format_value(spec.default, spec)})"
        )
        self.reset.clicked.connect(self._on_reset)

    def set_unavailable(self, why: str) -> None:
        """Disable the field with ``why`` as its tooltip ("" enables it again)."""
        tip = why or "\n\n".join(t for t in (self.spec.help, self.note) if t)
        for w in (self.editor, self.slider, self.caption, self.reset):
            if w is not None:
                w.setEnabled(not why)
                w.setToolTip(tip)

    def _make_editor(self, parent: QWidget) -> QWidget:
        spec = self.spec
        if spec.kind in ("float", "int"):
            assert spec.minimum is not None and spec.maximum is not None
            spin: QSpinBox | QDoubleSpinBox
            if spec.kind == "float":
                spin = QDoubleSpinBox(parent)
                spin.setDecimals(spec.decimals)
                spin.setRange(spec.minimum, spec.maximum)
                spin.setSingleStep(spec.step)
            else:
                spin = QSpinBox(parent)
                spin.setRange(int(spec.minimum), int(spec.maximum))
                spin.setSingleStep(max(1, int(spec.step)))
            if spec.name in SPECIAL_TEXT:
                spin.setSpecialValueText(SPECIAL_TEXT[spec.name])
            spin.setKeyboardTracking(False)  # typed numbers apply on Enter or leaving the box
            spin.setAlignment(Qt.AlignmentFlag.AlignRight)
            spin.valueChanged.connect(self._on_spin_changed)
            return spin
        if spec.kind == "bool":
            box = QCheckBox(spec.label, parent)
            box.toggled.connect(self._on_changed)
            return box
        if spec.kind == "choice":
            combo = QComboBox(parent)
            for choice in spec.choices:
                combo.addItem(choice.replace("_", " "), choice)
            combo.currentIndexChanged.connect(self._on_changed)
            return combo
        if spec.kind in ("text", "list"):
            edit = QPlainTextEdit(parent)
            edit.setFixedHeight(TEXT_HEIGHT)
            edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
            edit.setPlaceholderText("One per line" if spec.kind == "list" else spec.label)
            edit.setTabChangesFocus(spec.kind == "list")
            edit.textChanged.connect(self._on_changed)
            return edit
        raise ValueError(f"{spec.name}: no control for kind {spec.kind!r}")

    # -- value -----------------------------------------------------------------------

    def value(self) -> Any:
        """The value the control shows, in the field's type (not yet validated)."""
        w, kind = self.editor, self.spec.kind
        if isinstance(w, QDoubleSpinBox):
            return round(w.value(), self.spec.decimals)
        if isinstance(w, QSpinBox):
            return w.value()
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, QPlainTextEdit):
            text = w.toPlainText()
            return tuple(line for line in text.splitlines() if line) if kind == "list" else text
        raise TypeError(type(w))

    def set_value(self, value: Any) -> None:
        """Show ``value`` without reporting it as an edit."""
        w = self.editor
        widgets: list[QObject] = [w] if self.slider is None else [w, self.slider]
        with blocked(*widgets):
            if isinstance(w, QDoubleSpinBox | QSpinBox):
                w.setValue(value)
                if self.slider is not None and self.map is not None:
                    self.slider.setValue(self.map.position(value))
            elif isinstance(w, QCheckBox):
                w.setChecked(bool(value))
            elif isinstance(w, QComboBox):
                w.setCurrentIndex(max(0, w.findData(value)))
            elif isinstance(w, QPlainTextEdit):
                text = "\n".join(value) if self.spec.kind == "list" else str(value)
                if text != w.toPlainText():  # keeps the cursor when nothing changes
                    w.setPlainText(text)

    def set_invalid(self, invalid: bool) -> None:
        """Outline the editor while its value is invalid."""
        if bool(self.editor.property("invalid")) != invalid:
            self.editor.setProperty("invalid", invalid)
            self.editor.setStyleSheet(INVALID_STYLE if invalid else "")

    def set_reload_mark(self, changed: bool) -> None:
        """Mark the caption while the value differs from the loaded model's."""
        self.caption.setText(f"{self.spec.label} ⟳" if changed else self.spec.label)
        self.caption.setStyleSheet(RELOAD_STYLE if changed else "")
        note = "\n\nChanged: takes effect when the model is reloaded." if changed else ""
        self.caption.setToolTip(self.spec.help + note)

    # -- slots -----------------------------------------------------------------------

    def _on_slider_moved(self, position: int) -> None:
        assert self.map is not None
        value, spin = self.map.value(position), self.editor
        # -> _on_spin_changed reports the edit
        if isinstance(spin, QSpinBox):
            spin.setValue(int(value))
        elif isinstance(spin, QDoubleSpinBox):
            spin.setValue(float(value))

    def _on_spin_changed(self, value: float) -> None:
        if self.slider is not None and self.map is not None:
            with blocked(self.slider):
                self.slider.setValue(self.map.position(value))
        self._edited(self.spec.name)

    def _on_changed(self) -> None:
        self._edited(self.spec.name)

    def _on_reset(self) -> None:
        self.set_value(self.spec.default)
        self._edited(self.spec.name)
