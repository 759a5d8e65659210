"""What the engine in use cannot do, shown where it would be set.

``show`` disables the settings and panels the engine in use cannot honour, with
the engine's own reason as the tooltip, so nothing is silently ignored.
"""

from __future__ import annotations

from PySide6.QtGui import QAction

from app.engine.backend import Capabilities, ModelInfo
from app.remote.connection import Connection
from ui.perf.perf_panel import PerfPanel
from ui.settings.lora_panel import LoraPanel
from ui.settings.sampling_panel import SamplingPanel

_LOAD_FIELDS = ("n_ctx", "n_threads", "n_gpu_layers", "flash_attn")
_DRAFT_FIELDS = ("speculative", "draft_len")


def show(
    info: ModelInfo | None, sampling: SamplingPanel, lora: LoraPanel, connection: Connection | None
) -> None:
    """Disable the settings and panels the engine in use cannot honour, saying why."""
    caps = info.capabilities if info is not None else Capabilities(lora=True, grammar=True)
    reasons: dict[str, str] = {}
    if info is not None and info.server:
        where = connection.name if connection is not None else "the server"
        for name in _LOAD_FIELDS:
            reasons[name] = f"Set on {where}'s command line; this app only connects to it."
        for name in _DRAFT_FIELDS:
            reasons[name] = "Prompt-lookup drafting runs with the in-process engine only."
    if not caps.grammar:
        reasons["grammar"] = caps.why_not.get("grammar", "This engine takes no GBNF grammar.")
    sampling.set_unavailable(reasons)
    if info is not None and info.server:
        lora.set_server_adapters(info.adapters, caps.why_not.get("lora", ""))
    else:
        lora.set_server_adapters(None)
        lora.set_model(info.path if info is not None else None)


def show_in_window(info: ModelInfo, compact_cache: QAction, perf: PerfPanel) -> None:
    """The window's own switches the engine in use cannot honour."""
    compact_cache.setEnabled(not info.server)
    compact_cache.setToolTip(
        "The server's cache type is set on its command line." if info.server else ""
    )
    perf.itl.setToolTip(info.capabilities.why_not.get("token_latency", ""))


def thinking_text(info: ModelInfo | None) -> str:
    """What the model in use does about thinking: ``thinks (<think> tags, switchable)``;
    "" where its template shows no sign of it."""
    fmt = info.reasoning if info is not None else None
    if fmt is None:
        return ""
    how = [fmt.name]
    if fmt.switch:
        how.append("switchable")
    if fmt.effort:
        how.append("effort levels")
    return f"thinks ({', '.join(how)})"
