"""Settings checked on their way to llama.cpp: ``validate_*`` for what the user enters
(an error names the field and the allowed range), ``repair_*`` for what a file holds (a
bad value is clamped or reset, with a note), and the structured-output checks.

The declarations are in ``app.config.setting_specs``, one field's declaration and check
in ``app.config.field_spec``, the records in ``app.config.setting_records``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from app.config.field_spec import SettingError, check, repair
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPEC_BY_NAME


def repair_fields(kind: type, values: Any) -> tuple[dict[str, Any], list[str]]:
    """The known fields of dataclass ``kind`` in ``values``, each made valid (see ``repair``).

    Unknown keys are ignored without a note (a newer version may have written them).
    """
    if not isinstance(values, dict):
        return {}, []
    out: dict[str, Any] = {}
    notes = []
    for f in fields(kind):
        if f.name not in values:
            continue
        spec = SPEC_BY_NAME.get(f.name)
        if spec is None:  # pragma: no cover - every field has a declaration
            continue
        out[f.name], note = repair(spec, values[f.name])
        if note:
            notes.append(note)
    return out, notes


def repair_sampling(values: Any) -> tuple[SamplingParams, list[str]]:
    """SamplingParams from stored values: bad fields repaired, a bad schema or grammar
    switches the output format back to free text (the text itself is kept)."""
    out, notes = repair_fields(SamplingParams, values)
    params = SamplingParams(**out)
    try:
        check_structured(params)
    except SettingError as exc:
        notes.append(f"{exc}; the output format is back to free text.")
        params = replace(params, output_format="text")
    return params, notes


def repair_load(values: Any) -> tuple[LoadConfig, list[str]]:
    """LoadConfig from stored values: every field in its declared range (see ``repair``)."""
    out, notes = repair_fields(LoadConfig, values)
    return LoadConfig(**out), notes


def validate_sampling(values: dict[str, Any], base: SamplingParams | None = None) -> SamplingParams:
    """SamplingParams from ``values`` (missing fields from ``base``); every field checked.

    Raises:
        SettingError: the first bad field, by name, with its range.
    """
    base = base or SamplingParams()
    known = {f.name for f in fields(SamplingParams)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            raise SettingError(name, f"Unknown setting {name!r}.")
        spec = SPEC_BY_NAME.get(name)
        out[name] = check(spec, value) if spec is not None else value
    params = replace(base, **out)
    check_structured(params)
    return params


def validate_load(values: dict[str, Any], base: LoadConfig | None = None) -> LoadConfig:
    base = base or LoadConfig()
    out = {}
    for name, value in values.items():
        spec = SPEC_BY_NAME.get(name)
        if spec is None or spec.target != "load":
            raise SettingError(name, f"Unknown model setting {name!r}.")
        out[name] = check(spec, value)
    return replace(base, **out)


def check_structured(params: SamplingParams) -> None:
    """The schema or grammar must be usable before any generation starts."""
    if params.output_format == "json_schema":
        grammar_for(params)
    elif params.output_format == "gbnf" and "root" not in params.grammar:
        raise SettingError("grammar", "The GBNF grammar needs a `root ::= ...` rule.")
    template_variables(params)


def template_variables(params: SamplingParams) -> dict[str, Any]:
    """The JSON object in ``params.template_kwargs`` ({} for none).

    Raises:
        SettingError: it is not a JSON object (or is nested too deeply).
    """
    if not params.template_kwargs.strip():
        return {}
    try:
        value = json.loads(params.template_kwargs)
    except (RecursionError, ValueError) as exc:
        raise SettingError(
            "template_kwargs", f"The template variables are not valid JSON: {exc}"
        ) from exc
    if not isinstance(value, dict):
        raise SettingError("template_kwargs", "The template variables must be a JSON object.")
    return value


def grammar_for(
    params: SamplingParams, convert: Callable[[dict[str, Any]], str] | None = None
) -> str:
    """The GBNF text for the output format ('' for free text). ``convert`` turns a JSON
    schema into GBNF (the engine passes llama.cpp's own converter); by default
    llama-cpp-python's.

    Raises:
        SettingError: the JSON schema is not valid JSON or cannot be turned into a grammar.
    """
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if params.output_format == "json":
        return str(JSON_GBNF)
    if params.output_format == "gbnf":
        return params.grammar
    if params.output_format == "json_schema":
        try:
            schema = json.loads(params.json_schema)
        except RecursionError as exc:
            raise SettingError("json_schema", "The JSON schema is nested too deeply.") from exc
        except ValueError as exc:
            raise SettingError("json_schema", f"The JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise SettingError("json_schema", "The JSON schema must be a JSON object.")
        try:
            if convert is not None:
                return convert(schema)
            return str(json_schema_to_gbnf(json.dumps(schema)))
        except Exception as exc:  # the converter raises many types on odd schemas
            raise SettingError("json_schema", f"The JSON schema cannot be used: {exc}") from exc
    return ""


def sampling_to_dict(params: SamplingParams) -> dict[str, Any]:
    data = {f.name: getattr(params, f.name) for f in fields(SamplingParams)}
    data["stop"] = list(params.stop)
    return data
