"""Settings, their declarations and validation, presets, data directories."""
