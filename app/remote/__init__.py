"""Engines on other machines: llama-server and OpenAI-compatible servers as ``Backend``s."""
