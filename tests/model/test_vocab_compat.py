"""Draft/target vocabulary checks (``app/gguf/vocab_compat.py``) on real GGUF files.

Each refused variant is a loadable one-block draft of the default model with one
thing changed (``tests/draft_model.py``), so the refusal is the check's doing, not
a damaged file's.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.gguf.header import parse_header
from app.gguf.vocab_compat import draft_problem, vocab_signature
from tests.draft_model import read_gguf, vocab_variant
from tests.hypothesis_budget import examples


@pytest.fixture(scope="module")
def target_tokens(model_path: Path) -> list[str]:
    return list(read_gguf(model_path).fields["tokenizer.ggml.tokens"].contents())


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vocab-variants")


def _one_sentence(text: str) -> None:
    assert text and "\n" not in text and len(text) < 400, text
    assert text.endswith((".", "?")), text


def test_the_same_vocabulary_is_compatible(model_path: Path, draft_path: Path) -> None:
    assert draft_problem(model_path, draft_path) == ""
    assert draft_problem(draft_path, model_path) == ""
    assert draft_problem(model_path, model_path) == ""
    assert vocab_signature(model_path) == vocab_signature(draft_path)


def test_architecture_and_size_do_not_matter(model_path: Path, variants: Path) -> None:
    """A draft with another name, block count and context length drafts fine."""
    draft = vocab_variant(
        model_path,
        variants / "other-sizes.gguf",
        meta={"gemma3.context_length": 4096, "general.name": "Something else"},
    )
    assert draft_problem(model_path, draft) == ""


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "tokenizer",
            "The draft's tokenizer is byte-level BPE (gpt2); the model's is SentencePiece (llama).",
        ),
        ("size", "The draft's vocabulary has 32,000 tokens; the model's has 262,144."),
        (
            "token",
            "The draft's vocabulary differs from the model's at token 1,000 "
            "('put-draft-test' in the draft, 'put' in the model).",
        ),
        (
            "type",
            "The draft treats token 106 ('<end_of_turn>') as normal text; "
            "the model treats it as a control token.",
        ),
        (
            "eos",
            "The draft's end-of-sequence token is id 106 ('<end_of_turn>'); "
            "the model's is id 1 ('<eos>').",
        ),
        (
            "bos",
            "The draft's beginning-of-sequence token is id 999,999 (not in its vocabulary); "
            "the model's is id 2 ('<bos>').",
        ),
        (
            "eot",
            "The draft's end-of-turn token is id 106 ('<end_of_turn>'); the model's is not set.",
        ),
        ("pad", "The draft's padding token is not set; the model's is id 0 ('<pad>')."),
        (
            "unk",
            "The draft's unknown-text token is id 4 ('<mask>'); the model's is id 3 ('<unk>').",
        ),
        (
            "add_bos",
            "The draft does not add a beginning-of-sequence token to its input; the model does.",
        ),
        (
            "add_eos",
            "The draft adds an end-of-sequence token to its input; the model does not.",
        ),
    ],
)
def test_each_difference_is_named(
    model_path: Path, variants: Path, target_tokens: list[str], case: str, expected: str
) -> None:
    path = variants / f"{case}.gguf"
    cases: dict[str, dict[str, Any]] = {
        "tokenizer": {"meta": {"tokenizer.ggml.model": "gpt2"}},
        "size": {
            "meta": {
                "tokenizer.ggml.tokens": target_tokens[:32_000],
                "tokenizer.ggml.scores": [0.0] * 32_000,
                "tokenizer.ggml.token_type": [1] * 32_000,
            }
        },
        "token": {"tokens": {1000: "put-draft-test"}},
        "type": {"meta": {"tokenizer.ggml.token_type": _types(model_path, {106: 1})}},
        "eos": {"meta": {"tokenizer.ggml.eos_token_id": 106}},
        "bos": {"meta": {"tokenizer.ggml.bos_token_id": 999_999}},
        "eot": {"meta": {"tokenizer.ggml.eot_token_id": 106}},
        "pad": {"drop": ["tokenizer.ggml.padding_token_id"]},
        "unk": {"meta": {"tokenizer.ggml.unknown_token_id": 4}},
        "add_bos": {"meta": {"tokenizer.ggml.add_bos_token": False}},
        "add_eos": {"meta": {"tokenizer.ggml.add_eos_token": True}},
    }
    kw = cases[case]
    try:
        vocab_variant(model_path, path, **kw)
        start = time.perf_counter()
        problem = draft_problem(model_path, path)
        assert time.perf_counter() - start < 5
        assert problem == expected
        _one_sentence(problem)
    finally:
        path.unlink(missing_ok=True)


def _types(model_path: Path, changes: dict[int, int]) -> list[int]:
    types = list(read_gguf(model_path).fields["tokenizer.ggml.token_type"].contents())
    for index, value in changes.items():
        types[index] = value
    return types


def test_a_flag_unset_equals_false(model_path: Path, variants: Path) -> None:
    """llama.cpp reads a missing add_eos_token as false: no difference to report."""
    path = vocab_variant(
        model_path, variants / "no-add-eos.gguf", drop=["tokenizer.ggml.add_eos_token"]
    )
    try:
        assert draft_problem(model_path, path) == ""
    finally:
        path.unlink()


# ---------------------------------------------------------------------------------
# Damaged, truncated and hostile files: a sentence, never an exception


def test_unusable_drafts_are_named(model_path: Path, tmp_path: Path) -> None:
    cases: dict[str, Path] = {
        "missing": tmp_path / "missing.gguf",
        "directory": tmp_path,
        "empty": tmp_path / "empty.gguf",
        "text": tmp_path / "text.gguf",
        "garbage": tmp_path / "garbage.gguf",
    }
    cases["empty"].write_bytes(b"")
    cases["text"].write_text("not a model")
    cases["garbage"].write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(4096))
    if hasattr(os, "mkfifo"):
        cases["fifo"] = tmp_path / "fifo.gguf"
        os.mkfifo(cases["fifo"])
    for name, path in cases.items():
        problem = draft_problem(model_path, path)
        assert problem.startswith("The draft model cannot be used: "), (name, problem)
        _one_sentence(problem)
    # The model itself damaged: said the other way round.
    problem = draft_problem(cases["text"], model_path)
    assert problem.startswith("The model cannot be checked: "), problem


@pytest.fixture(scope="module")
def header_end(draft_path: Path) -> int:
    return parse_header(draft_path)[2]


@settings(max_examples=examples(30), deadline=None)
@given(fraction=st.floats(0.0, 1.0))
def test_truncated_drafts_are_refused(
    fraction: float,
    model_path: Path,
    draft_path: Path,
    header_end: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The first bytes of the draft, cut anywhere in or just past its 6.5 MB header."""
    n = int(fraction * (header_end + 4096))
    path = tmp_path_factory.mktemp("cut") / "draft.gguf"
    with draft_path.open("rb") as src:
        path.write_bytes(src.read(n))
    problem = draft_problem(model_path, path)
    assert problem.startswith("The draft model cannot be used: "), (n, problem)
    _one_sentence(problem)
    path.unlink()


@pytest.fixture(scope="module")
def mutable_draft(draft_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private copy of the draft, mutated in place and restored by each example."""
    path = tmp_path_factory.mktemp("mutable") / "draft.gguf"
    shutil.copyfile(draft_path, path)
    yield path
    path.unlink()


_OFFSETS = st.one_of(
    st.integers(0, 2048),  # magic, counts, the metadata scalars, special token ids
    st.integers(0, 6_600_000),  # anywhere in the header (mostly the token list)
    st.integers(6_480_000, 6_525_120),  # the tensor table
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edits=st.lists(st.tuples(_OFFSETS, st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_draft_headers_give_a_sentence(
    model_path: Path, mutable_draft: Path, header_end: int, edits: list[tuple[int, int]]
) -> None:
    edits = [(min(offset, header_end - 1), value) for offset, value in edits]
    with mutable_draft.open("r+b") as fh:
        saved = []
        for offset, value in edits:
            fh.seek(offset)
            saved.append((offset, fh.read(1)))
            fh.seek(offset)
            fh.write(bytes([value]))
    try:
        start = time.perf_counter()
        problem = draft_problem(model_path, mutable_draft)
        assert time.perf_counter() - start < 10, edits
        if problem:
            _one_sentence(problem)
            assert problem.startswith("The draft"), problem
            assert "unexpected" not in problem, (edits, problem)
    finally:
        with mutable_draft.open("r+b") as fh:
            for offset, old in reversed(saved):
                fh.seek(offset)
                fh.write(old)
