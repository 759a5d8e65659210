"""Model tier: the real default model (gemma 3 270m) in-process, on the engine or
behind the window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from tests.fakes.window import WindowFactory, window_factory
from tests.tiers import mark_tier


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.model)


@pytest.fixture()
def make_window(qtbot: QtBot, tmp_path: Path) -> Iterator[WindowFactory]:
    """Makes windows on fake engines (``tests.fakes.window.fake_window``); closes them after."""
    yield from window_factory(qtbot, tmp_path)
