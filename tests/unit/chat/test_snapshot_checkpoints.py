"""A recurrent state's checkpoints in a snapshot file (issue 43): written as a fifth
payload part indexed by the header, read back as they were; a damaged or hostile index
is refused with a message; files without them read as before."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.chat.snapshot import SnapshotError, SnapshotHeader, read_snapshot, write_snapshot
from app.engine.backend import KvState

HEADER = SnapshotHeader(
    model={"name": "m.gguf", "size": 1, "sha256": "00" * 32},
    runtime={"llama_cpp_python": "x"},
    cache={"n_ctx": 64},
    lora=[],
)
SAVED = ((3, b"abc"), (7, b"defgh"))


def kv(checkpoints: tuple[tuple[int, bytes], ...] = SAVED) -> KvState:
    return KvState(b"state", list(range(10)), "0123456789", [(0, 0)], checkpoints)


def rewrite_header(path: Path, change: Any) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<I", raw[4:8])
    head = json.loads(raw[8 : 8 + n])
    change(head)
    new = json.dumps(head).encode()
    path.write_bytes(raw[:4] + struct.pack("<I", len(new)) + new + raw[8 + n :])


def test_checkpoints_come_back_as_they_were_saved(tmp_path: Path) -> None:
    path = tmp_path / "c.lpkv"
    write_snapshot(path, HEADER, kv())
    got = read_snapshot(path, HEADER)
    assert got.checkpoints == SAVED and got.tokens == list(range(10))
    write_snapshot(path, HEADER, kv(()))  # an attention model's: four parts, as before
    assert read_snapshot(path, HEADER).checkpoints == ()


@pytest.mark.parametrize(
    "index",
    [
        [[3, 3], [7, 4]],  # lengths not adding up to the part
        [[7, 5], [3, 3]],  # not in token order
        [[3, 3], [3, 5]],  # one count twice
        [[0, 3], [7, 5]],  # before the first token
        [[3, 3], [11, 5]],  # past the tokens
        [[3, 8], [7, 0]],  # an empty one
        [[3, "3"], [7, 5]],
        [],
        None,
        [[3, 3, 1], [7, 4]],
    ],
)
def test_a_damaged_index_is_refused_with_a_message(tmp_path: Path, index: Any) -> None:
    path = tmp_path / "c.lpkv"
    write_snapshot(path, HEADER, kv())

    def damage(head: dict[str, Any]) -> None:
        head["checkpoints"] = index

    rewrite_header(path, damage)
    with pytest.raises(SnapshotError, match="checkpoints"):
        read_snapshot(path, HEADER)


@given(st.recursive(st.integers(-5, 20) | st.text(max_size=3) | st.none(), st.lists, max_leaves=8))
def test_any_index_is_read_or_refused_never_crashes(tmp_path_factory: Any, index: Any) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "c.lpkv"
    write_snapshot(path, HEADER, kv())

    def damage(head: dict[str, Any]) -> None:
        head["checkpoints"] = index

    rewrite_header(path, damage)
    try:
        got = read_snapshot(path, HEADER)
    except SnapshotError:
        return
    assert sum(len(d) for _n, d in got.checkpoints) == 8
