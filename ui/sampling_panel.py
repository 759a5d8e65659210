"""The sampling dock: every setting in ``app.config.params.SPECS``, presets, validation.

The panel holds no list of settings of its own: each ``FieldSpec`` becomes a row of
controls chosen by its ``kind``, in a collapsible section named by its ``group``.

Sliders: floats and int ranges up to ``LOG_SLIDER_SPAN`` wide move one ``step`` per
position. Wider int ranges (max new tokens, penalty window, context size) get a slider
over "nice" stops (1, 2, 3, 4, 6, 8, 12, 16, ... inside the range), so the common values
get most of its travel; their spin box still takes any value, and the slider then sits at
the nearest stop. Ranges wider than ``NO_SLIDER_SPAN`` (the seed) have no slider at all.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QAbstractSlider,
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config.params import (
    GROUPS,
    SPEC_BY_NAME,
    SPECS,
    FieldSpec,
    LoadConfig,
    SamplingParams,
    SettingError,
    validate_load,
    validate_sampling,
)
from app.config.presets import PresetStore
from app.util.atomic import atomic_write_text
from ui.qt_util import blocked

log = logging.getLogger(__name__)

GROUP_TITLES = {
    "basic": "Basic",
    "advanced": "Advanced",
    "structured": "Structured output",
    "speculative": "Speculative decoding",
    "model": "Model (applied on reload)",
}
OPEN_GROUPS = ("basic", "model")  # sections open at start; the others start collapsed
LOG_SLIDER_SPAN = 4096  # int ranges wider than this get a slider over nice stops
NO_SLIDER_SPAN = 2**20  # ... and wider than this none (a slider over seeds means nothing)
TEXT_HEIGHT = 84  # px: about four lines for schemas, grammars and stop strings
PRESET_FILTER = "Lamplight presets (*.json);;All files (*)"
INVALID_STYLE = "border: 2px solid #d32f2f;"
ERROR_STYLE = "color: #c62828;"
RELOAD_STYLE = "color: #b26a00; font-weight: bold;"

Config = TypeVar("Config", SamplingParams, LoadConfig)


def validate_partly(
    values: dict[str, Any], last: Config, validate: Callable[[dict[str, Any], Config], Config]
) -> tuple[Config, dict[str, str]]:
    """The valid part of ``values`` applied to ``last``, and a message per bad field.

    A bad field keeps its ``last`` value while the other edits apply. When the fault is in
    how fields of one group combine (an output format whose schema is not usable yet), the
    group's changed fields all keep their ``last`` values.
    """
    values = dict(values)
    errors: dict[str, str] = {}
    for _ in range(len(values) + 1):
        try:
            return validate(values, last), errors
        except SettingError as exc:
            errors.setdefault(exc.field, str(exc))
            spec = SPEC_BY_NAME.get(exc.field)
            if exc.field not in values:
                break
            undo = [exc.field] if values[exc.field] != getattr(last, exc.field) else []
            if not undo and spec is not None:
                undo = [
                    s.name
                    for s in SPECS
                    if s.group == spec.group
                    and s.name in values
                    and values[s.name] != getattr(last, s.name)
                ]
            if not undo:
                break
            values.update({name: getattr(last, name) for name in undo})
    return last, errors


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
        if self.stops is not None:
            return self.stops[position]
        value = min(self.hi, self.lo + position * self.spec.step)
        return round(value) if self.spec.kind == "int" else round(value, self.spec.decimals)

    def position(self, value: float) -> int:
        if self.stops is None:
            return max(0, min(self.count - 1, round((value - self.lo) / self.spec.step)))
        # nearest stop on a log scale, shifted so the range starts at 1
        target = math.log(max(value, self.lo) - self.lo + 1)
        distances = [abs(math.log(s - self.lo + 1) - target) for s in self.stops]
        return distances.index(min(distances))


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(repr(v) for v in value) or "none"
    if value == "":
        return "empty"
    return str(value)


class _WheelGuard(QObject):
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


class _Field:
    """The controls of one ``FieldSpec``: caption, editor, optional slider, reset button."""

    def __init__(
        self, spec: FieldSpec, parent: QWidget, edited: Callable[[str], None], guard: QObject
    ) -> None:
        self.spec = spec
        self._edited = edited
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
        self.reset.setToolTip(f"Reset {spec.label} to its default ({format_value(spec.default)})")
        self.reset.clicked.connect(self._on_reset)

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


class _Section(QWidget):
    """A titled section whose body folds away."""

    def __init__(self, group: str, title: str, parent: QWidget) -> None:
        super().__init__(parent)
        self.setObjectName(f"section_{group}")
        self.toggle = QToolButton(self)
        self.toggle.setObjectName(f"sectionToggle_{group}")
        self.toggle.setText(title)
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.toggle.setStyleSheet("QToolButton { font-weight: bold; border: none; }")
        self.body = QFrame(self)
        self.body.setFrameShape(QFrame.Shape.StyledPanel)
        self.grid = QGridLayout(self.body)
        self.grid.setContentsMargins(8, 6, 4, 6)
        self.grid.setHorizontalSpacing(6)
        self.grid.setVerticalSpacing(4)
        self.grid.setColumnStretch(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle)
        layout.addWidget(self.body)
        self.toggle.toggled.connect(self._on_toggled)
        self.toggle.setChecked(True)

    def _on_toggled(self, open_: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        self.body.setVisible(open_)

    def add(self, field: _Field) -> None:
        """One row per field (text fields: caption row, then the editor full width)."""
        grid, row = self.grid, self.grid.rowCount()
        if field.spec.kind in ("text", "list"):
            grid.addWidget(field.caption, row, 0, 1, 3)
            grid.addWidget(field.reset, row, 3)
            grid.addWidget(field.editor, row + 1, 0, 1, 4)
        elif field.spec.kind == "bool":
            grid.addWidget(field.caption, row, 0, 1, 3)
            grid.addWidget(field.reset, row, 3)
        else:
            grid.addWidget(field.caption, row, 0)
            if field.slider is not None:
                grid.addWidget(field.slider, row, 1)
                grid.addWidget(field.editor, row, 2)
            else:
                grid.addWidget(field.editor, row, 1, 1, 2)
            grid.addWidget(field.reset, row, 3)


class SamplingPanel(QDockWidget):
    """Sampling and model settings built from ``SPECS``, with presets.

    Every edit is validated at once. A valid sampling change is in force for the next
    reply; a bad one is shown (``errorLabel``, the field outlined) while the last valid
    value stays in force. Model settings wait for "Apply and reload".

    Signals:
        samplingChanged(object): the new validated ``SamplingParams``.
        reloadRequested(object): the ``LoadConfig`` the user wants the model reloaded with.
        presetsChanged(): the ``PresetStore`` changed (preset saved, renamed, deleted or
            imported, or a model default set).
    """

    samplingChanged = Signal(object)
    reloadRequested = Signal(object)
    presetsChanged = Signal()

    def __init__(
        self,
        presets: PresetStore,
        params: SamplingParams,
        load: LoadConfig,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__("Sampling", parent)
        self.setObjectName("samplingPanel")
        self._store = presets
        self._params = params  # last valid, in force
        self._loaded = load  # the loaded model's config: the reload mark's baseline
        self._load = load  # last valid edited config
        self._values: dict[str, Any] = {}  # what the controls show, valid or not
        self._errors: dict[str, str] = {}  # field -> message, sampling fields
        self._load_errors: dict[str, str] = {}
        self._preset: str | None = None
        self._model_key: str | None = None
        self._fields: dict[str, _Field] = {}
        self._sections: dict[str, _Section] = {}
        self._guard = _WheelGuard(self)
        self._build()
        self._show(params, load)
        self._preset = self._matching_preset()
        self._fill_picker()
        self._refresh()

    # -- construction ----------------------------------------------------------------

    def _build(self) -> None:
        root = QWidget(self)
        layout = QVBoxLayout(root)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(6)
        layout.addLayout(self._build_presets(root))

        content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        groups = [*GROUPS, *sorted({s.group for s in SPECS} - set(GROUPS))]
        for group in groups:
            specs = [s for s in SPECS if s.group == group]
            if not specs:
                continue
            section = _Section(group, GROUP_TITLES.get(group, group.capitalize()), content)
            for spec in specs:
                field = _Field(spec, section.body, self._on_field_edited, self._guard)
                self._fields[spec.name] = field
                section.add(field)
            section.toggle.setChecked(group in OPEN_GROUPS)
            self._sections[group] = section
            column.addWidget(section)
        column.addStretch(1)
        self._align_columns()
        scroll = QScrollArea(root)
        scroll.setObjectName("samplingScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.setWidget(content)
        layout.addWidget(scroll, 1)

        self.error_label = QLabel(root)
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(ERROR_STYLE)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()
        layout.addWidget(self.error_label)

        self.reload_notice = QLabel(root)
        self.reload_notice.setObjectName("reloadNotice")
        self.reload_notice.setWordWrap(True)
        self.reload_notice.setStyleSheet(RELOAD_STYLE)
        self.reload_button = QPushButton("Apply and reload", root)
        self.reload_button.setObjectName("reloadButton")
        self.reload_button.setToolTip("Reload the model with the changed model settings")
        self.reload_button.clicked.connect(self._on_reload_clicked)
        reload_row = QHBoxLayout()
        reload_row.addWidget(self.reload_notice, 1)
        reload_row.addWidget(self.reload_button)
        layout.addLayout(reload_row)
        self.setWidget(root)

    def _build_presets(self, parent: QWidget) -> QVBoxLayout:
        self.preset_picker = QComboBox(parent)
        self.preset_picker.setObjectName("presetPicker")
        self.preset_picker.setPlaceholderText("Custom")
        self.preset_picker.setToolTip("Choose a preset: it sets every sampling field.")
        self.preset_picker.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.preset_picker.setMinimumContentsLength(8)
        self.preset_picker.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.preset_picker.currentIndexChanged.connect(self._on_preset_chosen)
        self.preset_picker.activated.connect(self._on_preset_chosen)  # same item: drop edits

        def button(name: str, text: str, tip: str, slot: Callable[[], None]) -> QToolButton:
            b = QToolButton(parent)
            b.setObjectName(name)
            b.setText(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            return b

        self.save_preset_button = button(
            "savePresetButton", "Save as…", "Save these settings as a preset", self._on_save
        )
        self.rename_preset_button = button(
            "renamePresetButton", "Rename…", "Rename this preset", self._on_rename
        )
        self.delete_preset_button = button(
            "deletePresetButton", "Delete", "Delete this preset", self._on_delete
        )
        self.import_preset_button = button(
            "importPresetButton", "Import…", "Add a preset from a JSON file", self._on_import
        )
        self.export_preset_button = button(
            "exportPresetButton", "Export…", "Save this preset to a JSON file", self._on_export
        )
        self.model_default_button = button(
            "modelDefaultButton",
            "Default for this model",
            "Use this preset whenever this model is loaded",
            self._on_model_default,
        )
        top = QHBoxLayout()
        top.addWidget(QLabel("Preset", parent))
        top.addWidget(self.preset_picker, 1)
        top.addWidget(self.model_default_button)
        actions = QHBoxLayout()
        for b in (
            self.save_preset_button,
            self.rename_preset_button,
            self.delete_preset_button,
            self.import_preset_button,
            self.export_preset_button,
        ):
            actions.addWidget(b)
        actions.addStretch(1)
        box = QVBoxLayout()
        box.setSpacing(4)
        box.addLayout(top)
        box.addLayout(actions)
        return box

    def _align_columns(self) -> None:
        """Same caption and spin box widths in every section, so the sliders line up."""
        captions = [f.caption for f in self._fields.values() if isinstance(f.caption, QLabel)]
        spins = [f.editor for f in self._fields.values() if f.slider is not None]
        for group in (captions, spins):
            width = max((w.sizeHint().width() for w in group), default=0)
            for w in group:
                w.setMinimumWidth(width)

    # -- public API ------------------------------------------------------------------

    def params(self) -> SamplingParams:
        """The sampling settings in force: the last valid ones."""
        return self._params

    def set_params(self, params: SamplingParams) -> None:
        """Show ``params`` as the settings in force (no signal).

        The chosen preset stays (marked modified if it differs); with none chosen, a preset
        equal to ``params`` is picked.
        """
        self._params = params
        self._errors = {}
        self._show(params, None)
        if self._preset is None:
            self._preset = self._matching_preset()
            self._sync_picker()
        self._refresh()

    def load_config(self) -> LoadConfig:
        """The model settings as edited (the loaded config with the panel's changes)."""
        return self._load

    def set_load(self, load: LoadConfig) -> None:
        """Take ``load`` as the loaded model's config: shown, and the reload mark's baseline."""
        self._loaded = self._load = load
        self._load_errors = {}
        self._show(None, load)
        self._refresh()

    @property
    def model_key(self) -> str | None:
        """The loaded model's key for per-model default presets (None: no model)."""
        return self._model_key

    @model_key.setter
    def model_key(self, key: str | None) -> None:
        self._model_key = key
        self._refresh()

    def select_preset(self, name: str) -> None:
        """Choose preset ``name``: every sampling field takes its value.

        Emits ``samplingChanged`` if that changes the settings in force.

        Raises:
            PresetError: there is no such preset.
        """
        params = self._store.get(name)
        self._preset = name
        self._sync_picker()
        self._errors = {}
        self._show(params, None)
        self._commit(params)
        self._refresh()

    # -- state -----------------------------------------------------------------------

    def _show(self, params: SamplingParams | None, load: LoadConfig | None) -> None:
        for name, field in self._fields.items():
            source = params if field.spec.target == "sampling" else load
            if source is not None:
                value = getattr(source, name)
                self._values[name] = value
                field.set_value(value)

    def _sampling_values(self) -> dict[str, Any]:
        return {s.name: self._values[s.name] for s in SPECS if s.target == "sampling"}

    def _load_values(self) -> dict[str, Any]:
        return {s.name: self._values[s.name] for s in SPECS if s.target == "load"}

    def _commit(self, params: SamplingParams) -> None:
        if params != self._params:
            self._params = params
            self.samplingChanged.emit(params)

    def _matching_preset(self) -> str | None:
        values = self._sampling_values()
        for name in self._store.names():
            preset = self._store.get(name)
            if all(getattr(preset, k) == v for k, v in values.items()):
                return name
        return None

    def _preset_modified(self) -> bool:
        if self._preset is None:
            return False
        preset = self._store.get(self._preset)
        return any(getattr(preset, k) != v for k, v in self._sampling_values().items())

    def _fill_picker(self) -> None:
        """List the store's presets again (after it changed)."""
        names = self._store.names()
        if self._preset not in names:
            self._preset = None
        with blocked(self.preset_picker):
            self.preset_picker.clear()
            for name in names:
                self.preset_picker.addItem(name, name)
        self._sync_picker()

    def _sync_picker(self) -> None:
        index = -1 if self._preset is None else self.preset_picker.findData(self._preset)
        with blocked(self.preset_picker):
            self.preset_picker.setCurrentIndex(index)

    def _refresh(self) -> None:
        """Reset buttons, reload mark, error display, preset marker and preset buttons."""
        errors = {**self._errors, **self._load_errors}
        pending = []
        for name, field in self._fields.items():
            value = self._values[name]
            field.reset.setEnabled(value != field.spec.default)
            field.set_invalid(name in errors)
            if field.spec.reload:
                changed = value != getattr(self._loaded, name, value)
                field.set_reload_mark(changed)
                if changed:
                    pending.append(field.spec.label)
        for name in errors:
            if name in self._fields:
                section = self._sections[self._fields[name].spec.group]
                section.toggle.setChecked(True)  # an error is never folded away
        self.error_label.setText("\n".join(errors.values()))
        self.error_label.setVisible(bool(errors))
        self.reload_notice.setText(
            f"{', '.join(pending)} changed: takes effect after a reload." if pending else ""
        )
        self.reload_notice.setVisible(bool(pending))
        self.reload_button.setVisible(bool(pending))
        self.reload_button.setEnabled(bool(pending) and not self._load_errors)

        modified = self._preset_modified()
        for i in range(self.preset_picker.count()):
            name = self.preset_picker.itemData(i)
            mark = "*" if modified and name == self._preset else ""
            self.preset_picker.setItemText(i, f"{name}{mark}")
        own = self._preset is not None and not self._store.is_builtin(self._preset)
        self.rename_preset_button.setEnabled(own)
        self.delete_preset_button.setEnabled(own)
        self.export_preset_button.setEnabled(self._preset is not None)
        key = self._model_key
        is_default = key is not None and self._store.model_defaults.get(key) == self._preset
        self.model_default_button.setEnabled(
            bool(key) and self._preset is not None and not is_default
        )
        self.model_default_button.setToolTip(
            "This preset is this model's default"
            if is_default
            else "Use this preset whenever this model is loaded"
        )

    def _warn(self, title: str, exc: Exception) -> None:
        QMessageBox.warning(self, title, str(exc))

    def _ask_name(self, title: str, suggestion: str) -> str | None:
        name, ok = QInputDialog.getText(
            self, title, "Preset name:", QLineEdit.EchoMode.Normal, suggestion
        )
        name = " ".join(name.split())
        return name if ok and name else None

    # -- slots -----------------------------------------------------------------------

    def _on_field_edited(self, name: str) -> None:
        field = self._fields[name]
        self._values[name] = field.value()
        if field.spec.target == "load":
            self._load, self._load_errors = validate_partly(
                self._load_values(), self._load, validate_load
            )
        else:
            params, self._errors = validate_partly(
                self._sampling_values(), self._params, validate_sampling
            )
            self._commit(params)
        self._refresh()

    def _on_preset_chosen(self, index: int) -> None:
        name = self.preset_picker.itemData(index)
        if name is None:
            return
        if name != self._preset or self._preset_modified() or self._errors:
            self.select_preset(name)

    def _on_reload_clicked(self) -> None:
        self.reloadRequested.emit(self._load)

    def _on_save(self) -> None:
        own = self._preset is not None and not self._store.is_builtin(self._preset)
        name = self._ask_name("Save preset", self._preset if own and self._preset else "")
        if name is None:
            return
        if name in self._store.user:
            answer = QMessageBox.question(
                self, "Save preset", f"Replace the preset “{name}” with these settings?"
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        try:
            self._store.save(name, self._params)
        except (SettingError, OSError) as exc:
            self._warn("Save preset", exc)
            return
        self._preset = name
        self._fill_picker()
        self._refresh()
        self.presetsChanged.emit()

    def _on_rename(self) -> None:
        old = self._preset
        if old is None:
            return
        new = self._ask_name("Rename preset", old)
        if new is None or new == old:
            return
        try:
            self._store.rename(old, new)
        except (SettingError, OSError) as exc:
            self._warn("Rename preset", exc)
            return
        self._preset = new
        self._fill_picker()
        self._refresh()
        self.presetsChanged.emit()

    def _on_delete(self) -> None:
        name = self._preset
        if name is None:
            return
        answer = QMessageBox.question(self, "Delete preset", f"Delete the preset “{name}”?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            self._store.delete(name)
        except (SettingError, OSError) as exc:
            self._warn("Delete preset", exc)
            return
        self._preset = self._matching_preset()  # the settings in force stay
        self._fill_picker()
        self._refresh()
        self.presetsChanged.emit()

    def _on_export(self) -> None:
        name = self._preset
        if name is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export preset", f"{name}.json", PRESET_FILTER)
        if not path:
            return
        try:
            atomic_write_text(Path(path), self._store.export_preset(name))
        except (SettingError, OSError) as exc:
            self._warn("Export preset", exc)

    def _on_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import preset", "", PRESET_FILTER)
        if not path:
            return
        try:
            name = self._store.import_preset(Path(path).read_text(encoding="utf-8"))
        except (SettingError, OSError, UnicodeDecodeError) as exc:
            self._warn("Import preset", exc)
            return
        self._fill_picker()
        self.presetsChanged.emit()
        self.select_preset(name)

    def _on_model_default(self) -> None:
        if not self._model_key or self._preset is None:
            return
        try:
            self._store.set_model_default(self._model_key, self._preset)
        except (SettingError, OSError) as exc:
            self._warn("Default preset", exc)
            return
        self._refresh()
        self.presetsChanged.emit()
