"""What the llama-server backend says of the server's model: its ``ModelInfo`` (from
``/props`` and ``/v1/models``) and its capabilities, each refusal with its reason."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from app.engine.backend import Capabilities, ModelInfo
from app.engine.native.handles import HYBRID, RECURRENT
from app.engine.native.memory_probe import file_memory_kind
from app.engine.templates.chat_template import ChatTemplate
from app.engine.templates.override import TemplateInputs, looks_like_base_model
from app.remote.connection import Connection
from app.remote.http import where
from app.remote.llama_server.images import ServerImages
from app.remote.llama_server.wire import int_or, model_meta, text_of
from app.remote.server_link import fingerprint

DRAFT_WHY_NOT = (
    "a draft model runs with the in-process engine only; llama-server drafts with the "
    "model given on its own command line (--model-draft FILE), if any"
)
CHECKPOINTS_WHY_NOT = (
    "llama-server keeps context checkpoints of this model's state in its own memory, but "
    "its slot files hold none: after a saved chat is reopened, a regenerate or an edit "
    "reads the whole chat again"
)
_MAX_PATH = 4096  # longer is no path llama-server opened


def capabilities(url: str, adapters: bool, media: ServerImages, memory: str = "") -> Capabilities:
    """What a llama-server at ``url`` can do here; ``adapters``: it loaded LoRA adapters;
    ``memory``: how its model remembers the conversation (``server_memory``)."""
    why = {
        "token_latency": "the times between tokens are measured as they arrive over the "
        "network; the server's own decode rate is shown beside them",
        "gpu_offload": f"the model runs on the server at {where(url)}; "
        "its GPU settings are the server's command line",
        "draft_model": DRAFT_WHY_NOT,
        "mtp": "llama-server drafts with a model's next-token (MTP) layers itself, when "
        "started with --spec-type draft-mtp",
    }
    if not adapters:
        why["lora"] = (
            "the server loaded no LoRA adapters; start llama-server with --lora FILE "
            "(and --lora-init-without-apply) to stack them here"
        )
    if memory in (HYBRID, RECURRENT):
        why["checkpoints"] = CHECKPOINTS_WHY_NOT
    return Capabilities(
        snapshots=True,
        lora=adapters,
        grammar=True,
        prewarm=True,
        template_override=True,
        thinking_control=True,
        tools=True,
        vision=media.vision,
        memory=memory,
        why_not=why | media.why_not(),
    )


def model_info(
    props: dict[str, Any],
    models: Any,
    n_ctx: int,
    conn: Connection,
    template: ChatTemplate,
    inputs: TemplateInputs,
    t0: float,
) -> ModelInfo:
    """What ``/props`` and ``/v1/models`` say of the server's model, rendered with
    ``template`` (made of ``inputs``), connected since ``t0``. The backend adds what its
    parts know: the capabilities, the adapters and the tool-call format."""
    meta = model_meta(models)
    model_path = text_of(props.get("model_path"), 1000) or text_of(props.get("model_alias"), 1000)
    model_path = model_path or "model"
    name = PurePosixPath(model_path.replace("\\", "/")).name or model_path
    build = text_of(props.get("build_info"), 100)
    size = int_or(meta.get("size"), 0)
    n_params = int_or(meta.get("n_params"), 0)
    notes = (template.note,) if template.note else ()
    return ModelInfo(
        path=Path(model_path),
        name=name,
        architecture=(text_of(meta.get("ftype"), 60) or text_of(props.get("model_ftype"), 60)),
        n_params=n_params,
        file_size=size,
        n_ctx=n_ctx,
        n_ctx_train=int_or(meta.get("n_ctx_train"), n_ctx),
        n_threads=0,
        n_gpu_layers=0,
        template=template.label,
        backend=f"llama-server at {where(conn.url)}",
        load_ms=(time.perf_counter() - t0) * 1000,
        notes=notes,
        server=conn.url,
        fingerprint=fingerprint(name, size, [conn.url, model_path, size, n_params, build]),
        runtime={"llama_server": build},
        template_inputs=inputs,
        reasoning=template.reasoning,
        base_model=looks_like_base_model(
            (text_of(props.get("model_alias"), 1000), name),
            has_template=bool(inputs.embedded),
        ),
    )


def server_memory(url: str, props: dict[str, Any]) -> str:
    """How the model of the llama-server at ``url`` remembers the conversation, read from
    its file (``/props`` ``model_path``) when the server runs on this machine and the
    file is here; "" when not known (the server does not say it)."""
    path = props.get("model_path")
    if not isinstance(path, str) or not path or len(path) > _MAX_PATH or "\x00" in path:
        return ""
    # The path names a file on the server's machine: a file here is that one only when
    # the server is here.
    if not _loopback(urlsplit(url).hostname or ""):
        return ""
    return file_memory_kind(path)


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
