"""How a chat template marks a reply's thinking, found by rendering it.

Like llama.cpp's auto-parser, the markers come from diffing renders: an assistant
turn rendered with ``reasoning_content`` against the same turn without it. Templates
that draw the thinking block even when it is empty (Qwen3) or that never render past
thinking (DeepSeek-R1 distills) leave no difference: then a known marker pair found
in the template's source, or among the vocabulary's control tokens, is used. More
renders tell whether the generation prompt opens the block (the reply starts inside
it), which switches the template reads (``enable_thinking``, ``thinking``,
``reasoning_effort``) and whether past turns keep their thinking.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.chat_message import ChatMessage
from app.engine.context_map import common_prefix
from app.engine.template_errors import ChatTemplateError

Render = Callable[[Sequence[ChatMessage], bool, Mapping[str, Any] | None], str]

# Marker pairs of the families in use (open, close, what follows close before the answer).
KNOWN: tuple[tuple[str, str, str], ...] = (
    ("<think>", "</think>", ""),
    ("<|channel|>analysis<|message|>", "<|end|>", "<|start|>assistant<|channel|>final<|message|>"),
    ("[THINK]", "[/THINK]", ""),
    ("<|START_THINKING|>", "<|END_THINKING|>", ""),
    ("<seed:think>", "</seed:think>", ""),
    ("<thinking>", "</thinking>", ""),
    ("◁think▷", "◁/think▷", ""),
)
# Words no template writes, to find in renders.
_USER, _THOUGHT, _ANSWER, _USER2 = "Q7xUserAsks", "Q7xModelThinks", "Q7xModelAnswers", "Q7xMore"
_MARKER_LIMIT = 80  # longer "markers" are a template's prose, not a marker
_SWITCHES = ("enable_thinking", "thinking")
_TAG = re.compile(r"(<\|?[^<>\s]{1,40}\|?>|\[/?[A-Z_]{2,20}\]|◁/?[a-z]{2,10}▷)")


@dataclass(frozen=True)
class ReasoningFormat:
    """How one template's replies mark their thinking.

    ``open``/``close``: the markers; ``close_text``: what the template writes from the
    end of the thinking to the answer (``"\\n</think>\\n\\n"``), which the engine feeds
    when it ends the thinking itself; ``answer_lead``: header text between the close
    marker and the answer that is not the answer (gpt-oss's final-channel header).
    ``prefilled``: the generation prompt opens the block, so a reply starts inside it.
    ``switch``: the template variable that turns thinking on and off ("" for none);
    ``effort``: it reads ``reasoning_effort``; ``keeps_past``: earlier turns' thinking
    stays in the history it renders.
    """

    open: str
    close: str
    close_text: str = ""
    answer_lead: str = ""
    prefilled: bool = False
    switch: str = ""
    effort: bool = False
    keeps_past: bool = False
    source: str = "template"  # "template" (diffed renders), "known" (source), "vocab"

    @property
    def name(self) -> str:
        return "gpt-oss channels" if "<|channel|>" in self.open else f"{self.open} tags"

    def closing(self) -> str:
        """The text that ends a thinking block and leads into the answer."""
        return (self.close_text or f"\n{self.close}\n\n") + self.answer_lead

    def empty_block(self) -> str:
        """A thinking block with nothing in it: a prompt ending so the model answers at once."""
        return f"{self.open}\n{self.closing().lstrip()}" if not self.answer_lead else ""

    def extra(self, thinking: str, effort: str) -> dict[str, Any]:
        """Template variables for ``thinking`` ("auto", "on", "off") and ``effort``."""
        out: dict[str, Any] = {}
        if self.switch and thinking in ("on", "off"):
            out[self.switch] = thinking == "on"
        if self.effort and effort:
            out["reasoning_effort"] = effort
        return out


def _try(render: Render, messages: Sequence[ChatMessage], gen: bool, extra: Any = None) -> str:
    try:
        return render(messages, gen, extra)
    except ChatTemplateError:
        return ""


def _diffed(with_r: str, without: str) -> tuple[str, str] | None:
    """(text before the thinking, text after it) where only ``with_r`` has it."""
    i = with_r.find(_THOUGHT)
    if i < 0:
        return None
    p = min(common_prefix(with_r, without), i)
    s = common_prefix(with_r[::-1], without[::-1])
    end = max(i + len(_THOUGHT), len(with_r) - s)
    # The shared ends may take a marker's bracket with them ("[/THINK" + "]" shared
    # with "[/INST]"): give a marker back its bracket.
    while end < len(with_r) and _unclosed(with_r[i + len(_THOUGHT) : end]):
        end += 1
    while p > 0 and _unopened(with_r[p:i]):
        p -= 1
    before, after = with_r[p:i], with_r[i + len(_THOUGHT) : end]
    if not before.strip() or not after.strip():
        return None
    if len(before.strip()) > _MARKER_LIMIT or len(after.strip()) > _MARKER_LIMIT:
        return None
    return before, after


def _unclosed(text: str) -> bool:
    return text.count("[") > text.count("]") or text.count("<") > text.count(">")


def _unopened(text: str) -> bool:
    return text.count("]") > text.count("[") or text.count(">") > text.count("<")


def _known(text: str) -> tuple[str, str, str] | None:
    return next((k for k in KNOWN if k[0] in text and k[1] in text), None)


def _close_text(rendered: str, close: str) -> str:
    """The close marker with the whitespace the template puts around it."""
    i = rendered.find(_THOUGHT)
    j = rendered.find(close, i) if i >= 0 else -1
    if j < 0:
        return ""
    lead = rendered[i + len(_THOUGHT) : j]
    k = j + len(close)
    trail = rendered[k:]
    trail = trail[: len(trail) - len(trail.lstrip())]
    return (lead if not lead.strip() else "") + close + trail


def detect_reasoning(
    render: Render, source: str = "", has_token: Callable[[str], bool] | None = None
) -> ReasoningFormat | None:
    """The template's reasoning format, or None when it shows no sign of thinking.

    ``render`` is the template's; ``source`` its text (where marker pairs are looked
    for when renders do not show them); ``has_token`` tells which texts are single
    tokens of the model's vocabulary (a model with ``<think>`` tokens thinks).
    """
    user = ChatMessage("user", _USER)
    thought = ChatMessage("assistant", _ANSWER, _THOUGHT)
    with_r = _try(render, [user, thought], False)
    without = _try(render, [user, ChatMessage("assistant", _ANSWER)], False)
    diff = _diffed(with_r, without)
    how = "template"
    lead = ""
    if diff is not None:
        open_, close = diff[0].strip(), diff[1].strip()
        tags = _TAG.findall(diff[1])
        if tags and len(close) > len(tags[0]) and _ANSWER not in diff[1]:
            # gpt-oss style: "<|end|><|start|>assistant<|channel|>final<|message|>"
            close, lead = tags[0], diff[1].strip()[len(tags[0]) :]
        close_text = diff[1] if not lead else close
    else:
        known = _known(source) or _known(with_r)
        if known is None and has_token is not None:
            known = next((k for k in KNOWN if has_token(k[0]) and has_token(k[1])), None)
            how = "vocab"
        elif known is not None:
            how = "known"
        if known is None:
            return None
        open_, close, lead = known
        close_text = _close_text(with_r, close)
    gen = _try(render, [user], True)
    prefilled = bool(gen) and gen.rstrip().endswith(open_)
    switch = ""
    for name in _SWITCHES:
        if name in source or not source:
            on = _try(render, [user], True, {name: True})
            off = _try(render, [user], True, {name: False})
            if on and off and on != off:
                switch = name
                break
    low = _try(render, [user], True, {"reasoning_effort": "low"})
    high = _try(render, [user], True, {"reasoning_effort": "high"})
    effort = bool(low) and low != high
    past = _try(render, [user, thought, ChatMessage("user", _USER2)], True)
    return ReasoningFormat(
        open=open_,
        close=close,
        close_text=close_text,
        answer_lead=lead,
        prefilled=prefilled,
        switch=switch,
        effort=effort,
        keeps_past=_THOUGHT in past,
        source=how,
    )
