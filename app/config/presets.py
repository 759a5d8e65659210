"""Sampling presets: built-ins, user presets (JSON file), import/export, per-model defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.config.field_spec import SettingError, short_repr
from app.config.params import repair_sampling, sampling_to_dict, validate_sampling
from app.config.setting_records import SamplingParams
from app.util.atomic import atomic_write_text
from app.util.datafiles import (
    DataFileError,
    parse_json,
    read_json,
    repair_on_disk,
    set_aside_note,
)

BUILTIN: dict[str, SamplingParams] = {
    "Precise": SamplingParams(
        temperature=0.2, top_k=20, top_p=0.9, min_p=0.05, repeat_penalty=1.05
    ),
    "Balanced": SamplingParams(),
    "Creative": SamplingParams(
        temperature=1.1, top_k=100, top_p=0.98, min_p=0.02, repeat_penalty=1.0, presence_penalty=0.3
    ),
}
DEFAULT_PRESET = "Balanced"
NAME_CHARS = 60
MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 8  # the real file nests 4 levels: {"presets": {name: {"stop": [...]}}}
MAX_PRESETS = 1000
KEY_CHARS = 1000


class PresetError(SettingError):
    """A preset name or file that cannot be used."""


class PresetStore:
    """User presets and per-model defaults, kept in one JSON file (written atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.user: dict[str, SamplingParams] = {}
        self.model_defaults: dict[str, str] = {}  # model fingerprint or name -> preset name
        self.notes: list[str] = []  # what was wrong with the file, for the user
        self._load()

    def names(self) -> list[str]:
        return [*BUILTIN, *sorted(self.user)]

    def get(self, name: str) -> SamplingParams:
        if name in BUILTIN:
            return BUILTIN[name]
        if name in self.user:
            return self.user[name]
        raise PresetError("preset", f"There is no preset called {name!r}.")

    def is_builtin(self, name: str) -> bool:
        return name in BUILTIN

    def save(self, name: str, params: SamplingParams) -> None:
        name = self._checked_name(name)
        if name in BUILTIN:
            raise PresetError("preset", f"{name!r} is built in; save under another name.")
        self.user[name] = params
        self._write()

    def rename(self, old: str, new: str) -> None:
        new = self._checked_name(new)
        if old not in self.user:
            raise PresetError("preset", f"Only your own presets can be renamed ({old!r}).")
        if new in BUILTIN or (new in self.user and new != old):
            raise PresetError("preset", f"A preset called {new!r} exists already.")
        self.user[new] = self.user.pop(old)
        self.model_defaults = {k: (new if v == old else v) for k, v in self.model_defaults.items()}
        self._write()

    def delete(self, name: str) -> None:
        if name not in self.user:
            raise PresetError("preset", f"Only your own presets can be deleted ({name!r}).")
        del self.user[name]
        self.model_defaults = {k: v for k, v in self.model_defaults.items() if v != name}
        self._write()

    def set_model_default(self, model_key: str, name: str) -> None:
        self.get(name)
        self.model_defaults[model_key] = name
        self._write()

    def default_for(self, model_key: str) -> str:
        name = self.model_defaults.get(model_key, DEFAULT_PRESET)
        return name if name in BUILTIN or name in self.user else DEFAULT_PRESET

    def export_preset(self, name: str) -> str:
        return json.dumps(
            {"lamplight_preset": 1, "name": name, "params": sampling_to_dict(self.get(name))},
            indent=1,
        )

    def import_preset(self, text: str) -> str:
        """Add a preset from exported JSON; returns its (possibly de-duplicated) name."""
        try:
            data = parse_json(text, MAX_DEPTH)
        except DataFileError as exc:
            raise PresetError("preset", f"Not a preset file: it {exc}.") from exc
        if not isinstance(data, dict) or data.get("lamplight_preset") != 1:
            raise PresetError("preset", "Not a Lamplight preset file.")
        params = validate_sampling(_params_dict(data.get("params")))
        name = self._checked_name(str(data.get("name", "Imported")))
        base, n = name, 2
        while name in BUILTIN or name in self.user:
            name = f"{base} ({n})"
            n += 1
        self.save(name, params)
        return name

    def _checked_name(self, name: str) -> str:
        name = " ".join(name.split())
        if not name or len(name) > NAME_CHARS:
            raise PresetError("preset", f"A preset name needs 1 to {NAME_CHARS} characters.")
        return name

    def _load(self) -> None:
        """Read the file. One that cannot be used as a whole is set aside as ``.bad``
        (only the built-ins are listed); bad presets or values in a usable one are left
        out or repaired, and the original is kept as ``.bad`` before the repaired file is
        written. ``notes`` says what happened, one line each."""
        try:
            data = read_json(self.path, MAX_BYTES, MAX_DEPTH)
            if not isinstance(data, dict):
                raise DataFileError("is not a JSON object")
            presets = data.get("presets") or {}
            defaults = data.get("model_defaults") or {}
            if not isinstance(presets, dict) or not isinstance(defaults, dict):
                raise DataFileError("does not hold a table of presets")
        except FileNotFoundError:
            return
        except DataFileError as exc:
            self.notes.append(
                set_aside_note(self.path, str(exc), "only the built-in presets are listed")
            )
            return
        repairs: list[str] = []
        for raw_name, values in list(presets.items())[:MAX_PRESETS]:
            name = " ".join(raw_name.split())
            if not name or len(name) > NAME_CHARS or name in BUILTIN or name in self.user:
                repairs.append(f"the preset {short_repr(raw_name)} was left out (bad name).")
                continue
            if not isinstance(values, dict):
                repairs.append(f"the preset {name!r} was left out (no settings).")
                continue
            params, notes = repair_sampling(values)
            repairs += [f"preset {name!r}: {n}" for n in notes]
            if name != raw_name:
                repairs.append(f"the preset {short_repr(raw_name)} is now called {name!r}.")
            self.user[name] = params
        if len(presets) > MAX_PRESETS:
            repairs.append(f"only the first {MAX_PRESETS} presets were kept.")
        for key, value in defaults.items():
            if isinstance(value, str) and len(key) <= KEY_CHARS and len(value) <= KEY_CHARS:
                self.model_defaults[key] = value
            else:
                repairs.append(f"the default preset for {short_repr(key)} was left out.")
        if repairs:
            self.notes += repair_on_disk(self.path, repairs, self._write)

    def _write(self) -> None:
        data = {
            "version": 1,
            "presets": {n: sampling_to_dict(p) for n, p in self.user.items()},
            "model_defaults": self.model_defaults,
        }
        atomic_write_text(self.path, json.dumps(data, indent=1))


def _params_dict(values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise PresetError("preset", "The preset has no settings.")
    out = dict(values)
    if isinstance(out.get("stop"), list):
        out["stop"] = tuple(out["stop"])
    return out
