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

# Approximate bits per weight, for sorting and the size hint when no size is known.
BITS = {
    "Q2_K": 2.6,
    "Q3_K_S": 3.5,
    "Q3_K_M": 3.9,
    "Q3_K_L": 4.3,
    "Q4_0": 4.5,
    "Q4_1": 5.0,
    "Q4_K_S": 4.6,
    "Q4_K_M": 4.8,
    "Q5_0": 5.5,
    "Q5_1": 6.0,
    "Q5_K_S": 5.5,
    "Q5_K_M": 5.7,
    "Q6_K": 6.6,
    "Q8_0": 8.5,
    "F16": 16.0,
    "BF16": 16.0,
    "F32": 32.0,
    "IQ1_S": 1.6,
    "IQ1_M": 1.8,
    "IQ2_XXS": 2.1,
    "IQ2_XS": 2.3,
    "IQ2_S": 2.5,
    "IQ2_M": 2.7,
    "IQ3_XXS": 3.1,
    "IQ3_XS": 3.3,
    "IQ3_S": 3.4,
    "IQ3_M": 3.7,
    "IQ4_NL": 4.5,
    "IQ4_XS": 4.3,
}


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
