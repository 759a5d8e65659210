"""The loaded model's chat template: the one in use, the ones built for it, and the
request's binding (thinking switches and tools), with what follows from them: stop
tokens, thinking marker tokens, the tool-call format and the notes to show."""

from __future__ import annotations

import logging
from collections.abc import Callable
from threading import Event

from app.config.setting_records import SamplingParams
from app.engine.local.vocab import Vocab
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import AUTO as AUTO_TEMPLATE
from app.engine.templates.override import TemplateInputs, TemplateOverride, build_template
from app.engine.templates.thinking import ThinkingControl, marker_ids, request_template
from app.engine.tool_spec import ToolRequest
from app.engine.tools.binding import ToolDecoding, bind_tools, tool_decoding
from app.engine.tools.format import ToolFormat, template_tool_format
from app.engine.tools.native_reply import native_reply

log = logging.getLogger(__name__)

_BUILT_KEPT = 16  # templates built per load before the custom ones are forgotten


class TemplateState:
    """One model's templates: ``template`` (the one chosen), ``bound`` (it with the last
    request's switches and tools), ``stop_ids`` and ``markers`` (its token ids)."""

    def __init__(
        self,
        inputs: TemplateInputs,
        auto: tuple[ChatTemplate, frozenset[int]],
        vocab: Vocab,
        tokenize: Callable[[str], list[int]],
        guard_notes: tuple[str, ...],
    ) -> None:
        self.inputs = inputs  # what the model's templates are made from
        self._vocab = vocab
        self._tokenize = tokenize  # prompt text, no BOS
        self._guard_notes = guard_notes  # native paths off on this machine
        # Built by choice: the API server swaps between the window's choice and its own
        # per request, so each is built once per load.
        self._built: dict[TemplateOverride, tuple[ChatTemplate, frozenset[int]]] = {
            AUTO_TEMPLATE: auto
        }
        self.template, self.stop_ids = auto  # stop_ids: its stop strings that have no text
        self.notes: tuple[str, ...] = ()
        # The template with the last request's thinking switches bound (``request_template``):
        # every render for that request, and the next turn's prewarm, use it.
        self.bound: ChatTemplate | None = None
        self.markers: frozenset[int] = frozenset()
        self.tools: ToolRequest | None = None  # the last request's tools (bound in ``bound``)
        # For a reply llama.cpp parses: the control tokens it must see as text, its stops.
        self.special_ids: frozenset[int] = frozenset()
        self.extra_stops: tuple[str, ...] = ()
        self.use(*auto)

    def build(self, override: TemplateOverride) -> tuple[ChatTemplate, frozenset[int]]:
        """The template ``override`` chooses, and its stop tokens (built once)."""
        built = self._built.get(override)
        if built is None:
            template = build_template(override, self.inputs, self._vocab.is_special)
            built = (template, self._vocab.stop_tokens(template.stop_strings))
            if len(self._built) >= _BUILT_KEPT:  # a custom template edited many times
                self._built = {k: v for k, v in self._built.items() if k == AUTO_TEMPLATE}
            self._built[override] = built
        return built

    def use(self, template: ChatTemplate, stop_ids: frozenset[int] | None = None) -> None:
        """Render with ``template`` from the next request on (its binding is dropped)."""
        self.template = template
        self.bound = None
        self.markers = marker_ids(template.reasoning, self._tokenize)
        self.stop_ids = (
            stop_ids if stop_ids is not None else self._vocab.stop_tokens(template.stop_strings)
        )
        self.notes = (*self._guard_notes, *((template.note,) if template.note else ()))
        for note in self.notes:
            log.warning("%s", note)

    def start(self, params: SamplingParams, tools: ToolRequest | None) -> None:
        """Bind a request's switches and ``tools`` to the template in use."""
        self.tools = tools
        self.bound = self.bind(self.template, params)

    def bind(self, template: ChatTemplate, params: SamplingParams) -> ChatTemplate:
        """``template`` with the request's thinking switches and tools bound."""
        return bind_tools(request_template(template, params), self.tools, self.tool_format)

    def bound_for(self, params: SamplingParams, tools: ToolRequest | None) -> ChatTemplate:
        """The template in use as a request with ``params`` and ``tools`` binds it,
        without making it the one renders use."""
        return bind_tools(request_template(self.template, params), tools, self.tool_format)

    @property
    def rendering(self) -> ChatTemplate:
        """The template renders use: the last request's, switches bound."""
        return self.bound or self.template

    def tool_format(self, template: ChatTemplate) -> ToolFormat:
        """How ``template``'s model writes tool calls (the generic form when it knows none)."""
        return template_tool_format(template, self._vocab.is_special)

    def native_reply(
        self, tools: ToolRequest | None, prompt: str, params: SamplingParams, end: Event | None
    ) -> tuple[ThinkingControl, ToolDecoding | None] | None:
        """The reply's thinking and calls read by llama.cpp's parser, when llama.cpp
        rendered ``prompt``; None otherwise (the Python parsers read it)."""
        found = None
        if not self.rendering.completion:
            found = native_reply(self.rendering, tools, prompt, params, end)
        if found is None:
            # The Python parser reads the calls: their markers as text (a control token,
            # Mistral's [TOOL_CALLS] say, is otherwise written as nothing).
            calls = tools is not None and tools.active and not self.rendering.completion
            markers = self.tool_format(self.rendering).markers if calls else ()
            self.special_ids = frozenset(i for i in map(self._one, markers) if i is not None)
            self.extra_stops = ()
            return None
        ids = (self._one(t) for t in found.preserved)
        self.special_ids = frozenset(i for i in ids if i is not None)
        self.extra_stops = found.stops
        return found.thinking, found.tools

    def _one(self, text: str) -> int | None:
        """The id of the one token ``text`` is, if it is one."""
        ids = self._tokenize(text)
        return ids[0] if len(ids) == 1 else None

    def calls(self, tools: ToolRequest | None, prompt: str) -> ToolDecoding | None:
        """The reply's tool parser and grammar (none when continuing text: no tools shown)."""
        template = self.rendering
        if template.completion:
            return None
        return tool_decoding(self.tool_format(template), tools, template.reasoning, prompt)
