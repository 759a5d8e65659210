"""The local API server's settings (issue 17): declared, checked, repaired.

``ApiSettings`` itself is in ``app.config.setting_records``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import fields, replace
from typing import Any

from app.config.field_spec import FieldSpec, SettingError, check, short_repr
from app.config.setting_records import ApiSettings

HOST_CHARS = 253
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?")


API_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "enabled", "Serve the API", "bool", "api", "Start the server with the app.", target="api"
    ),
    FieldSpec(
        "host",
        "Address",
        "text",
        "api",
        "The address to listen on: 127.0.0.1 for this computer only.",
        maximum=HOST_CHARS,
        target="api",
    ),
    FieldSpec("port", "Port", "int", "api", "TCP port (0: any free one).", 0, 65535, target="api"),
    FieldSpec(
        "cors_origins",
        "Allowed web origins",
        "list",
        "api",
        "Web pages (https://host:port) allowed to call the API from a browser.",
        target="api",
    ),
    FieldSpec(
        "max_queue",
        "Queue size",
        "int",
        "api",
        "Requests running or waiting; more are refused with 429.",
        1,
        64,
        target="api",
    ),
    FieldSpec(
        "max_body_mb",
        "Largest request (MB)",
        "int",
        "api",
        "Larger request bodies are refused with 413 (images count as base64, a third "
        "larger than their files).",
        1,
        64,
        target="api",
    ),
    FieldSpec(
        "pool_mb",
        "Prompt cache (MB)",
        "int",
        "api",
        "RAM for KV snapshots of recent prompts (0: off).",
        0,
        16384,
        target="api",
    ),
)
API_SPEC_BY_NAME = {s.name: s for s in API_SPECS}


def is_host(value: str) -> bool:
    """An IP address or a DNS host name (``localhost`` included)."""
    if not value or len(value) > HOST_CHARS:
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


LOCALHOST_NAMES = ("localhost", "localhost.")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address: reachable from this computer only."""
    if host.lower() in LOCALHOST_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_origin(value: str) -> bool:
    """``*`` or a web origin: ``http(s)://host[:port]``, no path."""
    if value == "*":
        return True
    m = _ORIGIN.fullmatch(value)
    return m is not None and (m.group(2) is None or 0 < int(m.group(2)[1:]) <= 65535)


def check_api(spec: FieldSpec, value: Any) -> Any:
    """``check`` plus the address and origin syntax."""
    value = check(spec, value)
    if spec.name == "host" and not is_host(value):
        raise SettingError(
            "host", f"Address must be an IP address or a host name (got {short_repr(value)})."
        )
    if spec.name == "cors_origins":
        bad = [o for o in value if not is_origin(o)]
        if bad:
            raise SettingError(
                "cors_origins",
                f"Allowed web origins must look like https://host:port (got {short_repr(bad[0])}).",
            )
    return value


def validate_api(values: dict[str, Any], base: ApiSettings | None = None) -> ApiSettings:
    """ApiSettings from ``values`` (missing fields from ``base``); every field checked.

    Raises:
        SettingError: the first bad field, by name, with what it must be.
    """
    out = {}
    for name, value in values.items():
        spec = API_SPEC_BY_NAME.get(name)
        if spec is None:
            raise SettingError(name, f"Unknown server setting {name!r}.")
        out[name] = check_api(spec, value)
    return replace(base or ApiSettings(), **out)


def repair_api(values: Any) -> tuple[ApiSettings, list[str]]:
    """ApiSettings from stored values: a bad field takes its default, with a note."""
    if not isinstance(values, dict):
        return ApiSettings(), []
    out: dict[str, Any] = {}
    notes = []
    for f in fields(ApiSettings):
        if f.name not in values:
            continue
        spec = API_SPEC_BY_NAME[f.name]
        try:
            out[f.name] = check_api(spec, values[f.name])
        except SettingError as exc:
            out[f.name] = spec.default
            notes.append(f"{str(exc)[:-1]}; using the default ({short_repr(spec.default)}).")
    return ApiSettings(**out), notes
