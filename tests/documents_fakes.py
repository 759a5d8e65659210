"""Helpers for the document index tests: built documents and a deterministic embedding."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from app.documents.parse import Block, ParsedDocument

DIM = 64


def fake_embed(texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """A hashed bag of words as a unit vector: texts sharing words point alike."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
            out[i, h % DIM] += 1.0
        norm = float(np.linalg.norm(out[i]))
        out[i] = out[i] / norm if norm else out[i]
        if not norm:
            out[i, 0] = 1.0
    return out


def document(path: str, paragraphs: Sequence[str], page: int | None = None) -> ParsedDocument:
    """A document of ``paragraphs`` separated by blank lines, each a block at its line."""
    blocks = []
    line = 1
    for text in paragraphs:
        blocks.append(Block(text, page, line))
        line += text.count("\n") + 2
    return ParsedDocument(path, "text", path.rsplit("/", 1)[-1], tuple(blocks), None)
