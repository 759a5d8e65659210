"""The llama-server backend's side of the prompt driver (``app.engine.prompt.driver``):
this client renders the prompt (the same templates and sandbox as in-process), so it
holds the template in use (``ServerTemplates``); the driver's cache is the slot's
``ContextMap`` and ``/tokenize`` (``SlotCache``), which cannot shift on request (the
server re-reads), and whose next turn is read ahead by a ``/completion`` of no tokens.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.prompt.driver import Render, Warmup
from app.engine.prompt.overflow import Overflow
from app.engine.prompt.pipeline import LeastTokens, Prompt
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import (
    AUTO,
    TemplateInputs,
    TemplateOverride,
    build_template,
)
from app.engine.templates.thinking import request_template
from app.remote.llama_server.slot import Slot
from app.remote.llama_server.tokenizer import ServerTokenizer
from app.remote.llama_server.tools import ServerTools
from app.remote.server_link import ServerLink
from app.util.errors import ContextOverflowError, LamplightError, ServerOverflowError

log = logging.getLogger(__name__)


class ServerTemplates:
    """The template in use, and it with the request's switches bound (the driver's
    ``Templates``)."""

    def __init__(self, tokenizer: ServerTokenizer) -> None:
        self._tokenizer = tokenizer
        self._template: ChatTemplate | None = None
        self._bound: ChatTemplate | None = None  # the last request's, switches bound
        self._inputs = TemplateInputs()

    @property
    def inputs(self) -> TemplateInputs:
        return self._inputs

    @property
    def template(self) -> ChatTemplate:
        """The template in use (none bound)."""
        assert self._template is not None
        return self._template

    def connect(self, inputs: TemplateInputs) -> ChatTemplate:
        """A new server's template inputs; the template chosen automatically."""
        self._inputs = inputs
        template = build_template(AUTO, inputs, self._tokenizer.has_token)
        self._template, self._bound = template, None
        return template

    def clear(self) -> None:
        self._template = self._bound = None
        self._inputs = TemplateInputs()

    def choose(self, override: TemplateOverride) -> ChatTemplate:
        """Render with ``override`` from the next request on; the template it builds."""
        template = build_template(override, self._inputs, self._tokenizer.has_token)
        self.use(template)
        return template

    def use(self, template: ChatTemplate) -> None:
        self._template = template
        self._bound = None

    def start(self, params: SamplingParams, tools: ServerTools) -> None:
        """Bind a request's thinking switches and ``tools`` to the template in use."""
        self._bound = tools.bind(request_template(self.template, params))

    @property
    def rendering(self) -> ChatTemplate:
        """The template renders use: the last request's, its switches bound."""
        return self._bound or self.template

    def fall_back(self, fallback: ChatTemplate, params: SamplingParams) -> None:
        """The template in use failed: its fallback from now on, ``fallback`` (it bound)
        for this request."""
        if self.template.fallback is None:
            return
        self.use(self.template.fallback)
        self._bound = fallback

    def stop_strings(self) -> tuple[str, ...]:
        return self._template.stop_strings if self._template is not None else ()


class SlotCache:
    """The driver's ``PromptCache`` over the server's slot and ``/tokenize``."""

    refused: type[ContextOverflowError] = ServerOverflowError
    least_tokens: LeastTokens | None = None  # a request is not refused before ``/tokenize``

    def __init__(self, tokenizer: ServerTokenizer, slot: Slot, link: ServerLink) -> None:
        self._tokenizer = tokenizer
        self._slot = slot
        self._link = link

    @property
    def map(self) -> ContextMap:
        return self._slot.map

    def tokenize(self, text: str, bos: bool = False) -> list[int]:
        return self._tokenizer.tokenize(text, bos)

    def overflow(
        self, render: Render, messages: list[ChatMessage], policy: str, stop: threading.Event
    ) -> Overflow:
        return Overflow(
            render=render,
            tokenize=self._tokenizer.tokenize,
            cmap=ContextMap(),  # the slot cannot shift on request: the server re-reads
            mem=None,
            can_shift=False,
            refill=lambda _t: True,
            policy=policy,
            messages=messages,
        )

    def warm(self, warm: Warmup, stop: threading.Event | None = None) -> int:
        """Have the server read ``warm``'s tokens (``n_predict`` 0); the slot then holds them."""
        if min(warm.tokens) < 0:
            return 0  # images (negative ids) are sent with their text, in the next request
        body = {
            "prompt": warm.tokens,
            "n_predict": 0,
            "cache_prompt": self._slot.reuses(warm.tokens) > 0,
            "id_slot": self._link.connection.slot,
            "lora": self._slot.lora_body(),
        }
        try:
            self._link.call("POST", "/completion", body)
        except LamplightError as exc:
            log.info("prewarm on the server failed: %s", exc)
            return 0
        cmap = self._slot.map
        cmap.truncate(warm.n_keep)
        cmap.tokens = warm.tokens
        return warm.n_new

    def go_on(self, prompt: Prompt, reply: str, closing: str) -> Prompt:
        """The prompt that continues after ``reply`` (this request's text) and ``closing``:
        the tokens the slot holds (the reply's as sampled) and the closing text's."""
        held = self._slot.map.tokens
        n = len(prompt.tokens)
        if len(held) > n and held[:n] == prompt.tokens:
            tokens = list(held)
        else:  # the server sent no token ids: its text, tokenized
            tokens = prompt.tokens + self._tokenizer.tokenize(reply)
        text = prompt.text + reply + closing
        return replace(prompt, tokens=tokens + self._tokenizer.tokenize(closing), text=text)
