"""File sha256: one helper, remembered per file version (size, mtime) in this process
and, for model files, across runs in ``fingerprints.json``."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

from app.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

_BLOCK = 1 << 20
_lock = threading.Lock()
_memo: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """The file's sha256, hashed once per (path, size, mtime) in this process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _lock:
        known = _memo.get(key)
    if known is not None:
        return known
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    digest = h.hexdigest()
    with _lock:
        _memo[key] = digest
    return digest


class FingerprintCache:
    """Remembers each model file's sha256 against its (size, mtime), across runs."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self._data: dict[str, Any] = data if isinstance(data, dict) else {}
        except (OSError, ValueError, RecursionError):
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
