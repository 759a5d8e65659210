"""llama.cpp's chat-layer cases: the Python port against llama.cpp's own layer, per family.

    .venv/bin/python bench/chat_formats.py                # prints one JSON object
    .venv/bin/python bench/chat_formats.py --python-only  # the Python reading alone

For each case of ``tests/data/llama_chat/cases.jsonl`` (llama.cpp's ``test-chat.cpp``),
the reply is read two ways and compared with what llama.cpp expects (content, reasoning,
tool names, arguments and ids, as ``assert_msg_equals`` compares them):

- ``python``: the Python port as it stood before the seam (issue 42): the template in the
  jinja2 sandbox, its thinking markers from ``detect_reasoning``, the call family from
  ``detect_tool_format``, the reply through ``ReasoningSplitter`` and ``ToolCallParser``;
- ``llama``: the chat-format seam (llama.cpp's layer through the shim), streamed.

Per family (``FAMILIES``: the templates' vendors), three columns of cases: ``thinking``
(llama.cpp expects thinking apart), ``tools`` (it expects calls) and ``all``; each
``[passing with python, passing with llama, in scope]``. ``--python-only`` leaves out the
llama column, so the same script measures an older checkout (run it with that checkout's
``app`` first on ``sys.path``; it needs only the Python port).

No timing: this counts agreements. The baseline is the Python port, in the same run.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine.reasoning.splitter import ReasoningSplitter
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.thinking import starts_inside
from app.engine.tools.format import detect_tool_format
from app.engine.tools.parser import ToolCallParser
from tests import llama_chat

# A template's family: the first of these words in its lower-cased file name (the
# vendor's name before the base model's: a DeepSeek distill of Qwen is DeepSeek's).
FAMILIES = (
    "deepseek", "hermes", "firefunction", "functionary", "gemma", "glm", "kimi", "minimax",
    "cohere", "command", "granite", "lfm", "gpt-oss", "nemotron", "apriel", "seed-oss",
    "gigachat", "ling-", "spark", "stepfun", "reka", "mimo", "glimmer", "minicpm", "apertus",
    "bielik", "smollm", "phi-3", "laguna", "hy3", "solar", "rwkv",
    "qwq", "qwen", "ministral", "devstral", "mistral", "llama-3",
)  # fmt: skip
_SAME = {
    "ling-": "ling",
    "qwq": "qwen",
    "ministral": "mistral",
    "devstral": "mistral",
    "command": "cohere",
}


def family(template: str) -> str:
    name = template.lower()
    found = next((f for f in FAMILIES if f in name), name.removesuffix(".jinja"))
    return _SAME.get(found, found)


def _sandboxed(source: str) -> ChatTemplate:
    try:  # issue 42 named the sandbox's own constructor; before it, jinja_template was it
        from app.engine.templates.jinja_template import sandboxed_template as make
    except ImportError:
        from app.engine.templates.jinja_template import jinja_template as make
    return make(source, "", "")


def _python_reading(template: ChatTemplate | None, case: dict[str, Any]) -> dict[str, Any]:
    if template is None:
        return {"content": case["input"]}
    fmt = template.reasoning
    text = case["input"]
    thought, answer = "", text
    if fmt is not None:
        splitter = ReasoningSplitter(fmt, inside=starts_inside(fmt, case["result"]["prompt"]))
        parts = splitter.feed(text) + splitter.flush()
        thought = "".join(t for r, t in parts if r)
        answer = "".join(t for r, t in parts if not r)
    calls: list[dict[str, Any]] = []
    tools = case["inputs"].get("tools") or []
    if tools:
        family = detect_tool_format(template.source, lambda _t: False)
        names = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
        count = iter(range(1_000_000))
        parser = ToolCallParser(family, names, new_id=lambda: str(next(count)))
        answer = parser.feed(answer) + parser.finish()
        # Ids it made up are not the model's: compared as llama.cpp's (generated) ones.
        want = [c.get("id", "") for c in case["expect"].get("tool_calls") or []]
        calls = [
            {
                "function": {"name": c.name, "arguments": c.arguments},
                "id": want[i] if i < len(want) and c.id.startswith("call_") else c.id,
            }
            for i, c in enumerate(parser.calls)
        ]
    return {"content": answer, "reasoning_content": thought, "tool_calls": calls}


def main(python_only: bool = False) -> None:
    columns = ("thinking", "tools", "all")
    rows: dict[str, dict[str, list[int]]] = defaultdict(lambda: {c: [0, 0, 0] for c in columns})
    sandboxed: dict[str, ChatTemplate | None] = {}
    native: dict[str, Any] = {}
    for case in llama_chat.parse_cases():
        name = case["template"]
        if name not in sandboxed:
            source = llama_chat.template_source(name)
            try:
                sandboxed[name] = _sandboxed(source)
            except ChatTemplateError:
                sandboxed[name] = None
            if not python_only:
                from app.engine.chat_format.native import NativeFormatter

                native[name] = NativeFormatter(source)
        want = llama_chat.comparable(case["expect"])
        python = llama_chat.comparable(_python_reading(sandboxed[name], case)) == want
        llama = False
        if not python_only:
            seam, _matched = llama_chat.read_streamed(native[name], case)
            llama = llama_chat.comparable(seam) == want
        row = rows[family(name)]
        scopes = [want["reasoning_content"] != "", bool(want["tool_calls"]), True]
        for column, in_scope in zip(columns, scopes, strict=True):
            if in_scope:
                row[column][0] += python
                row[column][1] += llama
                row[column][2] += 1
    total = {c: [sum(r[c][i] for r in rows.values()) for i in range(3)] for c in columns}
    print(json.dumps({"bench": "chat_formats", "total": total, "per_family": rows}))


if __name__ == "__main__":
    main(python_only="--python-only" in sys.argv)
