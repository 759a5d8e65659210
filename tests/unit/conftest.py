"""Unit tier: app/ code alone. No Qt, no model; a child process of our own (a document
reader, an MCP server) is fine."""

from __future__ import annotations

import pytest

from tests.tiers import mark_tier, refuse_model


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.unit)


@pytest.fixture(autouse=True)
def _no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_model(monkeypatch, "unit")
