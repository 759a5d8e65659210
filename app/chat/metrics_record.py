"""A reply's metrics as stored with its message: written whole, read back field by field."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from app.chat.stored_fields import is_int, is_number
from app.engine.metrics import MessageMetrics

THINKING_CUTS = ("", "budget", "user")  # MessageMetrics.thinking_cut: who ended the thinking


def metrics_to_dict(m: MessageMetrics) -> dict[str, Any]:
    return asdict(m)


def metrics_from_dict(data: dict[str, Any]) -> MessageMetrics:
    """Metrics from stored values: a field of the wrong type, or not finite, keeps its
    default, so every figure computed from them (rates, percentiles) is a number."""
    defaults = MessageMetrics()
    kwargs: dict[str, Any] = {}
    for f in fields(MessageMetrics):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(defaults, f.name)
        if f.name == "seed":
            ok = value is None or is_int(value)
        elif isinstance(default, int):
            ok = is_int(value)
        elif isinstance(default, float):
            ok = is_number(value)
            value = float(value) if ok else value
        elif f.name == "thinking_cut":
            ok = value in THINKING_CUTS
        elif isinstance(default, str):
            ok = isinstance(value, str)
        elif f.name == "token_times_ms":
            ok = isinstance(value, list) and all(is_number(x) for x in value)
            value = [float(x) for x in value] if ok else value
        elif f.name == "notes":
            ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
        else:  # pragma: no cover - a new field of another type keeps its default
            ok = False
        if ok:
            kwargs[f.name] = value
    return MessageMetrics(**kwargs)
