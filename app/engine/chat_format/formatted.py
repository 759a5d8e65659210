"""What llama.cpp's ``common_chat_templates_apply`` gives for one request."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class TriggerKind(enum.IntEnum):
    """``common_grammar_trigger_type``: what wakes a lazy grammar."""

    TOKEN = 0
    WORD = 1
    PATTERN = 2  # a regex found anywhere in the output
    PATTERN_FULL = 3  # a regex the whole output so far must match


@dataclass(frozen=True)
class Trigger:
    kind: TriggerKind
    value: str


@dataclass(frozen=True)
class FormattedChat:
    """The prompt and everything the reply's decoding and parsing need."""

    format_id: int  # common_chat_format: how the parser maps its tree
    format_name: str  # "peg-native", "peg-gemma4", "Content-only"...
    prompt: str
    generation_prompt: str  # the part after the last message (where the reply starts)
    grammar: str  # GBNF; '' when the reply is free
    grammar_lazy: bool  # the grammar applies from the first trigger on
    triggers: tuple[Trigger, ...]
    preserved_tokens: tuple[str, ...]  # control tokens the parser must see as text
    stops: tuple[str, ...]  # extra stop strings
    supports_thinking: bool
    thinking_start: str
    thinking_ends: tuple[str, ...]
    parser_spec: str  # the PEG arena, as JSON text

    @classmethod
    def from_shim(cls, d: dict[str, Any]) -> FormattedChat:
        triggers = []
        for t in d.get("grammar_triggers") or []:
            try:
                triggers.append(Trigger(TriggerKind(int(t["type"])), str(t["value"])))
            except (KeyError, ValueError, TypeError):
                continue
        return cls(
            format_id=int(d.get("format", 0)),
            format_name=str(d.get("format_name", "")),
            prompt=str(d.get("prompt", "")),
            generation_prompt=str(d.get("generation_prompt", "")),
            grammar=str(d.get("grammar", "")),
            grammar_lazy=bool(d.get("grammar_lazy", False)),
            triggers=tuple(triggers),
            preserved_tokens=tuple(str(t) for t in d.get("preserved_tokens") or ()),
            stops=tuple(str(s) for s in d.get("additional_stops") or ()),
            supports_thinking=bool(d.get("supports_thinking", False)),
            thinking_start=str(d.get("thinking_start_tag", "")),
            thinking_ends=tuple(str(s) for s in d.get("thinking_end_tags") or ()),
            parser_spec=str(d.get("parser", "")),
        )
