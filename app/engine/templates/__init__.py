"""Chat templates: a conversation rendered into prompt text.

Sandboxed Jinja within limits, and the thinking switch a request renders with.
"""
