"""A tiny llama model whose vocabulary is the 256 bytes, built with ``gguf``.

For tests where a real llama-server must write given text exactly (a literal grammar)
and the model's own choices do not matter: one block of width 64, random weights
(seeded), an SPM vocabulary of ``<unk>``, ``<s>``, ``</s>`` and the byte tokens, so any
UTF-8 text is written byte by byte. Grammar sampling over 259 tokens and a forward pass
of a 64-wide block cost microseconds, where the default model's 262k-token vocabulary
makes every constrained token cost about 50 ms.

Built once per checkout into ``.cache/test-models/`` (well under a second), atomically
and under a lock (``tests/draft_model``'s), so parallel runs build it once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BYTE_MODEL = ROOT / ".cache" / "test-models" / "byte-llama-v1.gguf"
_WIDTH, _FF, _HEADS, _CTX = 64, 128, 4, 16384
_BYTE_TYPE, _CONTROL_TYPE, _UNKNOWN_TYPE = 6, 3, 2  # llama.cpp's llama_token_type


def byte_model_path() -> Path:
    """The byte-vocabulary model, built if missing."""
    from tests.draft_model import _locked

    with _locked(BYTE_MODEL.with_name(f".{BYTE_MODEL.name}.lock")):
        if not BYTE_MODEL.exists():
            _build(BYTE_MODEL)
    return BYTE_MODEL


def _build(out: Path) -> None:
    import gguf
    import numpy as np

    rng = np.random.default_rng(42)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("byte-llama")
    writer.add_block_count(1)
    writer.add_context_length(_CTX)
    writer.add_embedding_length(_WIDTH)
    writer.add_feed_forward_length(_FF)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_HEADS)
    writer.add_rope_dimension_count(_WIDTH // _HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n = add_byte_vocab(writer)

    def weight(*shape: int) -> Any:
        return rng.standard_normal(shape).astype(np.float32) * 0.1

    tensors = {
        "token_embd.weight": weight(n, _WIDTH),
        "output_norm.weight": np.ones(_WIDTH, np.float32),
        "output.weight": weight(n, _WIDTH),
        "blk.0.attn_norm.weight": np.ones(_WIDTH, np.float32),
        "blk.0.attn_q.weight": weight(_WIDTH, _WIDTH),
        "blk.0.attn_k.weight": weight(_WIDTH, _WIDTH),
        "blk.0.attn_v.weight": weight(_WIDTH, _WIDTH),
        "blk.0.attn_output.weight": weight(_WIDTH, _WIDTH),
        "blk.0.ffn_norm.weight": np.ones(_WIDTH, np.float32),
        "blk.0.ffn_gate.weight": weight(_FF, _WIDTH),
        "blk.0.ffn_up.weight": weight(_FF, _WIDTH),
        "blk.0.ffn_down.weight": weight(_WIDTH, _FF),
    }
    write_model(writer, tensors, tmp, out)


def add_byte_vocab(writer: Any) -> int:
    """The byte vocabulary (SPM: ``<unk>``, ``<s>``, ``</s>``, then the 256 byte tokens;
    no space prefix) into ``writer``; returns its size. Shared with ``tests/arch_models``:
    a change here wants both files' names (their versions) bumped."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([_UNKNOWN_TYPE, _CONTROL_TYPE, _CONTROL_TYPE] + [_BYTE_TYPE] * 256)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    return len(tokens)


def write_model(writer: Any, tensors: Mapping[str, Any], tmp: Path, out: Path) -> None:
    """Add ``tensors``, write ``writer``'s file (at ``tmp``) and move it to ``out``."""
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
