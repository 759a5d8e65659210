"""llama.cpp's corpus replies on the real tokenizer path (issue 42): each sample reply is
tokenized as its family's model writes it (every marker one token of the marked
vocabulary, ``tests/marked_model.py``), turned back into text token by token the way the
engine does (the format's preserved tokens as their text: they are control tokens, which
llama.cpp writes as nothing unless asked), and read by the seam after every token.

A marker the format does not list as preserved is written as its text: in its family's
vocabulary it is an ordinary added token (DeepSeek R1's ``<｜tool▁sep｜>``), which llama.cpp
always writes out, as llama-server's parser relies on."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

import pytest

from app.engine.chat_format.formatted import FormattedChat
from app.engine.chat_format.native import NativeFormatter
from app.engine.local.vocab import Vocab
from app.engine.native.chat_shim import ChatShim, library_path, load_shim
from app.engine.native.chat_worker import ChatWorker
from tests import llama_chat
from tests.marked_model import marked_model_path, markers
from tests.native import llama

CASES = llama_chat.parse_cases()


@pytest.fixture(scope="module")
def marked() -> Iterator[Any]:
    llm = llama(marked_model_path(), vocab_only=True, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def formatters() -> Iterator[tuple[dict[str, NativeFormatter], ChatShim, ChatWorker]]:
    shim = load_shim(llama_chat.shim_path())
    assert shim is not None
    worker = ChatWorker(lib=llama_chat.shim_path() or library_path())
    yield {}, shim, worker
    worker.close()


def _one(llm: Any, text: str) -> int | None:
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    return int(ids[0]) if len(ids) == 1 else None


def written(llm: Any, text: str, controls: tuple[str, ...]) -> list[int]:
    """``text`` as the model writes it: each of ``controls`` one token, the rest plain."""
    ids: list[int] = []
    pos = 0
    if controls:
        alternatives = "|".join(re.escape(m) for m in sorted(controls, key=len, reverse=True))
        for m in re.finditer(alternatives, text):
            ids += llm.tokenize(text[pos : m.start()].encode(), add_bos=False, special=False)
            marker = _one(llm, m.group())
            assert marker is not None, m.group()
            ids.append(marker)
            pos = m.end()
    ids += llm.tokenize(text[pos:].encode(), add_bos=False, special=False)
    return ids


def read_by_token(
    fmt: NativeFormatter, formatted: FormattedChat, pieces: list[bytes], cut: bool
) -> tuple[dict[str, Any], str]:
    """The reply read after every token, as the engine reads it; and its text."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    parser = fmt.parser(formatted)
    text = ""
    try:
        for piece in pieces[:-1]:
            text += decoder.decode(piece)
            parser.update(text)
        text += decoder.decode(pieces[-1] if pieces else b"", final=True)
        got = parser.finish(text, cut=cut)
    finally:
        parser.close()
    return llama_chat.message(got), text


@pytest.mark.parametrize("case", CASES, ids=[llama_chat.case_id(c, i) for i, c in enumerate(CASES)])
def test_each_case_read_token_by_token_with_markers_as_control_tokens(
    case: dict[str, Any], marked: Any, formatters: Any
) -> None:
    cache, shim, worker = formatters
    fmt = llama_chat.formatter(cache, case["template"], shim, worker)
    formatted = fmt.apply(llama_chat.request(case))
    # The ids the engine writes as text: the format's preserved tokens.
    special = {i for i in (_one(marked, t) for t in formatted.preserved_tokens) if i is not None}
    added = {_one(marked, m) for m in markers() if m not in formatted.preserved_tokens}
    vocab = Vocab(marked)
    tokens = written(marked, case["input"], markers())
    pieces = [vocab.piece(t, t in special or t in added) for t in tokens]
    got, text = read_by_token(fmt, formatted, pieces, case["is_partial"])
    assert text == case["input"]  # every marker reached the parser as its text
    assert llama_chat.comparable(got) == llama_chat.comparable(case["expect"])


def test_a_control_marker_is_text_only_when_preserved(marked: Any) -> None:
    """Why the engine asks for the format's preserved tokens: llama.cpp writes no text
    for a control token unless asked, so the parser would never see ``[TOOL_CALLS]``."""
    vocab = Vocab(marked)
    for marker in ("[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "<|START_THINKING|>"):
        token = _one(marked, marker)
        assert token is not None
        assert vocab.piece(token) == b""
        assert vocab.piece(token, True) == marker.encode()
