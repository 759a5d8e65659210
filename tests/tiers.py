"""The test tiers (``tests/unit``, ``tests/gui``, ``tests/model``, ``tests/e2e``): each
tier's conftest marks its tests, and the two fast tiers refuse the real model.

Run one tier by folder (``pytest tests/unit tests/gui``, the fast loop) or by marker
(``-m "unit or gui"``); the README's test command runs them all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MODEL_FIXTURES = frozenset(
    {"model_path", "loaded_engine", "engine", "one_engine", "draft_path", "llama_server"}
)
FAST_TIERS = frozenset({"unit", "gui"})


def mark_tier(items: list[pytest.Item], conftest: str, mark: pytest.MarkDecorator) -> None:
    """Mark the items under ``conftest``'s folder; a fast-tier test asking for the model
    is a collection error that says where it belongs."""
    folder = Path(conftest).resolve().parent
    for item in items:
        if folder not in item.path.resolve().parents:
            continue
        item.add_marker(mark)
        wanted = MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if mark.name in FAST_TIERS and wanted:
            raise pytest.UsageError(
                f"{item.nodeid} uses {sorted(wanted)}: the {mark.name} tier runs no model;"
                " move it to tests/model (or tests/e2e)"
            )


def refuse_model(monkeypatch: pytest.MonkeyPatch, tier: str) -> None:
    """Make loading a real model fail loudly for the rest of one fast-tier test."""
    import llama_cpp

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(
            f"the {tier} tier runs no model: move this test to tests/model (or tests/e2e)"
        )

    monkeypatch.setattr(llama_cpp.Llama, "__init__", refused)
