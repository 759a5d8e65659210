"""A project's pinned files checked against their stamps, and entries read again put in
place (issue 44): order and numbers kept, only a text change counts as a change."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from app.chat.project_pins import refreshed, stale
from app.chat.projects import Project


def entry(path: Path, text: str, n: int) -> dict[str, Any]:
    st = path.stat()
    return {
        "n": n,
        "path": str(path),
        "name": path.name,
        "text": text,
        "stamp": [st.st_size, st.st_mtime_ns],
    }


def test_stale_names_changed_and_gone_files(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in ("a.md", "b.md", "c.md"))
    for p in (a, b, c):
        p.write_text("one", encoding="utf-8")
    project = Project(pinned=[entry(a, "one", 1), entry(b, "one", 2), entry(c, "one", 3)])
    assert stale(project) == ([], [])
    os.utime(b, ns=(1, 5_000_000_000))
    c.unlink()
    assert stale(project) == ([b], [c])


def test_refreshed_keeps_order_and_numbers(tmp_path: Path) -> None:
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    for p in (a, b):
        p.write_text("one", encoding="utf-8")
    project = Project(pinned=[entry(a, "one", 1), entry(b, "two", 2)])
    touched = {**entry(b, "two", 1), "stamp": [3, 4]}
    assert not refreshed(project, [touched])  # only the stamp: the same opening
    assert [e["n"] for e in project.pinned] == [1, 2] and project.pinned[1]["stamp"] == [3, 4]
    assert refreshed(project, [{**entry(a, "uno", 1)}])
    assert [(e["name"], e["text"]) for e in project.pinned] == [("a.md", "uno"), ("b.md", "two")]
