"""Model tier: the real default model (gemma 3 270m) in-process, on the engine or
behind the window."""

from __future__ import annotations

import pytest

from tests.tiers import mark_tier


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.model)
