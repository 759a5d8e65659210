"""The settings form: each ``FieldSpec`` of ``app.config.setting_specs.SPECS`` as a row of controls.

The form holds no list of settings of its own: each ``FieldSpec`` becomes a row of
controls chosen by its ``kind`` (see ``ui.settings.settings_fields``), in a collapsible section
named by its ``group``. It shows values, reads them back and shows validation errors and
reload marks; what is valid and what is in force is its owner's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config.field_spec import GROUPS, SettingError
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPEC_BY_NAME, SPECS
from ui.settings.settings_fields import FieldRow, WheelGuard

GROUP_TITLES = {
    "basic": "Basic",
    "advanced": "Advanced",
    "reasoning": "Reasoning",
    "tools": "Tools",
    "structured": "Structured output",
    "speculative": "Speculative decoding",
    "model": "Model (applied on reload)",
}
OPEN_GROUPS = ("basic", "model")  # sections open at start; the others start collapsed
# An empty row for controls that are not a FieldSpec, placed before the named field (or at
# the end of its group): the draft model chooser sits above "Use draft model".
SLOTS = {"draft_model": "speculative"}
ERROR_STYLE = "color: #c62828;"

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


class Section(QWidget):
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

    def add(self, field: FieldRow) -> None:
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


class SettingsForm(QWidget):
    """The rows of every ``FieldSpec``, grouped in sections, in a scroll area; errors below.

    Call ``show_config`` for each target ("sampling", "load") before reading values or
    calling ``refresh``.

    Signals:
        edited(str): the user changed the named field; ``values`` already holds the new
            (not yet validated) value.
    """

    edited = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._values: dict[str, Any] = {}  # what the controls show, valid or not
        self._fields: dict[str, FieldRow] = {}
        self._sections: dict[str, Section] = {}
        self.slots: dict[str, QWidget] = {}  # see ``SLOTS``; fill with ``slot(name).layout()``
        self._guard = WheelGuard(self)

        content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        groups = [*GROUPS, *sorted({s.group for s in SPECS} - set(GROUPS))]
        for group in groups:
            specs = [s for s in SPECS if s.group == group]
            if not specs:
                continue
            section = Section(group, GROUP_TITLES.get(group, group.capitalize()), content)
            for spec in specs:
                if spec.name in SLOTS:
                    self._add_slot(spec.name, section)
                field = FieldRow(spec, section.body, self._on_field_edited, self._guard)
                self._fields[spec.name] = field
                section.add(field)
            for name, slot_group in SLOTS.items():
                if slot_group == group and name not in self.slots:
                    self._add_slot(name, section)
            section.toggle.setChecked(group in OPEN_GROUPS)
            self._sections[group] = section
            column.addWidget(section)
        column.addStretch(1)
        self._align_columns()
        scroll = QScrollArea(self)
        scroll.setObjectName("samplingScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.setWidget(content)

        self.error_label = QLabel(self)
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(ERROR_STYLE)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addWidget(scroll, 1)
        layout.addWidget(self.error_label)

    def _add_slot(self, name: str, section: Section) -> None:
        slot = QWidget(section.body)
        slot.setObjectName(f"slot_{name}")
        box = QVBoxLayout(slot)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(2)
        section.grid.addWidget(slot, section.grid.rowCount(), 0, 1, 4)
        self.slots[name] = slot

    def slot(self, name: str) -> QWidget:
        """The empty row kept for extra controls before field ``name`` (see ``SLOTS``)."""
        return self.slots[name]

    def set_unavailable(
        self, reasons: Mapping[str, str], notes: Mapping[str, str] | None = None
    ) -> None:
        """Disable the named fields, each with its reason as the tooltip; enable the rest.
        ``notes``: a line added to the tooltip of fields that work only in part."""
        notes = notes or {}
        for name, field in self._fields.items():
            field.note = notes.get(name, "")
            field.set_unavailable(reasons.get(name, ""))

    def _align_columns(self) -> None:
        """Same caption and spin box widths in every section, so the sliders line up."""
        captions = [f.caption for f in self._fields.values() if isinstance(f.caption, QLabel)]
        spins = [f.editor for f in self._fields.values() if f.slider is not None]
        for group in (captions, spins):
            width = max((w.sizeHint().width() for w in group), default=0)
            for w in group:
                w.setMinimumWidth(width)

    def values(self, target: str) -> dict[str, Any]:
        """What the controls of ``target``'s fields show (in ``SPECS`` order), valid or not."""
        return {s.name: self._values[s.name] for s in SPECS if s.target == target}

    def show_config(self, config: object, target: str) -> None:
        """Show ``config``'s value in each of ``target``'s fields (no ``edited`` signal)."""
        for name, field in self._fields.items():
            if field.spec.target == target:
                value = getattr(config, name)
                self._values[name] = value
                field.set_value(value)

    def refresh(self, errors: Mapping[str, str], baseline: object) -> list[str]:
        """Update reset buttons, error marks and reload marks; return the reload-pending labels.

        Args:
            errors: message per bad field; those fields are outlined, their sections opened.
            baseline: the loaded model's config: a reload field showing another value is
                marked as waiting for a reload.
        """
        pending = []
        for name, field in self._fields.items():
            value = self._values[name]
            field.reset.setEnabled(value != field.spec.default)
            field.set_invalid(name in errors)
            if field.spec.reload:
                changed = value != getattr(baseline, name, value)
                field.set_reload_mark(changed)
                if changed:
                    pending.append(field.spec.label)
        for name in errors:
            if name in self._fields:
                section = self._sections[self._fields[name].spec.group]
                section.toggle.setChecked(True)  # an error is never folded away
        self.error_label.setText("\n".join(errors.values()))
        self.error_label.setVisible(bool(errors))
        return pending

    def _on_field_edited(self, name: str) -> None:
        self._values[name] = self._fields[name].value()
        self.edited.emit(name)
