"""GGUF file names: the quantization they name, and split parts grouped as one model."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"I?Q[1-8](?:_(?:K|[0-9]|XXS|XS|S|M|L|NL))*"
    r"|TQ[12]_0|MXFP4|BF16|F16|FP16|F32|FP32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SPLIT = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)
# What llama.cpp writes and looks for (llama_split_path): exactly this, lower case.
_SPLIT_FILE = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$")


def split_name(filename: str) -> tuple[str, int, int] | None:
    """``(base, part, total)`` if ``filename`` names part ``part`` of a split GGUF."""
    m = _SPLIT_FILE.match(filename)
    if m is None:
        return None
    part, total = int(m["part"]), int(m["total"])
    if not 1 <= part <= total:
        return None
    return m["base"], part, total


def split_file_name(base: str, part: int, total: int) -> str:
    """The name of part ``part`` of ``total`` (the inverse of :func:`split_name`)."""
    return f"{base}-{part:05d}-of-{total:05d}.gguf"


def quant_of(filename: str) -> str:
    """The quantization a file name names (``Q4_K_M``, ``IQ2_XS``, ``F16``), or ``""``."""
    name = filename.rsplit("/", 1)[-1]
    found = _QUANT.findall(name)
    if not found:
        return ""
    q = str(found[-1]).upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


@dataclass(frozen=True)
class RepoFile:
    """One file of a Hub repository."""

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class GgufChoice:
    """A downloadable model: one GGUF, or all parts of a split one."""

    name: str
    quant: str
    files: tuple[RepoFile, ...] = field(default_factory=tuple)
    kind: str = "model"  # "model", "mmproj" (vision projector) or "adapter"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def split(self) -> bool:
        return len(self.files) > 1

    @property
    def first_file(self) -> str:
        """The path llama.cpp opens (it finds the other parts itself)."""
        return self.files[0].path


def group_gguf(files: Iterable[RepoFile]) -> list[GgufChoice]:
    """GGUF files of a repo as choices, split parts grouped, smallest first.

    A split model whose parts are not all present is left out.
    """
    singles: list[GgufChoice] = []
    splits: dict[tuple[str, int], list[tuple[int, RepoFile]]] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf"):
            continue
        name = f.path.rsplit("/", 1)[-1]
        m = _SPLIT.match(f.path)
        if m:
            key = (m["base"], int(m["total"]))
            splits.setdefault(key, []).append((int(m["part"]), f))
            continue
        singles.append(GgufChoice(name, quant_of(name), (f,), _kind(name)))
    for (base, total), parts in splits.items():
        parts.sort(key=lambda p: p[0])
        if [p for p, _ in parts] != list(range(1, total + 1)):
            continue
        name = base.rsplit("/", 1)[-1] + ".gguf"
        singles.append(GgufChoice(name, quant_of(name), tuple(f for _, f in parts), _kind(name)))
    return sorted(singles, key=lambda c: (c.kind != "model", c.size, c.name))


def _kind(name: str) -> str:
    low = name.lower()
    if "mmproj" in low:
        return "mmproj"
    if "lora" in low or "adapter" in low:
        return "adapter"
    return "model"
