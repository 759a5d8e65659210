"""Load and generation settings, declared once with defaults and stored as JSON.

A settings file that cannot be used as a whole (not UTF-8, not JSON, nested too
deeply, not an object, a directory or a pipe in its place, too large,
unreadable) is set aside as ``settings.json.bad`` and the defaults are used. A
file whose values are only partly wrong (out of range, of the wrong type) is
repaired value by value (``app.config.params.repair``): the original is kept
as ``settings.json.bad`` and the repaired settings are written in its place.
Either way the caller gets one line per change, to show the user.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.config.params import (
    ApiSettings,
    LoadConfig,
    SamplingParams,
    repair_api,
    repair_load,
    repair_sampling,
    short_repr,
)
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, repair_on_disk, set_aside_note

log = logging.getLogger(__name__)

SETTINGS_VERSION = 1
MAX_BYTES = 4 * 1024 * 1024  # far above any real settings file (schemas included)
MAX_DEPTH = 8  # the real file nests 3 levels: {"sampling": {"stop": [...]}}
PATH_CHARS = 4096
ID_CHARS = 128
MAX_IMPORTED = 10_000
DEFAULT_BUDGET_MB = 1024
MAX_RECENT = 8  # Model -> Recent models
THEMES = ("system", "light", "dark")
# The window's saved layout: Qt's own geometry/state blobs, base64. The real ones are
# a few hundred bytes; the UI checks their binary format before Qt sees them.
LAYOUT_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
LAYOUT_ENTRIES = 16
LAYOUT_CHARS = 16_384


@dataclass
class AppSettings:
    """Everything the app remembers between runs."""

    model_path: str | None = None
    system_prompt: str = ""
    last_conversation: str | None = None
    snapshot_budget_mb: int = DEFAULT_BUDGET_MB  # KV snapshots beyond this are dropped
    imported_models: list[str] = field(default_factory=list)  # GGUFs listed where they are
    recent_models: list[str] = field(default_factory=list)  # most recent first
    window_layout: dict[str, str] = field(default_factory=dict)  # name -> base64 blob
    theme: str = "system"  # follow the OS, or force "light" / "dark"
    load: LoadConfig = field(default_factory=LoadConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    api: ApiSettings = field(default_factory=ApiSettings)  # the local API server (off)

    def to_json(self) -> str:
        data: dict[str, Any] = {"version": SETTINGS_VERSION, **asdict(self)}
        return json.dumps(data, indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any], notes: list[str] | None = None) -> AppSettings:
        """Settings from stored values; every invalid one is repaired and noted in ``notes``."""
        notes = [] if notes is None else notes
        for key in ("load", "sampling", "api"):
            if key in data and not isinstance(data[key], dict):
                notes.append(f"the {key} settings were not an object; using the defaults.")
        load, load_notes = repair_load(data.get("load"))
        sampling, sampling_notes = repair_sampling(data.get("sampling"))
        api, api_notes = repair_api(data.get("api"))
        notes += load_notes + sampling_notes + api_notes

        def take(key: str, ok: bool, default: Any) -> Any:
            if ok:
                return data[key]
            if data.get(key) is not None:
                notes.append(f"{key} was not usable ({short_repr(data[key])}); using the default.")
            return default

        model_path = data.get("model_path")
        system_prompt = data.get("system_prompt")
        last = data.get("last_conversation")
        budget = data.get("snapshot_budget_mb")
        imported = data.get("imported_models")
        paths = [p for p in imported if _is_path(p)] if isinstance(imported, list) else []
        if imported is not None and (not isinstance(imported, list) or len(paths) != len(imported)):
            notes.append("imported_models had entries that are not file paths; they were left out.")
        recent = _recent(data.get("recent_models"), notes)
        layout = _layout(data.get("window_layout"), notes)
        theme = data.get("theme")
        return cls(
            model_path=take("model_path", _is_path(model_path), None),
            system_prompt=take("system_prompt", isinstance(system_prompt, str), ""),
            last_conversation=take("last_conversation", _is_id(last), None),
            snapshot_budget_mb=take(
                "snapshot_budget_mb",
                isinstance(budget, int) and not isinstance(budget, bool) and 0 <= budget < 2**40,
                DEFAULT_BUDGET_MB,
            ),
            imported_models=paths[:MAX_IMPORTED],
            recent_models=recent,
            window_layout=layout,
            theme=take("theme", theme in THEMES, "system"),
            load=load,
            sampling=sampling,
            api=api,
        )

    def remember_model(self, path: str) -> None:
        """Put ``path`` first in ``recent_models`` (once), keeping the newest ``MAX_RECENT``."""
        if _is_path(path):
            rest = [p for p in self.recent_models if p != path]
            self.recent_models = [path, *rest][:MAX_RECENT]

    def save(self, path: Path) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load_from(cls, path: Path) -> AppSettings:
        """``load_with_notes`` without the notes (they are logged)."""
        return cls.load_with_notes(path)[0]

    @classmethod
    def load_with_notes(cls, path: Path) -> tuple[AppSettings, list[str]]:
        """Read settings; never raises for what is in the file. Returns the settings and
        one line per thing that was wrong with it (empty when it was fine or missing)."""
        try:
            data = read_json(path, MAX_BYTES, MAX_DEPTH)
            if not isinstance(data, dict):
                raise DataFileError("is not a JSON object")
        except FileNotFoundError:
            return cls(), []
        except DataFileError as exc:
            note = set_aside_note(path, str(exc), "the defaults are used")
            log.warning("%s", note)
            return cls(), [note]
        repairs: list[str] = []
        settings = cls.from_dict(data, repairs)
        if not repairs:
            return settings, []
        notes = repair_on_disk(path, repairs, lambda: settings.save(path))
        for note in notes:
            log.warning("%s", note)
        return settings, notes


def _recent(value: Any, notes: list[str]) -> list[str]:
    """The recent-models list: paths, each once, at most ``MAX_RECENT``."""
    if value is None:
        return []
    items = value if isinstance(value, list) else []
    kept = list(dict.fromkeys(p for p in items if _is_path(p)))[:MAX_RECENT]
    if kept != items:
        notes.append("recent_models was not a short list of file paths; it was tidied.")
    return kept


def _layout(value: Any, notes: list[str]) -> dict[str, str]:
    """The saved window layout: a few named base64 strings; anything else is dropped."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        notes.append("window_layout was not an object; the default layout is used.")
        return {}
    kept = {k: v for k, v in value.items() if _is_layout_entry(k, v)}
    if len(kept) > LAYOUT_ENTRIES or len(kept) != len(value):
        notes.append("window_layout had unusable entries; they were left out.")
    return dict(list(kept.items())[:LAYOUT_ENTRIES])


def _is_layout_entry(key: Any, value: Any) -> bool:
    if not (isinstance(key, str) and LAYOUT_KEY.fullmatch(key)):
        return False
    if not (isinstance(value, str) and 0 < len(value) <= LAYOUT_CHARS and value.isascii()):
        return False
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _is_path(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= PATH_CHARS and "\0" not in value


def _is_id(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= ID_CHARS
        and value.isascii()
        and value.isalnum()
    )
