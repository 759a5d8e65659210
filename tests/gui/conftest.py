"""GUI tier: the window and its widgets (offscreen Qt) on a fake engine; no model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.fakes.documents import FakeEmbedder, FakeLibrary
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory, window_factory
from tests.tiers import mark_tier, refuse_model
from ui.window import send_flow
from ui.window.main_window import MainWindow


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.gui)


@pytest.fixture(autouse=True)
def _no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_model(monkeypatch, "gui")


@pytest.fixture(autouse=True)
def _fake_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """A window's documents go to a stand-in library (a test may put its own)."""
    monkeypatch.setattr(send_flow, "make_documents", lambda _root: (FakeEmbedder(), FakeLibrary()))


@pytest.fixture()
def make_window(qtbot: QtBot, tmp_path: Path) -> Iterator[WindowFactory]:
    """Makes windows on fake engines (``tests.fakes.window.fake_window``); closes them after."""
    yield from window_factory(qtbot, tmp_path)


@pytest.fixture()
def fake() -> FakeEngine:
    """The engine of ``window`` (a module may put its own)."""
    return FakeEngine()


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> MainWindow:
    """A shown window with a stand-in model loaded by ``fake``."""
    return make_window(fake)
