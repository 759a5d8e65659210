"""The window's shared state: the one loaded-model observable and the settings saveable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from ui.common.context import LoadedModel, SettingsStore


def info(path: str, server: str = "") -> ModelInfo:
    return ModelInfo(
        Path(path), Path(path).stem, "gemma3", 1, 1, 512, 512, 1, 0, "", "cpu", 0.0, server=server
    )


def test_the_loaded_model_says_every_change_and_which_are_loads(qtbot: QtBot) -> None:
    model = LoadedModel()
    changed: list[object] = []
    loaded: list[object] = []
    model.changed.connect(changed.append)
    model.loaded.connect(loaded.append)
    assert not model.ready and model.local_path is None
    model.set_loading(True)
    assert model.loading and not model.ready
    a = info("/m/a.gguf")
    model.set_loading(False)
    model.set_loaded(a)
    assert model.ready and model.local_path == "/m/a.gguf"
    model.set(a)  # a template applied: the same model, no new load
    model.set(None)
    assert changed == [a, a, None] and loaded == [a]
    model.set_loaded(info("/x", server="http://host:8080"))
    assert model.local_path is None  # a server's model has no local file


def test_settings_are_written_once_per_change_and_only_when_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "settings.json"
    store = SettingsStore(AppSettings(), path)
    writes: list[Path] = []
    real_save = AppSettings.save
    monkeypatch.setattr(AppSettings, "save", lambda s, p: (writes.append(p), real_save(s, p)))
    store.update(theme="dark", system_prompt="Be brief.")
    assert writes == [path] and not store.dirty
    assert AppSettings.load_from(path).theme == "dark"
    store.update(theme="dark")  # nothing changed: nothing written
    assert store.save() and writes == [path]
    store.value.remember_model("/m/a.gguf")
    store.mark_dirty()
    store.save()
    assert len(writes) == 2 and AppSettings.load_from(path).recent_models == ["/m/a.gguf"]
    with pytest.raises(AttributeError):
        store.update(no_such_setting=1)


def test_a_failed_write_is_said_and_tried_again(tmp_path: Path) -> None:
    said: list[str] = []
    blocked = tmp_path / "file"
    blocked.write_text("")
    store = SettingsStore(AppSettings(), blocked / "settings.json", said.append)
    store.update(theme="light")
    assert store.dirty and len(said) == 1 and said[0].startswith("Could not save settings")
    store.path = tmp_path / "settings.json"
    assert store.save() and not store.dirty
    assert AppSettings.load_from(store.path).theme == "light"
