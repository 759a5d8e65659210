"""A fake engine for fast widget tests; every behaviour is also tested on the real one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from app.config.params import LoadConfig, SamplingParams
from app.engine.backend import Finished, KvState, ModelInfo, ProgressFn, Token
from app.engine.hardware import HardwareInfo
from app.engine.metrics import MessageMetrics
from app.engine.templates import ChatMessage
from app.util.errors import ContextOverflowError, ModelFileError, ModelLoadError


class FakeEngine:
    """Streams ``reply`` word by word, ``delay`` seconds apart."""

    def __init__(self, reply: str = "Hello there, **friend**.", delay: float = 0.005) -> None:
        self.reply = reply
        self.delay = delay
        self.model: ModelInfo | None = None
        self.resets = 0
        self.requests: list[list[ChatMessage]] = []
        self.fail_with: Exception | None = None

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        if "missing" in str(path):
            raise ModelFileError(f"Model file not found: {path}")
        if "broken" in str(path):
            self.model = None  # like the real engine: the old model was freed first
            raise ModelLoadError(f"llama.cpp could not load {Path(path).name}")
        for i in range(5):
            if progress and not progress(i / 4):
                raise ModelFileError("cancelled")
        self.model = ModelInfo(
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
        )
        return self.model

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
    ) -> Iterator[Token | Finished]:
        self.requests.append(list(messages))
        if self.fail_with is not None:
            raise self.fail_with
        stop = stop or threading.Event()
        t0 = time.perf_counter()
        metrics = MessageMetrics(prompt_tokens=10, evaluated_tokens=10, prefill_ms=1.0, n_ctx=2048)
        parts: list[str] = []
        words = self.reply.split(" ")
        for i, word in enumerate(words[: params.max_tokens]):
            if stop.is_set():
                metrics.stop_reason = "cancelled"
                self.kv_tokens = list(range(10 + len(parts)))
                yield Finished("".join(parts), metrics)
                return
            time.sleep(self.delay)
            text = word if i == 0 else " " + word
            parts.append(text)
            metrics.generated_tokens += 1
            metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
            yield Token(text)
        metrics.stop_reason = "eos"
        self.kv_tokens = list(range(10 + len(parts)))
        yield Finished("".join(parts), metrics)

    def backend(self) -> HardwareInfo:
        return HardwareInfo(False, ())

    def reset(self) -> None:
        self.resets += 1
        self.kv_tokens = []

    # The snapshot interface, with a token list standing in for the KV cache.
    kv_tokens: list[int] = []  # noqa: RUF012  # replaced per instance on first use

    def cache_config(self) -> dict[str, object]:
        return {"n_ctx": 2048}

    def state_size(self) -> int:
        return 4 * len(self.kv_tokens)

    def export_state(self) -> KvState:
        return KvState(b"fake-state", list(self.kv_tokens), "", [(0, 0)])

    def import_state(self, kv: KvState) -> None:
        self.kv_tokens = list(kv.tokens)

    def unload(self) -> None:
        self.model = None


def overflow() -> ContextOverflowError:
    return ContextOverflowError(5000, 2048)
