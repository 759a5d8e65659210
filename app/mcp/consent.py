"""What a server is given, for the user to read before allowing it, and for its process.

A stdio server gets the SDK's basic environment (``HOME``, ``PATH`` … on POSIX; the
Windows equivalents there) plus the ``env`` of its ``mcp.json`` entry, never the rest
of Lamplight's environment (API keys, tokens). The consent lists exactly that: the
names of the basic variables, and each ``env`` name with its value (masked when it
looks secret); for an HTTP server, its headers.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcp.client.stdio import get_default_environment

from app.mcp.config import ServerConfig, shown_value

MAX_LINES = 64  # of env vars or headers listed; the count of the rest is said


def server_environment(env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of a stdio server: the basic one, ``env``, then ``extra``."""
    # The SDK merges its default under ``env`` too; doing it here keeps least privilege
    # ours to guarantee whatever a later SDK does with a full environment.
    return {**get_default_environment(), **env, **extra}


def consent_details(config: ServerConfig) -> tuple[str, ...]:
    """The lines, beside the command line or URL, that say what the server is given."""
    given = config.headers if config.transport == "http" else config.env
    lines: list[str] = []
    if given:
        lines.append(
            "sending these headers:"
            if config.transport == "http"
            else "with these environment variables from mcp.json:"
        )
        sep = ": " if config.transport == "http" else "="
        lines.extend(f"  {key}{sep}{shown_value(key, value)}" for key, value in given[:MAX_LINES])
        if len(given) > MAX_LINES:
            lines.append(f"  … and {len(given) - MAX_LINES} more")
    if config.transport == "stdio":
        names = ", ".join(sorted(get_default_environment())) or "none"
        lines.append(f"and of your own environment only: {names}")
    return tuple(lines)
