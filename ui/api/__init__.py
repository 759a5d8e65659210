"""The local OpenAI-compatible API server."""
