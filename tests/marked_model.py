"""The default model with the chat markers of llama.cpp's corpus as control tokens
(issue 42): ``[TOOL_CALLS]``, DeepSeek's ``<｜tool▁calls▁begin｜>``, Cohere's
``<|START_THINKING|>``... Real models of those families have them as control tokens,
which llama.cpp leaves out of a piece unless asked (``special``); gemma's vocabulary has
none of them, so without this model a marker would be text made of ordinary tokens and
the control-token path would go untested.

Every block and tensor is gemma's (``draft_model.build_draft`` with ``added``): the model
generates as gemma does, and a grammar can make it write a marker as one token.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from tests import llama_chat
from tests.draft_model import MODEL_CACHE, cached_draft

GEMMA_BLOCKS = 18  # gemma 3 270m: every block is kept
GEMMA_VOCAB = 262144  # its tokens; the markers come after them
# Each marker's embedding row is its first character's, stronger (where the model would
# write "<" and a grammar allows the marker, it writes the marker as one token, as a model
# of its family does); a marker that opens a call more so, over a thinking or text block.
BOOST, CALL_BOOST = 1.5, 2.0
# A marker is one bracketed word: llama.cpp's preserved tokens also list plain text
# (">", "```", "functools", "Action:\n```json") that no vocabulary has as one token.
_MARKER = re.compile(r"(<[^<>\s]+>|\[[^\[\]\s]+\])")


@cache
def markers() -> tuple[str, ...]:
    """The corpus's preserved tokens that are markers, sorted."""
    found: set[str] = set()
    for case in llama_chat.parse_cases():
        found.update(case["result"].get("preserved_tokens") or ())
    return tuple(sorted(m for m in found if _MARKER.fullmatch(m) and m != '">'))


@cache
def _call_openers() -> frozenset[str]:
    """Markers that start a call in the corpus (llama.cpp's grammar triggers)."""
    return frozenset(
        t["value"] for case in llama_chat.parse_cases() for t in case["result"]["grammar_triggers"]
    )


def marked_model_path() -> Path:
    """The marked model, built once into ``.cache/test-models/`` (about 250 MB)."""
    from app.models.default_model import ensure_default_model

    target = ensure_default_model(MODEL_CACHE)
    out = MODEL_CACHE / f"{target.stem}.marked.gguf"
    opens = _call_openers()
    added = [(m, m[0], CALL_BOOST if m in opens else BOOST) for m in markers()]
    return cached_draft(target, out, GEMMA_BLOCKS, added=added)
