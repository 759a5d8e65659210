"""How one model family writes tool calls, and which family a chat template uses.

The shapes follow llama.cpp's ``common/chat.cpp``:

- ``hermes`` (Hermes 2 Pro, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": .., "arguments":
  {..}}\\n</tool_call>``, one block per call;
- ``qwen3_coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>
  \\n</function>\\n</tool_call>``;
- ``llama3`` (3.1-3.3): the whole reply is ``{"name": .., "parameters": {..}}``, or
  ``<|python_tag|>`` and the same JSON;
- ``mistral``: ``[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ..}]`` or the newer
  ``[TOOL_CALLS]NAME[ARGS]{..}``;
- ``gpt_oss``: ``<|start|>assistant<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{..}<|call|>``;
- ``deepseek`` (R1, V3, V3.1): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
  <｜tool▁sep｜>NAME\\n```json\\n{..}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>``;
- ``generic``: a template with no tool support; the prompt asks for the hermes shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.templates.chat_template import ChatTemplate

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


@dataclass(frozen=True)
class ToolFormat:
    """One family's call syntax.

    ``opens``: the markers a call may start with (the parser's triggers); ``close``:
    the marker that ends one call ("" when the call ends with its JSON); ``bare_json``:
    a reply that starts with ``{`` may be a call (llama3); ``native``: the template
    knows the format (False: the generic fallback the prompt asks for);
    ``marker_tokens``: which of the markers are single tokens of the model's vocabulary
    (grammar token triggers; filled in by ``detect_tool_format``); ``by_llama``:
    llama.cpp's chat layer reads the calls (the family is then only the fallback for a
    reply llama.cpp did not render).
    """

    family: str
    native: bool
    opens: tuple[str, ...]
    close: str = ""
    bare_json: bool = False
    marker_tokens: tuple[str, ...] = ()
    by_llama: bool = False

    @property
    def label(self) -> str:
        """Who reads the calls, as the model's info names it."""
        return "llama.cpp" if self.by_llama else self.family

    @property
    def open(self) -> str:
        """The marker the grammar writes to start a call."""
        return self.opens[0] if self.opens else ""

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker of a call (those a vocabulary may have as control tokens)."""
        extra = {
            "mistral": ("[ARGS]", "[CALL_ID]"),
            "gpt_oss": ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"),
            "deepseek": (DS_CALL_END, DS_SEP),
        }.get(self.family, ())
        return tuple(m for m in (*self.opens, self.close, *extra) if m)


HERMES = ToolFormat("hermes", True, ("<tool_call>",), "</tool_call>")
QWEN3_CODER = ToolFormat("qwen3_coder", True, ("<tool_call>", "<function="), "</tool_call>")
LLAMA3 = ToolFormat("llama3", True, ("<|python_tag|>",), "", bare_json=True)
MISTRAL = ToolFormat("mistral", True, ("[TOOL_CALLS]",))
GPT_OSS = ToolFormat(
    "gpt_oss",
    True,
    # The reasoning splitter may eat a header's leading ``<|start|>assistant<|channel|>``
    # (it looks like the final channel's lead), so a bare ``commentary to=`` opens too.
    ("<|start|>assistant", "<|channel|>commentary", "commentary to=functions."),
    "<|call|>",
)
DEEPSEEK = ToolFormat("deepseek", True, (DS_CALLS_BEGIN, DS_CALL_BEGIN), DS_CALLS_END)
GENERIC = ToolFormat("generic", False, ("<tool_call>",), "</tool_call>")

FAMILIES: dict[str, ToolFormat] = {
    f.family: f for f in (HERMES, QWEN3_CODER, LLAMA3, MISTRAL, GPT_OSS, DEEPSEEK, GENERIC)
}

# Markers that are single control tokens in the families' vocabularies.
_TOKEN_MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|call|>",
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_SEP,
)


def _family(source: str, has_token: Callable[[str], bool]) -> str:
    if DS_CALLS_BEGIN in source or DS_CALL_BEGIN in source:
        return "deepseek"
    if "<function=" in source and "<parameter=" in source:
        return "qwen3_coder"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|channel|>" in source and ("to=functions" in source or "<|call|>" in source):
        return "gpt_oss"
    if "<|python_tag|>" in source or ("<|start_header_id|>" in source and "ipython" in source):
        return "llama3"
    # The template renders tools in a shape of its own: a vocabulary built for one
    # family still tells which.
    for marker, family in (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral")):
        if _safe(has_token, marker):
            return family
    return "generic"


def _safe(has_token: Callable[[str], bool], text: str) -> bool:
    try:
        return bool(has_token(text))
    except Exception:
        return False


def template_tool_format(template: ChatTemplate, has_token: Callable[[str], bool]) -> ToolFormat:
    """How ``template``'s model writes calls. Where llama.cpp renders the template, llama.cpp
    says whether it takes tools (it renders it with and without them and compares: Gemma 4,
    DeepSeek V3.1+, Kimi, MiniMax, Command R7B... whose sources the word test below misses);
    the family found here then only reads a reply llama.cpp did not render."""
    native = template.native
    if native is None:
        return detect_tool_format(template.source, has_token)
    if not native.formatter.takes_tools():
        return detect_tool_format("", has_token)  # the generic form
    found = detect_tool_format(template.source, has_token, gated=False)
    fallback = found if found.native else replace(HERMES, marker_tokens=found.marker_tokens)
    return replace(fallback, by_llama=True)


def detect_tool_format(
    source: str, has_token: Callable[[str], bool], gated: bool = True
) -> ToolFormat:
    """The family a chat template's ``source`` writes calls in; ``has_token(text)``: the
    model's vocabulary has ``text`` as one token. A template that never mentions
    ``tools`` (or none at all) gets the generic fallback (unless not ``gated``: llama.cpp
    found that it takes them)."""
    mentions = bool(source) and ("tools" in source or not gated)
    family = _family(source, has_token) if mentions else "generic"
    fmt = FAMILIES[family]
    tokens = tuple(m for m in _TOKEN_MARKERS if m in fmt.markers and _safe(has_token, m))
    return replace(fmt, marker_tokens=tokens)
