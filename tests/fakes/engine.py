"""A fake backend for fast widget and randomized tests; every behaviour is also tested
on the real engine. It implements ``app.engine.backend.Backend`` (mypy checks it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.config.field_spec import SettingError
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    Backend,
    CallProgress,
    Capabilities,
    DraftInfo,
    EngineEvent,
    Finished,
    KvState,
    LoadCancelled,
    ModelInfo,
    Opening,
    ProgressFn,
    Token,
)
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.metrics import MessageMetrics
from app.engine.native.hardware import HardwareInfo
from app.engine.reasoning.format import ReasoningFormat
from app.engine.templates.builtin import plain_template
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraError, LoraStack
from app.util.errors import (
    ContextOverflowError,
    DraftError,
    ImageError,
    ModelFileError,
    ModelLoadError,
    NoModelLoaded,
)

FAKE_CAPABILITIES = Capabilities(
    snapshots=True,
    template_override=True,
    draft_model=True,
    thinking_control=True,
    why_not={
        "lora": "the fake engine takes no adapters",
        "grammar": "the fake engine has no grammar sampler",
        "prewarm": "the fake engine has no next turn to prepare",
        "token_latency": "the fake engine's token times are made up",
        "gpu_offload": "the fake engine has no GPU",
    },
)

VISION_CAPABILITIES = replace(FAKE_CAPABILITIES, vision=True)  # a model with its projector
IMAGE_TOKENS = 64  # what each picture costs the fake, as the test projector's does


class FakeEngine:
    """Streams ``reply`` word by word, ``delay`` seconds apart, after ``prefill_delay``.

    With ``reasoning`` set, its words stream first as thinking (``Token(reasoning=True)``),
    unless ``params.thinking`` is "off"; the thinking ends early at ``thinking_budget``
    words or when ``end_thinking`` is set, as the engine's does.

    A token list stands in for the KV cache, so snapshots round-trip. A draft model is
    any existing file whose name has no "incompatible" in it; with ``draft_model`` on,
    every second word counts as an accepted guess (drafts are made up, like the words).
    """

    def __init__(
        self,
        reply: str = "Hello there, **friend**.",
        delay: float = 0.005,
        prefill_delay: float = 0.0,
    ) -> None:
        self.reply = reply
        self.delay = delay
        self.prefill_delay = prefill_delay
        self._model: ModelInfo | None = None
        self.resets = 0
        self.loads = 0
        self.requests: list[list[ChatMessage]] = []
        self.fail_with: Exception | None = None
        # With fail_with set: fail after this many words of the reply (0: before any).
        self.fail_after = 0
        self.kv_tokens: list[int] = []
        self.template = AUTO  # the last set_template (the fake renders nothing)
        self.base_model = False  # what the next load reports as ModelInfo.base_model
        self.load_notes: tuple[str, ...] = ()  # what the next load reports as its notes
        self._draft: DraftInfo | None = None
        self.caps = FAKE_CAPABILITIES  # what it reports (a test may play a server's part)
        self.draft_loads: list[Path | None] = []  # every set_draft, in order
        self.reasoning = ""  # thinking streamed before the reply ("": none)
        self.reasoning_format: ReasoningFormat | None = None  # what a load reports
        self.params: list[SamplingParams] = []  # each request's settings, in order
        # A request offered tools ends asking for these after its text, unless its last
        # message is a tool result (then it answers: the round trip ends).
        self.tool_calls: tuple[ToolCall, ...] = ()
        self.tools: list[ToolRequest | None] = []  # each request's tools, in order

    @property
    def model(self) -> ModelInfo | None:
        return self._model

    @model.setter
    def model(self, value: ModelInfo | None) -> None:
        self._model = value

    @property
    def capabilities(self) -> Capabilities:
        return self.caps

    def hardware(self) -> HardwareInfo:
        return HardwareInfo(False, ())

    def ping(self) -> str:
        return ""

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        if "missing" in str(path):
            raise ModelFileError(f"Model file not found: {path}")
        if "broken" in str(path):
            # Like the real engine: the model in use stays loaded.
            raise ModelLoadError(f"llama.cpp could not load {Path(path).name}")
        for i in range(5):
            if progress and not progress(i / 4):
                raise LoadCancelled("cancelled")
        self.loads += 1
        self.kv_tokens = []
        self._draft = None  # like the engine: a new model drops the draft
        self._model = ModelInfo(
            path=Path(path),
            name="Fake model",
            architecture="fake",
            n_params=1_000_000,
            file_size=1,
            n_ctx=config.n_ctx,
            n_ctx_train=config.n_ctx,
            n_threads=1,
            n_gpu_layers=0,
            template="fake",
            backend="CPU",
            load_ms=1.0,
            capabilities=self.caps,
            base_model=self.base_model,
            reasoning=self.reasoning_format,
            notes=self.load_notes,
        )
        self.template = AUTO
        return self._model

    def unload(self) -> None:
        self._model = None
        self._draft = None
        self.kv_tokens = []

    @property
    def draft_info(self) -> DraftInfo | None:
        return self._draft

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        self.draft_loads.append(Path(path) if path else None)
        if not path:
            self._draft = None
            return None
        if self._model is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        if not self.caps.draft_model:
            raise DraftError(f"Cannot use a draft model here: {self.caps.why_not['draft_model']}.")
        draft = Path(path)
        if "incompatible" in draft.name:
            raise DraftError(
                f"{draft.name} cannot draft for {self._model.name}: "
                "its vocabulary has 32,000 tokens; the model's has 262,144."
            )
        if not draft.is_file():
            raise DraftError(f"The draft model file is not there: {draft}")
        self._draft = DraftInfo(
            path=draft,
            name=draft.stem,
            n_params=100_000,
            n_ctx=n_ctx or min(self._model.n_ctx, 4096),
        )
        return self._draft

    def reset(self) -> None:
        self.resets += 1
        self.kv_tokens = []

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
        end_thinking: threading.Event | None = None,
        tools: ToolRequest | None = None,
    ) -> Generator[EngineEvent, None, None]:
        if self._model is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        self.requests.append(list(messages))
        self.params.append(params)
        self.tools.append(tools)
        if self.fail_with is not None and self.fail_after <= 0:
            raise self.fail_with
        if params.output_format != "text":  # honours its capabilities: no grammar
            raise SettingError("output_format", "The fake engine has no grammar sampler.")
        stop = stop or threading.Event()
        t0 = time.perf_counter()
        if any(m.images for m in messages) and not self.caps.vision:
            raise ImageError("This model sees no images: it has no vision projector.")
        # One "token" per word of the chat, so prefix reuse and overflow behave like an
        # engine's; a picture is IMAGE_TOKENS of one id before its turn's words.
        prompt = [t for m in messages for t in _prompt_tokens(m)]
        n_ctx = self._model.n_ctx
        if len(prompt) + 1 >= n_ctx:
            raise ContextOverflowError(len(prompt) + 1, n_ctx)
        cached = 0
        while cached < min(len(prompt), len(self.kv_tokens)) and (
            prompt[cached] == self.kv_tokens[cached]
        ):
            cached += 1
        metrics = MessageMetrics(
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            evaluated_tokens=len(prompt) - cached,
            prefill_ms=1.0,
            n_ctx=n_ctx,
        )
        if self.prefill_delay and stop.wait(self.prefill_delay):
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics)
            return
        thought = yield from self._think(params, stop, end_thinking, metrics, t0)
        if stop.is_set():
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics, thought)
            return
        parts: list[str] = []
        words = self.reply.split(" ")
        metrics.draft_kind = (
            "model"
            if params.draft_model and self._draft is not None
            else "lookup"
            if params.speculative
            else ""
        )
        if metrics.draft_kind:
            metrics.draft_len_final = params.draft_len
        room = params.max_tokens - metrics.reasoning_tokens  # thinking counts as reply tokens
        if room <= 0:
            metrics.stop_reason = "max_tokens"
            yield Finished("", metrics, thought)
            return
        for i, word in enumerate(words[:room]):
            if stop.is_set():
                metrics.stop_reason = "cancelled"
                self.kv_tokens = prompt + _words("assistant " + "".join(parts))
                yield Finished("".join(parts), metrics, thought)
                return
            if self.fail_with is not None and i >= self.fail_after:
                raise self.fail_with  # part way: the server went away, the decode failed
            time.sleep(self.delay)
            text = word if i == 0 else " " + word
            parts.append(text)
            metrics.generated_tokens += 1
            if metrics.draft_kind and i:
                # A guess for every word after the first, every second one right.
                metrics.drafted_tokens += 1
                metrics.accepted_tokens += i % 2
                metrics.draft_ms += 0.1
            metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
            if i == 0:
                metrics.first_answer_ms = metrics.token_times_ms[-1]
            yield Token(text)
        metrics.stop_reason = "eos"
        self.kv_tokens = prompt + _words("assistant " + "".join(parts))
        if self.tool_calls and tools and tools.active and messages[-1].role != "tool":
            # Written unseen, as the engine's parser holds a call: its progress shows.
            for n, call in enumerate(self.tool_calls, 1):
                time.sleep(self.delay)
                yield CallProgress(n, n * len(call.arguments))
            metrics.stop_reason = "tool_calls"
            yield Finished("".join(parts), metrics, thought, self.tool_calls)
            return
        yield Finished("".join(parts), metrics, thought)

    def _think(
        self,
        params: SamplingParams,
        stop: threading.Event,
        end_thinking: threading.Event | None,
        metrics: MessageMetrics,
        t0: float,
    ) -> Generator[EngineEvent, None, str]:
        """Stream ``reasoning`` as thinking; returns what was thought."""
        if not self.reasoning or params.thinking == "off":
            return ""
        parts: list[str] = []
        budget = params.thinking_budget
        for i, word in enumerate(self.reasoning.split(" ")[: params.max_tokens]):
            if stop.is_set():
                break
            if end_thinking is not None and end_thinking.is_set():
                metrics.thinking_cut = "user"
                break
            if budget and i >= budget:
                metrics.thinking_cut = "budget"
                break
            time.sleep(self.delay)
            text = word if i == 0 else " " + word
            parts.append(text)
            metrics.generated_tokens += 1
            metrics.reasoning_tokens += 1
            metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
            yield Token(text, reasoning=True)
        return "".join(parts)

    def image_tokens(self, image: ImagePart) -> int:
        if not self.caps.vision:
            raise ImageError("This model sees no images: it has no vision projector.")
        return IMAGE_TOKENS

    def count_tokens(self, text: str) -> int:
        return len(_words(text))

    def opening(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Opening | None:
        return None  # a project's opening is kept in-process only (``capabilities.prefix``)

    def warm_opening(self, opening: Opening, stop: threading.Event | None = None) -> int:
        return 0

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        return 0

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        if self._model is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        self.template = override
        label = "fake" if override.kind == "auto" else f"fake {override.kind}"
        if override.kind == "plain":  # as the engine says it: continue-the-text mode's label
            label = plain_template().label
        self._model = replace(self._model, template=label)
        return self._model

    @property
    def lora_stack(self) -> LoraStack:
        return LoraStack()

    def lora_signature(self) -> list[dict[str, Any]]:
        return []

    def set_lora_stack(self, stack: LoraStack) -> bool:
        raise LoraError("the fake engine takes no adapters")

    def cache_config(self) -> dict[str, Any]:
        return {"n_ctx": 2048}

    def export_state(self, key: str = "") -> KvState:
        return KvState(b"fake-state", list(self.kv_tokens), "", [(0, 0)])

    def import_state(self, kv: KvState) -> None:
        self.kv_tokens = list(kv.tokens)


def _prompt_tokens(m: ChatMessage) -> list[int]:
    pictures = [-2 - int(i.digest[:7], 16) for i in m.images for _ in range(IMAGE_TOKENS)]
    return pictures + _words(f"{m.role} {m.content}")


def _words(text: str) -> list[int]:
    return [hash(w) & 0xFFFF for w in text.split()]


def overflow() -> ContextOverflowError:
    return ContextOverflowError(5000, 2048)


def as_backend(fake: FakeEngine) -> Backend:
    """The fake where a Backend is wanted (mypy checks that it implements the protocol)."""
    return fake
