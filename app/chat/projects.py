"""Projects: a name and what every chat in it starts from (instructions, pinned documents,
collections, model, preset, adapters, tools), one JSON file each.

    <data>/projects/<id>.json    {"format": 1, "id", "name", ...}

A chat names its project by id (``Conversation.project_id``); the project never lists
its chats. Files are read as transcripts are (``app.util.datafiles``: regular files,
size and depth limits): structure that makes no sense is refused (``damaged``: the
file is set aside as ``<id>.json.bad`` with a note when the list is read), odd values
are repaired or dropped, fields it does not know are ignored.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import re
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import Any

from app.chat.conversation import NAME_MAX as MODEL_NAME_MAX
from app.chat.conversation import is_valid_id, new_id
from app.chat.doc_refs import read_names
from app.chat.snapshot import MAX_LORA, is_lora
from app.chat.stored_fields import is_int, read_path, read_text, read_time
from app.chat.stored_files import file_stamp, mtime, set_aside_noted
from app.config.field_spec import short_repr
from app.config.presets import NAME_CHARS as PRESET_NAME_MAX
from app.documents.sources import MAX_SOURCES, source_from_dict
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, ensure_directory, read_json, reason
from app.util.errors import LamplightError

FORMAT_VERSION = 1
NAME_MAX = 80
UNNAMED = "Untitled project"
INSTRUCTIONS_MAX = 100_000
MAX_PINNED = MAX_SOURCES  # whole documents, each at most ``MAX_SOURCE_CHARS``
MAX_TOOLS = 256  # as many as one MCP server may list
DESCRIPTION_MAX = 8 * 1024
SCHEMA_CHARS_MAX = 64 * 1024
SCHEMA_DEPTH_MAX = 32
MAX_BYTES = 64 * 1024 * 1024  # 16 pinned documents of 2M characters fit
MAX_DEPTH = 40  # the file nests 4 levels above a tool's schema
# Qualified MCP tool names (``app.mcp.results.sanitize``) and connection ids
# (``app.remote.connection_store``) share one alphabet.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LORA_KEYS = ("name", "path", "size", "sha256", "scale", "enabled")


class ProjectError(LamplightError):
    """A project file that cannot be read (``damaged``: its content is unusable, as
    ``ConversationError``), or a project that cannot be saved."""

    def __init__(self, message: str, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


def name_problem(name: str) -> str:
    """Why ``name`` cannot name a project ("" when it can)."""
    if not name.strip():
        return "A project needs a name."
    if len(name) > NAME_MAX:
        return f"A project's name can be at most {NAME_MAX} characters long."
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        return "A project's name cannot hold control characters; type it again."
    return ""


@dataclass
class Project:
    """What a project's chats start from.

    ``pinned``: whole documents (``Source.to_dict()`` copies, plus ``stamp`` [size,
    mtime_ns] and ``sha256`` of the file when it was read; [] and "" when unknown).
    ``model``: {} (none), {"path", "name", "size"} (a local file) or {"connection": id}.
    ``lora``: ``LoraStack.signature()`` entries. ``mcp_tools``: the qualified names of
    the tools it offers; ``tool_specs``: their {name, description, parameters} as last
    listed, so a chat's opening never waits on a server. ``api``: reachable through the
    API server.
    """

    id: str = field(default_factory=new_id)
    name: str = UNNAMED
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    instructions: str = ""
    pinned: list[dict[str, Any]] = field(default_factory=list)
    collections: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    preset: str = ""
    lora: list[dict[str, Any]] = field(default_factory=list)
    mcp_tools: list[str] = field(default_factory=list)
    tool_specs: list[dict[str, Any]] = field(default_factory=list)
    api: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(
        cls, data: Any, where: str = "project", fallback_time: float | None = None
    ) -> Project:
        """Validate and build; raises ProjectError naming what is wrong.

        Refused as ``damaged``: not an object, an unknown format, a bad id. Repaired:
        a name that ``name_problem`` refuses (cleaned, else ``UNNAMED``), times as a
        transcript's, text cut to its limit; bad entries of a list are dropped, and a
        value of the wrong type takes its default.
        """
        if not isinstance(data, dict):
            raise ProjectError(f"{where}: not a JSON object", damaged=True)
        version = data.get("format")
        if version != FORMAT_VERSION or isinstance(version, bool):
            newer = is_int(version) and version > FORMAT_VERSION
            raise ProjectError(
                f"{where}: unknown format {short_repr(version)}"
                + (" (saved by a newer Lamplight)" if newer else ""),
                damaged=not newer,
            )
        project_id = data.get("id")
        if not is_valid_id(project_id):
            raise ProjectError(f"{where}: bad id {short_repr(project_id)}", damaged=True)
        created = read_time(
            data.get("created"), time.time() if fallback_time is None else fallback_time
        )
        return cls(
            id=project_id,
            name=_name(data.get("name")),
            created=created,
            updated=read_time(data.get("updated"), created),
            instructions=read_text(data.get("instructions"), INSTRUCTIONS_MAX),
            pinned=read_pinned(data.get("pinned")),
            collections=read_names(data.get("collections")),
            model=_model(data.get("model")),
            preset=_preset(data.get("preset")),
            lora=_lora(data.get("lora")),
            mcp_tools=_tool_names(data.get("mcp_tools")),
            tool_specs=read_tool_specs(data.get("tool_specs")),
            api=data.get("api") is True,
        )


def _name(value: Any) -> str:
    if not isinstance(value, str):
        return UNNAMED
    if not name_problem(value):
        return value
    bare = "".join(" " if unicodedata.category(c) in ("Cc", "Cs") else c for c in value[:1000])
    return " ".join(bare.split())[:NAME_MAX].strip() or UNNAMED


def read_pinned(value: Any) -> list[dict[str, Any]]:
    """Pinned documents read back: whole ones only, each path once, numbered from 1."""
    if not isinstance(value, list):
        return []
    out: list[dict[str, Any]] = []
    paths: set[str] = set()
    for raw in value[: MAX_PINNED * 4]:
        source = source_from_dict(raw)
        if source is None or not source.whole or source.path in paths or len(out) == MAX_PINNED:
            continue
        paths.add(source.path)
        assert isinstance(raw, dict)  # source_from_dict read one
        digest = raw.get("sha256")
        entry = {**source.to_dict(), "n": len(out) + 1, "chunk": -1}
        entry["stamp"] = _stamp(raw.get("stamp"))
        entry["sha256"] = digest if isinstance(digest, str) and _SHA256.fullmatch(digest) else ""
        out.append(entry)
    return out


def _stamp(value: Any) -> list[int]:
    """A pinned file's [size, mtime_ns] when it was read ([] when unknown)."""
    if isinstance(value, list) and len(value) == 2 and all(map(_is_size, value)):
        return [int(value[0]), int(value[1])]
    return []


def _is_size(value: object) -> bool:
    return is_int(value) and value >= 0


def _model(value: Any) -> dict[str, Any]:
    """{} unless ``value`` names a connection or a file with its size (else a model
    could be taken for another of the same name)."""
    if not isinstance(value, dict):
        return {}
    connection = value.get("connection")
    if isinstance(connection, str) and _TOKEN.fullmatch(connection):
        return {"connection": connection}
    path, size, name = read_path(value.get("path")), value.get("size"), value.get("name")
    if not path or not _is_size(size):
        return {}
    if not isinstance(name, str) or not name or len(name) > MODEL_NAME_MAX:
        name = PurePath(path.replace("\\", "/")).name[:MODEL_NAME_MAX] or path[:MODEL_NAME_MAX]
    return {"path": path, "name": name, "size": size}


def _preset(value: Any) -> str:
    ok = isinstance(value, str) and len(value) <= PRESET_NAME_MAX and value.isprintable()
    return value if ok else ""


def _lora(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    kept = [e for e in value[: MAX_LORA * 4] if is_lora(e)][:MAX_LORA]
    return [{k: e[k] for k in _LORA_KEYS if k in e} for e in kept]


def _tool_names(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    out: list[str] = []
    for name in value[: MAX_TOOLS * 4]:
        if isinstance(name, str) and _TOKEN.fullmatch(name) and name not in out:
            out.append(name)
    return out[:MAX_TOOLS]


def read_tool_specs(value: Any) -> list[dict[str, Any]]:
    """Stored tool specs ({name, description, parameters}): one per name; a spec whose
    schema is not a JSON object within the limits is dropped (it cannot be offered)."""
    if not isinstance(value, list):
        return []
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for raw in value[: MAX_TOOLS * 4]:
        spec = _tool_spec(raw)
        if spec is not None and spec["name"] not in names and len(out) < MAX_TOOLS:
            names.add(spec["name"])
            out.append(spec)
    return out


def _tool_spec(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    name, description, parameters = raw.get("name"), raw.get("description"), raw.get("parameters")
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        return None
    if not isinstance(parameters, dict) or _depth(parameters, 1) > SCHEMA_DEPTH_MAX:
        return None
    try:  # the schema goes to templates and clients as JSON: no NaN, nothing else
        size = len(json.dumps(parameters, allow_nan=False))
    except (TypeError, ValueError):
        return None
    if size > SCHEMA_CHARS_MAX:
        return None
    text = description[:DESCRIPTION_MAX] if isinstance(description, str) else ""
    return {"name": name, "description": text, "parameters": parameters}


def _depth(value: Any, level: int) -> int:
    """How many objects and arrays deep ``value`` nests, itself at ``level`` (counted
    only until past the limit, so a hostile file costs no more than a good one)."""
    if not isinstance(value, dict | list):
        return level - 1
    if level > SCHEMA_DEPTH_MAX:
        return level
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in items), default=level)


@dataclass(frozen=True)
class ProjectSummary:
    """A row of the project list; ``error`` is set for a file that cannot be used now
    (unreadable, too large, newer) and is kept where it is."""

    id: str
    name: str
    updated: float
    api: bool = False
    error: str = ""


class ProjectStore:
    """Reads and writes the projects under ``root``. Thread-safe: the window writes
    them, the API server reads them."""

    def __init__(self, root: Path) -> None:
        self.folder = root / "projects"
        self._notes: builtins.list[str] = []  # for the user: files set aside
        note = ensure_directory(self.folder)
        if note:
            self._notes.append(note + ".")
        # Projects by id, with the file's (size, mtime_ns) they were read at.
        self._read: dict[str, tuple[tuple[int, int], Project | ProjectError]] = {}
        self._lock = threading.RLock()

    def path(self, project_id: str) -> Path:
        if not is_valid_id(project_id):  # ids become file names
            raise ProjectError(f"invalid project id {short_repr(project_id)}")
        return self.folder / f"{project_id}.json"

    def take_notes(self) -> builtins.list[str]:
        """What was set aside since the last call, one line each (then forgotten)."""
        with self._lock:
            notes, self._notes = self._notes, []
            return notes

    def list(self) -> builtins.list[ProjectSummary]:
        """Every project, by name. Damaged files are set aside (``take_notes``); those
        that cannot be used now are listed with the reason. Only files that changed
        since the last call are read again."""
        with self._lock:
            rows = [
                row
                for path in self.folder.glob("*.json")
                if is_valid_id(path.stem) and (row := self._row(path)) is not None
            ]
            for gone in set(self._read) - {r.id for r in rows}:
                del self._read[gone]
            rows.sort(key=lambda r: (r.name.casefold(), r.id))
            return rows

    def _row(self, path: Path) -> ProjectSummary | None:
        """The list's row for ``path``; None when it was damaged and is set aside now."""
        got = self._get(path.stem)
        if isinstance(got, Project):
            return ProjectSummary(got.id, got.name, got.updated, got.api)
        if got.damaged:
            if set_aside_noted(path, str(got), self._notes):
                self._read.pop(path.stem, None)
                return None
            # Listed as it is from now on: the note said why it stayed.
            self._read[path.stem] = (file_stamp(path), ProjectError(str(got)))
        return ProjectSummary(path.stem, f"(unreadable) {path.name}", mtime(path), error=str(got))

    def load(self, project_id: str) -> Project:
        """Project ``project_id`` (a copy: changing it changes nothing until ``save``).

        Raises:
            ProjectError: missing, unreadable, too large or damaged (``damaged``).
        """
        with self._lock:
            got = self._get(project_id)
            if isinstance(got, ProjectError):
                raise got
            return copy.deepcopy(got)

    def _get(self, project_id: str) -> Project | ProjectError:
        path = self.path(project_id)
        stamp = file_stamp(path)
        known = self._read.get(project_id)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            got: Project | ProjectError = _read(path, project_id)
        except ProjectError as exc:
            got = exc
        self._read[project_id] = (stamp, got)
        return got

    def save(self, project: Project) -> None:
        """Write ``project`` (its ``updated`` becomes now).

        Raises:
            ProjectError: a bad id or name, or larger than ``load`` reads (nothing written).
            OSError: the write failed.
        """
        problem = name_problem(project.name)
        if problem:
            raise ProjectError(problem)
        with self._lock:
            path = self.path(project.id)
            project.updated = time.time()
            try:
                text = json.dumps(project.to_dict(), indent=1, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ProjectError(f"the project cannot be written as JSON ({exc})") from exc
            if len(text) > MAX_BYTES:  # ASCII: ``json.dumps`` escapes the rest
                raise ProjectError(f"it would be over the {MAX_BYTES >> 20} MB a project can hold")
            atomic_write_text(path, text)
            self._read.pop(project.id, None)  # read back as ``load`` reads it

    def delete(self, project_id: str) -> None:
        """Remove the project's file (its chats keep their link and show no project)."""
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                self.path(project_id).unlink()
            self._read.pop(project_id, None)


def _read(path: Path, project_id: str) -> Project:
    try:
        data = read_json(path, MAX_BYTES, MAX_DEPTH)
    except FileNotFoundError as exc:
        raise ProjectError(f"{path.name}: no such project") from exc
    except DataFileError as exc:
        what = "damaged" if exc.damaged else "not usable"
        raise ProjectError(f"{path.name}: {what} ({reason(exc)})", exc.damaged) from exc
    project = Project.from_dict(data, where=path.name, fallback_time=mtime(path))
    if project.id != project_id:
        raise ProjectError(f"{path.name}: holds project {project.id}", damaged=True)
    return project
