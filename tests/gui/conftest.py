"""GUI tier: the window and its widgets (offscreen Qt) on a fake engine; no model."""

from __future__ import annotations

import pytest

from tests.fake_documents import FakeEmbedder, FakeLibrary
from tests.tiers import mark_tier, refuse_model
from ui.window import send_flow


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.gui)


@pytest.fixture(autouse=True)
def _no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_model(monkeypatch, "gui")


@pytest.fixture(autouse=True)
def _fake_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window's documents go to a stand-in library (a test may put its own)."""
    monkeypatch.setattr(send_flow, "make_documents", lambda _root: (FakeEmbedder(), FakeLibrary()))
