"""llama.cpp's log, routed to Python logging, and its recent problems kept for error messages."""

from __future__ import annotations

import collections
import ctypes
import logging
from typing import Any

llama_log = logging.getLogger("llama.cpp")

# llama.cpp's last warnings and errors: some failures (a grammar that does not parse)
# are explained only in its log.
RECENT_PROBLEMS: collections.deque[str] = collections.deque(maxlen=20)


def install_log_route() -> None:
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
    try:  # libmtmd (vision projectors) logs on its own, to stderr unless told otherwise
        from llama_cpp import mtmd_cpp

        mtmd_cpp.mtmd_log_set(cb, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(cb, ctypes.c_void_p(0))
    except (ImportError, OSError, AttributeError):
        pass
    install_log_route.callback = cb  # type: ignore[attr-defined]  # keep it alive
