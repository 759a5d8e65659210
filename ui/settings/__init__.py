"""Sampling, presets, template, LoRA and draft settings."""
