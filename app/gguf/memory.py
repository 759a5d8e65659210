"""How much memory a GGUF model needs: the one RAM estimate the app uses."""

from __future__ import annotations

from app.gguf.info import GgufInfo


def estimate_ram(info: GgufInfo, n_ctx: int, kv_bytes_per_element: float = 2.0) -> int:
    """Weights, the KV cache at ``n_ctx`` and llama.cpp's compute buffers, in bytes."""
    kv = 0
    if info.n_layers and info.n_embd_k_gqa and info.n_embd_v_gqa:
        kv = int(
            info.n_layers * n_ctx * (info.n_embd_k_gqa + info.n_embd_v_gqa) * kv_bytes_per_element
        )
    # Compute buffers: the output logits row set and activations, measured at roughly
    # vocab x 4 bytes x 64 plus 64 MB here; small next to weights for large models.
    compute = (info.n_vocab or 32_000) * 4 * 64 + 64 * 1024 * 1024
    return info.file_size + kv + compute
