"""LoRA adapters: reading and checking adapter GGUFs, and the ordered stack the user builds.

Every check llama.cpp makes when it loads an adapter (``llama_adapter_lora_init``
in ``src/llama-adapter.cpp``) is made here first, from the GGUF header alone:
llama.cpp reports a refusal only as a NULL pointer and a log line, and some bad
headers (a float64 alpha, a non-string type) trip a ``GGML_ASSERT`` that ends
the process. An adapter reaches llama.cpp only after :func:`check_adapter`
accepted it for the loaded model.

Shape rules (ggml ``ne`` order, ``ne[0]`` first), for a model tensor ``W``:

* ``W.lora_a`` is ``[n_in, rank]`` and ``W.lora_b`` is ``[rank, n_out]`` where
  ``W`` is ``[n_in, n_out]``; llama.cpp calls a pair whose ranks differ "not
  transposed".
* ``token_embd.weight`` is the exception: A and B are flipped, ``lora_a`` is
  ``[rank, n_vocab]`` and ``lora_b`` is ``[rank, n_embd]``.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.gguf.header import GGUF_MAGIC, STRING, parse_header, shown
from app.util.errors import LamplightError
from app.util.hashing import sha256_file

SCALE_MIN, SCALE_MAX = -2.0, 2.0
GGML_MAX_NAME = 64  # llama.cpp refuses tensor names this long or longer
GGUF_TYPE_UINT32, GGUF_TYPE_FLOAT32 = 4, 6
_SUFFIX_A, _SUFFIX_B = ".lora_a", ".lora_b"


class LoraError(LamplightError):
    """An adapter that cannot be used; the message says why in plain words."""


@dataclass(frozen=True)
class LoraPair:
    """One ``lora_a``/``lora_b`` pair and the model tensor it changes."""

    target: str
    a: tuple[int, ...]  # ne of lora_a, padded to 4 dims
    b: tuple[int, ...]

    @property
    def is_embedding(self) -> bool:
        return self.target.endswith("token_embd.weight")

    @property
    def rank(self) -> int:
        return self.b[0]  # llama.cpp scales by alpha / b->ne[0]

    @property
    def expects(self) -> tuple[int, int]:
        """The ``[ne0, ne1]`` the target tensor must have."""
        if self.is_embedding:
            return self.b[1], self.a[1]
        return self.a[0], self.b[1]


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter GGUF says about itself (structure checked, model not yet)."""

    path: Path
    name: str
    rank: int  # the largest rank; most adapters use one rank throughout
    alpha: float  # 0 means llama.cpp applies the scale unchanged
    size: int
    architecture: str
    n_tensors: int
    pairs: tuple[LoraPair, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({p.rank for p in self.pairs}))

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(p.target for p in self.pairs)


@dataclass(frozen=True)
class ModelTensors:
    """A model's architecture and tensor dimensions, to check adapters against."""

    path: Path
    architecture: str
    dims: Mapping[str, tuple[int, ...]]


def dims_text(dims: Sequence[int]) -> str:
    """``640x1024``: the dimensions as llama.cpp lists them, trailing 1s dropped."""
    shown = list(dims)
    while len(shown) > 2 and shown[-1] == 1:
        shown.pop()
    return "x".join(str(d) for d in shown)


def _pad(dims: Sequence[int]) -> tuple[int, ...]:
    return (*dims, *([1] * (4 - len(dims))))


def read_adapter(path: str | Path) -> AdapterInfo:
    """Read an adapter GGUF and check it the way llama.cpp would, without a model.

    Raises:
        LoraError: missing, not GGUF, damaged, truncated, not a LoRA adapter, or
            tensors llama.cpp would refuse.
    """
    p = Path(path)
    try:
        if not p.is_file():
            raise LoraError(f"The LoRA adapter {shown(p.name)} is missing ({shown(str(p))}).")
        size = p.stat().st_size
        if size == 0:
            raise LoraError(f"{shown(p.name)} is empty (0 bytes).")
        with p.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise LoraError(f"{shown(p.name)} cannot be read: {exc.strerror}.") from exc
    if magic != GGUF_MAGIC:
        raise LoraError(f"{p.name} is not a GGUF file, so it cannot be a LoRA adapter.")
    try:
        # llama.cpp reads general.type and friends with gguf_get_val_str and the alpha
        # with gguf_get_val_f32, which assert on any other type: check the types too.
        types: dict[str, int] = {}
        meta, tensors, data_start = parse_header(p, types)
    except (ValueError, struct.error, OSError, KeyError, RecursionError) as exc:
        raise LoraError(f"{p.name} is a damaged GGUF file ({exc}).") from exc

    def text_key(key: str) -> str:
        if key in types and types[key] != STRING:
            raise LoraError(f"{p.name} is damaged: {key} is not text.")
        return str(meta.get(key) or "")

    general_type = text_key("general.type")
    if general_type != "adapter":
        what = f"a {general_type}" if general_type else "not marked as an adapter"
        raise LoraError(f"{p.name} is {what}, not a LoRA adapter (general.type).")
    adapter_type = text_key("adapter.type")
    if adapter_type != "lora":
        raise LoraError(
            f"{p.name} is a {adapter_type or 'untyped'} adapter, not a LoRA (adapter.type)."
        )
    arch = text_key("general.architecture")
    if not arch:
        raise LoraError(f"{p.name} does not say which architecture it is for.")
    if "adapter.lora.alpha" in types and types["adapter.lora.alpha"] != GGUF_TYPE_FLOAT32:
        raise LoraError(f"{p.name} is damaged: its alpha is not a 32-bit float.")
    if "adapter.alora.invocation_tokens" in types:
        raise LoraError(f"{p.name} is an activated LoRA (aLoRA); only plain LoRAs are supported.")
    alignment = meta.get("general.alignment", 32)
    if "general.alignment" in types and types["general.alignment"] != GGUF_TYPE_UINT32:
        raise LoraError(f"{p.name} is damaged: general.alignment is not a 32-bit integer.")
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise LoraError(f"{p.name} is damaged: alignment {alignment} is not a power of two.")

    shapes = _check_tensor_table(p, tensors, data_start, size, alignment)
    pairs = _pair_up(p, shapes)
    alpha = meta.get("adapter.lora.alpha", 0.0)
    return AdapterInfo(
        path=p,
        name=str(meta.get("general.name") or p.stem),
        rank=max(pair.rank for pair in pairs),
        alpha=float(alpha) if isinstance(alpha, float) else 0.0,
        size=size,
        architecture=arch,
        n_tensors=len(tensors),
        pairs=pairs,
    )


def _check_tensor_table(
    p: Path,
    tensors: list[tuple[str, list[int], int, int]],
    data_start: int,
    size: int,
    alignment: int,
) -> dict[str, tuple[int, ...]]:
    """gguf.cpp's tensor checks: names, types, contiguous offsets, data inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    shapes: dict[str, tuple[int, ...]] = {}
    expected = 0
    data_end = data_start
    for name, dims, ttype, offset in tensors:
        if len(name.encode("utf-8")) >= GGML_MAX_NAME:
            raise LoraError(f"{p.name} is damaged: tensor name {name[:40]}… is too long.")
        if name in shapes:
            raise LoraError(f"{p.name} is damaged: tensor {name} appears twice.")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError) as exc:
            raise LoraError(f"{p.name} uses an unknown tensor type {ttype} ({name}).") from exc
        if not dims or any(d <= 0 for d in dims) or dims[0] % block:
            raise LoraError(f"{p.name} is damaged: tensor {name} has shape {dims}.")
        if offset != expected:
            raise LoraError(f"{p.name} is damaged: tensor {name} is not where it should be.")
        nbytes = math.prod(dims) // block * type_size
        expected += (nbytes + alignment - 1) // alignment * alignment
        data_end = max(data_end, data_start + offset + nbytes)
        shapes[name] = _pad(dims)
    if data_end > size:
        raise LoraError(
            f"{p.name} is truncated: its tensors need {data_end:,} bytes but the file has "
            f"{size:,}. Copy or download it again."
        )
    if not tensors:
        raise LoraError(f"{p.name} holds no LoRA tensors.")
    return shapes


def _pair_up(p: Path, shapes: Mapping[str, tuple[int, ...]]) -> tuple[LoraPair, ...]:
    """Group ``X.lora_a``/``X.lora_b`` into pairs and check each pair on its own."""
    halves: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, dims in shapes.items():
        if name.endswith(_SUFFIX_A):
            halves.setdefault(name.removesuffix(_SUFFIX_A), {})["a"] = dims
        elif name.endswith(_SUFFIX_B):
            halves.setdefault(name.removesuffix(_SUFFIX_B), {})["b"] = dims
        elif name.endswith("_norm.weight"):
            continue  # llama.cpp skips norm vectors in adapters
        else:
            raise LoraError(f"{p.name} has a tensor llama.cpp does not accept in a LoRA: {name}.")
    pairs = []
    for target, half in sorted(halves.items()):
        if "a" not in half or "b" not in half:
            missing = "lora_b" if "a" in half else "lora_a"
            raise LoraError(f"{p.name} is incomplete: {target} has no {missing}.")
        pair = LoraPair(target, half["a"], half["b"])
        a_rank = pair.a[0] if pair.is_embedding else pair.a[1]
        if a_rank != pair.b[0] or pair.rank <= 0:
            raise LoraError(
                f"{p.name}: the ranks of {target} do not agree (lora_a {dims_text(pair.a)}, "
                f"lora_b {dims_text(pair.b)}); its lora_a may not be transposed."
            )
        if pair.a[2:] != pair.b[2:]:
            raise LoraError(f"{p.name}: lora_a and lora_b of {target} differ in shape.")
        pairs.append(pair)
    if not pairs:
        raise LoraError(f"{p.name} holds no LoRA tensor pairs.")
    return tuple(pairs)


def check_adapter(info: AdapterInfo, model: ModelTensors) -> AdapterInfo:
    """Check that ``info`` fits ``model``: architecture, target tensors and their shapes.

    Returns ``info`` so that ``check_adapter(read_adapter(p), model)`` reads well.

    Raises:
        LoraError: naming the first tensor that does not fit (and how many more).
    """
    name = info.path.name
    if info.architecture != model.architecture:
        raise LoraError(
            f"{name} was built for {info.architecture}, the loaded model is {model.architecture}."
        )
    problems = []
    for pair in info.pairs:
        dims = model.dims.get(pair.target)
        if dims is None:
            problems.append(f"{pair.target}: the model has no such tensor")
            continue
        padded = _pad(dims)
        if pair.expects != padded[:2] or pair.a[2:] != padded[2:]:
            problems.append(
                f"{pair.target}: adapter expects {dims_text((*pair.expects, *pair.a[2:]))}, "
                f"model has {dims_text(dims)}"
            )
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise LoraError(f"{name} does not fit the loaded model: {problems[0]}{more}.")
    return info


_model_cache: dict[tuple[str, int, int], ModelTensors] = {}
_sha_cache: dict[tuple[str, int, int], str] = {}
_cache_lock = threading.Lock()  # the panel (GUI thread) and the engine thread both read


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def read_model_tensors(path: str | Path) -> ModelTensors:
    """The tensor table of a model GGUF, cached by (path, size, mtime).

    Reading it walks the 262k-entry vocabulary (~85 ms for the default model),
    so it is done once per model file.

    Raises:
        LoraError: the model file cannot be read.
    """
    p = Path(path)
    try:
        key = _stamp(p)
        with _cache_lock:
            cached = _model_cache.get(key)
        if cached is not None:
            return cached
        meta, tensors, _ = parse_header(p)
    except (ValueError, struct.error, OSError, KeyError) as exc:
        raise LoraError(
            f"The model file {p.name} could not be read to check adapters: {exc}"
        ) from exc
    model = ModelTensors(
        path=p,
        architecture=str(meta.get("general.architecture") or ""),
        dims={name: tuple(dims) for name, dims, _, _ in tensors},
    )
    with _cache_lock:
        _model_cache[key] = model
    return model


def validate_adapter(path: str | Path, model_path: str | Path) -> AdapterInfo:
    """``read_adapter`` and ``check_adapter`` against the model file at ``model_path``."""
    return check_adapter(read_adapter(path), read_model_tensors(model_path))


def format_scale(scale: float) -> str:
    """``0.8``, ``1.0``, ``-0.25``: at least one decimal, at most two."""
    text = f"{scale:.2f}"
    return text[:-1] if text.endswith("0") else text


@dataclass(frozen=True)
class LoraEntry:
    """One adapter in the stack."""

    path: Path
    scale: float = 1.0
    enabled: bool = True

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def active(self) -> bool:
        """Whether it changes the model (llama.cpp leaves scale-0 adapters out)."""
        return self.enabled and self.scale != 0.0


def _checked_scale(scale: float) -> float:
    value = float(scale)
    if not (SCALE_MIN <= value <= SCALE_MAX):  # also refuses NaN
        raise ValueError(f"A LoRA scale must be between {SCALE_MIN:g} and {SCALE_MAX:g}.")
    return value


class LoraStack:
    """An ordered list of adapters with a scale each; the engine applies the active ones.

    Mutable, so the panel edits it in place; it is copied whenever it crosses
    to the engine thread. The effect is a sum, so order only matters to the user.
    """

    def __init__(self, entries: Iterable[LoraEntry] = ()) -> None:
        self._entries: list[LoraEntry] = []
        for entry in entries:
            self.push(entry.path, entry.scale, entry.enabled)

    @property
    def entries(self) -> tuple[LoraEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LoraEntry]:
        return iter(tuple(self._entries))

    def __getitem__(self, index: int) -> LoraEntry:
        return self._entries[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoraStack) and self._entries == other._entries

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LoraStack({self._entries!r})"

    def copy(self) -> LoraStack:
        return LoraStack(self._entries)

    def index(self, path: str | Path) -> int:
        """Position of the adapter at ``path``; ValueError when it is not in the stack."""
        want = Path(path)
        for i, entry in enumerate(self._entries):
            if entry.path == want:
                return i
        raise ValueError(f"{want.name} is not in the LoRA stack.")

    def push(self, path: str | Path, scale: float = 1.0, enabled: bool = True) -> LoraEntry:
        """Append an adapter; a file already in the stack is refused (change its scale)."""
        p = Path(path)
        if any(e.path == p for e in self._entries):
            raise ValueError(f"{p.name} is already in the LoRA stack.")
        entry = LoraEntry(p, _checked_scale(scale), bool(enabled))
        self._entries.append(entry)
        return entry

    def remove(self, index: int) -> LoraEntry:
        return self._entries.pop(index)

    def clear(self) -> None:
        self._entries.clear()

    def enable(self, index: int, enabled: bool = True) -> None:
        self._entries[index] = replace(self._entries[index], enabled=bool(enabled))

    def set_scale(self, index: int, scale: float) -> None:
        self._entries[index] = replace(self._entries[index], scale=_checked_scale(scale))

    def reorder(self, index: int, new_index: int) -> None:
        """Move the entry at ``index`` to ``new_index`` (clamped to the list)."""
        entry = self._entries.pop(index)
        self._entries.insert(max(0, min(new_index, len(self._entries))), entry)

    def active(self) -> list[LoraEntry]:
        return [e for e in self._entries if e.active]

    def summary(self) -> str:
        """``LoRA: style×0.8, tone×1.0`` (empty for an empty stack)."""
        if not self._entries:
            return ""
        parts = [f"{e.name}×{format_scale(e.scale)}" for e in self.active()]
        return "LoRA: " + (", ".join(parts) if parts else "none active")

    def signature(self) -> list[dict[str, Any]]:
        """What a KV cache made under this stack depends on, for snapshot headers.

        Every entry is listed (disabled ones too, so a restore shows the same
        stack); :func:`stack_key` keeps only what changes the model's output.

        Raises:
            OSError: an active adapter's file cannot be read (an inactive one is
                listed with ``size`` and ``sha256`` None).
        """
        return [_entry_signature(e) for e in self._entries]

    @classmethod
    def from_signature(cls, signature: Iterable[Mapping[str, Any]]) -> LoraStack:
        """The stack a signature describes (files are not checked here)."""
        return cls(
            LoraEntry(Path(str(s["path"])), float(s["scale"]), bool(s.get("enabled", True)))
            for s in signature
        )


def _entry_signature(entry: LoraEntry) -> dict[str, Any]:
    try:
        size: int | None = entry.path.stat().st_size
        digest: str | None = sha256_file(entry.path)
    except OSError:
        if entry.active:
            raise
        size = digest = None  # it does not change the model; a restore can still show it
    return {
        "name": entry.path.name,
        "path": str(entry.path),
        "size": size,
        "sha256": digest,
        "scale": entry.scale,
        "enabled": entry.enabled,
    }


def stack_key(signature: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, float], ...]:
    """The part of a signature that changes the model: active (sha256, scale), order-free.

    llama.cpp keeps the applied adapters in an unordered map and sums their
    deltas, so two stacks with equal keys compute the same KV cache.
    """
    return tuple(
        sorted(
            (str(s.get("sha256")), float(s.get("scale", 0.0)))
            for s in signature
            if s.get("enabled", True) and float(s.get("scale", 0.0)) != 0.0
        )
    )
