"""Tokens estimated from characters, where the model's tokenizer cannot be asked.

Three characters a token, below English's ~4 with these tokenizers, so an estimate errs
towards less room. The send-time composer uses it for text, the document library for
a document's size before it is read.
"""

from __future__ import annotations

CHARS_PER_TOKEN = 3


def estimate_tokens(text: str) -> int:
    """About ``CHARS_PER_TOKEN`` characters a token."""
    return len(text) // CHARS_PER_TOKEN
