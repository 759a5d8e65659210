"""A loaded model's vocabulary: token ids to the bytes and text they stand for."""

from __future__ import annotations

import ctypes
from typing import Any


class Vocab:
    """Token text for one ``llama_cpp.Llama``, through a reused piece buffer."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self._vocab = llm._model.vocab
        self._buf = ctypes.create_string_buffer(256)

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes ``token`` stands for (part of a UTF-8 character, possibly)."""
        import llama_cpp

        n = llama_cpp.llama_token_to_piece(
            self._vocab, token, self._buf, len(self._buf), 0, special
        )
        if n < 0:
            self._buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(
                self._vocab, token, self._buf, len(self._buf), 0, special
            )
        return self._buf.raw[:n]

    def text(self, token: int) -> str:
        """A special token's text ("" for a missing one, whose id is negative)."""
        if token < 0:
            return ""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def is_special(self, text: str) -> bool:
        """Whether ``text`` is one special token of this vocabulary."""
        ids = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return len(ids) == 1
