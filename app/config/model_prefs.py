"""Per-model preferences: default system prompt, chat template choice, continue-the-text mode.

Kept in one JSON file in the data directory (``model_prefs.json``), keyed by
``model_key`` (the model file's name and size, so a re-download of the same file
keeps them and another quantization of the same model has its own). Written
atomically. Read like every data file (``app.util.datafiles``): bounded size and
depth, and a file that cannot be used as a whole is set aside as ``.bad``; a usable
file with bad entries or values is repaired entry by entry (the original kept as
``.bad``), and ``notes`` says what happened, one line each.

Loading and saving keep the same entries: the ``MAX_MODELS`` most recently used
models (the file lists them oldest first), within ``MAX_BYTES``. A write evicts
the least recently used beyond that, so a file the app wrote always loads whole;
a longer file (hand-made, or from an older version) loses its oldest entries at
load, with a note.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any, Literal

from app.config.field_spec import short_repr
from app.util.atomic import atomic_write_text
from app.util.datafiles import (
    DataFileError,
    clean_text,
    read_json,
    repair_on_disk,
    set_aside_note,
)

log = logging.getLogger(__name__)

FILE_NAME = "model_prefs.json"
PREFS_VERSION = 1
MAX_MODELS = 1000
KEY_CHARS = 1000
SYSTEM_PROMPT_CHARS = 100_000
TEMPLATE_CHARS = 200_000  # app.engine.templates.sandbox.MAX_SOURCE_CHARS (a test checks)
NAME_CHARS = 60
MAX_BYTES = 64 * 1024 * 1024  # 1000 models with a 200 000-character template would be 200 MB
ENTRY_SLACK = 64  # bytes per entry for the indentation and separators around it
MAX_DEPTH = 4  # {"models": {key: {"template": {...}}}}
TemplateKind = Literal["auto", "builtin", "custom"]
TEMPLATE_KINDS: tuple[TemplateKind, ...] = ("auto", "builtin", "custom")


@dataclass(frozen=True)
class ModelPrefs:
    """What the user chose for one model.

    ``system_prompt``: the default for new chats with this model (None: the global
    default applies). ``template``/``template_name``/``template_source``: the chat
    template (see ``app.engine.templates.override.TemplateOverride``). ``completion``:
    continue-the-text mode (None: on for base models, off for the others).
    """

    system_prompt: str | None = None
    template: TemplateKind = "auto"
    template_name: str = ""
    template_source: str = ""
    completion: bool | None = None

    @property
    def is_default(self) -> bool:
        return self == ModelPrefs()

    def completion_on(self, base_model: bool) -> bool:
        return base_model if self.completion is None else self.completion

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.system_prompt is not None:
            out["system_prompt"] = self.system_prompt
        if self.template != "auto":
            out["template"] = {
                "kind": self.template,
                "name": self.template_name,
                "source": self.template_source,
            }
        if self.completion is not None:
            out["completion"] = self.completion
        return out


def model_key(path: str | PurePath, size: int, server: str = "") -> str:
    """The key a model's preferences are stored under: file name and size (and server)."""
    name = PurePath(str(path).replace("\\", "/")).name or str(path)
    key = f"{name}:{size}"
    return f"{server} {key}"[:KEY_CHARS] if server else key[:KEY_CHARS]


def prefs_from_dict(values: Any, notes: list[str] | None = None) -> ModelPrefs:
    """Preferences from stored values; each unusable value keeps its default (and a note)."""
    notes = [] if notes is None else notes
    if not isinstance(values, dict):
        notes.append("was not an object; its preferences were reset.")
        return ModelPrefs()
    prefs = ModelPrefs()
    prompt = values.get("system_prompt")
    if isinstance(prompt, str) and len(prompt) <= SYSTEM_PROMPT_CHARS:
        prefs = replace(prefs, system_prompt=prompt)
    elif prompt is not None:
        notes.append(f"the system prompt was not usable ({short_repr(prompt)}).")
    completion = values.get("completion")
    if isinstance(completion, bool):
        prefs = replace(prefs, completion=completion)
    elif completion is not None:
        notes.append(f"the text-completion setting was not usable ({short_repr(completion)}).")
    template = values.get("template")
    if template is not None:
        prefs = _template(prefs, template, notes)
    return prefs


def _template(prefs: ModelPrefs, template: Any, notes: list[str]) -> ModelPrefs:
    if not isinstance(template, dict):
        notes.append(f"the chat template choice was not usable ({short_repr(template)}).")
        return prefs
    kind, name, source = template.get("kind"), template.get("name", ""), template.get("source", "")
    if kind not in TEMPLATE_KINDS:
        notes.append(f"the chat template kind {short_repr(kind)} is unknown; automatic is used.")
        return prefs
    if not isinstance(name, str) or not isinstance(source, str):
        notes.append("the chat template choice was not text; automatic is used.")
        return prefs
    if kind == "builtin" and not 0 < len(name) <= NAME_CHARS:
        notes.append(f"the built-in template name {short_repr(name)} is not usable.")
        return prefs
    if kind == "custom" and not 0 < len(source) <= TEMPLATE_CHARS:
        notes.append(
            f"the custom chat template was empty or over {TEMPLATE_CHARS} characters; "
            "automatic is used."
        )
        return prefs
    return replace(
        prefs,
        template=kind,
        template_name=name if kind == "builtin" else "",
        template_source=source if kind == "custom" else "",
    )


def _cleaned(prefs: ModelPrefs) -> ModelPrefs:
    """``prefs`` with lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD."""
    prompt = prefs.system_prompt
    return replace(
        prefs,
        system_prompt=None if prompt is None else clean_text(prompt),
        template_name=clean_text(prefs.template_name),
        template_source=clean_text(prefs.template_source),
    )


class ModelPrefsStore:
    """Every model's preferences, in one JSON file (written atomically on each change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._prefs: dict[str, ModelPrefs] = {}
        self.notes: list[str] = []  # what was wrong with the file, for the user
        self._load()

    def get(self, key: str) -> ModelPrefs:
        """``key``'s preferences; it counts as used now (kept longest; saved with the
        next write)."""
        prefs = self._prefs.pop(key, None)
        if prefs is None:
            return ModelPrefs()
        self._prefs[key] = prefs
        return prefs

    def set(self, key: str, prefs: ModelPrefs) -> None:
        """Store ``prefs`` for ``key`` and write the file.

        Raises:
            ValueError: the key or a value is over its limit.
            OSError: the file could not be written (the preferences in memory are kept).
        """
        if not 0 < len(key) <= KEY_CHARS:
            raise ValueError(f"a model key needs 1 to {KEY_CHARS} characters")
        key = clean_text(key)
        prefs = _cleaned(prefs)
        problems: list[str] = []
        checked = prefs_from_dict(prefs.to_dict(), problems)
        if problems or checked != prefs:
            raise ValueError(problems[0] if problems else "these preferences cannot be stored")
        self._prefs.pop(key, None)
        if not prefs.is_default:
            self._prefs[key] = prefs  # the most recently used, last
        self._write()

    def update(self, key: str, **changes: Any) -> ModelPrefs:
        """``set`` the model's preferences with ``changes``; returns the new preferences."""
        prefs = replace(self.get(key), **changes)
        self.set(key, prefs)
        return prefs

    def _load(self) -> None:
        try:
            data = read_json(self.path, MAX_BYTES, MAX_DEPTH)
            if not isinstance(data, dict):
                raise DataFileError("is not a JSON object")
            models = data.get("models", {})
            if not isinstance(models, dict):
                raise DataFileError("does not hold a table of models")
            version = data.get("version", PREFS_VERSION)
            if version != PREFS_VERSION:
                raise DataFileError(f"has an unknown version {short_repr(version)}")
        except FileNotFoundError:
            return
        except DataFileError as exc:
            note = set_aside_note(self.path, str(exc), "every model uses the defaults")
            log.warning("%s", note)
            self.notes.append(note)
            return
        repairs: list[str] = []
        items = list(models.items())
        if len(items) > MAX_MODELS:
            # The file lists the least recently used first: keep the newest, as a write does.
            repairs.append(
                f"{len(items) - MAX_MODELS} models' preferences were left out: only the "
                f"{MAX_MODELS} most recently used are kept."
            )
            items = items[-MAX_MODELS:]
        for key, values in items:
            if not 0 < len(key) <= KEY_CHARS:
                repairs.append(f"the entry {short_repr(key)} was left out (bad model key).")
                continue
            problems: list[str] = []
            prefs = prefs_from_dict(values, problems)
            repairs += [f"{short_repr(key)}: {p}" for p in problems]
            if not prefs.is_default:
                self._prefs[key] = prefs
        if repairs:
            self._repair(repairs)

    def _repair(self, repairs: list[str]) -> None:
        self.notes += repair_on_disk(self.path, repairs, self._write)
        for note in self.notes:
            log.warning("%s", note)

    def _write(self) -> None:
        """Write what ``_load`` reads back whole: the least recently used entries beyond
        ``MAX_MODELS`` or ``MAX_BYTES`` are evicted first."""
        models = {k: p.to_dict() for k, p in self._prefs.items()}
        sizes = {k: _entry_bytes(k, v) for k, v in models.items()}
        total = sum(sizes.values())
        evicted = []
        for key in list(models):
            if len(models) <= MAX_MODELS and total <= MAX_BYTES - 1024:  # 1 KiB: the envelope
                break
            if len(models) == 1:
                break  # the entry just set: far under MAX_BYTES (its fields are bounded)
            total -= sizes[key]
            del models[key], self._prefs[key]
            evicted.append(key)
        if evicted:
            log.info(
                "model_prefs.json: the preferences of %d least recently used models were "
                "dropped to stay within %d models and %d MB",
                len(evicted),
                MAX_MODELS,
                MAX_BYTES >> 20,
            )
        data = {"version": PREFS_VERSION, "models": models}
        atomic_write_text(self.path, json.dumps(data, indent=1, ensure_ascii=False))


def _entry_bytes(key: str, values: dict[str, Any]) -> int:
    """About what one entry takes in the file (an upper bound with ``ENTRY_SLACK``)."""
    text = json.dumps({key: values}, indent=1, ensure_ascii=False)
    return len(text.encode("utf-8")) + ENTRY_SLACK
