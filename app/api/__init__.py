"""Lamplight's local OpenAI-compatible HTTP API (issue 17).

The HTTP side never touches an engine: it reaches the one engine worker only through
``gateway.EngineGateway``. Starlette and uvicorn are imported only when a server starts.
"""
