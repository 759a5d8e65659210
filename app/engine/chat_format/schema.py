"""JSON schema to GBNF by llama.cpp's own converter (``common/json-schema-to-grammar``):
numeric bounds, ``pattern``, ``format``, ``$ref`` and item counts included, which
llama-cpp-python's Python converter drops. Its input is bounded first: the native
converter recurses per level and llama.cpp's grammar parser writes a repetition out
in full, so nesting past 32 and counts past 500 are cut (the same limits as before).
Without the shim, llama-cpp-python's converter is used.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.engine.native.chat_shim import ShimError, load_shim

MAX_SCHEMA_CHARS = 64 * 1024
MAX_DEPTH = 32
MAX_BOUND = 500  # length/item bounds above this are dropped (llama.cpp writes repeats out)
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BIG_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def bounded_schema(schema: Any, depth: int = 0) -> Any:
    """``schema`` without what llama.cpp cannot expand; nesting past 32 is dropped."""
    if depth > MAX_DEPTH:
        return {}
    if isinstance(schema, dict):
        out = {}
        for k, v in schema.items():
            if k in _BOUNDS and (not isinstance(v, int) or v > MAX_BOUND or v < 0):
                continue
            if k == "pattern" and isinstance(v, str) and _huge_repeat(v):
                continue
            out[str(k)] = bounded_schema(v, depth + 1)
        return out
    if isinstance(schema, list):
        return [bounded_schema(v, depth + 1) for v in schema]
    return schema


def _huge_repeat(pattern: str) -> bool:
    for low, high in _BIG_REPEAT.findall(pattern):
        if int(low) > MAX_BOUND or (high and int(high) > MAX_BOUND):
            return True
    return False


def schema_grammar(schema: dict[str, Any]) -> str:
    """The GBNF (root rule ``root``) for values of ``schema``.

    Raises:
        ValueError: the schema is too large or cannot be converted (llama.cpp's words).
    """
    cleaned = bounded_schema(schema)
    text = json.dumps(cleaned, ensure_ascii=False)
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError("the schema is too large (over 64 KiB)")
    shim = load_shim()
    if shim is None:
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        return str(json_schema_to_gbnf(text))
    try:
        return shim.schema_to_grammar(cleaned)
    except ShimError as exc:
        raise ValueError(str(exc)) from exc


_RULE = re.compile(r"^([a-zA-Z0-9_-]+)\s*::=\s*(.*)$")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]*")


def prefixed_rules(gbnf: str, prefix: str) -> dict[str, str]:
    """``gbnf``'s rules (one per line, as llama.cpp writes them) renamed ``prefix-name``,
    references included, so several schemas' grammars can live in one grammar."""
    rules: dict[str, str] = {}
    for line in gbnf.splitlines():
        found = _RULE.match(line.strip())
        if found:
            rules[found.group(1)] = found.group(2)
    names = set(rules)
    return {f"{prefix}-{k}": _rename(v, names, prefix) for k, v in rules.items()}


def _rename(body: str, names: set[str], prefix: str) -> str:
    """``body`` with each reference to a rule in ``names`` prefixed; strings and character
    classes are copied as they are."""
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c in '"[':
            end = _closing(body, i, '"' if c == '"' else "]")
            out.append(body[i:end])
            i = end
            continue
        found = _NAME.match(body, i) if c.isalpha() or c == "_" else None
        if found:
            word = found.group(0)
            out.append(f"{prefix}-{word}" if word in names else word)
            i = found.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _closing(body: str, start: int, close: str) -> int:
    """Just past the literal or class opened at ``start`` (backslash escapes skipped)."""
    i = start + 1
    while i < len(body):
        if body[i] == "\\":
            i += 2
            continue
        if body[i] == close:
            return i + 1
        i += 1
    return len(body)
