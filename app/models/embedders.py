"""The embedding models in ``<data>/embedders``, and which one documents use.

The choice lives in ``<data>/embedders/chosen.json`` (``{"file": "<name>.gguf"}``, a
file name inside the folder, never a path elsewhere), written atomically and read
defensively: a missing, damaged or no longer usable choice falls back to the
built-in model.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from app.gguf.embedder import EmbedderInfo, read_embedder_info
from app.models.default_embedder import embedders_dir, ensure_default_embedder
from app.util.atomic import atomic_write_text
from app.util.errors import EmbedderError, ModelFileError

log = logging.getLogger(__name__)

CHOSEN_FILE = "chosen.json"
MAX_CHOSEN_BYTES = 4096
MAX_LISTED = 200  # files looked at in the folder


def list_embedders(data_dir: Path, notes: list[str] | None = None) -> list[EmbedderInfo]:
    """The usable embedding models in ``<data>/embedders``, by file name; a file that
    fails the checks is skipped, with a line in ``notes`` saying why."""
    folder = embedders_dir(data_dir)
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf")
    except OSError:
        return []
    out: list[EmbedderInfo] = []
    for path in files[:MAX_LISTED]:
        if path.name.startswith("."):
            continue  # a conversion or download in progress
        try:
            out.append(read_embedder_info(path))
        except ModelFileError as exc:
            if notes is not None:
                notes.append(str(exc))
            log.info("skipped embedder %s: %s", path.name, exc)
    return out


def chosen_name(data_dir: Path) -> str | None:
    path = embedders_dir(data_dir) / CHOSEN_FILE
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CHOSEN_BYTES + 1)
        if len(raw) > MAX_CHOSEN_BYTES:
            return None
        value = json.loads(raw)
    except (OSError, ValueError):
        return None
    name = value.get("file") if isinstance(value, dict) else None
    if not isinstance(name, str) or not name or Path(name).name != name:
        return None
    return name


def chosen_embedder(data_dir: Path) -> Path:
    """The chosen embedding model when it still passes the checks, else the built-in one.

    Raises:
        EmbedderError: nothing is chosen and the built-in model cannot be prepared.
    """
    name = chosen_name(data_dir)
    if name is not None:
        path = embedders_dir(data_dir) / name
        try:
            read_embedder_info(path)
            return path
        except ModelFileError as exc:
            log.warning("the chosen embedding model is not usable: %s", exc)
    return ensure_default_embedder(data_dir)


def choose_embedder(data_dir: Path, path: Path | None) -> None:
    """Remember ``path`` (a file in ``<data>/embedders``) as the embedding model; None
    goes back to the built-in one.

    Raises:
        EmbedderError: ``path`` is not in the embedders folder or not an embedding model.
    """
    folder = embedders_dir(data_dir)
    target = folder / CHOSEN_FILE
    if path is None:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        return
    if path.parent.resolve() != folder.resolve():
        raise EmbedderError(
            f"{path.name} is not in the embedding models folder ({folder}); copy it there first."
        )
    try:
        read_embedder_info(path)
    except EmbedderError:
        raise
    except ModelFileError as exc:
        raise EmbedderError(str(exc)) from exc
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps({"file": path.name}))
