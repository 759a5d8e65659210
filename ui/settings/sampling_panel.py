"""The sampling dock: a settings form over ``app.config.setting_specs.SPECS``, presets, validation.

``settings_form`` builds the controls and shows errors, ``presets_bar`` handles
presets; the panel holds the settings in force and the edited model config, validates
every edit and keeps the two parts in step.
"""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDockWidget, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.config.params import validate_load, validate_sampling
from app.config.presets import PresetStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPEC_BY_NAME
from app.engine.backend import ModelInfo
from ui.settings.presets_bar import PresetsBar
from ui.settings.settings_fields import RELOAD_STYLE
from ui.settings.settings_form import SettingsForm, validate_partly

__all__ = ["SamplingPanel", "reasoning_limits"]

_THINKING_FIELDS = ("thinking", "reasoning_effort", "thinking_budget", "budget_message")


def reasoning_limits(info: ModelInfo | None) -> tuple[dict[str, str], dict[str, str]]:
    """What the model in use cannot do with its thinking: (field -> why it is disabled,
    field -> a note for a field that works only in part). No model: everything open."""
    if info is None:
        return {}, {}
    fmt = info.reasoning
    if fmt is None:
        why = (
            f"{info.name}'s chat template shows no thinking block: the model does not "
            "think, or not in a way this app can tell apart."
        )
        return dict.fromkeys(_THINKING_FIELDS, why), {}
    off: dict[str, str] = {}
    notes: dict[str, str] = {}
    caps = info.capabilities
    if not caps.thinking_control:
        why = caps.why_not.get("thinking_control", "This engine cannot end the thinking itself.")
        off["thinking_budget"] = off["budget_message"] = why
    if not fmt.effort:
        off["reasoning_effort"] = f"This chat template ({fmt.name}) reads no reasoning effort."
    if fmt.switch:
        notes["thinking"] = f"This template switches it with {fmt.switch!r}."
    elif fmt.empty_block():
        notes["thinking"] = (
            "This template has no switch: on is what it does anyway; off starts the reply "
            "with an empty thinking block, so the model answers at once."
        )
    else:
        off["thinking"] = f"This template ({fmt.name}) cannot switch thinking off" + (
            "; a low reasoning effort keeps it short." if fmt.effort else "."
        )
    return off, notes


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
        self._errors: dict[str, str] = {}  # field -> message, sampling fields
        self._load_errors: dict[str, str] = {}
        self._unavailable: dict[str, str] = {}  # from the engine's capabilities (window)
        self._draft_unavailable: dict[str, str] = {}  # from the draft model chooser
        # from the model's reasoning format (``set_model``): disabled fields, and notes
        self._reasoning_unavailable: dict[str, str] = {}
        self._reasoning_notes: dict[str, str] = {}
        self._build()
        self._form.show_config(params, "sampling")
        self._form.show_config(load, "load")
        self.presets_bar.choose_matching()
        self._refresh()

    def _build(self) -> None:
        root = QWidget(self)
        layout = QVBoxLayout(root)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(6)
        self.presets_bar = PresetsBar(
            self._store, lambda: self._form.values("sampling"), self.params, root
        )
        self.presets_bar.presetPicked.connect(self._on_preset_picked)
        self.presets_bar.stateChanged.connect(self._refresh)
        self.presets_bar.presetsChanged.connect(self.presetsChanged)
        layout.addWidget(self.presets_bar)
        # the bar's controls, under the names callers and tests use
        self.preset_picker = self.presets_bar.preset_picker
        self.save_preset_button = self.presets_bar.save_preset_button
        self.rename_preset_button = self.presets_bar.rename_preset_button
        self.delete_preset_button = self.presets_bar.delete_preset_button
        self.import_preset_button = self.presets_bar.import_preset_button
        self.export_preset_button = self.presets_bar.export_preset_button
        self.model_default_button = self.presets_bar.model_default_button

        self._form = SettingsForm(root)
        self._form.edited.connect(self._on_field_edited)
        self.error_label = self._form.error_label
        layout.addWidget(self._form, 1)

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

    # -- public API ------------------------------------------------------------------

    def set_unavailable(self, reasons: Mapping[str, str]) -> None:
        """Disable settings the engine in use cannot honour, saying why in each tooltip."""
        self._unavailable = dict(reasons)
        self._show_unavailable()

    def set_draft_unavailable(self, reasons: Mapping[str, str]) -> None:
        """As ``set_unavailable``, for the draft model's settings (kept apart, so that
        either caller may update its own reasons without clearing the other's)."""
        self._draft_unavailable = dict(reasons)
        self._show_unavailable()

    def set_model(self, info: ModelInfo | None) -> None:
        """Follow the model in use (``LoadedModel.changed``): the reasoning settings its
        template cannot use are disabled, saying why."""
        self._reasoning_unavailable, self._reasoning_notes = reasoning_limits(info)
        self._show_unavailable()

    def _show_unavailable(self) -> None:
        reasons = {**self._reasoning_unavailable, **self._draft_unavailable, **self._unavailable}
        self._form.set_unavailable(reasons, self._reasoning_notes)

    def slot(self, name: str) -> QWidget:
        """An empty row in the form for controls that are not settings fields (see
        ``ui.settings.settings_form.SLOTS``)."""
        return self._form.slot(name)

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
        self._form.show_config(params, "sampling")
        if self.presets_bar.preset is None:
            self.presets_bar.choose_matching()
        self._refresh()

    def load_config(self) -> LoadConfig:
        """The model settings as edited (the loaded config with the panel's changes)."""
        return self._load

    def set_load(self, load: LoadConfig) -> None:
        """Take ``load`` as the loaded model's config: shown, and the reload mark's baseline."""
        self._loaded = self._load = load
        self._load_errors = {}
        self._form.show_config(load, "load")
        self._refresh()

    @property
    def model_key(self) -> str | None:
        """The loaded model's key for per-model default presets (None: no model)."""
        return self.presets_bar.model_key

    @model_key.setter
    def model_key(self, key: str | None) -> None:
        self.presets_bar.model_key = key
        self._refresh()

    def select_preset(self, name: str) -> None:
        """Choose preset ``name``: every sampling field takes its value.

        Emits ``samplingChanged`` if that changes the settings in force.

        Raises:
            PresetError: there is no such preset.
        """
        params = self._store.get(name)
        self.presets_bar.choose(name)
        self._errors = {}
        self._form.show_config(params, "sampling")
        self._commit(params)
        self._refresh()

    # -- state -----------------------------------------------------------------------

    def _commit(self, params: SamplingParams) -> None:
        if params != self._params:
            self._params = params
            self.samplingChanged.emit(params)

    def _refresh(self) -> None:
        """Field marks, error display, reload notice, preset marker and preset buttons."""
        errors = {**self._errors, **self._load_errors}
        pending = self._form.refresh(errors, self._loaded)
        self.reload_notice.setText(
            f"{', '.join(pending)} changed: takes effect after a reload." if pending else ""
        )
        self.reload_notice.setVisible(bool(pending))
        self.reload_button.setVisible(bool(pending))
        self.reload_button.setEnabled(bool(pending) and not self._load_errors)
        self.presets_bar.refresh()

    # -- slots -----------------------------------------------------------------------

    def _on_field_edited(self, name: str) -> None:
        if SPEC_BY_NAME[name].target == "load":
            self._load, self._load_errors = validate_partly(
                self._form.values("load"), self._load, validate_load
            )
        else:
            params, self._errors = validate_partly(
                self._form.values("sampling"), self._params, validate_sampling
            )
            self._commit(params)
        self._refresh()

    def _on_preset_picked(self, name: str) -> None:
        bar = self.presets_bar
        if name != bar.preset or bar.modified() or self._errors:
            self.select_preset(name)

    def _on_reload_clicked(self) -> None:
        self.reloadRequested.emit(self._load)
