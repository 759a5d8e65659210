"""Load and generation settings, declared once with defaults and stored as JSON.

A settings file that cannot be used as a whole (not UTF-8, not JSON, nested too
deeply, not an object, a directory or a pipe in its place, too large,
unreadable) is set aside as ``settings.json.bad`` and the defaults are used. A
file whose values are only partly wrong (out of range, of the wrong type) is
repaired value by value (``app.config.field_spec.repair``): the original is kept
as ``settings.json.bad`` and the repaired settings are written in its place.
Either way the caller gets one line per change, to show the user: no value is
used other than as written without one (a wrong type, ``null`` where a value
belongs, a setting in the wrong group, a list cut to its limit).

Files carry ``version``. An older file is brought up to ``SETTINGS_VERSION`` one
step at a time (``MIGRATIONS``). A file written by a newer Lamplight is read as
well as this version can, and is never downgraded: it is not repaired on disk,
and saving keeps its version, the settings this version does not know, and every
value the user did not change here (see docs/notes/datafiles.md).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from app.config.api_settings import repair_api
from app.config.field_spec import short_repr
from app.config.params import repair_load, repair_sampling
from app.config.setting_records import ApiSettings, LoadConfig, SamplingParams
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, repair_on_disk, set_aside_note

log = logging.getLogger(__name__)

SETTINGS_VERSION = 2  # one more than the last step in MIGRATIONS
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
MAX_FOLDED = 1000
PROMPT_CHARS = 20_000  # a compaction prompt
# Where each group's settings belong, to say so when one is found in another place.
GROUPS = {"load": LoadConfig, "sampling": SamplingParams, "api": ApiSettings}


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
    folded_projects: list[str] = field(default_factory=list)  # sidebar groups folded
    compact_prompt: str = ""  # what a compaction asks the model ("": the default)
    theme: str = "system"  # follow the OS, or force "light" / "dark"
    load: LoadConfig = field(default_factory=LoadConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    api: ApiSettings = field(default_factory=ApiSettings)  # the local API server (off)
    # A file of a newer version, as read, and these settings as first read from it:
    # what ``to_json`` writes back over (never a setting of the file, never compared).
    newer: tuple[dict[str, Any], dict[str, Any]] | None = field(
        default=None, repr=False, compare=False
    )

    def to_json(self) -> str:
        data: dict[str, Any] = {"version": SETTINGS_VERSION, **self._values()}
        if self.newer is not None:
            raw, first = self.newer
            data = _over_newer(raw, first, data)
        return json.dumps(data, indent=2)

    def _values(self) -> dict[str, Any]:
        data = asdict(self)
        del data["newer"]
        # A projector belongs to one model (model prefs pair them), not to every load.
        del data["load"]["mmproj"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], notes: list[str] | None = None) -> AppSettings:
        """Settings from stored values; every invalid one is repaired and noted in ``notes``."""
        notes = [] if notes is None else notes
        _misplaced(data, notes)
        for key in GROUPS:
            if key in data and not isinstance(data[key], dict):
                notes.append(f"the {key} settings were not an object; using the defaults.")
        raw = copy.deepcopy(data) if _is_newer(data) else None
        version = data.get("version", SETTINGS_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            notes.append(f"version was not usable ({short_repr(version)}); version 1 is assumed.")
            version = 1
        elif version > SETTINGS_VERSION:
            notes.append(
                f"it was written by a newer Lamplight (settings version {short_repr(version)}); "
                "only the settings this version knows are used."
            )
        migrate(data, version)
        load, load_notes = repair_load(data.get("load"))
        sampling, sampling_notes = repair_sampling(data.get("sampling"))
        api, api_notes = repair_api(data.get("api"))
        notes += load_notes + sampling_notes + api_notes

        def take(key: str, ok: bool, default: Any) -> Any:
            if ok:
                return data[key]
            # Absent is the default; anything else not usable (null included, where the
            # default is not null) is said.
            if key in data and not (data[key] is None and default is None):
                notes.append(f"{key} was not usable ({short_repr(data[key])}); using the default.")
            return default

        model_path = data.get("model_path")
        system_prompt = data.get("system_prompt")
        last = data.get("last_conversation")
        budget = data.get("snapshot_budget_mb")
        imported = data.get("imported_models")
        paths = [p for p in imported if _is_path(p)] if isinstance(imported, list) else []
        if "imported_models" in data and (
            not isinstance(imported, list) or len(paths) != len(imported)
        ):
            notes.append("imported_models had entries that are not file paths; they were left out.")
        if len(paths) > MAX_IMPORTED:
            notes.append(
                f"imported_models listed {len(paths):,} files; the first {MAX_IMPORTED:,} are kept."
            )
        recent = _recent(data.get("recent_models", _ABSENT), notes)
        layout = _layout(data.get("window_layout", _ABSENT), notes)
        folded = _folded(data.get("folded_projects", _ABSENT), notes)
        prompt = data.get("compact_prompt")
        theme = data.get("theme")
        settings = cls(
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
            folded_projects=folded,
            compact_prompt=take(
                "compact_prompt", isinstance(prompt, str) and len(prompt) <= PROMPT_CHARS, ""
            ),
            theme=take("theme", theme in THEMES, "system"),
            load=load,
            sampling=sampling,
            api=api,
        )
        if raw is not None:
            settings.newer = (raw, settings._values())
        return settings

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
        if settings.newer is not None:
            # Not this version's to repair: a newer one may read it as it is.
            for note in repairs:
                log.warning("%s: %s", path.name, note)
            return settings, [f"{path.name}: {note}" for note in repairs]
        if not repairs:
            return settings, []
        notes = repair_on_disk(path, repairs, lambda: settings.save(path))
        for note in notes:
            log.warning("%s", note)
        return settings, notes


def _recent(value: Any, notes: list[str]) -> list[str]:
    """The recent-models list: paths, each once, at most ``MAX_RECENT``."""
    return _short_list(value, _is_path, MAX_RECENT, "recent_models", "file paths", notes)


def _folded(value: Any, notes: list[str]) -> list[str]:
    """The projects folded in the sidebar: ids, each once, at most ``MAX_FOLDED``."""
    return _short_list(value, _is_id, MAX_FOLDED, "folded_projects", "project ids", notes)


def _short_list(
    value: Any, ok: Callable[[Any], bool], most: int, key: str, what: str, notes: list[str]
) -> list[str]:
    """``value`` as a list of the items ``ok`` takes, each once, at most ``most``; a note
    when that changed it ([] when absent)."""
    if value is _ABSENT:
        return []
    items = value if isinstance(value, list) else []
    kept = list(dict.fromkeys(p for p in items if ok(p)))[:most]
    if kept != value:
        notes.append(f"{key} was not a short list of {what}; it was tidied.")
    return kept


def _layout(value: Any, notes: list[str]) -> dict[str, str]:
    """The saved window layout: a few named base64 strings; anything else is dropped."""
    if value is _ABSENT:
        return {}
    if not isinstance(value, dict):
        notes.append("window_layout was not an object; the default layout is used.")
        return {}
    kept = {k: v for k, v in value.items() if _is_layout_entry(k, v)}
    if len(kept) > LAYOUT_ENTRIES or len(kept) != len(value):
        notes.append("window_layout had unusable entries; they were left out.")
    return dict(list(kept.items())[:LAYOUT_ENTRIES])


_ABSENT: Any = object()  # a key the file does not have (``null`` is a value, and a wrong one)


def _misplaced(data: dict[str, Any], notes: list[str]) -> None:
    """Note settings of one group found at the top level or in another group: they are
    not used there (``{"n_ctx": ...}`` at the top level used to be dropped silently)."""
    home = {f.name: group for group, kind in GROUPS.items() for f in fields(kind)}
    places: list[tuple[str, Any]] = [("", data)]
    places += [(g, data[g]) for g in GROUPS if isinstance(data.get(g), dict)]
    top = {f.name for f in fields(AppSettings)} | {"version"}
    for where, values in places:
        for key in values:
            group = home.get(key)
            if group is None or group == where or (not where and key in top):
                continue
            inside = f"in the {where} settings" if where else "at the top level"
            notes.append(
                f"{key} was {inside}; it belongs in the {group} settings and was not used."
            )


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


def _queue_default_to_32(data: dict[str, Any]) -> None:
    """Version 1 to 2: version 1 wrote the old default queue size (8) into every file, and
    a burst of a dozen client requests was refused. A file's 8 is that default, not a
    choice: it becomes the new default."""
    api = data.get("api")
    if isinstance(api, dict) and api.get("max_queue") == 8:
        api["max_queue"] = 32


# Version N to N + 1, in place, on the file's data as read (before any repair).
MIGRATIONS: dict[int, Callable[[dict[str, Any]], None]] = {
    1: _queue_default_to_32,
}


def migrate(data: dict[str, Any], version: int) -> None:
    """Stored settings of ``version`` brought up to ``SETTINGS_VERSION`` (in place); a
    newer version is left as it is."""
    for step in range(version, SETTINGS_VERSION):
        MIGRATIONS[step](data)


def _is_newer(data: dict[str, Any]) -> bool:
    version = data.get("version")
    return isinstance(version, int) and not isinstance(version, bool) and version > SETTINGS_VERSION


def _over_newer(raw: dict[str, Any], first: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """What to write over a newer version's file ``raw``: its keys and version, with each
    setting this version knows that changed here (``now`` differs from ``first``, as
    read) written as it is now. One level of groups (``load``, ``sampling``, ``api``)."""
    out = {**raw}
    for key, value in now.items():
        if key == "version":
            continue
        old = raw.get(key, _ABSENT)
        if isinstance(value, dict) and isinstance(old, dict) and key in GROUPS:
            was = first.get(key, {})
            out[key] = {**old, **{k: v for k, v in value.items() if was.get(k, _ABSENT) != v}}
        elif old is _ABSENT or first.get(key, _ABSENT) != value:
            out[key] = value
    return out
