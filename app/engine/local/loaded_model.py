"""One opened model and what was opened with it: its native handles, vocabulary, LoRA
adapters, vision projector and tokenizer, and the settings it was loaded with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config.setting_records import LoadConfig
from app.engine.backend import Capabilities, ModelInfo
from app.engine.local.adapters import AdapterSet
from app.engine.local.model_template import head_tokens
from app.engine.local.prompt_tokenizer import PromptTokenizer
from app.engine.local.template_state import TemplateState
from app.engine.local.vocab import Vocab
from app.engine.native.guard import NativeGuard
from app.engine.native.handles import Native
from app.engine.native.hardware import HardwareInfo
from app.engine.templates.override import looks_like_base_model
from app.gguf.info import GgufInfo
from app.util.errors import LamplightError

if TYPE_CHECKING:
    from app.engine.local.vision import Projector


def prepare(
    gguf: GgufInfo,
    config: LoadConfig,
    guard: NativeGuard | None,
    hardware: Callable[[], HardwareInfo],
) -> tuple[LoadConfig, bool, tuple[str, ...]]:
    """``config`` with auto offload resolved and the native ``guard``'s changes; whether
    extra buffer types are safe; the guard's notes."""
    from app.engine.local.offload import AUTO, resolve

    if config.n_gpu_layers == AUTO:
        config = resolve(config, gguf, hardware())
    if guard is None:
        return config, True, ()
    prepared = guard.prepare(gguf.path, config, hardware().gpu_offload)
    return prepared.config, prepared.extra_bufts, prepared.notes


class LoadedModel:
    """A ``llama_cpp.Llama`` opened from ``path`` with ``config``; ``close`` frees it."""

    def __init__(
        self,
        llm: Any,
        vocab: Vocab,
        path: Path,
        config: LoadConfig,
        extra_bufts: bool,
        projector: Projector | None,
    ) -> None:
        self.llm = llm
        self.vocab = vocab
        self.path = path
        self.config = config
        self.extra_bufts = extra_bufts  # its draft loads the same way
        self.projector = projector  # a vision projector loaded with the model
        self.native = Native(llm)
        # LoRA: the loaded adapters and the applied stack.
        self.adapters = AdapterSet(path)
        self.n_swa = self.native.n_swa()
        self.memory = self.native.memory_kind()  # recurrent state cannot be cut back
        self.can_shift = self.native.can_shift()  # llama_memory_can_shift: drops need no re-reading
        # What the engine puts before the template's text (BOS, if the model wants it).
        self.head = head_tokens(llm)
        self.tokenizer = PromptTokenizer(llm, vocab, projector, self.head)

    @property
    def flash(self) -> bool:
        """The context stores V untransposed (flash attention, on for quantized KV)."""
        return self.config.flash_attn or self.config.kv_type != "f16"

    @property
    def mrope(self) -> bool:
        """Images take fewer KV positions than tokens (M-RoPE)."""
        return self.projector is not None and self.projector.mrope

    def last_logits(self) -> Any:
        """A numpy copy of the logits of the last evaluated token."""
        import numpy as np

        row = self.native.logits(-1)
        if not row:
            raise LamplightError("There are no logits yet: nothing has been evaluated.")
        return np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),)).copy()

    def describe(
        self,
        gguf: GgufInfo,
        chat: TemplateState,
        load_ms: float,
        backend: str,
        capabilities: Capabilities,
    ) -> ModelInfo:
        """What was loaded from ``gguf``, for the window and the API."""
        template, config = chat.template, self.config
        return ModelInfo(
            path=gguf.path,
            name=gguf.display_name,
            architecture=gguf.architecture,
            n_params=gguf.n_params,
            file_size=gguf.file_size,
            n_ctx=self.llm.n_ctx(),
            n_ctx_train=self.native.n_ctx_train(),
            n_threads=config.threads(),
            n_gpu_layers=config.n_gpu_layers,
            template=template.label,
            backend=backend,
            load_ms=load_ms,
            notes=chat.notes,
            capabilities=capabilities,
            template_inputs=chat.inputs,
            base_model=looks_like_base_model(
                (gguf.name, gguf.path.name), has_template=bool(gguf.chat_template)
            ),
            reasoning=template.reasoning,
            tool_format=chat.tool_format(template).label,
            projector=self.projector.path.name if self.projector is not None else "",
        )

    def close(self) -> None:
        """Free the projector, then the model with its context.

        llama.cpp frees every adapter with its model (``llama_model::~llama_model``), so
        the adapter handles are only dropped: freeing one after the model would be a
        double free.
        """
        self.adapters = AdapterSet()
        if self.projector is not None:  # before its model
            self.projector.close()
            self.projector = None
        self.llm.close()
