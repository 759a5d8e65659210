"""Pairing a local model with its vision projector (``mmproj``).

A model and a projector in the same folder are paired automatically: files named
``mmproj*.gguf`` or ``*mmproj*.gguf``; when several, the one whose name shares the
model's stem first, then by precision (F16, BF16, Q8_0, F32, others); one that
does not fit the model (its width, its architecture; from both headers) is passed
over, and so is one refused because loading it ended llama.cpp's process
(``projector_checks.json``, beside this file). A pairing chosen by hand (a file, or
none) is remembered per model in ``projectors.json`` in the data folder, keyed like
the model preferences (``app.config.model_prefs.model_key``: file name and size).
The file is read afresh for every question and written atomically, so any number of
windows and dialogs can use it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from app.config.model_prefs import model_key
from app.config.setting_records import LoadConfig
from app.gguf.header import int_value, parse_header, shown
from app.gguf.projector import ProjectorInfo, check_fits, read_projector
from app.gguf.projector_checks import FILE_NAME as CHECKS_FILE
from app.gguf.projector_checks import ProjectorChecks
from app.models.quant import quant_of
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json
from app.util.errors import LamplightError, ProjectorError

log = logging.getLogger(__name__)

FILE_NAME = "projectors.json"
VERSION = 1
MAX_BYTES = 4 * 1024 * 1024
MAX_MODELS = 1000
MAX_PATH = 4096
MAX_LISTED = 10_000  # folder entries looked at for projectors
_PRECISION = ("F16", "BF16", "Q8_0", "F32")


def is_projector_name(name: str) -> bool:
    """``mmproj*.gguf`` or ``*mmproj*.gguf`` (any case)."""
    low = name.lower()
    return low.endswith(".gguf") and "mmproj" in low


def candidates(model: Path) -> list[Path]:
    """Projector files beside ``model``, best first (see the module docstring)."""
    found: list[Path] = []
    try:
        with os.scandir(model.parent) as it:
            for n, entry in enumerate(it):
                if n >= MAX_LISTED:
                    break
                if not is_projector_name(entry.name) or entry.name.startswith("."):
                    continue
                try:
                    if stat.S_ISREG(os.stat(entry.path).st_mode):
                        found.append(Path(entry.path))
                except OSError:
                    continue
    except OSError as exc:
        log.info("projectors beside %s not listed: %s", model.name, exc)
        return []
    return sorted(found, key=lambda p: rank(model.name, p.name))


def _stem(name: str) -> str:
    """A model or projector name without quantization, ``mmproj`` and separators."""
    low = name.lower().removesuffix(".gguf")
    quant = quant_of(name).lower()
    if quant:
        low = low.replace(quant, "")
    low = low.replace("mmproj", "").replace("model", "")
    return "".join(c for c in low if c.isalnum())


def rank(model: str, projector: str) -> tuple[int, int, str]:
    """Sort key of projector file ``projector`` for model file ``model``: lower is better."""
    mine, theirs = _stem(model), _stem(projector)
    shares = bool(theirs) and (theirs in mine or mine in theirs)
    quant = quant_of(projector)
    precision = _PRECISION.index(quant) if quant in _PRECISION else len(_PRECISION)
    return (0 if shares else 1, precision, projector)


@dataclass(frozen=True)
class ModelShape:
    """What a projector must fit: the model's architecture and width."""

    architecture: str
    n_embd: int | None


def model_shape(model: Path) -> ModelShape | None:
    """The architecture and width from ``model``'s header; None if it cannot be read."""
    try:
        meta, _tensors, _start = parse_header(model)
    except (OSError, ValueError) as exc:
        log.info("%s: header not read for pairing: %s", model.name, exc)
        return None
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return None
    return ModelShape(arch, int_value(meta.get(f"{arch}.embedding_length")))


class ProjectorRefused(ProjectorError):
    """A projector whose load ended llama.cpp's process (in a test process, or the app's)."""


def check_pair(
    projector: Path, shape: ModelShape | None, model: str, checks: ProjectorChecks | None = None
) -> ProjectorInfo:
    """Read ``projector`` and check it fits a model of ``shape`` (and, with ``checks``,
    that it was not refused for ending llama.cpp's process).

    Raises:
        ProjectorError: it is not a usable projector, or does not fit.
    """
    info = read_projector(projector)
    if shape is not None:
        check_fits(info, shape.n_embd, shape.architecture, model=model)
    refused = checks.refused(info) if checks is not None else ""
    if refused:
        raise ProjectorRefused(refused)
    return info


def find_projector(
    model: Path, shape: ModelShape | None = None, checks: ProjectorChecks | None = None
) -> Path | None:
    """The best projector beside ``model`` that fits it, or None."""
    return pick_projector(model, shape, checks)[0]


def pick_projector(
    model: Path, shape: ModelShape | None = None, checks: ProjectorChecks | None = None
) -> tuple[Path | None, str]:
    """The best projector beside ``model`` that fits it (or None), and why the best one
    refused by ``checks`` was passed over ('' when none was)."""
    found = candidates(model)
    if not found:
        return None, ""
    shape = shape or model_shape(model)
    refused = ""
    for path in found:
        try:
            check_pair(path, shape, shown(model.name), checks)
        except ProjectorRefused as exc:
            refused = refused or str(exc)
            continue
        except ProjectorError as exc:
            log.info("projector %s passed over: %s", path.name, exc)
            continue
        return path, refused
    return None, refused


class ProjectorPairs:
    """Projectors chosen by hand, per model: a path, or "" for none."""

    def __init__(self, path: Path, checks: Path | None = None) -> None:
        self.path = path
        # What is known against projector files (the engine's guard writes it).
        self.checks = ProjectorChecks(checks or path.with_name(CHECKS_FILE))

    def _read(self) -> dict[str, str]:
        try:
            data = read_json(self.path, MAX_BYTES, 3)
        except FileNotFoundError:
            return {}
        except DataFileError as exc:
            log.warning("%s %s; pairings by hand are not used", self.path.name, exc)
            return {}
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict) or data.get("version") != VERSION:
            return {}
        return {
            k: v
            for k, v in list(models.items())[-MAX_MODELS:]
            if isinstance(k, str) and isinstance(v, str) and len(k) <= 1000 and len(v) <= MAX_PATH
        }

    def get(self, model: Path) -> str | None:
        """The projector chosen for ``model`` ("" for none), or None: automatic."""
        key = _key(model)
        return None if key is None else self._read().get(key)

    def set(self, model: Path, projector: str | None) -> None:
        """Remember ``projector`` for ``model`` ("" for none, None: automatic again).

        Raises:
            OSError: the file could not be written (or the model is gone).
        """
        if projector is not None and len(projector) > MAX_PATH:
            raise ValueError("the projector's path is too long")
        key = _key(model)
        if key is None:
            raise FileNotFoundError(f"{model.name} is not there")
        models = self._read()
        models.pop(key, None)
        if projector is not None:
            models[key] = projector  # the most recently chosen last
        models = dict(list(models.items())[-MAX_MODELS:])
        atomic_write_text(self.path, json.dumps({"version": VERSION, "models": models}, indent=1))


def _key(model: Path) -> str | None:
    try:
        return model_key(model, model.stat().st_size)
    except OSError:
        return None


def projector_for(model: Path, pairs: ProjectorPairs) -> tuple[str, str]:
    """The projector to load with ``model`` and a note ("" or why a chosen one is not used)."""
    chosen = pairs.get(model)
    if chosen == "":
        return "", ""
    if chosen is None:
        found, refused = pick_projector(model, checks=pairs.checks)
        note = f"The model is loaded without its vision projector: {refused}" if refused else ""
        return (str(found) if found else ""), "" if found else note
    try:
        check_pair(Path(chosen), model_shape(model), shown(model.name), pairs.checks)
    except ProjectorError as exc:
        return "", f"The model is loaded without its vision projector: {exc}"
    return chosen, ""


def load_config_for(model: Path, base: LoadConfig, pairs: ProjectorPairs) -> tuple[LoadConfig, str]:
    """``base`` with the projector for ``model`` (see ``projector_for``), and its note."""
    try:
        mmproj, note = projector_for(model, pairs)
    except (LamplightError, OSError, ValueError) as exc:  # pairing must never stop a load
        log.warning("projector for %s not chosen: %r", model.name, exc)
        mmproj, note = "", ""
    return replace(base, mmproj=mmproj), note
