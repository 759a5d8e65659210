"""The local model library: GGUFs in the models dir, the Hugging Face cache, and imports.

Metadata comes from ``app.gguf.info`` and is cached in JSON by (path, size,
mtime), so a rescan reads only new or changed files. A file that is not a
valid GGUF is listed with the reason and never loaded; one that cannot be
read, or that is not a regular file (a FIFO, a device, a looping symlink), never
stops the others from being listed, and is never opened. The parts of a split
model are one entry: loadable when every part is there, listed as incomplete
(and not loadable) while one is missing.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app.gguf.info import GgufInfo, read_gguf_info
from app.gguf.memory import estimate_ram
from app.models.names import repo_id_of_dir
from app.models.quant import split_file_name, split_name
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json
from app.util.errors import ModelFileError

log = logging.getLogger(__name__)

CACHE_VERSION = 4  # 4: projectors (mmproj) are refused as models; n_embd
MAX_CACHE_BYTES = 32 * 1024 * 1024
MAX_FILES = 10_000  # model files listed from the models dir
MAX_DEPTH = 8  # folders below the models dir
MAX_PARTS = 4096  # parts of one split model the library looks for


@dataclass(frozen=True)
class LibraryEntry:
    """One model file the app knows about (for a split model, its first part)."""

    path: Path
    source: str  # "models", "hf-cache" or "imported"
    size: int
    info: GgufInfo | None
    error: str = ""
    repo_id: str = ""
    parts: tuple[Path, ...] = ()  # every part of a split model, in order (present ones)

    @property
    def valid(self) -> bool:
        return self.info is not None and not self.error

    @property
    def is_adapter(self) -> bool:
        return self.info is not None and self.info.general_type == "adapter"

    @property
    def name(self) -> str:
        return self.info.display_name if self.info else self.path.name

    @property
    def files(self) -> tuple[Path, ...]:
        """The files on disk this entry stands for (what deleting it removes)."""
        return self.parts or (self.path,)

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
        """Every known model, models dir first; never raises for a bad file."""
        seen: set[Path] = set()
        out: list[LibraryEntry] = []
        used: dict[str, Any] = {}

        def add(path: Path, source: str, repo_id: str = "") -> None:
            try:
                entry = self._entry(path, source, repo_id, seen, used)
            except Exception as exc:  # the scan must list the others whatever one file does
                log.warning("library: %s skipped: %r", path, exc)
                return
            if entry is not None:
                out.append(entry)

        for path in self._model_files():
            rel = path.parent.relative_to(self.models_dir)
            add(path, "models", repo_id_of_dir(rel.parts[0]) if rel.parts else "")
        if self.hf_cache:
            for path, repo_id in self._hf_cache_files():
                add(path, "hf-cache", repo_id)
        for path in self.imported:
            add(path, "imported")
        self._cache = used  # forget files that are gone
        self._write_cache()
        return out

    def _model_files(self) -> list[Path]:
        """``*.gguf`` regular files (or links to them) under the models dir, bounded.

        Hidden names are skipped; linked folders are followed once each (a loop of
        links ends); nothing is opened.
        """
        found: list[Path] = []
        visited: set[tuple[int, int]] = set()
        stack = [(self.models_dir, 0)]
        while stack and len(found) < MAX_FILES:
            folder, depth = stack.pop()
            try:
                st = folder.stat()
                if (st.st_dev, st.st_ino) in visited:
                    continue
                visited.add((st.st_dev, st.st_ino))
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                if depth:
                    log.info("library: folder %s not read: %s", folder, exc)
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                try:
                    if e.is_dir():
                        if depth < MAX_DEPTH:
                            stack.append((Path(e.path), depth + 1))
                    elif e.name.endswith(".gguf") and e.is_file():
                        found.append(Path(e.path))
                except OSError:  # a looping or unreadable link: not a model
                    continue
        return sorted(found[:MAX_FILES])

    def _entry(
        self, path: Path, source: str, repo_id: str, seen: set[Path], used: dict[str, Any]
    ) -> LibraryEntry | None:
        """The entry for ``path`` (for a split part: for its whole model), or None if seen."""
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError):
            resolved = path
        split = split_name(path.name)
        parts: tuple[Path, ...] = ()
        missing: list[int] = []
        if split is not None:
            base, _part, total = split
            first = path.with_name(split_file_name(base, 1, total))
            try:
                resolved = first.resolve()
            except (OSError, RuntimeError):
                resolved = first
            if resolved in seen:
                return None
            seen.add(resolved)
            if total > MAX_PARTS:
                return LibraryEntry(
                    first, source, 0, None, f"claims {total} parts; not a model", repo_id
                )
            present: list[Path] = []
            for i in range(1, total + 1):
                p = path.with_name(split_file_name(base, i, total))
                if _regular_size(p) is None:
                    missing.append(i)
                else:
                    present.append(p)
            parts = tuple(present)
            path = first
        else:
            if resolved in seen:
                return None
            seen.add(resolved)
        try:
            st = path.stat()
        except OSError as exc:
            if missing:
                return self._incomplete(path, source, repo_id, parts, missing)
            why = exc.strerror or exc.__class__.__name__
            return LibraryEntry(path, source, 0, None, f"cannot be read: {why}", repo_id)
        if not stat.S_ISREG(st.st_mode):
            return LibraryEntry(path, source, 0, None, "not a regular file", repo_id)
        if missing:
            return self._incomplete(path, source, repo_id, parts, missing)
        size = sum(_regular_size(p) or 0 for p in parts) if parts else st.st_size
        key = str(path)
        cached = self._cache.get(key)
        if (
            isinstance(cached, dict)
            and cached.get("size") == st.st_size
            and cached.get("mtime_ns") == st.st_mtime_ns
            and isinstance(cached.get("error", ""), str)
        ):
            used[key] = cached
            old = _info_from_json(cached.get("info"), path)
            error = str(cached.get("error", ""))[:2000]
            if old is not None or error:
                return LibraryEntry(path, source, size, old, error, repo_id, parts)
        info: GgufInfo | None
        try:
            info = read_gguf_info(path)
            error = ""
        except ModelFileError as exc:
            info, error = None, str(exc)
        except Exception as exc:  # a reader bug must not hide the rest of the library
            log.warning("library: reading %s failed: %r", path, exc)
            info, error = None, f"could not be read ({exc.__class__.__name__})"
        used[key] = {
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "info": _info_to_json(info),
            "error": error,
        }
        return LibraryEntry(path, source, size, info, error, repo_id, parts)

    @staticmethod
    def _incomplete(
        path: Path, source: str, repo_id: str, parts: tuple[Path, ...], missing: list[int]
    ) -> LibraryEntry:
        total = len(parts) + len(missing)
        shown = ", ".join(map(str, missing[:5])) + (", …" if len(missing) > 5 else "")
        error = (
            f"incomplete split model: part{'s' if len(missing) > 1 else ''} {shown} of {total} "
            "missing (an unfinished download?)"
        )
        size = sum(_regular_size(p) or 0 for p in parts)
        return LibraryEntry(path, source, size, None, error, repo_id, parts)

    def _hf_cache_files(self) -> list[tuple[Path, str]]:
        try:
            from huggingface_hub import scan_cache_dir

            report = scan_cache_dir()
            out = []
            for repo in report.repos:
                if repo.repo_type != "model":
                    continue
                for revision in repo.revisions:
                    for f in revision.files:
                        if f.file_name.endswith(".gguf"):
                            out.append((Path(f.file_path), repo.repo_id))
        except Exception as exc:  # no cache, unreadable cache: nothing to list
            log.info("Hugging Face cache not scanned: %s", exc)
            return []
        return out[:MAX_FILES]

    def _read_cache(self) -> dict[str, Any]:
        """What the last scan read; anything unusable is an empty cache (it is rebuilt)."""
        try:
            data = read_json(self.cache_file, MAX_CACHE_BYTES)
        except (FileNotFoundError, DataFileError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.info("library cache %s not used: %s", self.cache_file, exc)
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
        except (OSError, ValueError) as exc:
            log.warning("library cache not written: %s", exc)


def _regular_size(path: Path) -> int | None:
    """The size of ``path`` if it is (a link to) a regular file, else None."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _info_to_json(info: GgufInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    data = asdict(info)
    data["path"] = str(info.path)
    return data


def _info_from_json(data: Any, path: Path) -> GgufInfo | None:
    """A cached ``GgufInfo``, or None unless every field has its declared type."""
    if not isinstance(data, dict):
        return None
    hints = _INFO_TYPES
    values = {k: v for k, v in data.items() if k != "path"}
    if set(values) != set(hints):
        return None
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, hints[name]):
            return None
        if isinstance(value, str) and len(value) > 1_000_000:
            return None
    return GgufInfo(**{**values, "path": path})


_INFO_TYPES: dict[str, Any] = {
    f.name: typing.get_type_hints(GgufInfo)[f.name] for f in fields(GgufInfo) if f.name != "path"
}
