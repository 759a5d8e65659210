"""Attached images: content-addressed files beside the transcripts, and the references a
transcript keeps to them.

    <data>/images/<digest[:2]>/<digest>.<ext>   one file per distinct picture (sha256)

A user message's ``images`` is a list of references, one dict per picture::

    {"digest": "<sha256 hex>", "mime": "image/png", "width": 640, "height": 480,
     "name": "cat.png"}

The bytes live once in the store however many messages (or conversations) show them.
Files in the data folder are untrusted like any input: a digest is 64 hex digits (never
a path), reads are capped at ``MAX_IMAGE_BYTES``, a file is checked against its digest
and decoded defensively (``app.util.images``) before the model sees it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard

from app.engine.chat_message import ImagePart
from app.util.atomic import atomic_write_bytes
from app.util.datafiles import DataFileError, read_limited, reason
from app.util.errors import ImageError
from app.util.images import MAX_IMAGE_BYTES, check_image

log = logging.getLogger(__name__)

MAX_IMAGES = 16  # pictures of one message (a file's extra references are dropped)
IMAGE_NAME_CHARS = 255
MAX_DIMENSION = 1 << 20  # a stored width or height past this reads as 0 (unknown)
CACHE_BYTES = 256 << 20  # checked images kept in memory: each reply sends the history
EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/webp": "webp",
    "image/gif": "gif",
    "image/bmp": "bmp",
}
_DIGEST = re.compile(r"[0-9a-f]{64}")
_FOLDER = re.compile(r"[0-9a-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def is_digest(value: object) -> TypeGuard[str]:
    """A sha256 in lowercase hex: the only thing that names a file in the store."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def extension(mime: str) -> str:
    return EXTENSIONS.get(mime, "png")


def image_ref(part: ImagePart) -> dict[str, Any]:
    """What a transcript keeps of ``part``."""
    return {
        "digest": part.digest,
        "mime": part.mime if part.mime in EXTENSIONS else "image/png",
        "width": _dimension(part.width),
        "height": _dimension(part.height),
        "name": clean_name(part.name),
    }


def read_image_refs(raw: Any) -> list[dict[str, Any]]:
    """Stored ``images`` made valid: at most ``MAX_IMAGES``; an entry that is not an
    object or has no valid digest is dropped (it names no file); odd fields are
    repaired (an unknown type reads as PNG: the file says what it is when read)."""
    if not isinstance(raw, list):
        return []
    out: list[dict[str, Any]] = []
    for r in raw[: MAX_IMAGES * 4]:  # bounded work on a hostile list
        if len(out) == MAX_IMAGES:
            break
        if not isinstance(r, dict) or not is_digest(r.get("digest")):
            continue
        mime = r.get("mime")
        name = r.get("name")
        out.append(
            {
                "digest": r["digest"],
                "mime": mime if isinstance(mime, str) and mime in EXTENSIONS else "image/png",
                "width": _dimension(r.get("width")),
                "height": _dimension(r.get("height")),
                "name": clean_name(name) if isinstance(name, str) else "",
            }
        )
    return out


def clean_name(name: str) -> str:
    """A file name to show: one line, no control characters, at most 255 characters."""
    return _CONTROL.sub("", name[: IMAGE_NAME_CHARS * 4]).strip()[:IMAGE_NAME_CHARS]


def image_label(digest: str, name: str = "") -> str:
    """How a message names an image: its file name, else the start of its digest."""
    return f"“{name}”" if name else str(digest)[:12]


def markdown_image(ref: dict[str, Any]) -> str:
    """``![name](images/<digest>.<ext>)``: where ``export_images`` puts the file."""
    alt = re.sub(r"([\\\[\]*_`<>])", r"\\\1", ref["name"] or "image")
    return f"![{alt}](images/{ref['digest']}.{extension(ref['mime'])})"


def _dimension(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DIMENSION:
        return value
    return 0


class ImageStore:
    """The images folder of the data folder ``root``. Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.images_dir = root / "images"
        self._lock = threading.Lock()
        # digest -> (file stamp, part without a name), least recently used first
        self._cache: OrderedDict[str, tuple[tuple[int, int], ImagePart]] = OrderedDict()
        self._cached_bytes = 0

    def put(self, data: bytes, name: str = "") -> ImagePart:
        """Check ``data`` and keep it; the same bytes are one file, written once.

        Raises:
            ImageError: not an image this app reads (the message says why), or the
                file could not be written.
        """
        info = check_image(data)
        part = ImagePart.from_bytes(data, info.mime, info.width, info.height, clean_name(name))
        target = self._file(part.digest, info.mime)
        try:
            if self._intact(target, part):
                return part
            atomic_write_bytes(target, data)
        except OSError as exc:
            raise ImageError(
                f"The image could not be saved in the data folder ({exc.strerror or exc})."
            ) from exc
        return part

    def path(self, digest: str) -> Path | None:
        """The file of image ``digest``, or None (none stored, or not a digest)."""
        if not is_digest(digest):
            return None
        for ext in EXTENSIONS.values():
            candidate = self._file(digest, "", ext)
            try:
                if stat.S_ISREG(candidate.lstat().st_mode):
                    return candidate
            except OSError:
                continue
        return None

    def exists(self, digest: str) -> bool:
        return self.path(digest) is not None

    def get(self, digest: str, name: str = "") -> ImagePart:
        """Image ``digest``, read back and checked, named ``name``.

        Raises:
            ImageError: not a digest, missing, changed on disk, unreadable or damaged.
        """
        if not is_digest(digest):
            raise ImageError(f"“{str(digest)[:80]}” does not name a stored image.")
        label = image_label(digest, clean_name(name))
        path = self.path(digest)
        if path is None:
            raise ImageError(f"The image {label} is missing from the data folder.")
        try:
            st = path.stat()
        except OSError:
            raise ImageError(f"The image {label} is missing from the data folder.") from None
        stamp = (st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._cache.get(digest)
            if known is not None and known[0] == stamp:
                self._cache.move_to_end(digest)
                return replace(known[1], name=clean_name(name))
        part = self._read(path, digest, label)
        self._remember(digest, stamp, part)
        return replace(part, name=clean_name(name))

    def load(self, ref: dict[str, Any]) -> ImagePart:
        """The image a transcript reference names (``get`` with its name)."""
        return self.get(ref["digest"], ref.get("name", ""))

    def load_all(self, refs: Sequence[dict[str, Any]]) -> tuple[list[ImagePart], list[str]]:
        """The images of ``refs`` that can be read, and a message for each that cannot."""
        parts: list[ImagePart] = []
        errors: list[str] = []
        for ref in refs:
            try:
                parts.append(self.load(ref))
            except ImageError as exc:
                errors.append(str(exc))
        return parts, errors

    def _read(self, path: Path, digest: str, label: str) -> ImagePart:
        try:
            data = read_limited(path, MAX_IMAGE_BYTES)
        except FileNotFoundError:
            raise ImageError(f"The image {label} is missing from the data folder.") from None
        except DataFileError as exc:
            raise ImageError(
                f"The image {label} could not be read from the data folder ({reason(exc)})."
            ) from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise ImageError(f"The image {label} was changed on disk.")
        try:
            info = check_image(data)
        except ImageError as exc:
            raise ImageError(f"The image {label} in the data folder is damaged: {exc}") from exc
        return ImagePart(digest, data, info.mime, info.width, info.height)

    def _remember(self, digest: str, stamp: tuple[int, int], part: ImagePart) -> None:
        with self._lock:
            old = self._cache.pop(digest, None)
            if old is not None:
                self._cached_bytes -= len(old[1].data)
            self._cache[digest] = (stamp, part)
            self._cached_bytes += len(part.data)
            while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
                _, (_, dropped) = self._cache.popitem(last=False)
                self._cached_bytes -= len(dropped.data)

    def _intact(self, target: Path, part: ImagePart) -> bool:
        """Whether ``target`` holds ``part``'s bytes already (a damaged copy is rewritten)."""
        try:
            if target.lstat().st_size != len(part.data):
                return False
            data = read_limited(target, MAX_IMAGE_BYTES)
        except (OSError, DataFileError):
            return False
        return hashlib.sha256(data).hexdigest() == part.digest

    def folders(self) -> list[Path]:
        """The store's subfolders (``<digest[:2]>``), where interrupted writes leave temp
        files (``ConversationStore.prune`` removes old ones)."""
        try:
            return [p for p in self.images_dir.iterdir() if _FOLDER.fullmatch(p.name)]
        except OSError:
            return []

    def _file(self, digest: str, mime: str, ext: str = "") -> Path:
        return self.images_dir / digest[:2] / f"{digest}.{ext or extension(mime)}"


def copy_images(
    refs: Iterable[dict[str, Any]], store: ImageStore, dest_dir: Path, notes: list[str]
) -> list[Path]:
    """Copy the images ``refs`` name into ``dest_dir/images/`` as ``<digest>.<ext>``
    (the links ``markdown_image`` writes); the files written. An image that cannot be
    copied (missing, changed on disk) is skipped with a line in ``notes``.

    Raises:
        OSError: a file could not be written.
    """
    written: list[Path] = []
    done: set[str] = set()
    for ref in refs:
        target = dest_dir / "images" / f"{ref['digest']}.{extension(ref['mime'])}"
        if target.name in done:
            continue
        done.add(target.name)
        try:
            data = store.load(ref).data
        except ImageError as exc:
            log.info("export: %s", exc)
            notes.append(str(exc))
            continue
        atomic_write_bytes(target, data)
        written.append(target)
    return written
