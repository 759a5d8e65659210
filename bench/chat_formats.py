"""llama.cpp's chat-layer cases: the Python port against llama.cpp's own layer, per template.

    .venv/bin/python bench/chat_formats.py    # prints one JSON object

For each case of ``tests/data/llama_chat/cases.jsonl`` (llama.cpp's ``test-chat.cpp``),
the reply is read two ways and compared with what llama.cpp expects (content, reasoning,
tool names, arguments and ids, as ``assert_msg_equals`` compares them):

- ``python``: the Python port as it stood before the seam (issue 42): the template in the
  jinja2 sandbox, its thinking markers from ``detect_reasoning``, the call family from
  ``detect_tool_format``, the reply through ``ReasoningSplitter`` and ``ToolCallParser``;
- ``llama``: the chat-format seam (llama.cpp's layer through the shim), streamed.

No timing: this counts agreements. The baseline is the Python port, in the same run.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine.chat_format.native import NativeFormatter
from app.engine.reasoning.splitter import ReasoningSplitter
from app.engine.template_errors import ChatTemplateError
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.jinja_template import sandboxed_template
from app.engine.templates.thinking import starts_inside
from app.engine.tools.format import detect_tool_format
from app.engine.tools.parser import ToolCallParser
from tests import llama_chat


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


def main() -> None:
    per: dict[str, dict[str, int]] = defaultdict(lambda: {"cases": 0, "python": 0, "llama": 0})
    sandboxed: dict[str, ChatTemplate | None] = {}
    native: dict[str, NativeFormatter] = {}
    for case in llama_chat.parse_cases():
        name = case["template"]
        if name not in sandboxed:
            source = llama_chat.template_source(name)
            try:
                sandboxed[name] = sandboxed_template(source, "", "")
            except ChatTemplateError:
                sandboxed[name] = None
            native[name] = NativeFormatter(source)
        want = llama_chat.comparable(case["expect"])
        row = per[name.removesuffix(".jinja")]
        row["cases"] += 1
        row["python"] += llama_chat.comparable(_python_reading(sandboxed[name], case)) == want
        seam, _matched = llama_chat.read_streamed(native[name], case)
        row["llama"] += llama_chat.comparable(seam) == want
    total = {k: sum(r[k] for r in per.values()) for k in ("cases", "python", "llama")}
    print(json.dumps({"bench": "chat_formats", "total": total, "per_template": per}))


if __name__ == "__main__":
    main()
