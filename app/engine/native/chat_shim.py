"""llama.cpp's chat layer through Lamplight's C shim (``packaging/chat_shim``), by ctypes.

The shim is built with the wheel (``packaging/llama_build.py``) and lives beside
``libllama`` in ``llama_cpp/lib``. Everything crosses as UTF-8 JSON text; the shim
catches every C++ exception and answers ``{"error": ...}``, raised here as
:class:`ShimError`.

Two kinds of call, two homes:

- **Templates** (``lc_templates_new``, ``lc_apply``) run llama.cpp's Jinja engine,
  which has no limits on time, memory or depth: a hostile template could hang or end
  the process. They run only in the chat-format worker (``chat_worker.py``), a child
  with a deadline and a memory cap.
- **Parsing and grammars** (``lc_parser_new``, ``lc_parse``,
  ``lc_schema_to_grammar``) run no template code: the parser is a PEG arena (data)
  and the input is the model's reply. They run in-process, with inputs capped.

Without the shim (a plain PyPI wheel, an older build) :func:`load_shim` answers None
and the Python formats are used.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ABI = 2  # packaging/chat_shim/lamplight_chat.cpp's LC_ABI
STEM = "lamplight-chat"
MAX_TEXT = 4_000_000  # a reply or a request, in bytes
MAX_SCHEMA = 64 * 1024  # as chat_format/schema.py's MAX_SCHEMA_CHARS


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """``text`` in UTF-8, lone surrogates as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def utf8_json(value: Any) -> bytes:
    """``value`` as JSON in UTF-8; lone surrogates (which UTF-8 cannot hold) become U+FFFD,
    as the sandbox's renders make them."""
    text = json.dumps(value, ensure_ascii=False)
    return _SURROGATE.sub("\ufffd", text).encode("utf-8")


class ShimError(RuntimeError):
    """The shim refused a call (its message is llama.cpp's own)."""


def library_path(directory: Path | None = None) -> Path:
    """Where the shim would be: ``llama_cpp/lib``, found without importing llama_cpp."""
    if directory is None:
        spec = importlib.util.find_spec("llama_cpp")
        places = list(spec.submodule_search_locations or []) if spec else []
        directory = Path(places[0]) / "lib" if places else Path()
    if sys.platform == "win32":
        return directory / f"{STEM}.dll"
    if sys.platform == "darwin":
        return directory / f"lib{STEM}.dylib"
    return directory / f"lib{STEM}.so"


class ChatShim:
    """The loaded shim: typed entry points, and JSON in and out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._lib = lib
        c_void, c_char, c_size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        err = ctypes.POINTER(ctypes.c_void_p)
        lib.lc_abi.restype = ctypes.c_int
        lib.lc_free.argtypes = [c_void]
        lib.lc_quiet.argtypes = []
        lib.lc_templates_new.argtypes = [c_char, c_size, c_char, c_char, err]
        lib.lc_templates_new.restype = c_void
        lib.lc_templates_free.argtypes = [c_void]
        lib.lc_caps.argtypes = [c_void]
        lib.lc_caps.restype = c_void
        lib.lc_apply.argtypes = [c_void, c_char, c_size]
        lib.lc_apply.restype = c_void
        lib.lc_parser_new.argtypes = [c_char, c_size, err]
        lib.lc_parser_new.restype = c_void
        lib.lc_parser_free.argtypes = [c_void]
        lib.lc_parse.argtypes = [c_void, c_char, c_size, ctypes.c_int]
        lib.lc_parse.restype = c_void
        lib.lc_schema_to_grammar.argtypes = [c_char, c_size, ctypes.c_int]
        lib.lc_schema_to_grammar.restype = c_void
        lib.lc_grammar_prefill.argtypes = [c_void, c_void, c_char, c_size]
        lib.lc_grammar_prefill.restype = ctypes.c_int
        self.abi = int(lib.lc_abi())

    def _take(self, ptr: int | None) -> Any:
        """The JSON answer at ``ptr``, freed; a ``{"error"}`` answer raised."""
        if not ptr:
            raise ShimError("the chat shim gave no answer (out of memory)")
        try:
            text = ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self._lib.lc_free(ptr)
        answer = json.loads(text)
        if isinstance(answer, dict) and "error" in answer and len(answer) == 1:
            raise ShimError(str(answer["error"])[:2000])
        return answer

    def _new(self, fn: Any, *args: Any) -> int:
        """Call a constructor that reports failure through its last argument."""
        err = ctypes.c_void_p()
        handle = fn(*args, ctypes.byref(err))
        if not handle:
            why = "unknown error"
            if err.value:
                why = ctypes.string_at(err.value).decode("utf-8", "replace")
                self._lib.lc_free(err.value)
            raise ShimError(why[:2000])
        return int(handle)

    def quiet(self) -> None:
        self._lib.lc_quiet()

    # Template calls: for the worker child only (see the module's docstring).
    def templates_new(self, source: str, bos: str = "", eos: str = "") -> int:
        raw = utf8(source)
        fn = self._lib.lc_templates_new
        return self._new(fn, raw, len(raw), utf8(bos), utf8(eos))

    def templates_free(self, handle: int) -> None:
        self._lib.lc_templates_free(handle)

    def caps(self, handle: int) -> dict[str, Any]:
        return dict(self._take(self._lib.lc_caps(handle)))

    def apply(self, handle: int, request: dict[str, Any]) -> dict[str, Any]:
        raw = utf8_json(request)
        if len(raw) > MAX_TEXT:
            raise ShimError("the conversation is too large to format")
        return dict(self._take(self._lib.lc_apply(handle, raw, len(raw))))

    # Data-driven calls: safe in-process.
    def parser_new(self, spec: dict[str, Any]) -> int:
        raw = utf8_json(spec)
        return self._new(self._lib.lc_parser_new, raw, len(raw))

    def parser_free(self, handle: int) -> None:
        self._lib.lc_parser_free(handle)

    def parse(self, handle: int, text: str, partial: bool) -> dict[str, Any]:
        raw = utf8(text)
        if len(raw) > MAX_TEXT:
            raise ShimError("the reply is too long to parse")
        return dict(self._take(self._lib.lc_parse(handle, raw, len(raw), int(partial))))

    def grammar_prefill(self, sampler: Any, vocab: Any, text: str) -> bool:
        """Feed a grammar sampler ``text`` the prompt already holds; False when the grammar
        refuses it (then the sampler must not be used)."""
        raw = utf8(text)
        return int(self._lib.lc_grammar_prefill(sampler, vocab, raw, len(raw))) == 0

    def schema_to_grammar(self, schema: Any, force_gbnf: bool = True) -> str:
        raw = utf8_json(schema)
        if len(raw) > MAX_SCHEMA:
            raise ShimError("the schema is too large (over 64 KiB)")
        out = self._take(self._lib.lc_schema_to_grammar(raw, len(raw), int(force_gbnf)))
        return str(out["grammar"])


@dataclass
class _Loaded:
    shim: ChatShim | None
    why: str


_lock = threading.Lock()
_loaded: dict[Path, _Loaded] = {}


def load_shim(path: Path | None = None) -> ChatShim | None:
    """The shim, loaded once per file; None (with the reason logged once) when absent."""
    path = path or library_path()
    with _lock:
        found = _loaded.get(path)
        if found is None:
            found = _open(path)
            _loaded[path] = found
            if found.shim is None:
                log.info("llama.cpp's chat layer is not available: %s", found.why)
        return found.shim


def unavailable_reason(path: Path | None = None) -> str:
    """Why :func:`load_shim` answers None ('' when it loads)."""
    load_shim(path)
    return _loaded[path or library_path()].why


def _open(path: Path) -> _Loaded:
    if not path.is_file():
        return _Loaded(None, f"{path.name} is not in this build of llama.cpp")
    try:
        shim = ChatShim(path)
    except (OSError, AttributeError) as exc:
        return _Loaded(None, f"{path.name} would not load: {exc}")
    if shim.abi != ABI:
        return _Loaded(None, f"{path.name} speaks version {shim.abi}, this app {ABI}")
    shim.quiet()
    return _Loaded(shim, "")
