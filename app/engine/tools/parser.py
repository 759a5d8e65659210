"""Tool calls in a streamed reply's answer text, per model family (``tool_format``).

``ToolCallParser`` is fed the answer (never the thinking) piece by piece. Text that
could be the start of a call marker is held back until the next piece decides; from
a call's first marker on nothing more is shown. ``finish`` parses what was held:
the calls go to ``calls``; a malformed call becomes a line in ``problems`` and its raw
text is given back as answer text, so nothing the model wrote is lost. Text between
or after calls is answer text too.

Model output is untrusted: a call's text is at most ``MAX_CALL_CHARS``, a reply has
at most ``MAX_CALLS`` calls, JSON nests at most ``MAX_DEPTH`` deep; beyond that a
call is a problem, never an exception. A call to a tool not offered is still a call
(the chat answers it with an error result, which the model can read).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Collection, Mapping
from typing import Any

from app.engine.chat_message import ToolCall
from app.engine.stopping import partial_suffix
from app.engine.tools.format import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_END,
    DS_SEP,
    ToolFormat,
)

MAX_CALL_CHARS = 256 * 1024
MAX_CALLS = 32
MAX_DEPTH = 64
_ID_CHARS = string.ascii_letters + string.digits
_NAME_HINT = re.compile(r'"name"\s*:\s*"([^"\\]{1,100})"')
_RECIPIENT = re.compile(r"to=functions\.([^\s<]{1,256})")
_BARE_NAME = re.compile(r"[^\[\]\s{}\"<>]{1,256}")
_HEADER_LIMIT = 1024  # a gpt-oss header longer than this is not a header

Found = tuple[str, Any, str]  # (tool name, arguments, the model's own id or "")


class _Bad(Exception):
    """A malformed call: the message is for the user."""


class _Cut(_Bad):
    """A call the reply ended inside (stopped, cut at the token limit): reported as a call
    that did not finish, never shown as raw syntax."""


class _NotCall(Exception):
    """What looked like a call is the model's text after all."""


def _random_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


class ToolCallParser:
    """One reply's answer text split into shown text and calls (see the module docstring).

    ``tool_names``: the tools offered; a ``Mapping`` of name to JSON schema also tells
    which Qwen3-Coder parameters are strings. ``new_id``: makes the tail of each call
    id (9 random letters and digits by default); a model's own ids (Mistral) are kept.
    ``started``: a call has begun (for llama3, a reply starting with ``{`` counts until
    ``finish`` decides it was text).
    """

    def __init__(
        self,
        fmt: ToolFormat,
        tool_names: Collection[str],
        id_prefix: str = "call_",
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.fmt = fmt
        self._schemas: Mapping[str, Any] = tool_names if isinstance(tool_names, Mapping) else {}
        self._id_prefix = id_prefix
        self._new_id = new_id or _random_id
        self.calls: list[ToolCall] = []
        self.problems: list[str] = []
        self.started = False
        self._held = ""
        self._tail: list[str] = []
        self.call_chars = 0  # of the calls' text held so far (progress while one is written)
        self._answered = False  # non-whitespace answer text has been shown
        self._ids: set[str] = set()

    def feed(self, text: str) -> str:
        """The part of the answer that is safe to show now."""
        if self.started:
            self._hold(text)
            return ""
        text = self._held + text
        self._held = ""
        if self.fmt.bare_json and not self._answered:
            stripped = text.lstrip()
            if not stripped:
                self._held = text
                return ""
            if stripped.startswith("{"):
                self.started = True
                self._hold(text)
                return ""
        cut, _ = _next_open(self.fmt.opens, text, 0)
        if cut >= 0:
            self.started = True
            self._hold(text[cut:])
            return self._show(text[:cut])
        keep = partial_suffix(text, self.fmt.opens)
        self._held = text[len(text) - keep :]
        return self._show(text[: len(text) - keep])

    def _hold(self, text: str) -> None:
        self._tail.append(text)
        self.call_chars += len(text)

    def finish(self) -> str:
        """Parse what was held once the reply has ended: the text that was not a call."""
        if not self.started:
            held, self._held = self._held, ""
            return held
        tail = "".join(self._tail)
        self._tail = []
        try:
            return self._parse(tail)
        except Exception as e:
            self.problems.append(f"The model's tool call could not be read: {e}")
            return tail

    def _show(self, text: str) -> str:
        if text.strip():
            self._answered = True
        return text

    # -- the held text -----------------------------------------------------------------

    def _parse(self, text: str) -> str:
        pieces: list[str] = []
        pos, first = 0, True
        while pos < len(text):
            if first and self.fmt.bare_json and text.lstrip().startswith("{"):
                cut, marker = len(text) - len(text.lstrip()), "{"
            else:
                cut, marker = _next_open(self.fmt.opens, text, pos)
            first = False
            if cut < 0:
                pieces.append(text[pos:])
                break
            pieces.append(text[pos:cut])
            pos = self._region(text, cut, marker, pieces)
        if self.calls:
            pieces = [p for p in pieces if p.strip()]
        return "".join(pieces)

    def _region(self, text: str, at: int, marker: str, pieces: list[str]) -> int:
        """Parse the call(s) starting at ``at``; returns where the region ends."""
        cur = _Cursor(text, at + len(marker) if marker != "{" else at)
        try:
            found = _READERS[self.fmt.family](cur, marker, self._schemas)
            if cur.pos - at > MAX_CALL_CHARS * max(1, len(found)):
                raise _Bad(f"is longer than {MAX_CALL_CHARS // 1024} KiB")
            for name, args, own_id in found:
                self._add(name, args, own_id, text[at : cur.pos], pieces)
            return max(cur.pos, at + 1)
        except _NotCall:
            end = at + max(1, len(marker)) if marker != "{" else len(text)
            pieces.append(text[at:end])
            return end
        except (_Bad, ValueError, RecursionError) as e:
            end = _raw_end(text, at, self.fmt)
            hint = _NAME_HINT.search(text, at, min(end, at + 4096))
            who = f"a call to '{hint.group(1)}'" if hint else "a tool call"
            unclosed = bool(self.fmt.close) and not text.endswith(self.fmt.close, at, end)
            if isinstance(e, _Cut) or (unclosed and end == len(text)):
                self.problems.append(f"The model's reply ended inside {who}; it was not run.")
                return end
            self.problems.append(f"The model wrote {who} that {e}")
            pieces.append(text[at:end])
            return end

    def _add(self, name: str, args: Any, own_id: str, raw: str, pieces: list[str]) -> None:
        if len(self.calls) >= MAX_CALLS:
            note = (
                f"The model wrote more than {MAX_CALLS} calls in one reply; the rest were not run"
            )
            if note not in self.problems:
                self.problems.append(note)
            pieces.append(raw)
            return
        arguments = _arguments(name, args)
        if any(c.name == name and c.arguments == arguments for c in self.calls):
            # A small model may repeat itself call after call: one run answers them all.
            note = f"The model repeated a call to '{name}' with the same arguments; it runs once"
            if note not in self.problems:
                self.problems.append(note)
            return
        call_id = own_id if own_id and own_id not in self._ids else ""
        while not call_id or call_id in self._ids:
            call_id = f"{self._id_prefix}{self._new_id()}"
        self._ids.add(call_id)
        self.calls.append(ToolCall(call_id, name, arguments))


def parse_calls(
    fmt: ToolFormat, text: str, tool_names: Collection[str]
) -> tuple[str, list[ToolCall], list[str]]:
    """A whole reply's answer at once: (shown text, calls, problems)."""
    parser = ToolCallParser(fmt, tool_names)
    shown = parser.feed(text) + parser.finish()
    return shown, parser.calls, parser.problems


def _next_open(opens: tuple[str, ...], text: str, start: int) -> tuple[int, str]:
    best = (-1, "")
    for m in opens:
        i = text.find(m, start)
        if i >= 0 and (best[0] < 0 or i < best[0]):
            best = (i, m)
    return best


def _raw_end(text: str, at: int, fmt: ToolFormat) -> int:
    """Where a malformed call's raw text ends: after its closing marker, else the end."""
    if fmt.close:
        i = text.find(fmt.close, at)
        if i >= 0:
            return i + len(fmt.close)
    return len(text)


def _arguments(name: str, args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as e:
            raise _Bad(f"has arguments that are not valid JSON: {e}") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise _Bad(f"has arguments that are not a JSON object (a {type(args).__name__})")
    return json.dumps(args, ensure_ascii=False)


class _Cursor:
    """A position in the held text, with the small steps every reader needs."""

    def __init__(self, text: str, pos: int) -> None:
        self.text, self.pos = text, pos

    def ws(self) -> None:
        n = len(self.text)
        while self.pos < n and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, s: str) -> bool:
        if self.text.startswith(s, self.pos):
            self.pos += len(s)
            return True
        return False

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def until(self, s: str, limit: int = MAX_CALL_CHARS) -> str | None:
        """The text up to ``s`` (consumed), or None when it does not come."""
        i = self.text.find(s, self.pos, self.pos + limit + len(s))
        if i < 0:
            return None
        out, self.pos = self.text[self.pos : i], i + len(s)
        return out

    def json(self) -> Any:
        """One JSON object or array, scanned for its end first (strings, depth, size)."""
        end = _scan_json(self.text, self.pos)
        try:
            value = json.loads(self.text[self.pos : end])
        except RecursionError:
            raise _Bad(f"nests deeper than {MAX_DEPTH} levels") from None
        except ValueError as e:
            raise _Bad(f"is not valid JSON: {e}") from None
        self.pos = end
        return value


def _scan_json(text: str, start: int) -> int:
    """Where the JSON object/array at ``start`` ends (braces inside strings ignored)."""
    if start >= len(text) or text[start] not in "{[":
        raise _Bad("has no JSON object where its arguments should be")
    depth, in_str, esc = 0, False, False
    stop = min(len(text), start + MAX_CALL_CHARS)
    for j in range(start, stop):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                raise _Bad(f"nests deeper than {MAX_DEPTH} levels")
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    if stop < len(text):
        raise _Bad(f"is longer than {MAX_CALL_CHARS // 1024} KiB")
    raise _Cut("is not valid JSON: it ends before its last brace")


def _named(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> Found:
    """(name, arguments, id) of a ``{"name": .., "arguments": ..}`` object."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # {"type": "function", "function": {...}}
    if not isinstance(obj, dict):
        raise _Bad("is not a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _Bad("has no tool name")
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    own = obj.get("id")
    own_id = own if isinstance(own, str) and 0 < len(own) <= 64 else ""
    _arguments(name, args)  # a bad argument shows as this call's problem
    return name.strip(), args, own_id


# -- one reader per family: called just past the opening marker -------------------------


def _hermes(cur: _Cursor, marker: str, schemas: Mapping[str, Any]) -> list[Found]:
    cur.ws()
    if cur.text.startswith("<function=", cur.pos):
        cur.pos += len("<function=")
        return _qwen3_coder(cur, "<tool_call>", schemas, opened=True)
    found = _named(cur.json())
    cur.ws()
    cur.take("</tool_call>")
    return [found]


def _qwen3_coder(
    cur: _Cursor, marker: str, schemas: Mapping[str, Any], opened: bool = False
) -> list[Found]:
    if marker == "<tool_call>" and not opened:
        cur.ws()
        if not cur.take("<function="):
            return _hermes(cur, marker, schemas)
    name = cur.until(">", 256)
    if name is None or not name.strip():
        raise _Bad("has no tool name")
    name = name.strip()
    props = _properties(schemas.get(name))
    args: dict[str, Any] = {}
    while True:
        cur.ws()
        if not cur.take("<parameter="):
            break
        key = cur.until(">", 256)
        if key is None:
            raise _Cut(f"to '{name}' has an unfinished parameter")
        value = cur.until("</parameter>")
        if value is None:
            raise _Cut(f"to '{name}' has an unfinished parameter")
        args[key.strip()] = _xml_value(value, props.get(key.strip()))
    if not cur.take("</function>") and _ends_in(cur, "<parameter=", "</function>"):
        raise _Cut(f"to '{name}' has no end")
    cur.ws()
    cur.take("</tool_call>")
    return [(name, args, "")]


def _ends_in(cur: _Cursor, *markers: str) -> bool:
    """Whether the text left is (a start of) one of ``markers``: the reply ended there."""
    rest = cur.text[cur.pos :]
    return any(m.startswith(rest) for m in markers)


def _properties(schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return dict(props) if isinstance(props, Mapping) else {}


def _xml_value(value: str, schema: Any) -> Any:
    value = value.removeprefix("\n").removesuffix("\n")
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _llama3(cur: _Cursor, marker: str, schemas: Mapping[str, Any]) -> list[Found]:
    cur.ws()
    if marker == "{":
        try:
            obj = cur.json()
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise _NotCall
        except _Bad:
            if re.match(r'\{\s*"(name|type)"', cur.text[cur.pos : cur.pos + 64]):
                raise
            raise _NotCall from None
        return [_named(obj)]
    if not cur.text.startswith("{", cur.pos):
        raise _Bad("uses a built-in tool syntax (name.call(...)) that Lamplight does not run")
    found = [_named(cur.json())]
    while True:  # several calls: separated by ";" or whitespace
        save = cur.pos
        cur.ws()
        cur.take(";")
        cur.ws()
        if not cur.text.startswith("{", cur.pos):
            cur.pos = save
            return found
        found.append(_named(cur.json()))


def _mistral(cur: _Cursor, marker: str, schemas: Mapping[str, Any]) -> list[Found]:
    cur.ws()
    if cur.text.startswith("[", cur.pos) and not cur.text.startswith("[ARGS]", cur.pos):
        value = cur.json()
        items = value if isinstance(value, list) else [value]
        if not items:
            raise _Bad("lists no calls")
        return [_named(item) for item in items]
    if cur.text.startswith("{", cur.pos):
        return [_named(cur.json())]
    m = _BARE_NAME.match(cur.text, cur.pos)
    if not m:
        raise _Bad("has no tool name")
    name, cur.pos = m.group(0), m.end()
    own_id = ""
    if cur.take("[CALL_ID]"):
        id_match = re.compile(r"[A-Za-z0-9]{1,64}").match(cur.text, cur.pos)
        if id_match:
            own_id, cur.pos = id_match.group(0), id_match.end()
    if not cur.take("[ARGS]"):
        raise _Bad(f"to '{name}' has no [ARGS]")
    cur.ws()
    args = cur.json()
    _arguments(name, args)
    return [(name, args, own_id)]


def _gpt_oss(cur: _Cursor, marker: str, schemas: Mapping[str, Any]) -> list[Found]:
    start = cur.pos - len(marker)
    header = cur.until("<|message|>", _HEADER_LIMIT)
    if header is None:
        if len(cur.text) - cur.pos < _HEADER_LIMIT and "<|" not in cur.text[cur.pos :]:
            raise _NotCall
        raise _Bad("has an unfinished header")
    recipient = _RECIPIENT.search(marker + header)
    if recipient is None:
        if "final" in header:
            return []  # the final channel's header: not answer text
        cur.pos = start + len(marker)
        raise _NotCall
    name = recipient.group(1)
    cur.ws()
    args = cur.json()
    _arguments(name, args)
    cur.ws()
    cur.take("<|call|>")
    return [(name, args, "")]


def _deepseek(cur: _Cursor, marker: str, schemas: Mapping[str, Any]) -> list[Found]:
    found: list[Found] = []
    if marker == DS_CALL_BEGIN:
        cur.pos -= len(marker)
    while True:
        cur.ws()
        if not cur.take(DS_CALL_BEGIN):
            break
        cur.take("function")
        if not cur.take(DS_SEP):  # V3.1: NAME<sep>{json}
            name = cur.until(DS_SEP, 256)
        else:
            m = re.compile(r"[^\n`{<]{1,256}").match(cur.text, cur.pos)
            name = m.group(0) if m else None
            cur.pos = m.end() if m else cur.pos
        if not name or not name.strip():
            raise _Bad("has no tool name")
        cur.ws()
        fenced = cur.take("```json") or cur.take("```")
        cur.ws()
        args = cur.json()
        _arguments(name, args)
        cur.ws()
        if fenced:
            cur.take("```")
            cur.ws()
        cur.take(DS_CALL_END)
        found.append((name.strip(), args, ""))
    cur.take(DS_CALLS_END)
    if not found:
        raise _Bad("lists no calls")
    return found


_READERS: dict[str, Callable[[_Cursor, str, Mapping[str, Any]], list[Found]]] = {
    "hermes": _hermes,
    "generic": _hermes,
    "qwen3_coder": _qwen3_coder,
    "llama3": _llama3,
    "mistral": _mistral,
    "gpt_oss": _gpt_oss,
    "deepseek": _deepseek,
}
