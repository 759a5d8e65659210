"""What the app says about drafting, and where the draft model is recorded.

The claim: drafting gives the same reply as plain decoding up to floating-point
differences between batched and one-token evaluation (which can flip a greedy choice at
a near-tie); sampled replies keep the model's distribution exactly. The old claim that
prompt lookup "never changes what a greedy reply says" is false on the CPU build.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.chat.conversation import PATH_MAX, Conversation, Message
from app.chat.snapshot import (
    SnapshotError,
    SnapshotHeader,
    draft_record,
    read_header,
    read_snapshot,
    write_snapshot,
)
from app.config.setting_specs import SPEC_BY_NAME
from app.engine.backend import DraftInfo, KvState
from app.engine.metrics import MessageMetrics
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.openai.backend import OpenAIBackend
from app.util.errors import DraftError
from tests.hypothesis_budget import examples
from ui.common.draft_stats import draft_text, reply_footer, tokens_per_pass
from ui.settings.draft_control import COMBO_HELP

ROOT = Path(__file__).resolve().parents[2]
FALSE_CLAIM = re.compile(r"never\s+changes\s+what\s+a\s+greedy", re.IGNORECASE)


def _texts() -> dict[str, str]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    files += [*(ROOT / "ui").glob("*.py"), *(ROOT / "app").rglob("*.py")]
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def test_the_false_claim_is_gone_everywhere() -> None:
    found = [name for name, text in _texts().items() if FALSE_CLAIM.search(text)]
    assert found == []


@pytest.mark.parametrize("text", [SPEC_BY_NAME["speculative"].help, COMBO_HELP])
def test_the_help_says_what_is_and_is_not_identical(text: str) -> None:
    assert "distribution exactly" in text
    assert "floating-point" in text and "near-tie" in text


def test_readme_and_notes_make_the_same_claim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    notes = (ROOT / "docs" / "notes" / "speculative.md").read_text(encoding="utf-8")
    for text in (readme, notes):
        flat = " ".join(text.split())
        assert "distribution exactly" in flat
        assert "floating-point" in flat and "near-tie" in flat
    assert "docs/notes/speculative.md" in (ROOT / "docs" / "NOTES.md").read_text()


# -- the figures under a reply ---------------------------------------------------------


def test_tokens_per_pass_counts_one_pass_per_token_the_model_chose_itself() -> None:
    assert tokens_per_pass(MessageMetrics()) == 0.0
    assert tokens_per_pass(MessageMetrics(generated_tokens=10)) == 1.0
    m = MessageMetrics(generated_tokens=30, drafted_tokens=40, accepted_tokens=20)
    assert tokens_per_pass(m) == 3.0  # 10 passes, each kept 2 guesses and added 1
    # Counts that do not add up (a damaged transcript) still give a finite figure.
    assert tokens_per_pass(MessageMetrics(generated_tokens=3, accepted_tokens=9)) == 3.0


def test_the_footer_names_the_drafter_and_its_figures() -> None:
    m = MessageMetrics(
        generated_tokens=30,
        token_times_ms=[10.0, 20.0],
        drafted_tokens=40,
        accepted_tokens=20,
        draft_kind="model",
        draft_ms=84.6,
        seed=3,
    )
    footer = reply_footer(m)
    assert "draft model: 20/40 guesses kept (50%), 3.00 tokens per pass, draft 85 ms" in footer
    assert "drafts 50% accepted" not in footer and footer.endswith("seed 3")
    lookup = MessageMetrics(generated_tokens=5, draft_kind="lookup")
    assert draft_text(lookup).startswith("prompt lookup: nothing guessed")
    assert "prompt lookup" in reply_footer(lookup)
    assert draft_text(MessageMetrics(generated_tokens=5)) == ""


@settings(max_examples=examples(60), deadline=None)
@given(
    generated=st.integers(0, 10_000),
    drafted=st.integers(0, 10_000),
    accepted=st.integers(0, 10_000),
    kind=st.sampled_from(["", "lookup", "model", "x"]),
)
def test_figures_are_finite_for_any_counts(
    generated: int, drafted: int, accepted: int, kind: str
) -> None:
    m = MessageMetrics(
        generated_tokens=generated,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        draft_kind=kind,
    )
    value = tokens_per_pass(m)
    assert 0.0 <= value <= max(1, generated)
    assert isinstance(reply_footer(m), str)


# -- the draft in the conversation and the snapshot ------------------------------------


def test_the_conversation_keeps_its_draft_and_refuses_odd_values() -> None:
    conv = Conversation(draft_path="/models/tiny.gguf", messages=[Message("user", "hi")])
    again = Conversation.from_dict(conv.to_dict())
    assert again.draft_path == "/models/tiny.gguf"
    for bad in (3, None, ["a"], "a\0b", "x" * (PATH_MAX + 1)):
        data = {**conv.to_dict(), "draft_path": bad}
        assert Conversation.from_dict(data).draft_path == ""
    old = conv.to_dict()
    del old["draft_path"]  # a file from before this setting
    assert Conversation.from_dict(old).draft_path == ""


def _header(draft: dict[str, object]) -> SnapshotHeader:
    return SnapshotHeader(
        model={"sha256": "abc", "size": 1, "name": "m"},
        runtime={"llama_cpp_python": "0"},
        cache={"n_ctx": 2048},
        lora=[],
        draft=dict(draft),
    )


def test_the_snapshot_records_the_draft_and_restores_under_another(tmp_path: Path) -> None:
    info = DraftInfo(Path("/models/d.gguf"), "Draft", 100, 512)
    record = draft_record(info)
    assert record == {"name": "Draft", "path": "/models/d.gguf", "n_params": 100}
    assert draft_record(None) == {}
    path = tmp_path / "s.lpkv"
    kv = KvState(b"state", [1, 2, 3], "abc", [(3, 3)])
    write_snapshot(path, _header(record), kv)
    header, _, _ = read_header(path)
    assert header.draft == record
    # Another draft, or none, is no reason to refuse the cache.
    assert header.mismatch(_header({})) == ""
    assert read_snapshot(path, _header({"name": "Other", "path": "/x", "n_params": 5})).tokens == [
        1,
        2,
        3,
    ]


def test_a_snapshot_from_before_drafts_reads_and_a_damaged_draft_field_is_refused(
    tmp_path: Path,
) -> None:
    import json
    import struct

    path = tmp_path / "s.lpkv"
    write_snapshot(path, _header({}), KvState(b"st", [7], "a", []))
    blob = path.read_bytes()
    (n,) = struct.unpack("<I", blob[4:8])
    head = json.loads(blob[8 : 8 + n])

    def rewrite(h: dict[str, object]) -> None:
        raw = json.dumps(h).encode()
        path.write_bytes(blob[:4] + struct.pack("<I", len(raw)) + raw + blob[8 + n :])

    del head["draft"]
    rewrite(head)
    assert read_header(path)[0].draft == {}
    rewrite({**head, "draft": [1, 2]})
    with pytest.raises(SnapshotError, match="damaged header \\(draft\\)"):
        read_header(path)


# -- servers take no draft -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama-server", "openai"])
def test_servers_refuse_a_draft_with_their_reason(kind: str) -> None:
    conn = Connection(id="c1", name="s", kind=kind, url="http://127.0.0.1:9")
    backend = LlamaServerBackend(conn) if kind == "llama-server" else OpenAIBackend(conn)
    caps = backend.capabilities
    assert not caps.draft_model and "in-process engine only" in caps.why_not["draft_model"]
    assert backend.draft_info is None
    assert backend.set_draft(None) is None
    with pytest.raises(DraftError, match="Cannot use a draft model here"):
        backend.set_draft("/models/d.gguf")
