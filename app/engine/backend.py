"""The seam between the chat and an inference engine: the ``Backend`` protocol.

The worker thread drives exactly this interface. The in-process llama.cpp
engine (``app.engine.local.engine.Engine``) implements it; so does the test fake, and
so will remote engines (llama-server, OpenAI-compatible servers). What an
engine cannot do is declared in its ``Capabilities``, never discovered with
``hasattr``: callers check a flag, and the UI disables what is off, saying why.

A backend is not thread-safe: one thread owns it and makes every call; other
threads may only set the stop ``Event`` passed to ``generate``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.metrics import MessageMetrics
from app.engine.native.hardware import HardwareInfo
from app.engine.reasoning.format import ReasoningFormat
from app.engine.templates.builtin import plain_template
from app.engine.templates.override import TemplateInputs, TemplateOverride
from app.engine.tool_spec import ToolRequest
from app.gguf.lora import LoraStack
from app.util.errors import LamplightError

ProgressFn = Callable[[float], bool]
"""Load progress 0..1; return False to cancel the load."""

# A reply's size in bytes, whatever the backend: a server that ignores the token limit
# (or sends megabytes per "token") must not fill the transcript, whose file has a limit
# of its own (app.chat.store.MAX_TRANSCRIPT_BYTES).
MAX_REPLY_BYTES = 4 << 20
MIN_REPLY_BYTES = 64 << 10
REPLY_BYTES_PER_TOKEN = 256  # generous: a token is a few bytes, a server's delta a few tokens

# Stop reasons a reply may end with besides the engine's own ("eos", "stop_string",
# "max_tokens", "context_full", "cancelled", "connection_lost"). Each keeps the text so
# far and explains itself in ``metrics.notes``; all mean "the reply is incomplete".
SIZE_LIMIT = "size_limit"  # the reply reached ``reply_byte_cap``
TIME_LIMIT = "time_limit"  # the server fell silent, or took longer than a reply may
SERVER_ERROR = "server_error"  # the server failed after the reply had begun

# ``export_state(STASH + party)``: a stash of ``party``; a backend that stores states
# itself (llama-server) keeps each party's apart, so one never overwrites another's.
STASH = "pool:"


def reply_byte_cap(max_tokens: int) -> int:
    """The most UTF-8 bytes a reply of ``max_tokens`` tokens may hold."""
    return min(MAX_REPLY_BYTES, max(MIN_REPLY_BYTES, max_tokens * REPLY_BYTES_PER_TOKEN))


def cut_to_bytes(text: str, max_bytes: int) -> str:
    """The longest start of ``text`` whose UTF-8 encoding fits ``max_bytes``."""
    if len(text) * 4 <= max_bytes:  # fits whatever its characters
        return text
    return text.encode("utf-8", "replace")[: max(0, max_bytes)].decode("utf-8", "ignore")


def fit_bytes(piece: str, used: int, room: int) -> tuple[str, int, bool]:
    """``piece`` cut so that ``used`` plus its UTF-8 size stays within ``room``: the
    piece, its size in bytes, and whether it was cut."""
    n = len(piece.encode("utf-8"))
    if used + n <= room:
        return piece, n, False
    piece = cut_to_bytes(piece, room - used)
    return piece, len(piece.encode("utf-8")), True


class LoadCancelled(LamplightError):
    """The user cancelled a model load."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; ``why_not`` explains each missing one for a tooltip."""

    snapshots: bool = False  # export_state / import_state
    lora: bool = False  # set_lora_stack
    grammar: bool = False  # JSON mode, JSON schema, GBNF
    prewarm: bool = False  # evaluating the next turn's opening ahead of time
    token_latency: bool = False  # per-token arrival times are the engine's own
    gpu_offload: bool = False
    template_override: bool = False  # set_template: this app renders the prompt
    draft_model: bool = False  # set_draft: speculative decoding with a draft model
    # The engine ends a thinking block itself: a thinking budget, and Stop thinking.
    thinking_control: bool = False
    # Tool calls: ``generate`` takes a ``ToolRequest`` and ``Finished.tool_calls`` has
    # the calls (this app's parser and grammar in-process; the server's own otherwise).
    tools: bool = False
    # Images in user turns (``ChatMessage.images``): a projector is loaded, or a server
    # says it takes them.
    vision: bool = False
    # How the model remembers the conversation: "attention", "sliding-window", "hybrid"
    # (recurrent layers with attention) or "recurrent"; "" where not known (a server whose
    # model file is not on this machine).
    memory: str = ""
    # Drafting with the model's own next-token (MTP) layers (``SamplingParams.mtp``).
    mtp: bool = False
    # ``opening`` / ``warm_opening``: a new chat's shared opening read once, kept apart.
    prefix: bool = False
    why_not: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model, as the UI shows it."""

    path: Path
    name: str
    architecture: str
    n_params: int
    file_size: int
    n_ctx: int
    n_ctx_train: int
    n_threads: int
    n_gpu_layers: int
    template: str
    backend: str
    load_ms: float
    notes: tuple[str, ...] = ()  # what the user should know about this load (a template fallback)
    capabilities: Capabilities = field(default_factory=Capabilities)  # for the UI to show
    # A model on a server: where it runs ("" in-process), and what a snapshot of its
    # cache depends on instead of the local file's fingerprint and llama.cpp version.
    server: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    adapters: tuple[str, ...] = ()  # LoRA adapters a server loaded (its paths)
    # What its chat template is made from (for the template dialog's preview), and whether
    # it looks like a base model: no chat template, no "instruct"/"chat"/"-it" in its names.
    template_inputs: TemplateInputs | None = None
    base_model: bool = False
    # How its replies mark their thinking (None: no sign of it; a server's may still
    # send reasoning apart, as OpenAI-compatible servers do).
    reasoning: ReasoningFormat | None = None
    # Who reads its tool calls: "llama.cpp" (its chat layer, for the template in use), or
    # the family the Python parser reads ("hermes", "llama3", ...); "" when not known or
    # a server parses them.
    tool_format: str = ""
    projector: str = ""  # the vision projector's file name ("" when it sees no images)

    @property
    def continues_text(self) -> bool:
        """Continue-the-text mode (the plain template): the prompt is the conversation
        as one text, with no turns, so no tools are offered."""
        return self.template == plain_template().label


@dataclass(frozen=True)
class DraftInfo:
    """A loaded draft model (speculative decoding), as the UI shows it."""

    path: Path
    name: str
    n_params: int
    n_ctx: int


@dataclass(frozen=True)
class Token:
    """A piece of reply text, ready to show; ``reasoning``: it is thinking, not answer."""

    text: str
    reasoning: bool = False


@dataclass(frozen=True)
class PrefillProgress:
    """Prompt evaluation advanced: ``done`` of ``total`` new tokens."""

    done: int
    total: int


@dataclass(frozen=True)
class Finished:
    """The reply ended; ``metrics.stop_reason`` says why (``cancelled`` for a stop).
    ``text`` is the answer, ``reasoning`` the thinking before it (markers removed).
    ``tool_calls``: the calls the reply asked for (``stop_reason`` "tool_calls"); the
    text of the calls is not in ``text``."""

    text: str
    metrics: MessageMetrics
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class CallProgress:
    """A tool call is being written: its text is held back until the whole call can be
    read, so this tells how far it got (``tokens`` and ``chars`` of it so far)."""

    tokens: int
    chars: int


EngineEvent = Token | PrefillProgress | CallProgress | Finished
"""What ``Backend.generate`` yields: progress and tokens, then exactly one ``Finished``."""


@dataclass(frozen=True)
class KvState:
    """KV sequence 0 as the engine serializes it, with the tokens and text it covers."""

    state: bytes | bytearray | memoryview
    tokens: list[int]
    text: str
    marks: list[tuple[int, int]]
    # A recurrent state's checkpoints (token count, its recurrent part), so a reopened
    # chat rewinds as the open one did (``app/engine/local/checkpoints.py``).
    checkpoints: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True)
class Opening:
    """What every new chat with the same system turn (a project's) starts with: the
    template's text up to the first question's words, and its tokens."""

    head: str
    tokens: tuple[int, ...]


@runtime_checkable
class Backend(Protocol):
    """What the engine worker calls. Every method runs on the worker's thread."""

    @property
    def model(self) -> ModelInfo | None:
        """The loaded model, or None."""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend supports (may change with the loaded model)."""

    def hardware(self) -> HardwareInfo:
        """The compute devices this backend can use."""

    def ping(self) -> str:
        """Why the engine cannot be reached now ("" when it can; always "" in-process)."""

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Load a model. The previous one stays loaded until the new one is ready, so a
        failed or cancelled load leaves it working.

        Raises:
            ModelFileError, ModelLoadError, LoadCancelled.
        """

    def unload(self) -> None:
        """Free the model (and everything that belongs to it)."""

    def reset(self) -> None:
        """Forget the conversation held in the cache (a new chat)."""

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
        end_thinking: threading.Event | None = None,
        tools: ToolRequest | None = None,
    ) -> Generator[EngineEvent, None, None]:
        """Stream the assistant's reply to ``messages``: ``PrefillProgress`` and ``Token``
        events, then one ``Finished``. Setting ``stop`` ends it promptly (``cancelled``);
        setting ``end_thinking`` ends a thinking block at once, and the model answers
        (``capabilities.thinking_control``). Closing the generator abandons the reply.
        ``tools``: what the model may call (``capabilities.tools``); the calls it makes
        end the reply, in ``Finished.tool_calls``.

        Raises:
            NoModelLoaded, ContextOverflowError, DecodeError, SettingError.
        """

    def prewarm(self, messages: Sequence[ChatMessage], reply: ChatMessage) -> int:
        """Make the cache hold the history as the template renders it with ``reply``
        (the assistant's turn that just ended), and the next turn's opening; returns
        the tokens evaluated."""

    def opening(
        self, messages: Sequence[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Opening | None:
        """The opening a new chat with ``messages`` (its system turn) and ``tools`` shares
        with every other such chat; None where there is none (or ``capabilities.prefix``
        is off). The cache is not touched."""

    def warm_opening(self, opening: Opening, stop: threading.Event | None = None) -> int:
        """Empty the cache and read ``opening`` into it, marked so that a new chat's
        prompt keeps it; the tokens read (0: it could not, or ``stop`` was set: the
        cache then holds what its map says)."""

    def image_tokens(self, image: ImagePart) -> int:
        """Context tokens ``image`` takes in a prompt (0 when the backend cannot tell).

        Raises:
            ImageError: the model sees no images, or the image cannot be read.
        """

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in a prompt, by the model's tokenizer (no BOS); 0 when
        the backend cannot count (the caller estimates).

        Raises:
            NoModelLoaded; LamplightError: the server could not be asked.
        """

    def set_template(self, override: TemplateOverride) -> ModelInfo:
        """Use ``override`` as the chat template from the next message on (no reload).

        A choice that cannot be used falls back to the automatic one, and the returned
        ``ModelInfo.notes`` say why. The cache stays: the next prompt reuses what it
        shares with it.

        Raises:
            NoModelLoaded; LamplightError where ``capabilities.template_override`` is off.
        """

    @property
    def lora_stack(self) -> LoraStack:
        """A copy of the applied adapter stack."""

    def lora_signature(self) -> list[dict[str, Any]]:
        """The applied stack's ``LoraStack.signature()`` (what a snapshot records)."""

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Apply ``stack`` from the next message on; True when the cache went stale.

        Raises:
            NoModelLoaded, LoraError.
        """

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved cache depends on (checked before restoring one)."""

    def export_state(self, key: str = "") -> KvState:
        """The cache as it stands (``tokens`` empty when it holds nothing).

        ``key`` names the conversation, for an engine that stores the state itself
        (llama-server keeps one file per key on its side; ``state`` then refers to it).
        """

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure it is left empty.

        Raises:
            LamplightError: the state was refused.
        """

    @property
    def draft_info(self) -> DraftInfo | None:
        """The loaded draft model, or None."""

    def set_draft(self, path: str | Path | None, n_ctx: int = 0) -> DraftInfo | None:
        """Load ``path`` as the draft model for speculative decoding (None: drop it).

        The draft's vocabulary is checked against the loaded model's before it is
        loaded. ``n_ctx`` 0 picks the draft's context size. On any error the previous
        draft stays. Loading another model drops the draft.

        Raises:
            NoModelLoaded; DraftError (incompatible, unreadable or refused draft, or
            ``capabilities.draft_model`` is off).
        """
