"""The error a chat template raises; its own module so the sandbox and the templates
that use it both import it without importing each other."""

from __future__ import annotations

from app.util.errors import LamplightError


class ChatTemplateError(LamplightError, ValueError):
    """A chat template failed: it does not compile, broke a limit, or raised.

    A ``ValueError`` too, for callers that caught the template's errors as one.
    """


class TemplateLimitError(ChatTemplateError):
    """A template broke a limit (time, size, depth, memory): hostile, or broken beyond use.
    Such a template is never handed to an engine without limits (llama.cpp's Jinja)."""
