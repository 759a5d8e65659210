"""Reading GGUF files: model headers, LoRA adapters, memory estimates."""
