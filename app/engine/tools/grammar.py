"""GBNF grammars that make a model's tool calls well-formed, and when to arm them.

For llama.cpp's ``llama_sampler_init_grammar_lazy_patterns`` (``lazy``) or
``llama_sampler_init_grammar``. How llama.cpp (``llama_grammar_trigger_pattern::find``)
reads ``patterns``: each sampled token's text is appended to a buffer of everything
generated since the sampler was made; a pattern starting with ``^`` and ending with
``$`` must match the whole buffer, any other is searched for anywhere in it. When one
matches, the grammar is fed the buffer from the start of the first non-empty capture
group (else the whole match) on, and constrains every token after. ``tokens`` are
marker texts that are single tokens (the caller maps them to ids): sampling one arms
the grammar with that token. Token triggers fire anywhere, even in thinking, so with a
thinking template only patterns are used; they require the thinking block's close
marker before the call marker.

Each tool's arguments follow its JSON schema (llama.cpp's own converter, numeric bounds
included, when the build has it: ``chat_format/schema.py``; else llama-cpp-python's);
a schema that cannot be converted, or is too large, allows any JSON object instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from app.engine.chat_format.formatted import FormattedChat, TriggerKind
from app.engine.chat_format.native import available as native_available
from app.engine.chat_format.schema import (
    MAX_SCHEMA_CHARS,
    bounded_schema,
    prefixed_rules,
    schema_grammar,
)
from app.engine.tool_spec import AUTO, ToolRequest, ToolSpec
from app.engine.tools.format import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    ToolFormat,
)

_ANY_OBJECT = {"type": "object"}
_WS = "tool-ws"
_SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'  # llama.cpp's ``space``
_RULES_TAIL = {
    _WS: "[ \\t\\n]{0,4}",
    # Qwen3-Coder's raw parameter text: anything without "</" in it.
    "tool-xml-text": '([^<] | "<" [^/])*',
    "tool-xml-any-param": (
        '"<parameter=" [a-zA-Z0-9_.-]{1,64} ">\\n" tool-xml-text "\\n</parameter>\\n"'
    ),
}


@dataclass(frozen=True)
class ToolGrammar:
    """A grammar (root rule ``root``) and, when ``lazy``, what arms it."""

    gbnf: str
    patterns: tuple[str, ...]
    tokens: tuple[str, ...]
    lazy: bool
    prefill: str = ""  # text the prompt holds that the grammar starts with (llama.cpp's)


MAX_PARALLEL = 8  # calls in one turn, when parallel calls are allowed


def tool_grammar(
    fmt: ToolFormat,
    request: ToolRequest,
    think_close: str = "",
    starts_inside: bool = False,
    think_open: str = "",
) -> ToolGrammar | None:
    """The grammar for ``request`` in ``fmt``'s syntax, or None when nothing may be called.

    ``auto``: armed by the call marker, never by one inside a thinking block (``think_open``
    / ``think_close``; ``starts_inside``: the prompt opened the block). ``required`` or a
    tool's name: the call is forced from the first answer token (without thinking, at
    once; with a reply that starts inside thinking, from the close marker on, which the
    grammar then starts with).
    """
    if not request.active:
        return None
    named = request.named()
    tools = (named,) if named else request.tools
    converter = _Converter()
    calls = [_call_rule(fmt, converter, i, tool) for i, tool in enumerate(tools)]
    one = " | ".join(f"tool-call-{i}" for i in range(len(calls)))
    body = _body(fmt, request.parallel)
    rules = {f"tool-call-{i}": rule for i, rule in enumerate(calls)}
    rules["tool-one"] = one
    if request.choice == AUTO and not named:
        patterns, tokens = _triggers(fmt, think_close, think_open, starts_inside)
        return ToolGrammar(_gbnf(body, rules, converter), patterns, tokens, lazy=True)
    if think_close and starts_inside:
        root = f"{_lit(think_close)} {_WS} {body}"
        pattern = f"({re.escape(think_close)})"
        return ToolGrammar(_gbnf(root, rules, converter), (pattern,), (), lazy=True)
    return ToolGrammar(_gbnf(body, rules, converter), (), (), lazy=False)


def _body(fmt: ToolFormat, parallel: bool) -> str:
    """The root's shape around single calls (``tool-one``): at most ``MAX_PARALLEL`` of
    them, since a small model may otherwise repeat a call until its token limit."""
    many = parallel and fmt.family != "gpt_oss"  # gpt-oss ends its turn at each call
    more = f"{{0,{MAX_PARALLEL - 1}}}"
    if fmt.family == "mistral" and "[ARGS]" not in fmt.marker_tokens:
        tail = f' ("," {_WS} tool-one){more}' if many else ""
        return f'"[TOOL_CALLS]" "[" tool-one{tail} "]"'
    if fmt.family == "deepseek":
        inner = f"tool-one ({_WS} tool-one){more}" if many else "tool-one"
        return f"{_lit(DS_CALLS_BEGIN)} {inner} {_lit(DS_CALLS_END)}"
    if fmt.family == "llama3":
        inner = f'tool-one ({_WS} ";"? {_WS} tool-one){more}' if many else "tool-one"
        return f'"<|python_tag|>"? {inner}'
    return f"tool-one ({_WS} tool-one){more} {_WS}" if many else f"tool-one {_WS}"


def _call_rule(fmt: ToolFormat, converter: _Converter, i: int, tool: ToolSpec) -> str:
    """One call to ``tool`` in ``fmt``'s syntax."""
    name = _lit(json.dumps(tool.name, ensure_ascii=False))
    if fmt.family == "qwen3_coder":
        return _xml_call(converter, i, tool)
    args = _args_rule(converter, f"tool{i}-args", tool.parameters)
    if fmt.family == "llama3":
        return (
            f'"{{" space "\\"name\\"" space ":" space {name} space "," space '
            f'"\\"parameters\\"" space ":" space {args} "}}"'
        )
    if fmt.family == "mistral":
        if "[ARGS]" in fmt.marker_tokens:
            return f'"[TOOL_CALLS]" {_lit(tool.name)} "[ARGS]" {args}'
        return (
            f'"{{" space "\\"name\\"" space ":" space {name} space "," space "\\"arguments\\"" '
            f'space ":" space {args} "," space "\\"id\\"" space ":" space "\\"" '
            '[a-zA-Z0-9]{9} "\\"" space "}"'
        )
    if fmt.family == "gpt_oss":
        # The turn's header, then the arguments; <|call|> is an end-of-generation token
        # (allowed once the grammar is complete), so it is not in the grammar.
        return (
            f'"<|start|>assistant"? "<|channel|>commentary to=functions." {_lit(tool.name)} '
            f'(" <|constrain|>json" | " json")? "<|message|>" {args}'
        )
    if fmt.family == "deepseek":
        return (
            f'{_lit(DS_CALL_BEGIN)} "function" {_lit(DS_SEP)} {_lit(tool.name)} '
            f'"\\n```json\\n" {args} "\\n```" {_lit(DS_CALL_END)}'
        )
    return (  # hermes, generic
        f'"<tool_call>" "\\n"? "{{" space "\\"name\\"" space ":" space {name} space "," space '
        f'"\\"arguments\\"" space ":" space {args} "}}" "\\n"? "</tool_call>"'
    )


def _xml_call(converter: _Converter, i: int, tool: ToolSpec) -> str:
    """Qwen3-Coder: ``<function=NAME>`` and one ``<parameter=P>`` block per argument."""
    head = f'"<tool_call>\\n<function=" {_lit(tool.name)} ">\\n"'
    tail = '"</function>\\n</tool_call>"'
    schema = bounded_schema(tool.parameters)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return f"{head} tool-xml-any-param* {tail}"
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    parts = []
    for j, (key, sub) in enumerate(props.items()):
        sub = sub if isinstance(sub, dict) else {}
        value = (
            "tool-xml-text"
            if sub.get("type") == "string"
            else _args_rule(converter, f"tool{i}-p{j}", sub, fallback={})
        )
        block = f'"<parameter=" {_lit(str(key))} ">\\n" {value} "\\n</parameter>\\n"'
        parts.append(block if key in needed else f"({block})?")
    return f"{head} {' '.join(parts)} {tail}"


class _Converter(SchemaConverter):  # type: ignore[misc]  # llama_cpp is untyped
    """llama-cpp-python's converter, plus the rules llama.cpp's own converter wrote."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self.native: dict[str, str] = {}


def _args_rule(converter: _Converter, name: str, schema: Any, fallback: Any = _ANY_OBJECT) -> str:
    """A rule for values of ``schema``; ``fallback``'s (any object) when it will not convert.
    llama.cpp's converter when the build has it (numeric bounds, patterns, formats)."""
    cleaned = bounded_schema(schema)
    if native_available():
        try:
            converter.native |= prefixed_rules(schema_grammar(cleaned), name)
            return f"{name}-root"
        except ValueError:
            pass
    try:
        if len(json.dumps(cleaned)) > MAX_SCHEMA_CHARS:
            raise ValueError("schema too large")
        trial = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        trial.visit(trial.resolve_refs(json.loads(json.dumps(cleaned)), name), name)
        resolved = converter.resolve_refs(json.loads(json.dumps(cleaned)), name)
        return str(converter.visit(resolved, name))
    except Exception:
        return str(converter.visit(dict(fallback), f"{name}-any"))


def _triggers(
    fmt: ToolFormat, think_close: str, think_open: str, starts_inside: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Auto mode's (patterns, tokens)."""
    marker = _trigger_marker(fmt)
    if fmt.family == "llama3":
        found: tuple[str, ...] = (r"^\s*(\{)",)  # only a reply that starts with a JSON object
        markers: Sequence[str] = ("<|python_tag|>",)
    else:
        found, markers = (), (marker,)
    alts = "|".join(re.escape(m) for m in markers)
    if not think_close:
        tokens = tuple(m for m in markers if m in fmt.marker_tokens)
        return (*found, f"({alts})"), tokens
    close = re.escape(think_close)
    after_close = f"{close}[\\s\\S]*?({alts})"
    if starts_inside or not think_open:
        return (after_close,), ()
    # No block was opened at the start of the reply, or it has closed.
    never_opened = f"^(?!\\s*{re.escape(think_open)})[\\s\\S]*?({alts})"
    return (*found, never_opened, after_close), ()


def _trigger_marker(fmt: ToolFormat) -> str:
    if fmt.family == "gpt_oss":
        return "<|channel|>commentary to=functions."
    return fmt.open


def _lit(text: str) -> str:
    """A GBNF string literal."""
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def _gbnf(root: str, rules: dict[str, str], converter: _Converter) -> str:
    lines = [f"root ::= {root}"]
    lines += [f"{k} ::= {v}" for k, v in {**rules, **_RULES_TAIL, **converter.native}.items()]
    theirs = converter.format_grammar()
    lines.append(theirs)
    if not re.search(r"^space ::=", theirs, re.M):  # the call rules' own whitespace
        lines.append(f"space ::= {_SPACE}")
    return "\n".join(lines) + "\n"


def native_grammar(
    formatted: FormattedChat, forced: bool = False, parallel: bool = True
) -> ToolGrammar | None:
    """The grammar llama.cpp's chat layer made for a request, armed as llama.cpp's
    sampler arms it (``common_sampler_init``): a word is searched for, a full pattern
    must match everything generated so far, and an eager grammar starts with the
    generation prompt, which it is fed first (``prefill``). Unlike llama.cpp, which
    keeps a lazy grammar asleep inside thinking with its reasoning-budget sampler, a
    word here counts only after the thinking block ended (or never opened); and not
    ``parallel``, one call block where llama.cpp's repeats it."""
    if not formatted.grammar:
        return None
    grammar = formatted.grammar if parallel else _one_call(formatted.grammar)
    patterns: list[str] = []
    for trigger in formatted.triggers:
        if trigger.kind == TriggerKind.WORD:
            patterns += _after_thinking(formatted, re.escape(trigger.value))
        elif trigger.kind == TriggerKind.PATTERN:
            patterns.append(trigger.value)
        elif trigger.kind == TriggerKind.PATTERN_FULL:
            value = trigger.value
            patterns.append(
                f"{'' if value.startswith('^') else '^'}{value}{'' if value.endswith('$') else '$'}"
            )
    if formatted.grammar_lazy:
        return ToolGrammar(grammar, tuple(patterns), (), lazy=True)
    gbnf = _call_at_once(grammar) if forced else grammar
    return ToolGrammar(gbnf, (), (), lazy=False, prefill=formatted.generation_prompt)


_RULE_START = re.compile(r'^(tool-calls|tool-call) ::= \(?"((?:[^"\\]|\\.)*)"', re.MULTILINE)


def call_openers(formatted: FormattedChat) -> tuple[str, ...]:
    """How a call starts in ``formatted``'s format: its trigger words and the first
    literal of its call rule (``"<tool_call>\\n"``, ``"[TOOL_CALLS]"``), ends stripped."""
    words = [t.value for t in formatted.triggers if t.kind == TriggerKind.WORD]
    for m in _RULE_START.finditer(formatted.grammar):
        words.append(json.loads(f'"{m.group(2)}"'))
    return tuple(dict.fromkeys(w.strip() for w in words if w.strip()))


# llama.cpp's Hermes-shaped formats (Qwen 2.5/3, QwQ, Hermes, Granite 4: 11 of the corpus)
# repeat the call block whatever ``parallel_tool_calls`` says: the model writes a second
# call that is then dropped, and its tokens must be taken back out of the cache.
_REPEATED_CALLS = "tool-calls ::= (tool-call space)+"


def _one_call(gbnf: str) -> str:
    single = "tool-calls ::= tool-call space"
    return "\n".join(single if line == _REPEATED_CALLS else line for line in gbnf.splitlines())


_CALL_WS = "lamplight-call-ws"  # whitespace before a forced call (the thinking's close)
_UNTIL = re.compile(r"(?<![\w-])until-\d+\??(?![\w-])")


def _call_at_once(gbnf: str) -> str:
    """``gbnf`` with the free-text runs (``until-N``) at the top level of its root removed;
    those inside parentheses (a thinking block, a channel) stay."""
    lines = gbnf.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("root ::= "):
            lines[i] = "root ::= " + _top_level_sub(line[len("root ::= ") :])
    lines.append(f"{_CALL_WS} ::= [ \\t\\n]{{0,8}}")
    return "\n".join(lines) + "\n"


def _top_level_sub(body: str) -> str:
    out: list[str] = []
    depth, plain, i = 0, "", 0

    def flush() -> None:
        nonlocal plain
        out.append(_UNTIL.sub(f" {_CALL_WS} ", plain) if depth == 0 else plain)
        plain = ""

    while i < len(body):
        c = body[i]
        if c in '"[':  # a literal or a character class: copied whole
            flush()
            close, j = ('"' if c == '"' else "]"), i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i : j + 1])
            i = j + 1
            continue
        if c in "()":
            flush()
            depth += 1 if c == "(" else -1
            out.append(c)
        else:
            plain += c
        i += 1
    flush()
    return "".join(out)


def _after_thinking(formatted: FormattedChat, word: str) -> list[str]:
    """Patterns for ``word`` outside the thinking block (see ``_triggers``)."""
    ends = [e for e in formatted.thinking_ends if e.strip()]
    start = formatted.thinking_start.strip()
    if not ends or not start or any(re.escape(e.strip()) == word.strip() for e in ends):
        return [word]  # no block, or a call ends it (Qwen3.5's thinking may close on one)
    out = [f"{re.escape(e)}[\\s\\S]*?({word})" for e in ends]
    if not formatted.generation_prompt.rstrip().endswith(start):
        out.append(f"^(?!\\s*{re.escape(start)})[\\s\\S]*?({word})")
    return out
