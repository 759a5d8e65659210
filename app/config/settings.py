"""Load and generation settings, declared once with defaults and stored as JSON."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from app.config.params import SPEC_BY_NAME, LoadConfig, SamplingParams, SettingError, check
from app.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

SETTINGS_VERSION = 1


@dataclass
class AppSettings:
    """Everything the app remembers between runs."""

    model_path: str | None = None
    system_prompt: str = ""
    last_conversation: str | None = None
    snapshot_budget_mb: int = 1024  # KV snapshots beyond this are dropped, oldest use first
    imported_models: list[str] = field(default_factory=list)  # GGUFs listed where they are
    load: LoadConfig = field(default_factory=LoadConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def to_json(self) -> str:
        data: dict[str, Any] = {"version": SETTINGS_VERSION, **asdict(self)}
        return json.dumps(data, indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AppSettings:
        load = _pick(LoadConfig, data.get("load"))
        sampling = _pick(SamplingParams, data.get("sampling"))
        if "stop" in sampling:
            sampling["stop"] = tuple(str(s) for s in sampling["stop"])
        sampling = _valid_or_default(sampling)
        model_path = data.get("model_path")
        last = data.get("last_conversation")
        budget = data.get("snapshot_budget_mb")
        return cls(
            model_path=str(model_path) if model_path else None,
            system_prompt=str(data.get("system_prompt", "")),
            last_conversation=str(last) if isinstance(last, str) and last.isalnum() else None,
            snapshot_budget_mb=budget
            if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
            else 1024,
            imported_models=[
                str(p) for p in data.get("imported_models") or [] if isinstance(p, str)
            ],
            load=LoadConfig(**load),
            sampling=SamplingParams(**sampling),
        )

    def save(self, path: Path) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load_from(cls, path: Path) -> AppSettings:
        """Read settings; a missing or unreadable file gives defaults (and is kept aside)."""
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls.from_dict(data)
        except (ValueError, TypeError) as exc:
            aside = path.with_suffix(".json.bad")
            log.warning("settings file %s unreadable (%s); kept as %s", path, exc, aside)
            path.replace(aside)
            return cls()


def _valid_or_default(values: dict[str, Any]) -> dict[str, Any]:
    """Values that pass validation; a bad one falls back to its default."""
    out = {}
    for name, value in values.items():
        spec = SPEC_BY_NAME.get(name)
        try:
            out[name] = check(spec, value) if spec is not None else value
        except SettingError as exc:
            log.warning("settings: %s; using the default", exc)
    return out


def _pick(kind: type, data: object) -> dict[str, Any]:
    """Known fields of ``kind`` from ``data`` whose type matches the default's type."""
    if not isinstance(data, dict):
        return {}
    out: dict[str, Any] = {}
    for f in fields(kind):
        if f.name not in data:
            continue
        value = data[f.name]
        default = f.default
        if isinstance(default, bool) or default is None:
            ok = isinstance(value, type(default)) if default is not None else True
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, tuple):
            ok = isinstance(value, list)
        else:
            ok = isinstance(value, type(default))
        if ok:
            out[f.name] = value
    return out
