"""A real draft model for the default model, built in the test suite with ``gguf``.

:func:`build_draft` keeps the target's first ``n_blocks`` transformer blocks and
everything that is not a block (token embedding, output norm, output head, which
Gemma 3 ties to the embedding), with every metadata key copied except the block
count (and per-layer arrays, cut to the kept blocks). Tensors are copied byte for
byte in their own quantization, so the draft reads text with the same vocabulary
and the same head as the target: a genuinely smaller, compatible draft, without a
download. Its predictions are the target's early-exit guesses, which agree with
the target often enough to test acceptance and rewinds.

:func:`draft_model_path` builds it once per checkout into ``.cache/test-models/``
next to the default model, keyed by the target's size and mtime, atomically (a
temp file, fsync, rename) and under a lock, so parallel runs build it once.

:func:`vocab_variant` writes a draft whose vocabulary differs in one chosen way,
for the refusal tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = ROOT / ".cache" / "test-models"
DRAFT_BLOCKS = 4
AGREEING_BLOCKS = 15
# Bump when build_draft changes what it writes, so cached drafts are rebuilt.
BUILDER_VERSION = 1
_BLOCK = re.compile(r"blk\.(\d+)\.")
Added = tuple[str, str, float]  # a control token appended: (text, like token, scale)
_READER_LOCK = threading.Lock()  # one reader swaps gguf_reader's numpy at a time


class _PlainArrays:
    """numpy for ``gguf.gguf_reader``, but ``memmap`` gives a plain ndarray view of the
    map: the reader slices it once per value, and each slice of a ``np.memmap`` runs
    Python hooks (``__array_finalize__``), 60 % of reading the 262k-token vocabulary."""

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def memmap(path: str, mode: str = "r") -> Any:
        return np.memmap(path, mode=mode).view(np.ndarray)  # keeps the map alive


@functools.lru_cache(maxsize=2)
def _reader(path: str, size: int, mtime_ns: int) -> Any:
    """A parsed GGUF file (4 s for the 262k-token vocabulary), kept for the next variant."""
    import gguf.gguf_reader

    del size, mtime_ns  # part of the cache key only
    module: Any = gguf.gguf_reader
    with _READER_LOCK:
        real, module.np = module.np, _PlainArrays()
        try:
            return gguf.GGUFReader(path)
        finally:
            module.np = real


def read_gguf(path: Path) -> Any:
    """``gguf.GGUFReader`` for ``path``, cached while the file is unchanged."""
    st = Path(path).stat()
    return _reader(str(path), st.st_size, st.st_mtime_ns)


def build_draft(
    target: Path,
    out: Path,
    n_blocks: int = DRAFT_BLOCKS,
    *,
    meta: Mapping[str, Any] | None = None,
    tokens: Mapping[int, str] | None = None,
    drop: Iterable[str] = (),
    blocks: Iterable[int] | None = None,
    added: Sequence[Added] = (),
) -> Path:
    """Write a draft model for ``target`` to ``out``: its first ``n_blocks`` blocks.

    Args:
        meta: metadata values to set instead of the target's (the key keeps its
            type; a new key gets one from its Python type).
        tokens: token strings to change, by id (a vocabulary that differs).
        drop: metadata keys to leave out.
        added: control tokens appended to the vocabulary, each ``(text, like, scale)``:
            its embedding row is the row of the token ``like``, scaled by ``scale`` (Q8_0),
            so the tied head scores it as that token, stronger.

    Returns:
        ``out``. The file appears complete or not at all.
    """
    import gguf

    reader = read_gguf(Path(target))
    arch = str(reader.fields["general.architecture"].contents())
    blocks_key = f"{arch}.block_count"
    n_target = int(reader.fields[blocks_key].contents())
    chosen = sorted(set(blocks)) if blocks is not None else list(range(n_blocks))
    n_blocks = len(chosen)
    if not 0 < n_blocks <= n_target or not 0 <= chosen[0] <= chosen[-1] < n_target:
        raise ValueError(f"choose 1 to {n_target} blocks from 0 to {n_target - 1}: {chosen}")
    renumber = {old: new for new, old in enumerate(chosen)}
    overrides = dict(meta or {})
    overrides.setdefault(blocks_key, n_blocks)
    name = reader.fields.get("general.name")
    base = str(name.contents()) if name is not None else Path(target).stem
    overrides.setdefault("general.name", f"{base} draft ({n_blocks} of {n_target} blocks)")
    dropped = set(drop)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    like: list[int] = []  # the rows the added tokens copy
    try:
        for field in reader.fields.values():
            key = field.name
            if key == "general.architecture" or key.startswith("GGUF.") or key in dropped:
                continue
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            value = overrides.pop(key) if key in overrides else field.contents()
            if key == "tokenizer.ggml.tokens" and tokens:
                value = list(value)
                for index, text in tokens.items():
                    value[index] = text
            if key == "tokenizer.ggml.tokens" and added:
                ids = {text: i for i, text in enumerate(value)}
                like = [ids[a[1]] for a in added]
            if key in _ADDED and added:
                value = [*value, *(_ADDED[key](a[0]) for a in added)]
            elif (
                sub_type is not None
                and sub_type != gguf.GGUFValueType.STRING
                and len(value) == n_target
                and key.startswith(f"{arch}.")
            ):
                value = [value[i] for i in chosen]  # a per-layer array
            writer.add_key_value(key, value, vtype, sub_type=sub_type)
        for key, value in overrides.items():
            writer.add_key_value(key, value, _value_type(value))

        kept = [(_renamed(t.name, renumber), t) for t in reader.tensors]
        rows = [(i, a[2]) for i, a in zip(like, added, strict=True)]
        kept = [(name, t, _with_rows(name, t, rows)) for name, t in kept if name]
        for name, t, data in kept:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _name, _t, data in kept:
            writer.write_tensor_data(data, tensor_endianess=reader.endianess)
        writer.flush()
        assert writer.fout is not None
        for fh in writer.fout:
            os.fsync(fh.fileno())
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return out


def vocab_variant(
    target: Path,
    out: Path,
    *,
    meta: Mapping[str, Any] | None = None,
    tokens: Mapping[int, str] | None = None,
    drop: Iterable[str] = (),
) -> Path:
    """A one-block draft of ``target`` whose vocabulary differs as given (see
    :func:`build_draft`): loadable by llama.cpp, refused as a draft for ``target``."""
    return build_draft(target, out, 1, meta=meta, tokens=tokens, drop=drop)


def draft_model_path(n_blocks: int = DRAFT_BLOCKS) -> Path:
    """The default model's test draft (its first ``n_blocks`` blocks), built once into
    ``.cache/test-models/``.

    The 4-block draft is 1.5x faster than the target but rarely agrees with it (about
    1 % of greedy tokens): a draft whose proposals fail. :func:`agreeing_draft_path`
    is one that agrees more often.
    """
    from app.models.default_model import ensure_default_model

    target = ensure_default_model(MODEL_CACHE)
    return cached_draft(target, MODEL_CACHE / f"{target.stem}.draft-{n_blocks}blk.gguf", n_blocks)


def cached_draft(
    target: Path, out: Path, n_blocks: int = DRAFT_BLOCKS, added: Sequence[Added] = ()
) -> Path:
    """``build_draft(target, out, n_blocks, added=added)`` unless ``out`` was built from
    this very ``target`` (same size and mtime) by this builder; a stamp file beside
    ``out`` says."""
    stamp = out.with_name(f".{out.name}.built.json")
    st = target.stat()
    key: dict[str, Any] = {
        "target": target.name,
        "target_size": st.st_size,
        "target_mtime_ns": st.st_mtime_ns,
        "n_blocks": n_blocks,
        "builder": BUILDER_VERSION,
    }
    if added:
        key["added"] = [list(a) for a in added]
    with _locked(out.with_name(f".{out.name}.lock")):
        if _stamp_matches(stamp, key, out):
            return out
        build_draft(target, out, n_blocks, added=added)
        from app.util.atomic import atomic_write_text

        key["size"] = out.stat().st_size
        atomic_write_text(stamp, json.dumps(key))
    return out


def agreeing_draft_path() -> Path:
    """A draft of the first 15 of 18 blocks: it proposes the target's greedy token
    about 60 % of the time (measured on three prompts), but is barely faster."""
    return draft_model_path(AGREEING_BLOCKS)


def _stamp_matches(stamp: Path, key: dict[str, Any], out: Path) -> bool:
    try:
        saved = json.loads(stamp.read_text())
        return bool(saved == {**key, "size": out.stat().st_size})
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing), so one process builds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# Per-token metadata of an appended control token (llama.cpp's LLAMA_TOKEN_TYPE_CONTROL).
_ADDED: dict[str, Callable[[str], Any]] = {
    "tokenizer.ggml.tokens": lambda text: text,
    "tokenizer.ggml.scores": lambda _text: 0.0,
    "tokenizer.ggml.token_type": lambda _text: 3,
}


def _with_rows(name: str, tensor: Any, rows: Sequence[tuple[int, float]]) -> Any:
    """The tensor's data with a row appended per ``(row to copy, scale)`` when it is the
    token embedding (rows are whole quantized blocks: appending bytes appends tokens)."""
    import gguf
    import numpy as np

    data = tensor.data
    if not rows or name != "token_embd.weight":
        return data
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0, tensor.tensor_type
    new = data[[i for i, _ in rows]].copy()
    blocks = new.reshape(len(rows), -1, 34)  # Q8_0: an fp16 scale, then 32 int8
    scales = blocks[:, :, :2].copy().view(np.float16)
    scales *= np.array([s for _, s in rows], dtype=np.float16)[:, None, None]
    blocks[:, :, :2] = scales.view(np.uint8)
    return np.concatenate([data, blocks.reshape(new.shape)])


def _renamed(name: str, renumber: Mapping[int, int]) -> str:
    """``name`` in the draft ("" where its block is left out)."""
    m = _BLOCK.match(name)
    if m is None:
        return name
    new = renumber.get(int(m.group(1)))
    return "" if new is None else f"blk.{new}.{name[m.end() :]}"


def _value_type(value: Any) -> Any:
    import gguf

    if isinstance(value, bool):
        return gguf.GGUFValueType.BOOL
    if isinstance(value, int):
        return gguf.GGUFValueType.UINT32 if value >= 0 else gguf.GGUFValueType.INT32
    if isinstance(value, float):
        return gguf.GGUFValueType.FLOAT32
    return gguf.GGUFValueType.STRING
