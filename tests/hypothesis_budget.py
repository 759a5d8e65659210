"""How many examples a Hypothesis test tries, from the profile the run chose.

Profiles (registered in ``tests/conftest.py``; pick one with ``--hypothesis-profile``):
``ci`` (the default: derandomized, the budgets as written), ``dev`` (a tenth, for a fast
loop) and ``deep`` (ten times as many, a fresh random search each run). A test states
its budget at the ``ci`` profile, ``examples(300)``, weighed by what one example costs.
"""

from __future__ import annotations

from hypothesis import settings

CI_EXAMPLES = 100  # the ``ci`` profile's max_examples: the scale budgets are written in


def examples(at_ci: int) -> int:
    """``at_ci`` scaled to the loaded profile (never below 3, so each test still runs)."""
    loaded = settings.default
    scale = (loaded.max_examples if loaded is not None else CI_EXAMPLES) / CI_EXAMPLES
    return max(3, round(at_ci * scale))
