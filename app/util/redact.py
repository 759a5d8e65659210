"""Secrets kept out of logs, crash records and the messages a transcript keeps.

``redact_text`` rewrites text that may hold a credential: in every URL the user name
and password and the values of the query and fragment become ``***`` (the scheme,
host, path and parameter names stay, so a line still says where it went); values of
``name=value`` / ``name: value`` pairs whose name looks secret (key, token,
password, ``Authorization`` ...) and ``Bearer``/``Basic`` credentials become ``***``.
``RedactFilter`` applies it to every record a Lamplight handler writes, third-party
loggers' included; ``secure_logging`` installs it and quiets the chatty HTTP and MCP
loggers, which log every request's full URL at INFO.

Every pattern starts only where a run of its characters starts (a lookbehind) and can
backtrack at most a fixed number of characters, so the time is linear in the text's
length whatever it holds (a log line is untrusted).
"""

from __future__ import annotations

import logging
import re

MASK = "***"
# Loggers that describe every request (httpx logs "HTTP Request: POST <url>" at INFO,
# the MCP SDK its sessions): only their warnings and errors are written.
QUIET_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "hpack",
    "h11",
    "mcp",
    "uvicorn",
    "uvicorn.access",
    "urllib3",
    "huggingface_hub",
    "filelock",
    "asyncio",
    "sse_starlette",
)
# A name is secret when one of its words (split at ``_-.`` and camelCase) is one of
# these, or ends like the second set: ``api_key``, ``X-Auth-Token``, ``apiKey`` are;
# ``max_tokens``, ``keyboard``, ``author`` are not.
_SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "accesskey",
        "privatekey",
        "secretkey",
        "authkey",
        "auth",
        "authorization",
        "bearer",
        "pwd",
        "cookie",
        "session",
        "sessionid",
        "signature",
        "sig",
        "credential",
        "credentials",
        "passphrase",
    }
)
_SECRET_ENDINGS = ("token", "secret", "password", "passwd")
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")

_URL = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]{0,31})://([^\s'\"<>`]+)")
# A pair: name and separator (quotes allowed around either side), then the value (a
# Bearer/Basic scheme word is part of it). Only a secret name's value is scanned, and
# pairs inside a masked value are skipped, so each character is read a fixed number of
# times.
_NAME_SEP = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]{1,128})([\"']?[ \t]*[:=][ \t]*[\"']?)")
_VALUE = re.compile(r"(?:(?i:bearer|basic|token)[ \t]+)?[^\s\"',;&}\]<>]+")
_SCHEME_CREDENTIAL = re.compile(
    r"(?<![A-Za-z0-9_-])((?i:bearer|basic)[ \t]+)([A-Za-z0-9._~+/=-]{8,})"
)
# Key formats that name themselves (OpenAI-style ``sk-``, GitHub, Slack).
_KNOWN_KEY = re.compile(
    r"(?<![A-Za-z0-9_-])(?:sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,})"
)
_PLAIN_VALUE = re.compile(r"true|false|null|none|\*\*\*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` without its user name, password, query values and fragment values."""
    head, sep, rest = url.partition("://")
    if not sep:
        return _query_masked(url) if "?" in url else url
    return f"{head}://{_after_scheme(rest)}"


def redact_text(text: str) -> str:
    """``text`` with URL credentials and queries, secret-looking pairs and bearer
    credentials replaced by ``***``; text with none of them is returned as it is."""
    if not text:
        return text
    text = _URL.sub(lambda m: f"{m.group(1)}://{_after_scheme(m.group(2))}", text)
    text = _SCHEME_CREDENTIAL.sub(lambda m: m.group(1) + MASK, text)
    text = _KNOWN_KEY.sub(MASK, text)
    return _pairs_masked(text)


class RedactFilter(logging.Filter):
    """Redacts each record's message, exception text and stack (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the handler reports it as logging does
            return True
        record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


def secure_logging(*handlers: logging.Handler) -> None:
    """Redact what ``handlers`` write and keep the per-request loggers at WARNING."""
    for handler in handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def secret_name(name: str) -> bool:
    """Whether a field, header or variable called ``name`` holds a secret."""
    words = [w.lower() for w in _WORD.findall(name)]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def _after_scheme(rest: str) -> str:
    """The part of a URL after ``scheme://``, redacted."""
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if 0 <= at < end:
            end = at
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    return authority + (_query_masked(tail) if ("?" in tail or "#" in tail) else tail)


def _query_masked(tail: str) -> str:
    """A path with its query and fragment values masked (names kept)."""
    path, hash_mark, fragment = tail.partition("#")
    path, question, query = path.partition("?")
    out = path
    if question:
        out += "?" + _params_masked(query)
    if hash_mark:
        out += "#" + _params_masked(fragment)
    return out


def _params_masked(query: str) -> str:
    if not query:
        return query
    parts = []
    for item in query.split("&"):
        name, eq, value = item.partition("=")
        if eq:
            parts.append(f"{name}={MASK if value else ''}")
        else:
            parts.append(MASK if item else "")
    return "&".join(parts)


def _pairs_masked(text: str) -> str:
    """``text`` with the values of secret-named pairs masked (``Request: token=x`` too:
    a pair is looked for in a value that is not masked)."""
    out: list[str] = []
    last = 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < last or not secret_name(m.group(1)):
            continue
        value = _VALUE.match(text, m.end())
        if value is None or _PLAIN_VALUE.fullmatch(value.group()):
            continue
        if value.group().startswith("${"):  # a reference (VS Code's ${input:...})
            continue
        out += [text[last : m.end()], MASK]
        last = value.end()
    out.append(text[last:])
    return "".join(out)
