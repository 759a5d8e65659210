"""The presets bar: the preset picker and its actions over a ``PresetStore``.

The bar tracks which preset is chosen and whether the settings shown differ from it
("modified", a ``*`` after its name); applying a preset to the settings is its owner's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.config.field_spec import SettingError
from app.config.presets import PresetStore
from app.config.setting_records import SamplingParams
from app.util.atomic import atomic_write_text
from ui.common.qt_util import blocked

PRESET_FILTER = "Lamplight presets (*.json);;All files (*)"


class PresetsBar(QWidget):
    """Preset picker, save / rename / delete / import / export and per-model default.

    Args:
        store: the presets.
        shown: the sampling values the settings show now, valid or not (for the
            "modified" mark and for finding a preset equal to them).
        in_force: the sampling settings in force (what "Save as…" stores).
        parent: the parent widget.

    Signals:
        presetPicked(str): the user chose the named preset in the picker (again the
            chosen one too: that drops edits), or imported it; the owner applies it.
        presetsChanged(): the store changed (preset saved, renamed, deleted or imported,
            or a model default set).
        stateChanged(): the chosen preset or a model default changed; the owner refreshes
            (then calls ``refresh``).
    """

    presetPicked = Signal(str)
    presetsChanged = Signal()
    stateChanged = Signal()

    def __init__(
        self,
        store: PresetStore,
        shown: Callable[[], Mapping[str, Any]],
        in_force: Callable[[], SamplingParams],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._store = store
        self._shown = shown
        self._in_force = in_force
        self._preset: str | None = None
        self.model_key: str | None = None  # the loaded model's, for per-model defaults
        self._build()
        self.fill()

    def _build(self) -> None:
        self.preset_picker = QComboBox(self)
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
            b = QToolButton(self)
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
        top.addWidget(QLabel("Preset", self))
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
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(4)
        box.addLayout(top)
        box.addLayout(actions)

    # -- state -----------------------------------------------------------------------

    @property
    def preset(self) -> str | None:
        """The chosen preset's name (None: custom settings)."""
        return self._preset

    def choose(self, name: str | None) -> None:
        """Mark ``name`` as the chosen preset in the picker (no signal)."""
        self._preset = name
        self._sync_picker()

    def choose_matching(self) -> None:
        """Choose the first preset equal to the settings shown, or none (no signal)."""
        self.choose(self._matching_preset())

    def modified(self) -> bool:
        """Whether the settings shown differ from the chosen preset's."""
        if self._preset is None:
            return False
        preset = self._store.get(self._preset)
        return any(getattr(preset, k) != v for k, v in self._shown().items())

    def fill(self) -> None:
        """List the store's presets again (after it changed)."""
        names = self._store.names()
        if self._preset not in names:
            self._preset = None
        with blocked(self.preset_picker):
            self.preset_picker.clear()
            for name in names:
                self.preset_picker.addItem(name, name)
        self._sync_picker()

    def refresh(self) -> None:
        """Update the modified mark and which actions apply."""
        modified = self.modified()
        for i in range(self.preset_picker.count()):
            name = self.preset_picker.itemData(i)
            mark = "*" if modified and name == self._preset else ""
            self.preset_picker.setItemText(i, f"{name}{mark}")
        own = self._preset is not None and not self._store.is_builtin(self._preset)
        self.rename_preset_button.setEnabled(own)
        self.delete_preset_button.setEnabled(own)
        self.export_preset_button.setEnabled(self._preset is not None)
        key = self.model_key
        is_default = key is not None and self._store.model_defaults.get(key) == self._preset
        self.model_default_button.setEnabled(
            bool(key) and self._preset is not None and not is_default
        )
        self.model_default_button.setToolTip(
            "This preset is this model's default"
            if is_default
            else "Use this preset whenever this model is loaded"
        )

    def _matching_preset(self) -> str | None:
        values = self._shown()
        for name in self._store.names():
            preset = self._store.get(name)
            if all(getattr(preset, k) == v for k, v in values.items()):
                return name
        return None

    def _sync_picker(self) -> None:
        index = -1 if self._preset is None else self.preset_picker.findData(self._preset)
        with blocked(self.preset_picker):
            self.preset_picker.setCurrentIndex(index)

    def _warn(self, title: str, exc: Exception) -> None:
        QMessageBox.warning(self, title, str(exc))

    def _ask_name(self, title: str, suggestion: str) -> str | None:
        name, ok = QInputDialog.getText(
            self, title, "Preset name:", QLineEdit.EchoMode.Normal, suggestion
        )
        name = " ".join(name.split())
        return name if ok and name else None

    # -- slots -----------------------------------------------------------------------

    def _on_preset_chosen(self, index: int) -> None:
        name = self.preset_picker.itemData(index)
        if name is not None:
            self.presetPicked.emit(name)

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
            self._store.save(name, self._in_force())
        except (SettingError, OSError) as exc:
            self._warn("Save preset", exc)
            return
        self._preset = name
        self.fill()
        self.stateChanged.emit()
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
        self.fill()
        self.stateChanged.emit()
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
        self.fill()
        self.stateChanged.emit()
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
        self.fill()
        self.presetsChanged.emit()
        self.presetPicked.emit(name)  # a new name (import never reuses one): always applied

    def _on_model_default(self) -> None:
        if not self.model_key or self._preset is None:
            return
        try:
            self._store.set_model_default(self.model_key, self._preset)
        except (SettingError, OSError) as exc:
            self._warn("Default preset", exc)
            return
        self.stateChanged.emit()
        self.presetsChanged.emit()
