"""The LoRA dock with real adapter files (no model loaded), and the worker's LoRA slot."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Slot
from PySide6.QtWidgets import QDockWidget, QFileDialog
from pytestqt.qtbot import QtBot

from app.config.setting_records import LoadConfig
from app.engine.backend import Capabilities
from app.gguf.lora import LoraStack
from app.util.errors import LamplightError
from tests.fakes.engine import FAKE_CAPABILITIES, FakeEngine
from tests.lora_factory import (
    corrupt_lora,
    make_lora,
    wrong_architecture_lora,
    wrong_dimension_lora,
)
from ui.engine.worker import EngineClient
from ui.settings.lora_panel import LoraPanel


@pytest.fixture(scope="module")
def files(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gui-lora")
    return {
        "style": make_lora(d / "style.gguf", model_path, seed=1, rank=8, alpha=16.0),
        "tone": make_lora(d / "tone.gguf", model_path, seed=2, rank=4, alpha=0.0, layers=(0,)),
        "wrong-arch": wrong_architecture_lora(d / "llama-style.gguf", model_path),
        "wrong-dims": wrong_dimension_lora(d / "wide.gguf", model_path),
        "corrupt": corrupt_lora(d / "noise.gguf"),
    }


@pytest.fixture()
def panel(qtbot: QtBot, model_path: Path) -> LoraPanel:
    p = LoraPanel()
    qtbot.addWidget(p)
    p.set_model(model_path)
    p.show()
    return p


def stack(*entries: tuple[Path, float, bool]) -> LoraStack:
    s = LoraStack()
    for path, scale, enabled in entries:
        s.push(path, scale, enabled)
    return s


def emitted(qtbot: QtBot, panel: LoraPanel, action: object) -> LoraStack:
    """The stack ``action()`` makes the panel report."""
    with qtbot.waitSignal(panel.stackChanged, timeout=1000) as blocker:
        action()  # type: ignore[operator]
    result = blocker.args[0]
    assert isinstance(result, LoraStack)
    return result


def test_it_is_a_dock_named_lora_panel(panel: LoraPanel) -> None:
    assert isinstance(panel, QDockWidget) and panel.objectName() == "loraPanel"
    assert panel.empty.isVisible() and panel.rows == [] and panel.summary() == ""


def test_adding_shows_the_adapter_and_reports_the_stack(
    qtbot: QtBot, panel: LoraPanel, files: dict[str, Path]
) -> None:
    got = emitted(qtbot, panel, lambda: panel.add_adapter(files["style"]))
    assert got == stack((files["style"], 1.0, True))
    row = panel.rows[0]
    assert row.enable.text() == "style" and row.enable.isChecked()
    assert row.details.text().startswith("rank 8 · alpha 16 · ")
    assert "kB" in row.details.text()
    assert not panel.empty.isVisible() and not panel.error.isVisible()
    emitted(qtbot, panel, lambda: panel.add_adapter(files["tone"]))
    assert panel.rows[1].details.text().startswith("rank 4 · no alpha")
    assert panel.summary() == "LoRA: style×1.0, tone×1.0"


def test_adding_from_the_library_and_from_a_file(
    qtbot: QtBot, panel: LoraPanel, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    panel.set_library_adapters([files["style"], files["tone"]])
    actions = {a.text(): a for a in panel.add_menu.actions()}
    got = emitted(qtbot, panel, actions["tone.gguf"].trigger)
    assert got == stack((files["tone"], 1.0, True))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(files["style"]), ""))
    got = emitted(qtbot, panel, panel.file_action.trigger)
    assert [e.name for e in got] == ["tone", "style"]
    panel.set_library_adapters([])
    assert "No adapters in the library" in [a.text() for a in panel.add_menu.actions()]


def test_slider_and_spin_box_stay_in_sync(
    qtbot: QtBot, panel: LoraPanel, files: dict[str, Path]
) -> None:
    panel.add_adapter(files["style"])
    row = panel.rows[0]
    got = emitted(qtbot, panel, lambda: row.slider.setValue(80))
    assert got[0].scale == 0.8 and row.spin.value() == 0.8
    got = emitted(qtbot, panel, lambda: row.spin.setValue(-1.25))
    assert got[0].scale == -1.25 and row.slider.value() == -125
    assert panel.summary() == "LoRA: style×-1.25"

    # A drag shows the value as it goes and reports it once, on release.
    row.slider.setSliderDown(True)
    with qtbot.assertNotEmitted(panel.stackChanged):
        row.slider.setValue(30)
    assert row.spin.value() == 0.3
    got = emitted(qtbot, panel, lambda: row.slider.setSliderDown(False))
    assert got[0].scale == 0.3


def test_enable_reorder_and_remove(qtbot: QtBot, panel: LoraPanel, files: dict[str, Path]) -> None:
    panel.add_adapter(files["style"])
    panel.add_adapter(files["tone"])
    got = emitted(qtbot, panel, lambda: panel.rows[0].enable.setChecked(False))
    assert got == stack((files["style"], 1.0, False), (files["tone"], 1.0, True))
    assert panel.summary() == "LoRA: tone×1.0"

    assert not panel.rows[0].up.isEnabled() and not panel.rows[1].down.isEnabled()
    got = emitted(qtbot, panel, panel.rows[1].up.click)
    assert [e.name for e in got] == ["tone", "style"]
    assert [r.enable.text() for r in panel.rows] == ["tone", "style"]
    assert not panel.rows[1].enable.isChecked()  # the state moved with its adapter
    got = emitted(qtbot, panel, panel.rows[0].down.click)
    assert [e.name for e in got] == ["style", "tone"]

    got = emitted(qtbot, panel, panel.rows[0].remove.click)
    assert got == stack((files["tone"], 1.0, True))
    got = emitted(qtbot, panel, panel.rows[0].remove.click)
    assert got == LoraStack() and panel.rows == [] and panel.empty.isVisible()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("wrong-arch", "llama-style.gguf was built for llama, the loaded model is gemma3."),
        ("wrong-dims", "blk.0.attn_k.weight: adapter expects 640x1024, model has 640x256"),
        ("corrupt", "noise.gguf is a damaged GGUF file"),
    ],
)
def test_an_invalid_file_is_explained_and_not_added(
    qtbot: QtBot, panel: LoraPanel, files: dict[str, Path], kind: str, message: str
) -> None:
    with qtbot.assertNotEmitted(panel.stackChanged):
        assert not panel.add_adapter(files[kind])
    assert panel.error.isVisible() and message in panel.error.text()
    assert panel.rows == []
    panel.add_adapter(files["style"])  # the next good one clears the message
    assert not panel.error.isVisible()
    assert not panel.add_adapter(files["style"])
    assert "already in the LoRA stack" in panel.error.text()


def test_a_new_model_switches_off_what_does_not_fit(
    qtbot: QtBot, model_path: Path, files: dict[str, Path]
) -> None:
    panel = LoraPanel()
    qtbot.addWidget(panel)
    assert panel.add_adapter(files["wrong-dims"])  # no model yet: its shapes are not checked
    assert panel.add_adapter(files["style"])
    got = emitted(qtbot, panel, lambda: panel.set_model(model_path))
    assert got == stack((files["wrong-dims"], 1.0, False), (files["style"], 1.0, True))
    assert "Switched off: wide.gguf does not fit" in panel.error.text()
    assert "model has 640x256" in panel.rows[0].details.text()
    with qtbot.assertNotEmitted(panel.stackChanged):
        panel.rows[0].enable.setChecked(True)  # still refused
    assert not panel.rows[0].enable.isChecked()


def test_set_stack_shows_without_reporting(
    qtbot: QtBot, panel: LoraPanel, files: dict[str, Path], tmp_path: Path
) -> None:
    shown = stack((files["tone"], 0.5, True), (tmp_path / "gone.gguf", 1.0, False))
    with qtbot.assertNotEmitted(panel.stackChanged):
        panel.set_stack(shown)
    assert panel.stack() == shown
    assert panel.rows[0].spin.value() == 0.5
    assert "gone.gguf is missing" in panel.rows[1].details.text()
    panel.set_applied(shown)
    assert panel.status.text() == "Applied — LoRA: tone×0.5"
    panel.rows[0].spin.setValue(1.0)
    panel.set_applied(shown)
    assert "not applied" in panel.status.text()


class LoraFake(FakeEngine):
    """The fake engine with the LoRA calls the worker makes (and the capability declared)."""

    def __init__(self) -> None:
        super().__init__()
        self._stack = LoraStack()
        self.applied: list[LoraStack] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(FAKE_CAPABILITIES, lora=True)

    @property
    def lora_stack(self) -> LoraStack:
        return self._stack.copy()

    def set_lora_stack(self, stack: LoraStack) -> bool:
        if any(e.name == "refused" for e in stack):
            raise LamplightError("refused.gguf was built for llama, the loaded model is fake.")
        self._stack = stack.copy()
        self.applied.append(stack.copy())
        return True


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[tuple[EngineClient, LoraFake]]:
    fake = LoraFake()
    c = EngineClient(tmp_path / "models", engine_factory=lambda: fake)
    yield c, fake
    assert c.shutdown()


class Recorder(QObject):
    """Receives the worker's LoRA signals on the GUI thread, as the window would."""

    def __init__(self, client: EngineClient) -> None:
        super().__init__()
        self.events: list[tuple[object, ...]] = []
        client.worker.loraApplied.connect(self._on_applied)
        client.worker.loraFailed.connect(self._on_failed)
        client.worker.modelLoaded.connect(self._on_loaded)

    @Slot(object)
    def _on_applied(self, applied: LoraStack) -> None:
        self.events.append(("applied", applied))

    @Slot(str, object)
    def _on_failed(self, message: str, still: LoraStack) -> None:
        self.events.append(("failed", message, still))

    @Slot(object)
    def _on_loaded(self, _info: object) -> None:
        self.events.append(("loaded",))

    def next(self, qtbot: QtBot, count: int = 1) -> list[tuple[object, ...]]:
        start = len(self.events)
        qtbot.waitUntil(lambda: len(self.events) >= start + count, timeout=5000)
        return self.events[start:]


def test_the_worker_applies_stacks_and_reapplies_after_a_load(
    qtbot: QtBot, client: tuple[EngineClient, LoraFake], files: dict[str, Path], tmp_path: Path
) -> None:
    c, fake = client
    rec = Recorder(c)
    wanted = stack((files["style"], 0.8, True))
    c.set_lora_stack(wanted)  # no model yet: remembered for the load
    [(kind, message, still)] = rec.next(qtbot)
    assert kind == "failed" and "No model is loaded" in str(message) and still == LoraStack()
    c.load(tmp_path / "model.gguf", LoadConfig())
    assert rec.next(qtbot, 2) == [("applied", wanted), ("loaded",)]
    c.set_lora_stack(stack((tmp_path / "refused.gguf", 1.0, True)))
    [(kind, message, still)] = rec.next(qtbot)
    assert kind == "failed" and "built for llama" in str(message) and still == wanted
    c.set_lora_stack(LoraStack())
    assert rec.next(qtbot) == [("applied", LoraStack())]
    assert fake.applied == [wanted, LoraStack()]
