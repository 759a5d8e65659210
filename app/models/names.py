"""Repo ids and file names from the Hub (or a person): checked once, turned into paths once.

Every path the app writes a download to comes from :func:`destination`, which
checks the repo id with ``huggingface_hub``'s own validator, checks each
component of the file name with one strict rule that holds on Linux, macOS
and Windows, and finally resolves the path and refuses it unless it lies
inside the models directory.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path, PurePosixPath

from app.models.download_errors import DownloadError
from app.models.part_file import PART_SUFFIX

REPO_SEPARATOR = "__"  # owner/name is stored as the folder owner__name
NAME_MAX_BYTES = 255  # one path component, in UTF-8 (ext4, APFS, NTFS in UTF-16 units)
# The last component also carries ".part" while it downloads; it must fit too.
FILE_MAX_BYTES = NAME_MAX_BYTES - len(PART_SUFFIX)
MAX_DEPTH = 8  # components in a repo file path ("Q4_K_M/model-00001-of-00002.gguf" is 2)
MAX_PATH_BYTES = 259 if os.name == "nt" else 4095  # MAX_PATH without long-path support; PATH_MAX
WINDOWS_FORBIDDEN = frozenset('<>:"|?*\\/')
# Control, format (bidi overrides and isolates, zero-width joiners, BOM), surrogates,
# private use, unassigned, line and paragraph separators.
FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
_DEVICES |= {f"{port}{n}" for port in ("COM", "LPT") for n in (*"0123456789", "¹", "²", "³")}
WINDOWS_DEVICES = frozenset(_DEVICES)


class UnsafeNameError(DownloadError):
    """A repo id or file name the app will not turn into a path; the message says why."""


def check_repo_id(repo_id: object) -> str:
    """``repo_id`` if it is a Hub model id of the form ``owner/name``.

    Uses ``huggingface_hub.utils.validate_repo_id`` (96 characters per part,
    ``[A-Za-z0-9._-]``, no ``--`` or ``..``, no leading or trailing ``.``/``-``),
    plus what the folder name needs: ASCII only (the validator's ``\\w`` admits any
    letter), exactly one ``/``, and an owner without ``__`` or a trailing ``_`` so
    that ``owner__name`` maps back to exactly one id.

    Raises:
        UnsafeNameError: the id is refused, with the reason.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    if not isinstance(repo_id, str):
        raise UnsafeNameError(f"Refusing a repo id of type {type(repo_id).__name__}.")
    shown = _shown(repo_id)
    if not repo_id:
        raise UnsafeNameError("Refusing an empty repo id: expected owner/name.")
    if not repo_id.isascii():
        raise UnsafeNameError(f"Refusing the repo id {shown}: Hub ids are plain ASCII.")
    if repo_id.count("/") != 1:
        raise UnsafeNameError(f"Refusing the repo id {shown}: expected owner/name.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        why = str(exc)  # it quotes the id as given: escape it like ours
        why = why if why.isascii() and why.isprintable() else ascii(why)[1:-1]
        raise UnsafeNameError(f"Refusing the repo id {shown}: {why}") from exc
    owner = repo_id.split("/")[0]
    if REPO_SEPARATOR in owner or owner.endswith("_"):
        raise UnsafeNameError(
            f"Refusing the repo id {shown}: an owner with '__' or a trailing '_' would make "
            "its models folder ambiguous."
        )
    try:
        _check_component(repo_dir_name(repo_id), shown)
    except UnsafeNameError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise UnsafeNameError(f"Refusing the repo id {shown} as a folder name: {reason}") from exc
    return repo_id


def repo_dir_name(repo_id: str) -> str:
    """``owner/name`` as one folder name, ``owner__name`` (:func:`repo_id_of_dir` maps it back)."""
    return repo_id.replace("/", REPO_SEPARATOR, 1)


def repo_id_of_dir(folder: str) -> str:
    """The repo id a models sub-folder stands for, or ``""`` if it is not one of ours."""
    owner, sep, name = folder.partition(REPO_SEPARATOR)
    if not sep:
        return ""
    candidate = f"{owner}/{name}"
    try:
        return check_repo_id(candidate)
    except UnsafeNameError:
        return ""


def check_file_name(relative: object) -> PurePosixPath:
    """A repo file path (``/``-separated) that is safe to create on every platform.

    Sub-folders are allowed (large splits often live in ``Q4_K_M/``) and kept, so a
    split model's parts stay side by side where llama.cpp looks for them. Each
    component must be 1..250 UTF-8 bytes (255 with ``.part``), hold no control,
    format (bidi), surrogate, private-use or unassigned character, no whitespace
    but the plain space, none of ``<>:"|?*\\``, not start with ``.`` or a space
    (hidden files and the app's own ``.name.verified.json`` stamps), not end with
    ``.`` or a space (Windows drops them), not end with ``.part`` (a partial
    download), and not be a Windows device name (``CON``, ``nul.gguf``, ``COM1.x``).

    Raises:
        UnsafeNameError: the name is refused, with the reason.
    """
    if not isinstance(relative, str):
        raise UnsafeNameError(f"Refusing a file name of type {type(relative).__name__}.")
    shown = _shown(relative)
    if not relative:
        raise UnsafeNameError("Refusing an empty file name.")
    if len(relative) > MAX_DEPTH * NAME_MAX_BYTES:
        raise UnsafeNameError(_why(shown, "it is too long."))
    if relative.startswith("/"):
        raise UnsafeNameError(_why(shown, "it is an absolute path."))
    parts = relative.split("/")
    if len(parts) > MAX_DEPTH:
        raise UnsafeNameError(_why(shown, f"more than {MAX_DEPTH} folders deep."))
    for part in parts:
        _check_component(part, shown)
    if len(parts[-1].encode("utf-8")) > FILE_MAX_BYTES:
        raise UnsafeNameError(
            f"Refusing the file name {shown}: longer than {FILE_MAX_BYTES} bytes "
            f"(with {PART_SUFFIX} it must fit the file system's {NAME_MAX_BYTES})."
        )
    return PurePosixPath(*parts)


def destination(models_dir: Path, repo_id: str, relative: str) -> Path:
    """Where ``relative`` of ``repo_id`` is stored: ``models_dir/owner__name/relative``.

    The one place download paths are made. The result is resolved and must lie
    inside ``models_dir`` (a symlink planted in the folder cannot redirect it), and
    the path with ``.part`` must fit the platform's path length.

    Raises:
        UnsafeNameError: the repo id or the file name is refused, or the path escapes.
    """
    check_repo_id(repo_id)
    pure = check_file_name(relative)
    root = models_dir.resolve()
    target = (root / repo_dir_name(repo_id)).joinpath(*pure.parts).resolve()
    if not target.is_relative_to(root) or target == root:
        raise UnsafeNameError(
            f"Refusing the file name {_shown(relative)}: it would be written outside {root}."
        )
    check_path_length(target, _shown(relative), "models folder")
    return target


def check_path_length(target: Path, shown: str, folder: str) -> None:
    """Refuse ``target`` (its partial download included) when its path is longer than
    this system allows; ``shown`` names the file, ``folder`` what to choose shorter.

    Raises:
        UnsafeNameError: the path is too long.
    """
    if len(os.fsencode(str(target) + PART_SUFFIX)) > MAX_PATH_BYTES:
        raise UnsafeNameError(
            f"Refusing the file name {shown}: the full path would be longer than "
            f"this system allows ({MAX_PATH_BYTES} bytes). Choose a shorter {folder}."
        )


def _check_component(part: str, shown: str) -> None:
    if part in ("", ".", ".."):
        raise UnsafeNameError(_why(shown, "it has an empty, . or .. part."))
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        raise UnsafeNameError(_why(shown, "it is not valid Unicode.")) from None
    if size > NAME_MAX_BYTES:
        raise UnsafeNameError(_why(shown, f"a part is longer than {NAME_MAX_BYTES} bytes."))
    for ch in part:
        if unicodedata.category(ch) in FORBIDDEN_CATEGORIES or (ch.isspace() and ch != " "):
            raise UnsafeNameError(
                f"Refusing the file name {shown}: it contains the invisible or control "
                f"character U+{ord(ch):04X}."
            )
        if ch in WINDOWS_FORBIDDEN:
            raise UnsafeNameError(_why(shown, f"{ch!r} is not allowed in file names on Windows."))
    if part[0] in ". ":
        raise UnsafeNameError(_why(shown, "a part starts with '.' or a space."))
    if part[-1] in ". ":
        raise UnsafeNameError(_why(shown, "a part ends with '.' or a space."))
    if part.lower().endswith(PART_SUFFIX):
        raise UnsafeNameError(_why(shown, f"{PART_SUFFIX} marks a partial file."))
    if part.split(".", 1)[0].rstrip(" ").upper() in WINDOWS_DEVICES:
        raise UnsafeNameError(_why(shown, "it is a device name on Windows."))


def _why(shown: str, reason: str) -> str:
    return f"Refusing the file name {shown}: {reason}"


def _shown(text: str, limit: int = 80) -> str:
    """``text`` for a message: escaped (no control or bidi character reaches the UI), cut short."""
    cut = text[:limit]
    shown = repr(cut) if cut.isascii() and cut.isprintable() else ascii(cut)
    return shown + ("…" if len(text) > limit else "")
