"""A tiny random-weight ``qwen35`` model with one next-token (MTP, "NextN") block, built
with ``gguf`` for the tests and ``bench/hybrid.py`` (issue 43).

The trunk is ``tests/arch_models``' qwen35 (Gated DeltaNet and gated attention blocks,
width 64, the byte vocabulary). ``block_count`` counts the NextN block too, and
``qwen35.nextn_predict_layers`` = 1 marks it: ``blk.4`` is a full-attention block plus
``nextn.eh_proj`` {2*n_embd, n_embd}, ``nextn.enorm`` and ``nextn.hnorm`` {n_embd} and
``nextn.shared_head_norm`` (``src/models/qwen35.cpp``: ``load_block_mtp``, ``graph_mtp``);
the head and the embedding fall back to the trunk's.

Random next-token layers guess at chance (1 in 259), which tests the rollback and
nothing else; so the head is "aligned": the residual branches are scaled down and
``eh_proj`` is near ``[I | 0]``, so the NextN block mostly predicts what the trunk
would from the same token, and guesses are kept about a third of the time, some
rounds wholly, some in part, some not at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.byte_model import add_byte_vocab, write_model

MODEL_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "test-models"

BUILDER_VERSION = 1
_W, _FF, _CTX, _EPS, _SEED, _STD = 64, 128, 8192, 1e-5, 1234, 0.1
_N_LAYER, _INTERVAL, _N_HEAD, _N_HEAD_KV, _HEAD_DIM, _N_ROT = 4, 2, 4, 2, 32, 8
_D_CONV, _D_STATE, _N_K, _N_V = 4, 16, 2, 4
_KEY_DIM, _VALUE_DIM = _D_STATE * _N_K, _D_STATE * _N_V
_SCALE = 0.05  # the residual branches' output scale: the token's own embedding dominates


def mtp_model_path() -> Path:
    """The tiny qwen35 model with a NextN block, built if missing."""
    from tests.draft_model import _locked

    out = MODEL_CACHE / f"qwen35-mtp-v{BUILDER_VERSION}.gguf"
    with _locked(out.with_name(f".{out.name}.lock")):
        if not out.exists():
            _build(out)
    return out


class _Tensors(dict[str, Any]):
    """Tensors in llama.cpp's shape order (``ne``); numpy's is the reverse."""

    def __init__(self, rng: Any) -> None:
        super().__init__()
        self.rng = rng

    def rand(self, name: str, *ne: int, scale: float = 1.0) -> None:
        import numpy as np

        self[name] = (self.rng.standard_normal(ne[::-1]) * _STD * scale).astype(np.float32)

    def ones(self, name: str, *ne: int) -> None:
        import numpy as np

        self[name] = np.ones(ne[::-1], np.float32)


def _common(t: _Tensors, p: str) -> None:
    t.ones(f"{p}.attn_norm.weight", _W)
    t.ones(f"{p}.post_attention_norm.weight", _W)
    t.rand(f"{p}.ffn_gate.weight", _W, _FF)
    t.rand(f"{p}.ffn_up.weight", _W, _FF)
    t.rand(f"{p}.ffn_down.weight", _FF, _W, scale=_SCALE)


def _attention(t: _Tensors, p: str) -> None:
    t.rand(f"{p}.attn_q.weight", _W, 2 * _HEAD_DIM * _N_HEAD)  # query and gate
    t.rand(f"{p}.attn_k.weight", _W, _HEAD_DIM * _N_HEAD_KV)
    t.rand(f"{p}.attn_v.weight", _W, _HEAD_DIM * _N_HEAD_KV)
    t.rand(f"{p}.attn_output.weight", _HEAD_DIM * _N_HEAD, _W, scale=_SCALE)
    t.ones(f"{p}.attn_q_norm.weight", _HEAD_DIM)
    t.ones(f"{p}.attn_k_norm.weight", _HEAD_DIM)


def _delta_net(t: _Tensors, p: str) -> None:
    import numpy as np

    t.rand(f"{p}.attn_qkv.weight", _W, 2 * _KEY_DIM + _VALUE_DIM)
    t.rand(f"{p}.attn_gate.weight", _W, _VALUE_DIM)
    t.rand(f"{p}.ssm_conv1d.weight", _D_CONV, 2 * _KEY_DIM + _VALUE_DIM)
    t.rand(f"{p}.ssm_dt.bias", _N_V)
    t[f"{p}.ssm_a"] = -np.abs(t.rng.standard_normal(_N_V) * _STD).astype(np.float32)
    t.rand(f"{p}.ssm_beta.weight", _W, _N_V)
    t.rand(f"{p}.ssm_alpha.weight", _W, _N_V)
    t.ones(f"{p}.ssm_norm.weight", _D_STATE)
    t.rand(f"{p}.ssm_out.weight", _VALUE_DIM, _W, scale=_SCALE)


def _build(out: Path) -> None:
    import gguf
    import numpy as np

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen35")
    w.add_name("tiny-qwen35-mtp")
    w.add_context_length(_CTX)
    w.add_embedding_length(_W)
    w.add_layer_norm_rms_eps(_EPS)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = add_byte_vocab(w)
    w.add_feed_forward_length(_FF)
    w.add_head_count(_N_HEAD)
    w.add_head_count_kv(_N_HEAD_KV)
    w.add_key_length(_HEAD_DIM)
    w.add_value_length(_HEAD_DIM)
    w.add_rope_dimension_count(_N_ROT)
    w.add_rope_dimension_sections([2, 1, 1, 0])
    w.add_rope_freq_base(10_000_000.0)
    w.add_full_attention_interval(_INTERVAL)
    w.add_ssm_conv_kernel(_D_CONV)
    w.add_ssm_inner_size(_VALUE_DIM)
    w.add_ssm_state_size(_D_STATE)
    w.add_ssm_group_count(_N_K)
    w.add_ssm_time_step_rank(_N_V)
    w.add_block_count(_N_LAYER + 1)  # the NextN block counts
    w.add_nextn_predict_layers(1)
    t = _Tensors(np.random.default_rng(_SEED))
    t.rand("token_embd.weight", _W, n_vocab)
    t.ones("output_norm.weight", _W)
    # An untied head: the next token is then not simply the current one's neighbour.
    t.rand("output.weight", _W, n_vocab, scale=10.0)
    for il in range(_N_LAYER):
        _common(t, f"blk.{il}")
        (_attention if (il + 1) % _INTERVAL == 0 else _delta_net)(t, f"blk.{il}")
    p = f"blk.{_N_LAYER}"
    _common(t, p)
    _attention(t, p)
    eh = np.zeros((_W, 2 * _W), np.float32)  # y = eh @ concat(enorm(embedding), hnorm(h))
    eh[:, :_W] = np.eye(_W, dtype=np.float32)
    t[f"{p}.nextn.eh_proj.weight"] = eh + t.rng.standard_normal((_W, 2 * _W)).astype(
        np.float32
    ) * np.float32(0.015)
    for norm in ("enorm", "hnorm", "shared_head_norm"):
        t.ones(f"{p}.nextn.{norm}.weight", _W)
    write_model(w, t, tmp, out)
