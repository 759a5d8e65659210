"""What the engine thread is doing, for the crash record (``app/util/crash_record.py``).

The worker reports a handful of step changes per reply (prefill, decode, prewarm,
save, idle) and one per load; never one per token. Each is a small marker write,
so a native crash leaves behind which step, model, settings and native paths were
running. Only the engine's owner thread calls :class:`EngineSteps`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar, cast

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import ModelInfo
from app.engine.native.guard import wanted_paths
from app.engine.native.paths import RiskyPath
from app.util import crash_record
from app.util.crash_report import Scalar

F = TypeVar("F", bound=Callable[..., Any])

# The sampling settings a crash record keeps (the rest never reaches native code paths
# that differ between machines).
_SAMPLING_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "mirostat",
    "max_tokens",
    "seed",
    "output_format",
    "speculative",
    "draft_model",
    "overflow",
)


def active_paths(
    config: LoadConfig, gpu_build: bool, off: frozenset[RiskyPath] = frozenset()
) -> tuple[RiskyPath, ...]:
    """The risky native paths a load with ``config`` runs: those the guard would check
    (``native_guard.wanted_paths``) less those ``off`` on this machine. The worker does
    not see the guard's verdicts, so the crash notice leaves out the paths that are
    already off when it offers to turn one off."""
    return tuple(p for p in wanted_paths(config, gpu_build) if p not in off)


def load_summary(config: LoadConfig) -> dict[str, Scalar]:
    return {
        "n_ctx": config.n_ctx,
        "n_threads": config.threads(),
        "n_gpu_layers": config.n_gpu_layers,
        "n_batch": config.n_batch,
        "kv_type": config.kv_type,
        "flash_attn": config.flash_attn,
    }


def sampling_summary(params: SamplingParams) -> dict[str, Scalar]:
    return {k: getattr(params, k) for k in _SAMPLING_KEYS}


class EngineSteps:
    """The worker's side of the crash record: the model in use and the current step."""

    def __init__(self) -> None:
        self.model = ""
        self.load: dict[str, Scalar] = {}
        self.paths: tuple[str, ...] = ()
        self.step = "idle"
        self._request: dict[str, Scalar] = {}
        self._depth = 0

    def loading(self, path: str, config: LoadConfig, gpu_build: bool) -> None:
        """A model load starts (the model in use stays the context if it fails)."""
        paths = tuple(p.value for p in active_paths(config, gpu_build))
        self._mark("load", path, load_summary(config), paths)

    def loaded(self, info: ModelInfo, config: LoadConfig, gpu_build: bool) -> None:
        """``info`` is now the model in use, loaded with ``config`` (as resolved)."""
        config = replace(config, n_gpu_layers=info.n_gpu_layers)
        self.model = str(info.path)
        self.load = load_summary(config)
        self.paths = tuple(p.value for p in active_paths(config, gpu_build))

    def remote(self, info: ModelInfo) -> None:
        """A server's model is in use: no native path of ours runs."""
        self.model = f"{info.name} ({info.backend})"
        self.load = {}
        self.paths = ()

    def reply(self, kind: str, conv_id: str, params: SamplingParams) -> None:
        """A reply starts: its prompt is read first."""
        self._request = {"kind": kind, "conv": conv_id, **sampling_summary(params)}
        self.mark("prefill")

    def decoding(self) -> None:
        """A token came out (cheap when already decoding: called for every token)."""
        if self.step != "decode":
            self.mark("decode")

    def mark(self, step: str) -> None:
        """``step`` with the model in use (and the request, during a reply)."""
        self._mark(step, self.model, self.load, self.paths)

    @contextmanager
    def during(self, step: str = "") -> Iterator[None]:
        """Mark ``step`` (if given) for the block; the outermost block ends in ``idle``."""
        if step:
            self.mark(step)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._request = {}
                self.mark("idle")

    def _mark(self, step: str, model: str, load: dict[str, Scalar], paths: tuple[str, ...]) -> None:
        self.step = step
        request = self._request if step in ("prefill", "decode", "prewarm", "save") else None
        crash_record.set_step(step, model, load, paths, request)


def marked(step: str = "") -> Callable[[F], F]:
    """Run a worker method inside ``self.steps.during(step)``."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.steps.during(step):
                return method(self, *args, **kwargs)

        return cast(F, run)

    return wrap
