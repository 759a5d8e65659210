"""The sampling panel: controls built from SPECS, presets, validation and the reload mark."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QSlider,
    QSpinBox,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.config.presets import BUILTIN, PresetStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPECS
from ui.settings.sampling_panel import SamplingPanel
from ui.settings.settings_fields import nice_stops

LOADED = LoadConfig(n_ctx=2048, n_threads=2)


@pytest.fixture()
def presets_file(tmp_path: Path) -> Path:
    return tmp_path / "presets.json"


@pytest.fixture()
def panel(qtbot: QtBot, presets_file: Path) -> SamplingPanel:
    p = SamplingPanel(PresetStore(presets_file), SamplingParams(), LOADED)
    qtbot.addWidget(p)
    p.show()
    return p


def child(panel: SamplingPanel, kind: type[Any], name: str) -> Any:
    w = panel.findChild(kind, name)
    assert w is not None, name
    return w


def shown(panel: SamplingPanel, name: str) -> Any:
    """The value a field's control shows."""
    w = child(panel, QWidget, f"field_{name}")
    if isinstance(w, QDoubleSpinBox | QSpinBox):
        return w.value()
    if isinstance(w, QCheckBox):
        return w.isChecked()
    if isinstance(w, QComboBox):
        return w.currentData()
    assert isinstance(w, QPlainTextEdit)
    return w.toPlainText()


def emitted(panel: SamplingPanel) -> list[SamplingParams]:
    out: list[SamplingParams] = []
    panel.samplingChanged.connect(out.append)
    return out


def answer(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: (name, True))


def test_every_spec_has_named_controls_with_help(panel: SamplingPanel) -> None:
    for spec in SPECS:
        field = child(panel, QWidget, f"field_{spec.name}")
        assert field.toolTip() == spec.help
        assert child(panel, QAbstractButton, f"reset_{spec.name}")
        if spec.kind in ("float", "int") and spec.name != "seed":
            assert child(panel, QSlider, f"slider_{spec.name}").toolTip() == spec.help
    assert panel.findChild(QSlider, "slider_seed") is None  # 2**31 values: spin box only
    assert panel.objectName() == "samplingPanel" and panel.windowTitle() == "Sampling"
    assert panel.preset_picker.currentText() == "Balanced"


def test_slider_and_spin_box_stay_in_sync(qtbot: QtBot, panel: SamplingPanel) -> None:
    got = emitted(panel)
    slider = child(panel, QSlider, "slider_temperature")
    spin = child(panel, QDoubleSpinBox, "field_temperature")
    slider.setValue(30)  # 0.05 per step
    assert spin.value() == pytest.approx(1.5)
    spin.setValue(0.25)
    assert slider.value() == 5
    qtbot.keyClick(slider, Qt.Key.Key_Right)
    assert spin.value() == pytest.approx(0.3)
    assert [p.temperature for p in got] == [1.5, 0.25, 0.3]  # one signal per edit, no echo

    slider = child(panel, QSlider, "slider_top_k")
    spin = child(panel, QSpinBox, "field_top_k")
    slider.setValue(100)
    assert spin.value() == 100
    spin.setValue(7)
    assert slider.value() == 7
    assert [p.top_k for p in got[3:]] == [100, 7]


def test_wide_int_ranges_slide_over_nice_stops(panel: SamplingPanel) -> None:
    assert nice_stops(-1, 20) == [-1, 0, 1, 2, 3, 4, 6, 8, 12, 16, 20]
    slider = child(panel, QSlider, "slider_n_ctx")
    spin = child(panel, QSpinBox, "field_n_ctx")
    stops = nice_stops(256, 262144)
    assert slider.maximum() == len(stops) - 1 < 40
    slider.setValue(stops.index(8192))
    assert spin.value() == 8192
    spin.setValue(5000)  # between stops: the slider goes to the nearest, the value stays
    assert slider.value() == stops.index(4096) and spin.value() == 5000
    assert panel.load_config().n_ctx == 5000


def test_field_change_emits_validated_params(qtbot: QtBot, panel: SamplingPanel) -> None:
    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        child(panel, QDoubleSpinBox, "field_top_p").setValue(0.5)
    assert blocker.args == [replace(SamplingParams(), top_p=0.5)]
    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        child(panel, QPlainTextEdit, "field_stop").setPlainText("###\n\nUser:\n")
    assert blocker.args[0].stop == ("###", "User:")  # blank lines are not stop strings
    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        child(panel, QCheckBox, "field_speculative").setChecked(True)
    expected = replace(SamplingParams(), top_p=0.5, stop=("###", "User:"), speculative=True)
    assert blocker.args == [expected]
    assert panel.params() == expected


def test_preset_switch_updates_every_field_and_emits_once(panel: SamplingPanel) -> None:
    panel.select_preset("Precise")
    for spec in SPECS:
        if spec.target == "sampling" and spec.kind not in ("text", "list"):
            assert shown(panel, spec.name) == pytest.approx(getattr(BUILTIN["Precise"], spec.name))
    got = emitted(panel)
    picker = panel.preset_picker
    picker.setCurrentIndex(picker.findData("Creative"))  # what choosing it in the list does
    picker.activated.emit(picker.currentIndex())  # ... followed by activated
    creative = BUILTIN["Creative"]
    assert got == [creative]
    for spec in SPECS:
        if spec.target == "sampling" and spec.kind not in ("text", "list"):
            assert shown(panel, spec.name) == pytest.approx(getattr(creative, spec.name)), spec
    assert panel.params() == creative and picker.currentText() == "Creative"

    child(panel, QDoubleSpinBox, "field_temperature").setValue(0.4)
    assert picker.currentText() == "Creative*"
    picker.activated.emit(picker.currentIndex())  # choosing it again drops the edit
    assert picker.currentText() == "Creative" and panel.params() == creative
    assert got == [creative, replace(creative, temperature=0.4), creative]


def test_save_rename_delete_round_trip(
    qtbot: QtBot, panel: SamplingPanel, presets_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not panel.delete_preset_button.isEnabled()  # built-ins cannot be deleted
    assert not panel.rename_preset_button.isEnabled()
    changes: list[bool] = []
    panel.presetsChanged.connect(lambda: changes.append(True))
    child(panel, QDoubleSpinBox, "field_temperature").setValue(1.25)
    assert panel.preset_picker.currentText() == "Balanced*"

    answer(monkeypatch, "  My   preset ")
    qtbot.mouseClick(panel.save_preset_button, Qt.MouseButton.LeftButton)
    saved = replace(SamplingParams(), temperature=1.25)
    assert PresetStore(presets_file).get("My preset") == saved
    assert panel.preset_picker.currentText() == "My preset"
    assert panel.delete_preset_button.isEnabled()

    answer(monkeypatch, "Warm")
    qtbot.mouseClick(panel.rename_preset_button, Qt.MouseButton.LeftButton)
    fresh = PresetStore(presets_file)
    assert fresh.names() == [*BUILTIN, "Warm"] and fresh.get("Warm") == saved
    assert panel.preset_picker.currentText() == "Warm"

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    qtbot.mouseClick(panel.delete_preset_button, Qt.MouseButton.LeftButton)
    assert "Warm" in PresetStore(presets_file).names()  # declined: kept
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(panel.delete_preset_button, Qt.MouseButton.LeftButton)
    assert PresetStore(presets_file).names() == list(BUILTIN)
    assert panel.params() == saved  # the settings in force stay
    assert panel.preset_picker.currentIndex() == -1
    assert panel.preset_picker.currentText() == ""  # the "Custom" placeholder shows
    assert len(changes) == 3


def test_export_then_import_gives_an_equal_preset(
    qtbot: QtBot,
    panel: SamplingPanel,
    presets_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    panel.select_preset("Creative")
    child(panel, QSpinBox, "field_seed").setValue(1234)
    answer(monkeypatch, "Mine")
    qtbot.mouseClick(panel.save_preset_button, Qt.MouseButton.LeftButton)
    target = tmp_path / "exported" / "mine.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    qtbot.mouseClick(panel.export_preset_button, Qt.MouseButton.LeftButton)
    assert target.exists()

    panel.select_preset("Balanced")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(target), ""))
    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        qtbot.mouseClick(panel.import_preset_button, Qt.MouseButton.LeftButton)
    store = PresetStore(presets_file)
    assert store.get("Mine (2)") == store.get("Mine") == blocker.args[0]
    assert blocker.args[0].seed == 1234
    assert panel.preset_picker.currentText() == "Mine (2)"


def test_reset_button_restores_default_and_disables_itself(panel: SamplingPanel) -> None:
    reset = child(panel, QAbstractButton, "reset_top_k")
    assert not reset.isEnabled()
    child(panel, QSpinBox, "field_top_k").setValue(99)
    assert reset.isEnabled()
    got = emitted(panel)
    reset.click()
    assert shown(panel, "top_k") == 40 and child(panel, QSlider, "slider_top_k").value() == 40
    assert not reset.isEnabled()
    assert got == [SamplingParams()]


def test_context_size_change_asks_for_reload(qtbot: QtBot, panel: SamplingPanel) -> None:
    notice = child(panel, QLabel, "reloadNotice")
    button = child(panel, QAbstractButton, "reloadButton")
    assert notice.isHidden() and button.isHidden()
    with qtbot.assertNotEmitted(panel.samplingChanged):
        child(panel, QSpinBox, "field_n_ctx").setValue(8192)
    assert notice.isVisible() and "Context size" in notice.text()
    assert button.isVisible()
    with qtbot.waitSignal(panel.reloadRequested, timeout=1000) as blocker:
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert blocker.args == [LoadConfig(n_ctx=8192, n_threads=2)]
    panel.set_load(blocker.args[0])  # the window, once the model is loaded again
    assert notice.isHidden() and button.isHidden()
    assert panel.load_config() == LoadConfig(n_ctx=8192, n_threads=2)


def test_invalid_json_schema_is_shown_and_not_applied(qtbot: QtBot, panel: SamplingPanel) -> None:
    error = child(panel, QLabel, "errorLabel")
    schema = child(panel, QPlainTextEdit, "field_json_schema")
    with qtbot.assertNotEmitted(panel.samplingChanged):
        output = child(panel, QComboBox, "field_output_format")
        output.setCurrentIndex(output.findData("json_schema"))
        schema.setPlainText('{"type": "object", ')
    assert error.isVisible() and "JSON schema" in error.text()
    assert schema.property("invalid") is True
    assert panel.params() == SamplingParams()  # the last valid settings stay in force

    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        child(panel, QDoubleSpinBox, "field_temperature").setValue(0.3)
    assert blocker.args == [replace(SamplingParams(), temperature=0.3)]  # others still apply
    assert error.isVisible()

    good = '{"type": "object", "properties": {"a": {"type": "string"}}}'
    with qtbot.waitSignal(panel.samplingChanged, timeout=1000) as blocker:
        schema.setPlainText(good)
    assert blocker.args[0].output_format == "json_schema"
    assert blocker.args[0].json_schema == good
    assert error.isHidden() and not schema.property("invalid")


def test_bad_grammar_and_too_many_stop_strings(qtbot: QtBot, panel: SamplingPanel) -> None:
    error = child(panel, QLabel, "errorLabel")
    with qtbot.assertNotEmitted(panel.samplingChanged):
        output = child(panel, QComboBox, "field_output_format")
        output.setCurrentIndex(output.findData("gbnf"))
        child(panel, QPlainTextEdit, "field_grammar").setPlainText('answer ::= "yes" | "no"')
        child(panel, QPlainTextEdit, "field_stop").setPlainText(
            "\n".join(f"s{i}" for i in range(17))
        )
    assert "root" in error.text() and "Stop strings" in error.text()
    assert child(panel, QPlainTextEdit, "field_stop").property("invalid") is True
    assert panel.params() == SamplingParams()


def test_model_default_button_records_the_default(
    qtbot: QtBot, panel: SamplingPanel, presets_file: Path
) -> None:
    assert not panel.model_default_button.isEnabled()  # no model yet
    panel.model_key = "gemma-3-270m.gguf"
    panel.select_preset("Creative")
    assert panel.model_default_button.isEnabled()
    with qtbot.waitSignal(panel.presetsChanged, timeout=1000):
        qtbot.mouseClick(panel.model_default_button, Qt.MouseButton.LeftButton)
    assert PresetStore(presets_file).default_for("gemma-3-270m.gguf") == "Creative"
    assert not panel.model_default_button.isEnabled()  # already this model's default


def test_wheel_over_an_unfocused_control_does_not_change_it(panel: SamplingPanel) -> None:
    spin = child(panel, QDoubleSpinBox, "field_temperature")
    assert not spin.hasFocus()
    got = emitted(panel)
    pos = QPointF(spin.rect().center())
    event = QWheelEvent(
        pos,
        QPointF(spin.mapToGlobal(pos)),
        QPoint(0, 0),
        QPoint(0, 120),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(spin, event)
    assert spin.value() == pytest.approx(0.7) and got == []
