"""One setting's declaration (``FieldSpec``) and the one check every value goes through.

``check`` is the only way a value reaches llama.cpp: it converts a value to the
field's type or raises ``SettingError`` naming the field and its range;
``repair`` makes a stored value valid, with a note when it had to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.config.setting_records import ApiSettings, LoadConfig, SamplingParams
from app.util.errors import LamplightError

GROUPS = ("basic", "advanced", "reasoning", "tools", "structured", "speculative", "model")
TEXT_CHARS = 100_000  # the longest schema or grammar a text field takes


class SettingError(LamplightError):
    """A value out of range or of the wrong kind; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class FieldSpec:
    """One setting as the panel shows it and the validator checks it."""

    name: str
    label: str
    kind: str  # "float", "int", "bool", "choice", "text", "list"
    group: str
    help: str
    minimum: float | None = None
    maximum: float | None = None
    step: float = 1.0
    decimals: int = 0
    choices: tuple[str, ...] = ()
    reload: bool = False  # takes effect only when the model is loaded again
    target: str = "sampling"  # "sampling" (SamplingParams) or "load" (LoadConfig)

    @property
    def default(self) -> Any:
        source: object = (
            LoadConfig()
            if self.target == "load"
            else ApiSettings()
            if self.target == "api"
            else SamplingParams()
        )
        return getattr(source, self.name)


def check(spec: FieldSpec, value: Any) -> Any:
    """``value`` converted to the field's type, or SettingError naming field and range."""
    where = spec.label
    if spec.kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingError(spec.name, f"{where} must be a number (got {short_repr(value)}).")
        if isinstance(value, float) and not math.isfinite(value):
            raise SettingError(spec.name, f"{where} must be a finite number.")
        number: float | int
        if spec.kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise SettingError(spec.name, f"{where} must be a whole number (got {value}).")
            number = int(value)
        else:
            # A huge int would raise OverflowError in float(); it is out of range anyway.
            number = float(value) if abs(value) < 1e300 else math.copysign(math.inf, value)
        assert spec.minimum is not None and spec.maximum is not None
        if not spec.minimum <= number <= spec.maximum:
            raise SettingError(
                spec.name,
                f"{where} must be between {_bound(spec, spec.minimum)} and "
                f"{_bound(spec, spec.maximum)} (got {short_repr(value)}).",
            )
        return number
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise SettingError(spec.name, f"{where} must be on or off (got {short_repr(value)}).")
        return value
    if spec.kind == "choice":
        if not isinstance(value, str) or value not in spec.choices:
            raise SettingError(
                spec.name,
                f"{where} must be one of {', '.join(spec.choices)} (got {short_repr(value)}).",
            )
        return value
    if spec.kind == "text":
        if not isinstance(value, str):
            raise SettingError(spec.name, f"{where} must be text.")
        if spec.maximum is not None and len(value) > spec.maximum:
            raise SettingError(spec.name, f"{where}: at most {int(spec.maximum):,} characters.")
        return value
    if spec.kind == "list":
        items = list(value) if isinstance(value, list | tuple) else None
        if items is None or not all(isinstance(s, str) for s in items):
            raise SettingError(spec.name, f"{where} must be a list of text.")
        if any(not s for s in items) or len(items) > 16:
            raise SettingError(spec.name, f"{where}: up to 16, none empty.")
        return tuple(items)
    raise SettingError(spec.name, f"unknown kind {spec.kind}")


def repair(spec: FieldSpec, value: Any) -> tuple[Any, str]:
    """A valid value for ``spec`` from a stored one, and a note when it had to change.

    A sampling number above its range is clamped to the maximum (the bound is safe
    and keeps the intent: "a lot"). Everything else invalid takes the default: a
    sampling number below its range (the floor can be an extreme: a repeat penalty
    of 0.01 boosts repeats, where 0 was probably meant as "off"), any load setting
    out of range (a bound can still be too much for this machine: 262144 tokens of
    context, 256 threads; the default is known to load), a wrong type, NaN, an
    unknown choice.
    """
    try:
        return check(spec, value), ""
    except SettingError as exc:
        problem = str(exc)[:-1]  # without the full stop
    hi = spec.maximum
    number = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float)
        and math.isfinite(value)
        and (spec.kind == "float" or value.is_integer())
    )
    if (
        spec.target == "sampling"
        and spec.kind in ("float", "int")
        and hi is not None
        and number
        and value > hi
    ):
        return _bound(spec, hi), f"{problem}; set to {_bound(spec, hi)}."
    return spec.default, f"{problem}; using the default ({short_repr(spec.default)})."


def _bound(spec: FieldSpec, value: float) -> float | int:
    return int(value) if spec.kind == "int" else value


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to one short line (a stored value can be anything)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a huge number"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
