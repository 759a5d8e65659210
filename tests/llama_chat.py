"""llama.cpp's chat-layer cases (``tests/data/llama_chat``, written by
``packaging/llama_chat_goldens.py``) and its way of comparing a parsed reply."""

from __future__ import annotations

import datetime
import json
import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.engine.chat_format.native import NativeFormatter
    from app.engine.chat_format.reply import ParsedReply
    from app.engine.native.chat_shim import ChatShim
    from app.engine.native.chat_worker import ChatWorker

DATA = Path(__file__).parent / "data" / "llama_chat"
TEMPLATES = DATA / "templates"
FIXED_NOW = 1767225600  # the date the cases were dumped with (2026-01-01)
R1_DISTILL = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"  # opens thinking, no switch


def shim_path() -> Path | None:
    """``LAMPLIGHT_CHAT_SHIM`` (a shim built by hand, while developing), else the build's."""
    found = os.environ.get("LAMPLIGHT_CHAT_SHIM")
    return Path(found) if found else None


@cache
def _rows(name: str) -> tuple[dict[str, Any], ...]:
    text = (DATA / name).read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def parse_cases() -> tuple[dict[str, Any], ...]:
    return _rows("cases.jsonl")


def generation_prompt_cases() -> tuple[dict[str, Any], ...]:
    return _rows("generation_prompts.jsonl")


def schema_cases() -> tuple[dict[str, Any], ...]:
    return _rows("schema_to_grammar.jsonl")


@cache
def template_source(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def case_id(case: dict[str, Any], index: int) -> str:
    return f"{index:03d}-{case['template'].removesuffix('.jinja')}"


DUMPED_ON = datetime.date(2026, 11, 29)  # the dump's templates wrote this as "today"
# The corpus templates' strftime_now formats, and chat.cpp's ``datetime`` variable's.
_DATE_FORMATS = ("%Y-%m-%d", "%B %d, %Y", "%d %b %Y", "%b %d %Y")


def undated(text: str) -> str:
    """``text`` with the dates templates write with ``strftime_now`` replaced by one
    placeholder: the dump holds the day it was made, a run its own (or yesterday's,
    across midnight), as llama.cpp's templates read the clock."""
    today = datetime.date.today()
    for day in (DUMPED_ON, today, today - datetime.timedelta(days=1)):
        for fmt in _DATE_FORMATS:
            text = text.replace(day.strftime(fmt), "<date>")
    return text


def request(case: dict[str, Any]) -> dict[str, Any]:
    """The case's request as the shim reads it (the dump's date)."""
    return {**case["inputs"], "now": FIXED_NOW}


def comparable(msg: dict[str, Any]) -> dict[str, Any]:
    """What ``assert_msg_equals`` (tests/test-chat.cpp) compares: content and reasoning
    with the ends' whitespace stripped, each call's name, id and arguments as JSON."""
    calls = []
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments") or ""
        try:
            args = json.loads(args) if args else args
        except ValueError:
            args = ""  # renormalize_json: partial JSON is left out of the comparison
        calls.append({"name": fn.get("name", ""), "arguments": args, "id": call.get("id", "")})
    return {
        "content": _text(msg.get("content")).strip(),
        "reasoning_content": _text(msg.get("reasoning_content")).strip(),
        "tool_calls": calls,
    }


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def grammar_trim(text: str) -> str:
    """tests/test-json-schema-to-grammar.cpp's ``trim``: ends and each line's indent."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def utf8_prefixes(text: str) -> list[str]:
    """Every prefix of ``text`` at a byte, cut back to whole characters (as test-chat)."""
    raw = text.encode("utf-8")
    seen: list[str] = []
    for end in range(1, len(raw) + 1):
        prefix = raw[:end].decode("utf-8", "ignore")
        if not seen or prefix != seen[-1]:
            seen.append(prefix)
    return seen


def read_streamed(fmt: NativeFormatter, case: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The case's reply read by the seam, fed at every split (each partial parse must not
    fail), as an OpenAI message; and whether the final text matched the format."""
    parser = fmt.parser(fmt.apply(request(case)))
    try:
        for prefix in utf8_prefixes(case["input"])[:-1]:
            parser.update(prefix)
        got = parser.finish(case["input"], cut=case["is_partial"])
    finally:
        parser.close()
    return message(got), got.matched


def message(got: ParsedReply) -> dict[str, Any]:
    """A reply the seam read, as an OpenAI message (what ``comparable`` takes)."""
    calls = [
        {"function": {"name": c.name, "arguments": c.arguments}, "id": c.id} for c in got.calls
    ]
    return {"content": got.content, "reasoning_content": got.reasoning, "tool_calls": calls}


def formatter(
    cache: dict[str, NativeFormatter], name: str, shim: ChatShim, worker: ChatWorker
) -> NativeFormatter:
    """The corpus template ``name``'s formatter, made once per ``cache``."""
    if name not in cache:
        from app.engine.chat_format.native import NativeFormatter

        cache[name] = NativeFormatter(template_source(name), worker=worker, shim=shim)
    return cache[name]


def one_per_template() -> list[tuple[int, dict[str, Any]]]:
    """For each corpus template, its richest case a client of the llama-server backend can
    ask for: one user message, a whole reply, no template kwargs or schema; with thinking
    parsed out (the backend's ``deepseek``/``auto`` reading) unless the case expects none.
    Calls and thinking first, then the shortest reply (each costs server time)."""
    best: dict[str, tuple[tuple[bool, bool, int], int]] = {}
    for index, case in enumerate(parse_cases()):
        inputs, expect = case["inputs"], case["expect"]
        if (
            len(inputs["messages"]) != 1
            or case["is_partial"]
            or inputs["chat_template_kwargs"]
            or inputs["json_schema"]
            or inputs["continue_final_message"]
            or (inputs["reasoning_format"] == "none" and expect.get("reasoning_content"))
        ):
            continue
        key = (
            bool(expect.get("tool_calls")),
            bool(expect.get("reasoning_content")),
            -len(case["input"]),
        )
        if case["template"] not in best or key > best[case["template"]][0]:
            best[case["template"]] = (key, index)
    return [(i, parse_cases()[i]) for _key, i in sorted(best.values(), key=lambda b: b[1])]


def gbnf_literal(text: str) -> str:
    """A grammar that takes exactly ``text`` (GBNF reads UTF-8 in its literals)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return 'root ::= "' + "".join(escapes.get(ch, ch) for ch in text) + '"'
