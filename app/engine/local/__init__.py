"""llama.cpp in-process: the loaded model, its KV cache, decoding, vision, LoRA, embeddings."""
