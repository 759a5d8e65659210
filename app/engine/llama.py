"""The inference engine: one ``llama_cpp.Llama``, streamed generation, prefix reuse.

The engine is not thread-safe. One thread (the UI's worker thread, or a test)
owns it and makes every call; other threads may only set the stop ``Event``
they passed to :meth:`Engine.generate`.

llama-cpp-python's ``Llama`` loads the model, context and vocabulary; the
generation loop itself calls llama.cpp directly (``llama_decode`` on a
one-token batch, the native sampler chain) so no per-token copy of the
262k-entry logits row is made in Python.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import ctypes
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.config.params import LoadConfig, SamplingParams, SettingError, grammar_for
from app.engine.backend import (
    Capabilities,
    EngineEvent,
    Finished,
    KvState,
    LoadCancelled,
    ModelInfo,
    PrefillProgress,
    ProgressFn,
    Token,
)
from app.engine.context_map import ContextMap
from app.engine.hardware import HardwareInfo, detect_hardware
from app.engine.metrics import MessageMetrics
from app.engine.ngram import NgramIndex
from app.engine.stopping import StopStringFilter
from app.engine.templates import ChatMessage, ChatTemplate, choose_template
from app.gguf.info import GgufInfo, read_gguf_info
from app.gguf.lora import (
    AdapterInfo,
    LoraError,
    LoraStack,
    ModelTensors,
    check_adapter,
    read_adapter,
    read_model_tensors,
    stack_key,
)
from app.util.errors import (
    ContextOverflowError,
    DecodeError,
    LamplightError,
    ModelLoadError,
    NoModelLoaded,
)
from app.util.sysinfo import rss_bytes

log = logging.getLogger(__name__)
llama_log = logging.getLogger("llama.cpp")

KV_TYPES = {"f16": 1, "q8_0": 8}  # ggml_type ids: GGML_TYPE_F16, GGML_TYPE_Q8_0
MAX_IDLE_ADAPTERS = 4  # adapters kept loaded while out of the stack, for a quick re-add
LORA_CHANGED_NOTE = "the LoRA stack changed"


@dataclass
class _LoadedAdapter:
    """An adapter llama.cpp has loaded for the current model."""

    handle: Any  # llama_adapter_lora * (a ctypes pointer)
    stamp: tuple[int, int]  # (size, mtime_ns) of the file when it was loaded
    info: AdapterInfo
    used: int  # when it was last in an applied stack, for freeing the idle ones


# llama.cpp's last warnings and errors: some failures (a grammar that does not parse)
# are explained only in its log.
RECENT_PROBLEMS: collections.deque[str] = collections.deque(maxlen=20)


def _install_log_route() -> None:
    """Send llama.cpp's log to Python logging instead of the terminal."""
    import llama_cpp

    # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line.
    levels = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
    last = [logging.DEBUG]

    def route(level: int, text: bytes, _user: Any) -> None:
        lvl = levels.get(level, last[0])
        last[0] = lvl
        msg = text.decode("utf-8", errors="replace").rstrip()
        if msg:
            llama_log.log(lvl, "%s", msg)
            if lvl >= logging.WARNING:
                RECENT_PROBLEMS.append(msg)

    cb = llama_cpp.llama_log_callback(route)
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    _install_log_route.callback = cb  # type: ignore[attr-defined]  # keep it alive


@contextlib.contextmanager
def _load_progress(progress: ProgressFn | None) -> Iterator[None]:
    """Give llama.cpp's model loader a progress callback.

    ``Llama`` exposes no progress hook, but builds its params through
    ``llama_model_default_params`` at load time; we hand it params that carry
    our callback. Only the engine thread loads models, so the swap is safe.
    """
    if progress is None:
        yield
        return
    import llama_cpp.llama_cpp as lc

    original = lc.llama_model_default_params

    def on_progress(value: float, _user: Any) -> bool:
        try:
            return bool(progress(float(value)))
        except Exception:  # an exception must not unwind through C
            log.exception("load progress callback failed")
            return True

    c_callback = lc.llama_progress_callback(on_progress)

    def params_with_progress() -> Any:
        params = original()
        params.progress_callback = c_callback
        return params

    lc.llama_model_default_params = params_with_progress
    try:
        yield
    finally:
        lc.llama_model_default_params = original


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the shared prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Reply:
    """The reply being generated: its text, stop strings, and the cache's text marks.

    ``emit`` turns a sampled token into text to show; ``commit`` records that
    the token is now in the KV cache (so its text is part of what the cache holds).
    """

    def __init__(
        self,
        engine: Engine,
        params: SamplingParams,
        template_stops: tuple[str, ...],
        metrics: MessageMetrics,
        t0: float,
    ) -> None:
        self._engine = engine
        self._map = engine._map
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStringFilter((*params.stop, *template_stops))
        self._metrics = metrics
        self._t0 = t0
        self._parts: list[str] = []
        self._raw: list[str] = []  # decoded text before stop-string filtering: what the KV holds
        self._raw_len = 0
        self._piece = ""
        self._prompt_text = self._map.text
        self.count = 0

    @property
    def hit(self) -> bool:
        return self._stops.hit

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def emit(self, token: int) -> str:
        self._metrics.token_times_ms.append((time.perf_counter() - self._t0) * 1000)
        self._metrics.generated_tokens += 1
        self.count += 1
        self._piece = self._decoder.decode(self._engine._token_bytes(token))
        text = self._stops.feed(self._piece)
        if text:
            self._parts.append(text)
        return text

    def commit(self, token: int) -> None:
        self._map.tokens.append(token)
        if self._piece:
            self._raw.append(self._piece)
            self._raw_len += len(self._piece)
            self._piece = ""
        if not self._decoder.getstate()[0]:  # no partial UTF-8 character pending
            self._map.marks.append((len(self._map.tokens), len(self._prompt_text) + self._raw_len))

    def ended(self, max_tokens: int) -> str:
        """ "stop_string" or "max_tokens" once the reply must end, else ""."""
        if self._stops.hit:
            return "stop_string"
        return "max_tokens" if self.count >= max_tokens else ""

    def close(self) -> None:
        self._map.text = self._prompt_text + "".join(self._raw)
        self._map.keep_marks(len(self._map.tokens))

    def tail(self) -> str:
        """Text held back for a possible stop string, once the reply has ended."""
        if self._stops.hit:
            return ""
        tail = self._stops.feed(self._decoder.decode(b"", final=True)) + self._stops.flush()
        if tail:
            self._parts.append(tail)
        return tail


_CAPABILITIES = Capabilities(
    snapshots=True, lora=True, grammar=True, prewarm=True, token_latency=True
)
_CAPABILITIES_GPU = replace(_CAPABILITIES, gpu_offload=True)


class Engine:
    """Owns one model and its KV cache; streams replies as events."""

    def __init__(self) -> None:
        _install_log_route()
        self._llm: Any = None
        self._info: ModelInfo | None = None
        self._gguf: GgufInfo | None = None
        self._template: ChatTemplate | None = None
        self._backend: HardwareInfo | None = None
        self._config: LoadConfig | None = None
        # Tokens whose keys/values are in KV sequence 0, and the text they encode.
        self._map = ContextMap()
        self._n_swa = 0
        self._stop = threading.Event()
        self._abort_cb: Any = None
        self._piece_buf = ctypes.create_string_buffer(256)
        self._one_token: Any = None
        self.load_count = 0  # successful loads, so tests can tell a hot swap from a reload
        # LoRA: loaded adapters by resolved path; the applied stack; the stack the KV
        # cache was computed under (it goes stale when the two differ).
        self._adapters: dict[str, _LoadedAdapter] = {}
        self._retired: list[Any] = []  # old versions of changed files, freed after the next set
        self._clock = itertools.count()
        self._tensors: ModelTensors | None = None
        self._lora = LoraStack()
        self._lora_sig: list[dict[str, Any]] = []
        self._kv_lora_sig: list[dict[str, Any]] = []

    # -- model -----------------------------------------------------------------

    @property
    def model(self) -> ModelInfo | None:
        return self._info

    @property
    def template(self) -> ChatTemplate | None:
        return self._template

    @property
    def llama(self) -> Any:
        """The ``llama_cpp.Llama`` object, for benchmarks and tests on the owner thread."""
        return self._llm

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the token ids currently held in the KV cache."""
        return list(self._map.tokens)

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES_GPU if self.hardware().gpu_offload else _CAPABILITIES

    def hardware(self) -> HardwareInfo:
        if self._backend is None:
            self._backend = detect_hardware()
        return self._backend

    def load(
        self, path: str | Path, config: LoadConfig, progress: ProgressFn | None = None
    ) -> ModelInfo:
        """Load a GGUF model, replacing the current one once the new one is ready.

        The current model keeps working while the new one loads, and stays loaded
        when the load fails or is cancelled.

        Raises:
            ModelFileError: missing, empty, non-GGUF or truncated file.
            ModelLoadError: llama.cpp refused the file.
            LoadCancelled: ``progress`` returned False.
        """
        gguf = read_gguf_info(path)  # a bad file is refused before llama.cpp sees it
        from app.engine.offload import AUTO, resolve

        if config.n_gpu_layers == AUTO:
            config = resolve(config, gguf, self.hardware())
        import llama_cpp

        cancelled = [False]

        def on_progress(value: float) -> bool:
            keep_going = progress(value) if progress else True
            cancelled[0] = not keep_going
            return keep_going

        t0 = time.perf_counter()
        try:
            with _load_progress(on_progress):
                llm = llama_cpp.Llama(
                    model_path=str(gguf.path),
                    n_ctx=config.n_ctx,
                    n_batch=config.n_batch,
                    n_ubatch=config.n_batch,
                    n_threads=config.threads(),
                    n_threads_batch=config.threads(),
                    n_gpu_layers=config.n_gpu_layers,
                    # Full-size SWA cache: rewinding a sliding-window model's KV
                    # (regenerate, edit, prefix reuse) needs positions outside the window.
                    swa_full=True,
                    # A quantized V cache needs flash attention in llama.cpp.
                    flash_attn=config.flash_attn or config.kv_type != "f16",
                    type_k=KV_TYPES[config.kv_type],
                    type_v=KV_TYPES[config.kv_type],
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            if cancelled[0]:
                raise LoadCancelled(f"Loading {gguf.path.name} was cancelled.") from exc
            raise ModelLoadError(
                f"llama.cpp could not load {gguf.path.name}: {exc}. The file may be damaged "
                "or use an architecture this llama.cpp build does not support."
            ) from exc
        load_ms = (time.perf_counter() - t0) * 1000
        previous = self._llm
        self._llm = llm  # the token helpers below read the new vocabulary
        try:
            template = choose_template(
                gguf.chat_template,
                gguf.architecture,
                self._has_special_token,
                bos_token=self._token_text(llm.token_bos()),
                eos_token=self._token_text(llm.token_eos()),
            )
        except BaseException:
            self._llm = previous
            llm.close()
            raise
        self._llm = previous
        self.unload()  # the old model, its adapters and its cache: only now
        self.load_count += 1
        self._llm = llm
        self._gguf = gguf
        self._config = config
        self._template = template
        self._n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model))
        self._one_token = (llama_cpp.llama_token * 1)()
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        self._info = ModelInfo(
            path=gguf.path,
            name=gguf.display_name,
            architecture=gguf.architecture,
            n_params=gguf.n_params,
            file_size=gguf.file_size,
            n_ctx=llm.n_ctx(),
            n_ctx_train=llm._model.n_ctx_train(),
            n_threads=config.threads(),
            n_gpu_layers=config.n_gpu_layers,
            template=self._template.label,
            backend=self.hardware().label if config.n_gpu_layers != 0 else "CPU",
            load_ms=load_ms,
        )
        log.info("loaded %s in %.0f ms (template %s)", gguf.path, load_ms, self._template.label)
        return self._info

    def unload(self) -> None:
        """Free the model, its context and its LoRA adapters."""
        # llama.cpp frees every adapter with its model (llama_model::~llama_model), so the
        # handles are only dropped here: freeing one after the model would be a double free.
        self._adapters.clear()
        self._retired.clear()
        self._tensors = None
        self._lora = LoraStack()
        self._lora_sig = []
        self._kv_lora_sig = []
        if self._llm is not None:
            self._llm.close()
        self._llm = None
        self._info = None
        self._template = None
        self._map.clear()

    def reset(self) -> None:
        """Forget the conversation held in the KV cache (for a new chat)."""
        llm = self._require()
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm._ctx.ctx), True)
        self._map.clear()

    # -- LoRA --------------------------------------------------------------------------

    @property
    def lora_stack(self) -> LoraStack:
        """A copy of the adapter stack applied to the context (empty after every load)."""
        return self._lora.copy()

    def lora_signature(self) -> list[dict[str, Any]]:
        """The applied stack's ``LoraStack.signature()``."""
        return [dict(s) for s in self._lora_sig]

    @property
    def lora_stale(self) -> bool:
        """The KV cache holds tokens evaluated under a stack that changes the output differently."""
        return bool(self._map.tokens) and stack_key(self._kv_lora_sig) != stack_key(self._lora_sig)

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Apply ``stack`` from the next message on; the model stays loaded.

        Adapters loaded earlier for this model are reused (by path, size and mtime);
        a new one is checked against the model's tensors before llama.cpp sees it.
        ``llama_set_adapters_lora`` then replaces the whole set; disabled and scale-0
        entries are left out. On any error nothing changes.

        Returns True when the cached conversation is now stale: the next ``generate``
        evaluates it again and says so in ``metrics.cache_note``. Changes that leave the
        output alone (order, a disabled or scale-0 entry) keep the cache.

        Raises:
            NoModelLoaded, LoraError.
        """
        llm = self._require()
        import llama_cpp

        stack = stack.copy()
        handles: dict[str, Any] = {}
        scales: dict[str, float] = {}
        for entry in stack.active():
            key = self._adapter_key(entry.path)
            handles[key] = self._adapter(key, entry.path)
            # The same file twice: llama.cpp's map would keep one scale; the stack means the sum.
            scales[key] = scales.get(key, 0.0) + entry.scale
        try:
            signature = stack.signature()
        except OSError as exc:
            raise LoraError(f"A LoRA adapter could not be read: {exc}") from exc
        applied = [k for k, v in scales.items() if v != 0.0]
        n = len(applied)
        c_handles = (llama_cpp.llama_adapter_lora_p_ctypes * n)(*(handles[k] for k in applied))
        c_scales = (ctypes.c_float * n)(*(scales[k] for k in applied))
        llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, c_handles, n, c_scales)
        self._lora, self._lora_sig = stack, signature
        tick = next(self._clock)
        for key in applied:
            self._adapters[key].used = tick
        self._free_idle_adapters(set(applied))
        stale = self.lora_stale
        log.info("LoRA stack applied: %s%s", stack.summary() or "none", " (cache stale)" * stale)
        return stale

    def adapter_info(self, path: str | Path) -> AdapterInfo:
        """Read ``path`` and check it against the loaded model, without loading it.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        return check_adapter(read_adapter(path), self._model_tensors())

    @property
    def loaded_adapters(self) -> int:
        """How many adapters llama.cpp holds for this model (applied or idle)."""
        return len(self._adapters)

    def last_logits(self) -> Any:
        """A numpy copy of the logits of the last evaluated token (for tests and benches)."""
        llm = self._require()
        import llama_cpp
        import numpy as np

        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        if not row:
            raise LamplightError("There are no logits yet: nothing has been evaluated.")
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()

    @staticmethod
    def _adapter_key(path: Path) -> str:
        return str(Path(path).expanduser().resolve())

    def _model_tensors(self) -> ModelTensors:
        if self._tensors is None:
            assert self._gguf is not None
            self._tensors = read_model_tensors(self._gguf.path)
        return self._tensors

    def _adapter(self, key: str, path: Path) -> Any:
        """llama.cpp's handle for the adapter at ``key``, loaded when new or changed on disk."""
        import llama_cpp

        try:
            st = Path(key).stat()
        except OSError as exc:
            raise LoraError(f"The LoRA adapter {Path(path).name} is missing ({path}).") from exc
        stamp = (st.st_size, st.st_mtime_ns)
        known = self._adapters.get(key)
        if known is not None and known.stamp == stamp:
            return known.handle
        # Refused here, never by llama.cpp: it reports failure only as a NULL pointer and a
        # log line, and some bad headers abort the process inside it.
        info = check_adapter(read_adapter(key), self._model_tensors())
        RECENT_PROBLEMS.clear()
        handle = llama_cpp.llama_adapter_lora_init(self._llm._model.model, key.encode("utf-8"))
        if not handle:  # a NULL ctypes pointer is falsy (llama-cpp-python does not check)
            detail = "; ".join(RECENT_PROBLEMS)
            raise LoraError(f"llama.cpp could not load {info.path.name}: {detail or 'see the log'}")
        if known is not None:
            # The file changed: the old version may still be in the context's set.
            self._retired.append(known.handle)
        self._adapters[key] = _LoadedAdapter(handle, stamp, info, next(self._clock))
        return handle

    def _free_idle_adapters(self, applied: set[str]) -> None:
        """Free retired adapters and the least recently used idle ones beyond the limit.

        Only called right after ``llama_set_adapters_lora``: an adapter the context no
        longer references can then be freed safely.
        """
        import llama_cpp

        for handle in self._retired:
            llama_cpp.llama_adapter_lora_free(handle)
        self._retired.clear()
        idle = sorted((a.used, k) for k, a in self._adapters.items() if k not in applied)
        for _, key in idle[: max(0, len(idle) - MAX_IDLE_ADAPTERS)]:
            llama_cpp.llama_adapter_lora_free(self._adapters.pop(key).handle)

    def _sync_lora(self) -> str:
        """Empty a cache evaluated under another stack; returns the note to show, if any."""
        if not self.lora_stale:
            return ""
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._llm._ctx.ctx), True)
        self._map.clear()
        self._kv_lora_sig = self._lora_sig
        log.info("cache rebuilt: %s", LORA_CHANGED_NOTE)
        return LORA_CHANGED_NOTE

    # -- KV state ------------------------------------------------------------------

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved KV state depends on."""
        self._require()
        assert self._config is not None
        return {
            "n_ctx": self._llm.n_ctx(),
            "kv_type": self._config.kv_type,
            # Flash attention stores V untransposed: a state from one does not fit the other.
            "flash_attn": self._config.flash_attn or self._config.kv_type != "f16",
            "swa_full": True,
            "n_swa": self._n_swa,
            # The adapters the cached tokens were evaluated with (SessionCache moves this
            # to the snapshot header's own ``lora`` field).
            "lora": [dict(s) for s in (self._kv_lora_sig if self._map.tokens else self._lora_sig)],
        }

    def state_size(self) -> int:
        """Bytes llama.cpp needs to serialize KV sequence 0."""
        import llama_cpp

        return int(llama_cpp.llama_state_seq_get_size(self._require()._ctx.ctx, 0))

    def export_state(self) -> KvState:
        """Copy KV sequence 0 out of llama.cpp (no logits: it scales with the cache)."""
        import llama_cpp

        ctx = self._require()._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        if written != size:
            raise LamplightError(f"llama.cpp wrote {written} of {size} bytes of state.")
        return KvState(
            state=bytes(buf),
            tokens=list(self._map.tokens),
            text=self._map.text,
            marks=list(self._map.marks),
        )

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure the cache is left empty.

        Raises:
            LamplightError: llama.cpp rejected the state, or it does not cover ``kv.tokens``.
        """
        import llama_cpp

        ctx = self._require()._ctx.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        llama_cpp.llama_memory_clear(mem, True)
        self._map.clear()
        if not kv.tokens:
            return
        state = kv.state
        if isinstance(state, bytes):
            buf: Any = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        else:  # a writable buffer: llama.cpp reads it in place, no copy
            buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
        read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0)
        del buf
        pos_max = llama_cpp.llama_memory_seq_pos_max(mem, 0)
        if read == 0 or pos_max != len(kv.tokens) - 1:
            llama_cpp.llama_memory_clear(mem, True)
            raise LamplightError(
                "llama.cpp did not accept the saved state"
                if read == 0
                else f"the saved state covers {pos_max + 1} tokens, not {len(kv.tokens)}"
            )
        self._map = ContextMap(list(kv.tokens), kv.text, list(kv.marks) or [(0, 0)])
        # The caller (SessionCache) applied the stack the state was saved under.
        self._kv_lora_sig = self._lora_sig

    # -- tokens ------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids for prompt text: special tokens parsed, BOS added if the model wants it."""
        llm = self._require()
        return list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The conversation rendered by the chat template and tokenized."""
        assert self._template is not None
        return self.tokenize(self._template.render(messages, True))

    def _token_bytes(self, token: int, special: bool = False) -> bytes:
        import llama_cpp

        vocab = self._llm._model.vocab
        n = llama_cpp.llama_token_to_piece(
            vocab, token, self._piece_buf, len(self._piece_buf), 0, special
        )
        if n < 0:
            self._piece_buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(
                vocab, token, self._piece_buf, len(self._piece_buf), 0, special
            )
        return self._piece_buf.raw[:n]

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._token_bytes(token, special=True).decode("utf-8", errors="replace")

    def _has_special_token(self, text: str) -> bool:
        ids = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return len(ids) == 1

    # -- generation ----------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        stop: threading.Event | None = None,
    ) -> Iterator[EngineEvent]:
        """Stream the assistant's reply to ``messages``.

        Yields ``PrefillProgress`` while the prompt is read, ``Token`` for each
        piece of text, and one ``Finished`` last. Setting ``stop`` ends the
        stream promptly with ``stop_reason == "cancelled"``, during prompt
        evaluation too. The KV cache keeps the conversation, so the next call
        evaluates only tokens that are new.

        Raises:
            NoModelLoaded, ContextOverflowError, DecodeError.
        """
        import llama_cpp

        llm = self._require()
        stop = stop if stop is not None else threading.Event()
        t0 = time.perf_counter()
        assert self._template is not None
        self._build_sampler(params, 0, check_only=True)  # a bad grammar fails before any work
        llama_cpp.llama_perf_context_reset(llm._ctx.ctx)
        lora_note = self._sync_lora()
        text = self._template.render(messages, True)
        n_mark, c_mark = self._map.match(text)
        prompt = self._map.tokens[:n_mark] + self._tokenize(text[c_mark:], bos=n_mark == 0)
        n_ctx = llm.n_ctx()
        if len(prompt) >= n_ctx:
            raise ContextOverflowError(len(prompt) + 1, n_ctx)

        self._map.keep_marks(n_mark)
        keep = common_prefix(self._map.tokens, prompt)
        if keep == len(prompt):
            keep -= 1  # the last prompt token must be evaluated to get its logits
        note = self._rewind(keep)
        keep = len(self._map.tokens)
        seed = params.seed if params.seed >= 0 else secrets.randbits(31)
        metrics = MessageMetrics(
            prompt_tokens=len(prompt),
            cached_tokens=keep,
            n_ctx=n_ctx,
            seed=seed,
            cache_note=lora_note or note,
            turn_offset=min(n_mark, keep),
        )

        t_prefill = time.perf_counter()
        yield from self._prefill(prompt[keep:], stop)
        metrics.evaluated_tokens = len(self._map.tokens) - keep
        metrics.prefill_ms = (time.perf_counter() - t_prefill) * 1000
        if len(self._map.tokens) < len(prompt):
            metrics.stop_reason = "cancelled"
            yield Finished("", metrics)
            return
        self._map.mark(text)

        yield from self._decode(params, seed, metrics, t0, stop)

    def prewarm(self, messages: Sequence[ChatMessage], reply: str) -> int:
        """Evaluate the template text that opens the user's next turn, ahead of time.

        Called after a reply, while the user reads it: the next message (and a
        resumed conversation) then starts with only the user's own words to
        evaluate. Returns the number of tokens evaluated (0 when the cached
        text does not end where the template continues).
        """
        llm = self._require()
        assert self._template is not None
        if self.lora_stale:
            return 0  # the cache belongs to the previous stack; generate will rebuild it
        sentinel = "\ue000"  # a private-use character no template produces
        history = [*messages, ChatMessage("assistant", reply), ChatMessage("user", sentinel)]
        rendered = self._template.render(history, False)
        cut = rendered.find(sentinel)
        cached = self._map.text
        if cut <= len(cached) or not rendered.startswith(cached):
            return 0
        head = rendered[:cut]
        marks = self._map.marks
        if not marks or marks[-1][0] != len(self._map.tokens):
            return 0  # the cached tokens end mid-character: no safe boundary to extend
        tokens = self._tokenize(head[len(cached) :], bos=False)
        if not tokens or len(self._map.tokens) + len(tokens) + 1 >= llm.n_ctx():
            return 0
        stop = threading.Event()
        done = 0
        for event in self._prefill(tokens, stop):
            done = event.done
        if done != len(tokens):
            return 0
        self._map.mark(head)
        return done

    def _tokenize(self, text: str, bos: bool) -> list[int]:
        if not text:
            return []
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=bos, special=True))

    def _prefill(self, tokens: Sequence[int], stop: threading.Event) -> Iterator[PrefillProgress]:
        """Evaluate ``tokens`` in batches with the abort callback armed."""
        import llama_cpp

        ctx = self._llm._ctx.ctx
        n_batch = self._llm.n_batch
        self._stop = stop
        if not self._map.tokens:
            self._kv_lora_sig = self._lora_sig  # an empty cache fills under the applied stack
        llama_cpp.llama_set_abort_callback(ctx, self._abort_cb, None)
        try:
            for start in range(0, len(tokens), n_batch):
                if stop.is_set():
                    return
                chunk = tokens[start : start + n_batch]
                arr = (llama_cpp.llama_token * len(chunk))(*chunk)
                rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
                if rc == 2 or (rc != 0 and stop.is_set()):
                    # Aborted: some ubatches may be in memory; drop what we cannot vouch for.
                    self._rewind(len(self._map.tokens))
                    return
                if rc != 0:
                    self._rewind(len(self._map.tokens))
                    raise DecodeError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
                self._map.tokens.extend(chunk)
                yield PrefillProgress(start + len(chunk), len(tokens))
        finally:
            # Off during decoding: llama.cpp calls it for every graph node, which
            # would cost a Python call per node per token.
            llama_cpp.llama_set_abort_callback(ctx, llama_cpp.ggml_abort_callback(), None)

    def _decode(
        self,
        params: SamplingParams,
        seed: int,
        metrics: MessageMetrics,
        t0: float,
        stop: threading.Event,
    ) -> Iterator[EngineEvent]:
        import llama_cpp

        sampler = self._build_sampler(params, seed)
        assert self._template is not None
        reply = _Reply(self, params, self._template.stop_strings, metrics, t0)
        flash = self._config is not None and (
            self._config.flash_attn or self._config.kv_type != "f16"
        )
        if params.speculative and flash:
            metrics.notes.append(
                "prompt-lookup drafting is off with flash attention, whose batched "
                "evaluation rounds differently and could change the reply"
            )
        try:
            if params.speculative and not flash:
                reason = yield from self._loop_lookup(sampler, reply, params, metrics, stop)
            else:
                reason = yield from self._loop_plain(sampler, reply, params, stop)
        finally:
            llama_cpp.llama_sampler_free(sampler)
            reply.close()
        tail = reply.tail()
        if tail:
            yield Token(tail)
        metrics.stop_reason = reason
        self._read_perf(metrics)
        yield Finished(reply.text, metrics)

    def _read_perf(self, metrics: MessageMetrics) -> None:
        import llama_cpp

        perf = llama_cpp.llama_perf_context(self._llm._ctx.ctx)
        if perf.t_p_eval_ms > 0:
            metrics.native_prefill_tok_s = perf.n_p_eval * 1000.0 / perf.t_p_eval_ms
        if perf.t_eval_ms > 0:
            metrics.native_decode_tok_s = perf.n_eval * 1000.0 / perf.t_eval_ms
        metrics.rss_mb = rss_bytes() / 1e6

    def _loop_plain(
        self, sampler: Any, reply: _Reply, params: SamplingParams, stop: threading.Event
    ) -> Generator[Token, None, str]:
        """One token per llama_decode (the fastest path when nothing can be drafted)."""
        import llama_cpp

        ctx = self._llm._ctx.ctx
        vocab = self._llm._model.vocab
        n_ctx = self._llm.n_ctx()
        one = self._one_token
        for _ in range(params.max_tokens):
            if stop.is_set():
                return "cancelled"
            if len(self._map.tokens) >= n_ctx:
                return "context_full"
            tok = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                return "eos"
            text = reply.emit(tok)
            if text:
                yield Token(text)
            if reply.hit:
                return "stop_string"
            if stop.is_set():
                return "cancelled"
            one[0] = tok
            rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1))
            if rc != 0:
                self._rewind(len(self._map.tokens))
                raise DecodeError(f"llama.cpp failed while generating (code {rc}).")
            reply.commit(tok)
        return "max_tokens"

    def _loop_lookup(
        self,
        sampler: Any,
        reply: _Reply,
        params: SamplingParams,
        metrics: MessageMetrics,
        stop: threading.Event,
    ) -> Generator[Token, None, str]:
        """Prompt-lookup speculative decoding.

        The sampled token and up to ``draft_len`` tokens guessed from an earlier
        occurrence of the latest n-gram are evaluated in one batch, with logits
        for just those positions. Each position is then sampled in order; a
        guess is kept while it equals what was sampled, so the reply is exactly
        what plain decoding with the same sampler gives. Rejected guesses are
        removed from the KV cache.
        """
        import llama_cpp

        ctx = self._llm._ctx.ctx
        vocab = self._llm._model.vocab
        n_ctx = self._llm.n_ctx()
        mem = llama_cpp.llama_get_memory(ctx)
        index = NgramIndex(self._map.tokens)
        k_max = params.draft_len
        batch = llama_cpp.llama_batch_init(k_max + 1, 0, 1)
        try:
            pending = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
            while True:
                if stop.is_set():
                    return "cancelled"
                n_past = len(self._map.tokens)
                if n_past >= n_ctx:
                    return "context_full"
                if llama_cpp.llama_vocab_is_eog(vocab, pending):
                    return "eos"
                text = reply.emit(pending)
                if text:
                    yield Token(text)
                ended = reply.ended(params.max_tokens)
                if ended:
                    return ended
                if stop.is_set():
                    return "cancelled"
                index.append(pending)
                room = min(k_max, params.max_tokens - reply.count, n_ctx - n_past - 2)
                draft = index.draft(room) if room > 0 else []
                batch.n_tokens = 1 + len(draft)
                for i, tok in enumerate([pending, *draft]):
                    batch.token[i] = tok
                    batch.pos[i] = n_past + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc != 0:
                    llama_cpp.llama_memory_seq_rm(mem, 0, n_past, -1)
                    raise DecodeError(f"llama.cpp failed while generating (code {rc}).")
                reply.commit(pending)
                metrics.drafted_tokens += len(draft)
                # Position i's logits follow [pending, d1..di]: sample, compare with d(i+1).
                kept = 0
                nxt = llama_cpp.llama_sampler_sample(sampler, ctx, 0)
                for i, guess in enumerate(draft):
                    if nxt != guess or llama_cpp.llama_vocab_is_eog(vocab, nxt):
                        break
                    text = reply.emit(guess)
                    if text:
                        yield Token(text)
                    reply.commit(guess)
                    index.append(guess)
                    kept += 1
                    if reply.hit or reply.count >= params.max_tokens or stop.is_set():
                        break
                    nxt = llama_cpp.llama_sampler_sample(sampler, ctx, i + 1)
                metrics.accepted_tokens += kept
                if kept < len(draft):
                    llama_cpp.llama_memory_seq_rm(mem, 0, n_past + 1 + kept, -1)
                ended = reply.ended(params.max_tokens)
                if ended:
                    return ended
                pending = nxt
        finally:
            llama_cpp.llama_batch_free(batch)

    def _build_sampler(self, params: SamplingParams, seed: int, check_only: bool = False) -> Any:
        """llama.cpp's native sampler chain for ``params``; caller frees it.

        With ``check_only``, only the grammar is built and freed (None is returned).

        Raises:
            SettingError: the grammar (or JSON schema) does not parse.
        """
        import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())

        def add(s: Any) -> None:
            llama_cpp.llama_sampler_chain_add(chain, s)

        grammar = grammar_for(params)
        if grammar:
            RECENT_PROBLEMS.clear()
            g = llama_cpp.llama_sampler_init_grammar(
                self._llm._model.vocab, grammar.encode("utf-8"), b"root"
            )
            if not g:
                llama_cpp.llama_sampler_free(chain)
                detail = "; ".join(m for m in RECENT_PROBLEMS if "parse" in m or "error" in m)
                field = "grammar" if params.output_format == "gbnf" else "json_schema"
                raise SettingError(field, f"The grammar does not parse: {detail or 'see the log'}")
            add(g)
        if check_only:
            llama_cpp.llama_sampler_free(chain)
            return None
        penalize = (
            params.repeat_penalty != 1.0
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
        )
        if penalize and params.repeat_last_n != 0:
            last_n = params.repeat_last_n if params.repeat_last_n > 0 else self._llm.n_ctx()
            add(
                llama_cpp.llama_sampler_init_penalties(
                    self._llm.n_vocab(),
                    last_n,
                    params.repeat_penalty,
                    params.frequency_penalty,
                    params.presence_penalty,
                )
            )
        if params.temperature <= 0.0:
            add(llama_cpp.llama_sampler_init_greedy())
        elif params.mirostat != "off":
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            if params.mirostat == "v1":
                add(
                    llama_cpp.llama_sampler_init_mirostat(
                        self._llm.n_vocab(), seed, params.mirostat_tau, params.mirostat_eta, 100
                    )
                )
            else:
                add(
                    llama_cpp.llama_sampler_init_mirostat_v2(
                        seed, params.mirostat_tau, params.mirostat_eta
                    )
                )
        else:
            if params.top_k > 0:
                add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.typical_p < 1.0:
                add(llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
            if params.top_p < 1.0:
                add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            add(llama_cpp.llama_sampler_init_dist(seed))
        if penalize:
            # The penalties look back over the context; the grammar must not see the prompt.
            window = params.repeat_last_n if params.repeat_last_n > 0 else len(self._map.tokens)
            for tok in self._map.tokens[-window:]:
                llama_cpp.llama_sampler_accept(
                    llama_cpp.llama_sampler_chain_get(chain, 1 if grammar else 0), tok
                )
        return chain

    # -- internals -----------------------------------------------------------------

    def _should_abort(self, _data: Any) -> bool:
        return self._stop.is_set()

    def _rewind(self, n: int) -> str:
        """Keep only the first ``n`` tokens in the KV cache.

        Returns a note when the cache had to be emptied instead: llama.cpp
        refused the partial removal, or a sliding-window layer no longer holds
        the window that position ``n`` attends to (restored snapshots keep only
        the last window). Then the whole prompt is evaluated again.
        """
        import llama_cpp

        mem = llama_cpp.llama_get_memory(self._llm._ctx.ctx)
        note = ""
        # Checked before the removal: afterwards the window's cells may all be gone.
        pos_min = llama_cpp.llama_memory_seq_pos_min(mem, 0)
        if n > 0 and self._n_swa > 0 and pos_min > max(0, n - self._n_swa):
            note = (
                f"the sliding-window cache starts at token {pos_min}, "
                f"too late to continue from token {n}"
            )
        elif n < len(self._map.tokens) and not llama_cpp.llama_memory_seq_rm(mem, 0, n, -1):
            note = "llama.cpp could not rewind the cache"
        if note:
            log.info("cache rebuilt: %s", note)
            llama_cpp.llama_memory_clear(mem, True)
            self._map.clear()
        else:
            self._map.truncate(n)
        return note

    def _require(self) -> Any:
        if self._llm is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        return self._llm
