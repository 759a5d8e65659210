"""Tiny random-weight models of three recurrent and hybrid llama.cpp architectures.

For tests of recurrent and hybrid memory (drafting rollback, checkpoints, state
snapshots), which a pure-attention model cannot exercise: its memory is a KV cache
that rolls back by deleting cells, where a recurrent layer keeps one state per
sequence that must be saved and restored. Each model is written with ``gguf``:

- ``mamba2``: pure recurrent. 2 Mamba-2 blocks, width 64, ``ssm.inner_size`` 128,
  ``ssm.state_size`` 16, ``ssm.group_count`` 2, ``ssm.time_step_rank`` 4 (4 heads of
  32), ``ssm.conv_kernel`` 4. No FFN and no attention (head counts 0).
- ``lfm2``: hybrid. 4 blocks, width 64, FFN 128; blocks 0 and 2 are short-conv
  (``shortconv.l_cache`` 3), blocks 1 and 3 attention (4 query heads, 2 KV heads of 16):
  llama.cpp makes a block recurrent where the per-block ``head_count_kv`` is 0.
- ``qwen35``: hybrid. 4 blocks, width 64, FFN 128; ``full_attention_interval`` 2 makes
  blocks 0 and 2 Gated DeltaNet linear attention (2 key heads and 4 value heads of
  16, ``ssm.inner_size`` 64, conv kernel 4) and blocks 1 and 3 gated full attention
  (4 query heads, 2 KV heads of 32, IMRoPE on 8 of 32 dims, sections [2, 1, 1, 0]).

All share ``tests/byte_model``'s vocabulary (``<unk>``, ``<s>``, ``</s>`` and the 256
byte tokens, SPM, no space prefix), so any text tokenizes; the head is tied to the
token embedding, as in the small released models. Weights are F32 (llama.cpp's CPU
``ssm_conv`` and ``ssm_scan`` read F32 only), normal with standard deviation 0.1 from
a seeded generator, norms ones, SSM ``A`` negative (a decaying state). The context
length in the metadata is 8192. Each file is 0.3-0.9 MB and takes milliseconds.

The tensor names and shapes follow llama.cpp as vendored in llama-cpp-python 0.3.36:
``src/llama-arch.cpp`` (names, metadata keys), ``src/models/{mamba2,mamba-base,lfm2,
qwen35}.cpp`` (the keys each architecture reads, every tensor's shape, the graph) and
``tests/test-llama-archs.cpp`` (random models of every architecture). Built once per
checkout into ``.cache/test-models/``, atomically and under ``tests/draft_model``'s
lock, so parallel runs build each once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.byte_model import add_byte_vocab, write_model

MODEL_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-models"
ARCHS = ("mamba2", "lfm2", "qwen35")
# Bump when _build changes what it writes, so cached models are rebuilt.
BUILDER_VERSION = 1
_WIDTH, _FF, _CTX, _EPS, _SEED, _STD = 64, 128, 8192, 1e-5, 1234, 0.1


def arch_model_path(arch: str) -> Path:
    """The tiny ``arch`` model (one of :data:`ARCHS`), built if missing."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}, expected one of {ARCHS}")
    from tests.draft_model import _locked

    out = MODEL_CACHE / f"arch-{arch}-v{BUILDER_VERSION}.gguf"
    with _locked(out.with_name(f".{out.name}.lock")):
        if not out.exists():
            _build(arch, out)
    return out


class _Tensors(dict[str, Any]):
    """Tensors to write. Shapes are given in llama.cpp's order (``ne``, as in
    ``create_tensor`` calls); numpy's order is the reverse."""

    def __init__(self, rng: Any) -> None:
        super().__init__()
        self.rng = rng

    def rand(self, name: str, *ne: int) -> None:
        import numpy as np

        self[name] = (self.rng.standard_normal(ne[::-1]) * _STD).astype(np.float32)

    def ones(self, name: str, *ne: int) -> None:
        import numpy as np

        self[name] = np.ones(ne[::-1], np.float32)

    def negative(self, name: str, *ne: int) -> None:
        """Like test-llama-archs: an SSM ``A`` must be negative, or the state grows."""
        import numpy as np

        self[name] = -np.abs(self.rng.standard_normal(ne[::-1]) * _STD).astype(np.float32)


def _ffn(t: _Tensors, il: int) -> None:
    t.rand(f"blk.{il}.ffn_gate.weight", _WIDTH, _FF)
    t.rand(f"blk.{il}.ffn_up.weight", _WIDTH, _FF)
    t.rand(f"blk.{il}.ffn_down.weight", _FF, _WIDTH)


def _mamba2(w: Any, t: _Tensors) -> int:
    """src/models/mamba2.cpp: every block is one Mamba-2 mixer."""
    n_layer, d_conv, d_inner, d_state, n_group, n_head = 2, 4, 128, 16, 2, 4
    # The converter writes zero head counts and FFN for Mamba: no attention, no FFN.
    w.add_head_count(0)
    w.add_head_count_kv(0)
    w.add_feed_forward_length(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)
    conv_dim = d_inner + 2 * n_group * d_state  # x, B and C go through the conv
    for il in range(n_layer):
        p = f"blk.{il}"
        t.ones(f"{p}.attn_norm.weight", _WIDTH)
        t.rand(f"{p}.ssm_in.weight", _WIDTH, d_inner + conv_dim + n_head)  # z, xBC, dt
        t.rand(f"{p}.ssm_conv1d.weight", d_conv, conv_dim)
        t.rand(f"{p}.ssm_conv1d.bias", conv_dim)
        t.rand(f"{p}.ssm_dt.bias", n_head)
        t.negative(f"{p}.ssm_a", 1, n_head)
        t.ones(f"{p}.ssm_d", 1, n_head)
        t.ones(f"{p}.ssm_norm.weight", d_inner // n_group, n_group)
        t.rand(f"{p}.ssm_out.weight", d_inner, _WIDTH)
    return n_layer


def _lfm2(w: Any, t: _Tensors) -> int:
    """src/models/lfm2.cpp: a block is short-conv where its ``head_count_kv`` is 0."""
    n_head, n_head_kv, l_cache = 4, 2, 3
    head_dim = _WIDTH // n_head
    kv_per_layer = [0, n_head_kv, 0, n_head_kv]
    w.add_feed_forward_length(_FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(kv_per_layer)
    w.add_rope_freq_base(1_000_000.0)
    w.add_shortconv_l_cache(l_cache)
    for il, kv in enumerate(kv_per_layer):
        p = f"blk.{il}"
        t.ones(f"{p}.attn_norm.weight", _WIDTH)
        t.ones(f"{p}.ffn_norm.weight", _WIDTH)
        _ffn(t, il)
        if kv:
            t.ones(f"{p}.attn_q_norm.weight", head_dim)
            t.ones(f"{p}.attn_k_norm.weight", head_dim)
            t.rand(f"{p}.attn_q.weight", _WIDTH, _WIDTH)
            t.rand(f"{p}.attn_k.weight", _WIDTH, head_dim * kv)
            t.rand(f"{p}.attn_v.weight", _WIDTH, head_dim * kv)
            t.rand(f"{p}.attn_output.weight", _WIDTH, _WIDTH)
        else:
            t.rand(f"{p}.shortconv.conv.weight", l_cache, _WIDTH)
            t.rand(f"{p}.shortconv.in_proj.weight", _WIDTH, 3 * _WIDTH)  # B, C, x
            t.rand(f"{p}.shortconv.out_proj.weight", _WIDTH, _WIDTH)
    # LFM2's output norm has this name (llama-arch.cpp: "fix for wrong tensor name").
    t.ones("token_embd_norm.weight", _WIDTH)
    return len(kv_per_layer)


def _qwen35(w: Any, t: _Tensors) -> int:
    """src/models/qwen35.cpp: block ``i`` is full attention where ``(i + 1) %
    full_attention_interval == 0``, Gated DeltaNet otherwise."""
    n_layer, interval, n_head, n_head_kv, head_dim, n_rot = 4, 2, 4, 2, 32, 8
    d_conv, d_state, n_k_heads, n_v_heads = 4, 16, 2, 4
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    w.add_feed_forward_length(_FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    # Partial IMRoPE as in Qwen3.5 (a quarter of the head), its sections summing to n_rot/2.
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections([2, 1, 1, 0])  # required: load_arch_hparams reads 4
    w.add_rope_freq_base(10_000_000.0)
    w.add_full_attention_interval(interval)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)  # the graph takes head_v_dim = inner / time_step_rank
    w.add_ssm_state_size(d_state)
    w.add_ssm_group_count(n_k_heads)
    w.add_ssm_time_step_rank(n_v_heads)
    for il in range(n_layer):
        p = f"blk.{il}"
        t.ones(f"{p}.attn_norm.weight", _WIDTH)
        t.ones(f"{p}.post_attention_norm.weight", _WIDTH)
        _ffn(t, il)
        if (il + 1) % interval == 0:
            t.rand(f"{p}.attn_q.weight", _WIDTH, 2 * head_dim * n_head)  # query and gate
            t.rand(f"{p}.attn_k.weight", _WIDTH, head_dim * n_head_kv)
            t.rand(f"{p}.attn_v.weight", _WIDTH, head_dim * n_head_kv)
            t.rand(f"{p}.attn_output.weight", head_dim * n_head, _WIDTH)
            t.ones(f"{p}.attn_q_norm.weight", head_dim)
            t.ones(f"{p}.attn_k_norm.weight", head_dim)
        else:
            # Optional in load_tensors (a fused file may lack them) but read by the graph.
            t.rand(f"{p}.attn_qkv.weight", _WIDTH, 2 * key_dim + value_dim)
            t.rand(f"{p}.attn_gate.weight", _WIDTH, value_dim)
            t.rand(f"{p}.ssm_conv1d.weight", d_conv, 2 * key_dim + value_dim)
            t.rand(f"{p}.ssm_dt.bias", n_v_heads)
            t.negative(f"{p}.ssm_a", n_v_heads)
            t.rand(f"{p}.ssm_beta.weight", _WIDTH, n_v_heads)
            t.rand(f"{p}.ssm_alpha.weight", _WIDTH, n_v_heads)
            t.ones(f"{p}.ssm_norm.weight", d_state)
            t.rand(f"{p}.ssm_out.weight", value_dim, _WIDTH)
    return n_layer


_BLOCKS: dict[str, Callable[[Any, _Tensors], int]] = {
    "mamba2": _mamba2,
    "lfm2": _lfm2,
    "qwen35": _qwen35,
}


def _build(arch: str, out: Path) -> None:
    import gguf
    import numpy as np

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(_CTX)
    writer.add_embedding_length(_WIDTH)
    writer.add_layer_norm_rms_eps(_EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = add_byte_vocab(writer)
    tensors = _Tensors(np.random.default_rng(_SEED))
    # No output.weight: llama.cpp ties the head to the embedding when it is missing.
    tensors.rand("token_embd.weight", _WIDTH, n_vocab)
    if arch != "lfm2":
        tensors.ones("output_norm.weight", _WIDTH)
    writer.add_block_count(_BLOCKS[arch](writer, tensors))
    write_model(writer, tensors, tmp, out)
