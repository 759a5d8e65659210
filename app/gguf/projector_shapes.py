"""The header values of a vision projector that libmtmd trusts, checked against its tensors.

libmtmd (``clip.cpp``) reads the encoder's geometry from the header and builds its
graph from the tensors; where the two disagree, a ``GGML_ASSERT`` in the graph
ends the whole process (at load, when the warm-up graph is built, or at the first
image). Each rule here is one such assert, stated for the values it reads:

- the attention: ``d_head`` is ``attention.head_dim``, else ``embedding_length /
  head_count`` (integer division); Q must be ``d_head × head_count`` wide and K, V
  ``d_head × head_count_kv`` (``ggml_reshape_4d``), every block's input and output
  ``embedding_length`` wide (``ggml_mul_mat``, ``ggml_add``);
- ``block_count`` at most the blocks the file holds (each needs its ``attn_out``;
  a huge count is a huge allocation before the missing tensor is noticed);
- the patch embedding ``patch_size`` square with ``embedding_length`` filters, and
  the position embedding ``embedding_length`` wide with one row per patch;
- Gemma 3: the patches per side a multiple of the pooling ``scale_factor``
  (otherwise ``GGML_ABORT("Invalid number of output tokens")`` at the first image),
  and the projection and its norm reading ``embedding_length``.

The width rules hold for the encoders built by ``clip_graph::build_vit`` with
separate Q, K and V (:data:`VIT_TYPES`); other projector types get the block count
rule here, and the rest is left to the guarded load in a child process
(``app/engine/native/projector_guard.py``).
"""

from __future__ import annotations

import math
import re

from app.gguf.header import BOOL, FLOAT32, STRING, UINT32, Header, int_value, shown
from app.util.errors import ProjectorError

INT32 = 5
_TYPE_NAMES = {
    UINT32: "u32",
    INT32: "i32",
    FLOAT32: "f32",
    BOOL: "a bool",
    STRING: "text",
    9: "an array",
}
# Every scalar key clip.cpp reads, with the one GGUF type it reads it as: gguf.cpp's
# getters assert the type (GGML_ASSERT(type_to_gguf_type<T>::value == type)), so a
# u32 stored as i32 ends the process. Arrays are checked by clip.cpp itself.
_PER_ENCODER = {
    "attention.head_count": UINT32,
    "attention.head_count_kv": UINT32,
    "attention.head_dim": UINT32,
    "attention.layer_norm_epsilon": FLOAT32,
    "block_count": UINT32,
    "embedding_length": UINT32,
    "feed_forward_length": UINT32,
    "projection_dim": UINT32,
}
_U32_KEYS = (
    "clip.minicpmv_query_num",
    "clip.audio.chunk_size",
    "clip.audio.conv_kernel_size",
    "clip.audio.local_block_count",
    "clip.audio.local_group_size",
    "clip.audio.max_pos_emb",
    "clip.audio.num_mel_bins",
    "clip.audio.projector.downsample_rate",
    "clip.audio.projector.head_count",
    "clip.audio.projector.stack_factor",
    "clip.audio.projector.window_size",
    "clip.audio.rvq.num_quantizers",
    "clip.audio.subsampling_factor",
    "clip.audio.window_size",
    "clip.vision.expert_used_count",
    "clip.vision.image_max_pixels",
    "clip.vision.image_min_pixels",
    "clip.vision.image_size",
    "clip.vision.n_wa_pattern",
    "clip.vision.patch_size",
    "clip.vision.preproc_image_size",
    "clip.vision.preproc_max_tiles",
    "clip.vision.preproc_min_tiles",
    "clip.vision.projector.query_side",
    "clip.vision.projector.scale_factor",
    "clip.vision.projector.window_side",
    "clip.vision.sam.block_count",
    "clip.vision.sam.embedding_length",
    "clip.vision.sam.head_count",
    "clip.vision.spatial_merge_size",
    "clip.vision.window_size",
)
KEY_TYPES = {
    **{
        f"clip.{e}.{k}": t
        for e in ("vision", "audio", "gen.audio")
        for k, t in _PER_ENCODER.items()
    },
    **dict.fromkeys(_U32_KEYS, UINT32),
    "clip.minicpmv_version": INT32,
    "clip.vision.swiglu_clamp": FLOAT32,
    **dict.fromkeys(
        ("clip.has_vision_encoder", "clip.has_audio_encoder", "clip.has_gen_audio_encoder"), BOOL
    ),
    **dict.fromkeys(("clip.use_gelu", "clip.use_silu"), BOOL),
    **dict.fromkeys(
        (
            "general.name",
            "general.description",
            "clip.projector_type",
            "clip.vision.projector_type",
            "clip.audio.projector_type",
            "clip.gen.audio.projector_type",
            "clip.gen.audio.model_variant",
            "clip.vision.mm_patch_merge_type",
        ),
        STRING,
    ),
}

# Projector types whose encoder is clip_graph::build_vit over the standard blocks
# (clip.cpp: the siglip and llava graph builders).
VIT_TYPES = frozenset(["gemma3", "idefics3", "lfm2", "mlp", "mlp_norm", "ldp", "ldpv2"])
# Types that load no standard blocks (clip.cpp: has_standard_layers).
NO_BLOCKS = frozenset(["gemma3nv"])
MAX_PATCHES = 1 << 16  # patches in a fixed-size image (Gemma 3: 4,096)
_BLOCK = re.compile(r"v\.blk\.(\d{1,9})\.attn_out\.weight")
_V = "clip.vision."


def check_types(name: str, header: Header) -> None:
    """Refuse a key clip.cpp reads stored as another type, and a layer-norm epsilon
    ggml's norms assert on (``GGML_ASSERT(eps >= 0.0f)``, at the first image).

    Raises:
        ProjectorError: the first such key, in words.
    """
    for key, want in KEY_TYPES.items():
        have = header.types.get(key)
        if have is not None and have != want:
            kind = _TYPE_NAMES.get(have, f"type {have}")
            _refuse(name, f"its {key} is stored as {kind}, and llama.cpp reads {_TYPE_NAMES[want]}")
    for encoder in ("vision", "audio", "gen.audio"):
        eps = header.meta.get(f"clip.{encoder}.attention.layer_norm_epsilon")
        if isinstance(eps, float) and not (math.isfinite(eps) and eps >= 0):
            _refuse(name, f"its {encoder} layer-norm epsilon is {eps}")


def check_geometry(name: str, header: Header, kind: str) -> None:
    """Refuse a projector whose header values disagree with its tensors where libmtmd
    would abort (see the module docstring).

    Raises:
        ProjectorError: the first disagreement, in words.
    """
    meta = header.meta
    dims = {t: d for t, d, _type, _offset in header.tensors}
    n_layer = _int(meta, "block_count")
    if kind not in NO_BLOCKS and n_layer is not None:
        blocks = {int(m.group(1)) for t in dims if (m := _BLOCK.fullmatch(t))}
        held = next((i for i in range(len(blocks) + 1) if i not in blocks), 0)
        if not 0 <= n_layer <= held:
            _refuse(name, f"it names {n_layer} encoder blocks and holds {held}")
    if kind not in VIT_TYPES:
        return
    n_embd = _int(meta, "embedding_length") or 0
    n_head = _int(meta, "attention.head_count") or 0
    if n_embd < 1 or n_head < 1:
        _refuse(name, f"its embedding width {n_embd} and head count {n_head} make no sense")
    n_head_kv = _int(meta, "attention.head_count_kv") or n_head
    d_head = _int(meta, "attention.head_dim") or n_embd // n_head
    if d_head < 1 or n_head_kv < 1:
        _refuse(name, f"its head count {n_head} does not fit its embedding width {n_embd}")
    want = {"attn_q": (n_embd, d_head * n_head), "attn_k": (n_embd, d_head * n_head_kv)}
    want |= {"attn_v": want["attn_k"], "attn_out": (d_head * n_head, n_embd)}
    for il in range(n_layer or 0):
        for part, shape in want.items():
            _expect(name, dims, f"v.blk.{il}.{part}.weight", shape, n_embd, n_head)
        for part in ("ln1", "ln2"):
            _expect(name, dims, f"v.blk.{il}.{part}.weight", (n_embd,), n_embd, n_head)
        _check_ffn(name, dims, il, n_embd)
    _check_patches(name, header, dims, kind, n_embd)


def _check_ffn(name: str, dims: dict[str, list[int]], il: int, n_embd: int) -> None:
    """Up and down (stored either way round: clip.cpp swaps them back) join at the
    feed-forward width and come back to ``n_embd``."""
    up, down = dims.get(f"v.blk.{il}.ffn_up.weight"), dims.get(f"v.blk.{il}.ffn_down.weight")
    if up is None or down is None:
        return
    if len(up) == 2 and len(down) == 2 and down[0] == n_embd and up[1] == n_embd:
        up, down = down, up
    if not (len(up) == 2 and len(down) == 2 and up[0] == n_embd and down[1] == n_embd):
        _refuse(name, f"its block {il} feed-forward does not read {n_embd}-wide embeddings")
    if up[1] != down[0]:
        _refuse(name, f"its block {il} feed-forward widths {up[1]} and {down[0]} differ")


def _check_patches(
    name: str, header: Header, dims: dict[str, list[int]], kind: str, n_embd: int
) -> None:
    meta = header.meta
    size = int_value(meta.get(f"{_V}image_size")) or 0
    patch = int_value(meta.get(f"{_V}patch_size")) or 0
    kernel = dims.get("v.patch_embd.weight")
    if kernel is not None and (len(kernel) != 4 or kernel[3] != n_embd):
        _refuse(name, f"its patch embedding does not make {n_embd}-wide embeddings")
    if kernel is not None and patch and kernel[:2] != [patch, patch]:
        _refuse(name, f"its patch size {patch} is not its patch embedding's {kernel[:2]}")
    if kind != "gemma3":  # the others resize images to their own grids
        return
    side = size // patch if patch else 0
    merge = int_value(meta.get(f"{_V}projector.scale_factor"))
    merge = 4 if merge is None else merge  # clip.cpp's default for Gemma 3
    if not (side >= 1 and side * side <= MAX_PATCHES and merge >= 1 and side % merge == 0):
        _refuse(
            name,
            f"its image size {size}, patch size {patch} and pooling {merge} do not make "
            "a whole number of image tokens",
        )
    _expect(name, dims, "v.position_embd.weight", (n_embd, side * side), n_embd, 0)
    _expect(name, dims, "mm.soft_emb_norm.weight", (n_embd,), n_embd, 0)
    projection = dims.get("mm.input_projection.weight")
    if projection is not None and (len(projection) != 2 or projection[1] != n_embd):
        _refuse(name, f"its input projection does not read {n_embd}-wide embeddings")


def _expect(
    name: str,
    dims: dict[str, list[int]],
    tensor: str,
    shape: tuple[int, ...],
    n_embd: int,
    n_head: int,
) -> None:
    """``tensor`` (when present) has ``shape`` (ggml order)."""
    have = dims.get(tensor)
    if have is None or tuple(have) == shape:
        return
    heads = f" and head count {n_head}" if n_head else ""
    _refuse(
        name,
        f"its tensor {shown(tensor)} has shape {have}, not {list(shape)} as its "
        f"embedding width {n_embd}{heads} say",
    )


def _int(meta: dict[str, object], key: str) -> int | None:
    return int_value(meta.get(_V + key))


def _refuse(name: str, why: str) -> None:
    raise ProjectorError(
        f"{name} cannot be used: {why}, which would make llama.cpp end Lamplight. "
        "Use the mmproj file published with the model."
    )
