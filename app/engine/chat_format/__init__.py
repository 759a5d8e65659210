"""The chat-format seam: llama.cpp's own chat layer (``common/chat.*``) for a template and a
request: the prompt, the grammar with its triggers, the stops, the preserved tokens, and
a parser that turns the streamed reply into content, reasoning and tool calls.

``native`` asks the chat-format worker (template code runs only there) and ``reply``
parses in-process. Without the shim (a plain wheel) ``native.available()`` is False and
the Python formats in ``templates``, ``reasoning`` and ``tools`` are used.
"""
