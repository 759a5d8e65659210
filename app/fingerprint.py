"""Model fingerprints (size + sha256), hashed once per file version and cached."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from app.atomic import atomic_write_text
from app.default_model import sha256_file

log = logging.getLogger(__name__)


class FingerprintCache:
    """Remembers each model file's sha256 against its (size, mtime)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self._data: dict[str, Any] = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self._data = {}

    def fingerprint(self, model: Path) -> dict[str, Any]:
        """``{"name", "size", "sha256"}``; hashes the file only when it changed."""
        st = model.stat()
        key = str(model.resolve())
        entry = self._data.get(key)
        if not (
            isinstance(entry, dict)
            and entry.get("size") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_file(model)}
            self._data[key] = entry
            try:
                atomic_write_text(self._path, json.dumps(self._data, indent=1))
            except OSError as exc:  # a cache: the fingerprint is still right
                log.warning("could not save fingerprint cache: %s", exc)
        return {"name": model.name, "size": entry["size"], "sha256": entry["sha256"]}
