"""The local model library: GGUFs in the models dir, the Hugging Face cache, and imports.

Metadata comes from ``app.gguf.info`` and is cached in JSON by (path, size,
mtime), so a rescan reads only new or changed files. A file that is not a
valid GGUF is listed with the reason and never loaded.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.gguf.info import GgufInfo, read_gguf_info
from app.gguf.memory import estimate_ram
from app.util.atomic import atomic_write_text
from app.util.errors import ModelFileError

log = logging.getLogger(__name__)

CACHE_VERSION = 2


@dataclass(frozen=True)
class LibraryEntry:
    """One model file the app knows about."""

    path: Path
    source: str  # "models", "hf-cache" or "imported"
    size: int
    info: GgufInfo | None
    error: str = ""
    repo_id: str = ""

    @property
    def valid(self) -> bool:
        return self.info is not None and not self.error

    @property
    def is_adapter(self) -> bool:
        return self.info is not None and self.info.general_type == "adapter"

    @property
    def name(self) -> str:
        return self.info.display_name if self.info else self.path.name

    def ram_estimate(self, n_ctx: int, kv_bytes_per_element: float = 2.0) -> int:
        """Bytes of RAM to load this model at ``n_ctx`` (weights + KV cache + buffers)."""
        if self.info is None:
            return self.size
        return estimate_ram(self.info, n_ctx, kv_bytes_per_element)


class Library:
    """Scans for models and remembers what it read."""

    def __init__(self, models_dir: Path, cache_file: Path, hf_cache: bool = True) -> None:
        self.models_dir = models_dir
        self.cache_file = cache_file
        self.hf_cache = hf_cache
        self.imported: list[Path] = []
        self._cache: dict[str, Any] = self._read_cache()

    def scan(self) -> list[LibraryEntry]:
        """Every known model file, models dir first; never raises for a bad file."""
        seen: set[Path] = set()
        out: list[LibraryEntry] = []

        def add(path: Path, source: str, repo_id: str = "") -> None:
            try:
                resolved = path.resolve()
            except OSError:
                resolved = path
            if resolved in seen:
                return
            seen.add(resolved)
            out.append(self._entry(path, source, repo_id))

        if self.models_dir.is_dir():
            for path in sorted(self.models_dir.rglob("*.gguf")):
                if path.is_file() and not path.name.startswith("."):
                    rel = path.parent.relative_to(self.models_dir)
                    add(path, "models", str(rel).replace("__", "/") if rel.parts else "")
        if self.hf_cache:
            for path, repo_id in self._hf_cache_files():
                add(path, "hf-cache", repo_id)
        for path in self.imported:
            add(path, "imported")
        self._write_cache()
        return out

    def _entry(self, path: Path, source: str, repo_id: str) -> LibraryEntry:
        try:
            st = path.stat()
        except OSError as exc:
            return LibraryEntry(path, source, 0, None, f"cannot be read: {exc.strerror}", repo_id)
        key = str(path)
        cached = self._cache.get(key)
        if (
            isinstance(cached, dict)
            and cached.get("size") == st.st_size
            and cached.get("mtime_ns") == st.st_mtime_ns
        ):
            old = _info_from_json(cached.get("info"), path)
            return LibraryEntry(
                path, source, st.st_size, old, str(cached.get("error", "")), repo_id
            )
        info: GgufInfo | None
        try:
            info = read_gguf_info(path)
            error = ""
        except ModelFileError as exc:
            info, error = None, str(exc)
        self._cache[key] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "info": _info_to_json(info),
            "error": error,
        }
        return LibraryEntry(path, source, st.st_size, info, error, repo_id)

    def _hf_cache_files(self) -> list[tuple[Path, str]]:
        try:
            from huggingface_hub import scan_cache_dir

            report = scan_cache_dir()
        except Exception as exc:  # no cache, unreadable cache: nothing to list
            log.info("Hugging Face cache not scanned: %s", exc)
            return []
        out = []
        for repo in report.repos:
            if repo.repo_type != "model":
                continue
            for revision in repo.revisions:
                for f in revision.files:
                    if f.file_name.endswith(".gguf"):
                        out.append((Path(f.file_path), repo.repo_id))
        return out

    def _read_cache(self) -> dict[str, Any]:
        try:
            data = json.loads(self.cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}

    def _write_cache(self) -> None:
        try:
            atomic_write_text(
                self.cache_file, json.dumps({"version": CACHE_VERSION, "files": self._cache})
            )
        except OSError as exc:
            log.warning("library cache not written: %s", exc)


def _info_to_json(info: GgufInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    data = asdict(info)
    data["path"] = str(info.path)
    return data


def _info_from_json(data: Any, path: Path) -> GgufInfo | None:
    if not isinstance(data, dict):
        return None
    try:
        return GgufInfo(**{**data, "path": path})
    except TypeError:
        return None
