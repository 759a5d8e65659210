"""A saved server connection: where it is and what kind of API it speaks.

The API key is not part of it: it lives in the OS keyring (``app.remote.keys``),
never in settings.json.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("llama-server", "openai")
KIND_LABELS = {"llama-server": "llama.cpp server", "openai": "OpenAI-compatible"}


@dataclass(frozen=True)
class Connection:
    """One server the user added.

    ``kind`` is ``"llama-server"`` (llama.cpp's native API: snapshots, LoRA, grammar)
    or ``"openai"`` (``/v1/chat/completions``: vLLM, Ollama, LM Studio, hosted APIs).
    ``model`` is the model picked from the server's list ("" for the server's only one).
    """

    id: str
    name: str
    kind: str
    url: str
    model: str = ""
    verify_tls: bool = True
    slot: int = 0  # llama-server: the slot whose cache this app uses and saves

    @property
    def label(self) -> str:
        return f"{self.name} ({KIND_LABELS.get(self.kind, self.kind)})"
