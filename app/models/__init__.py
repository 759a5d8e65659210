"""Getting models: Hub search, downloads, the local library, the default model."""
