"""Tool calls in the in-process engine.

Each family's format, the parser, the grammar, and their binding to one request.
"""
