"""End-to-end tier: other processes: `lamplight serve`, a real llama-server, the app
started as a process, the frozen bundle."""

from __future__ import annotations

import pytest

from tests.tiers import mark_tier


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, __file__, pytest.mark.e2e)
