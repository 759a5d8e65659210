"""A loaded model's vocabulary: token ids to the bytes and text they stand for."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from app.engine.native.handles import Native


class Vocab:
    """Token text for one ``llama_cpp.Llama``, through a reused piece buffer."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self._vocab = Native(llm).vocab
        self._buf = ctypes.create_string_buffer(256)
        self._longest: int | None = None

    def longest_token(self) -> int:
        """The most bytes of prompt text one token can stand for; 0 when no such bound
        holds. Found once per model (0.2 s for 262k tokens), when first asked.

        Every token llama.cpp makes of text stands for its own text in the vocabulary, or
        for less of the input: SentencePiece (``SPM``) turns each space into "▁" (3 bytes)
        and a byte with no token into "<0xNN>" (6); byte-level BPE (``gpt2``) writes each
        input byte as a character of 1 or 2 bytes. So a text of n UTF-8 bytes needs at
        least n / (this) tokens. The other tokenizers (WordPiece, Unigram, BPE variants)
        fold whitespace, change case or make one unknown token of a whole word, and a
        special token that strips the spaces beside it (``LSTRIP``/``RSTRIP``, phi-3)
        swallows any number of them: for those, 0.
        """
        if self._longest is None:
            self._longest = self._find_longest()
        return self._longest

    def _find_longest(self) -> int:
        import llama_cpp

        kind = llama_cpp.llama_vocab_type(self._vocab)
        model = self._llm.metadata.get("tokenizer.ggml.model", "")
        if kind != llama_cpp.LLAMA_VOCAB_TYPE_SPM and (
            kind != llama_cpp.LLAMA_VOCAB_TYPE_BPE or model != "gpt2"
        ):
            return 0
        strips = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
        longest = 1
        for token in range(llama_cpp.llama_vocab_n_tokens(self._vocab)):
            if llama_cpp.llama_vocab_get_attr(self._vocab, token) & strips:
                return 0
            longest = max(longest, len(llama_cpp.llama_vocab_get_text(self._vocab, token)))
        return longest

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
        ids = self._llm.tokenize(text.encode("utf-8", "replace"), add_bos=False, special=True)
        return len(ids) == 1

    def control_token(self, text: str) -> int | None:
        """The id of the token ``text`` names when it is one that detokenizes to nothing.

        Such tokens (``<start_of_turn>``, ``<|im_start|>``, ...) never reach the
        reply's text, so a stop string made of one must be caught by its id.
        """
        if not text:
            return None
        ids = self._llm.tokenize(text.encode("utf-8", "replace"), add_bos=False, special=True)
        if len(ids) != 1 or self.piece(ids[0]) or self.text(ids[0]) != text:
            return None
        return int(ids[0])

    def stop_tokens(self, stops: Iterable[str]) -> frozenset[int]:
        """The ids of the stop strings that are each one token with no text."""
        ids = (self.control_token(s) for s in stops)
        return frozenset(i for i in ids if i is not None)
