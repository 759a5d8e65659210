"""Images sent to servers: OpenAI ``image_url`` parts, llama-server's multimodal
``/completion`` prompt, and what a server says about taking images.

An OpenAI-compatible server gets a user turn's images as ``image_url`` parts with
``data:`` URLs (base64 of the file), before its text as the templates show them.
Whether it takes images: llama-server says so (``/props`` ``modalities.vision``, or
``capabilities`` in ``/v1/models``), as do OpenRouter (``input_modalities``) and LM
Studio (``type: vlm``); any other server is assumed to, and a refusal that names
images becomes an ``ImageError`` that says so.

llama-server's ``/completion`` takes a prompt with media as
``{"prompt_string": text, "multimodal_data": [base64, ...]}``, each image at the
server's ``media_marker`` in the text (random per server, from ``/props``). Its
tokenizer adds BOS to that text itself, so a BOS the template wrote is left out.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import split_markers
from app.remote.http import ServerError, sentence
from app.util.errors import ImageError

DEFAULT_MEDIA_MARKER = "<__media__>"  # mtmd's default, for servers that do not say theirs
IMAGE_CHARS = 768  # an image's share of the character estimate (~256 tokens)
_IMAGE_WORDS = ("image", "vision", "multimodal", "mmproj", "media")
_REFUSAL_WORDS = ("not support", "unsupported", "does not", "cannot", "can't", "no ")


def data_url(image: ImagePart) -> str:
    return f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"


def content_parts(m: ChatMessage) -> str | list[dict[str, Any]]:
    """A message's ``content``: its text, or its images and then its text as parts."""
    if not m.images:
        return m.content
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": data_url(i)}} for i in m.images
    ]
    if m.content:
        parts.append({"type": "text", "text": m.content})
    return parts


def has_images(messages: list[ChatMessage]) -> bool:
    return any(m.images for m in messages)


def refuses_images(exc: ServerError) -> bool:
    """A 400 (or 415, 422, 500) whose words say the server's model takes no images."""
    if exc.status not in (400, 415, 422, 500):
        return False
    text = str(exc).lower()
    return any(w in text for w in _IMAGE_WORDS) and any(w in text for w in _REFUSAL_WORDS)


def images_refused(exc: ServerError, server: str) -> ImageError:
    return ImageError(
        f"The server at {server} cannot take images with this model: {sentence(str(exc))} "
        "Remove the images, or use a vision model (llama-server needs --mmproj)."
    )


def vision_of_props(props: Any) -> bool | None:
    """llama-server's ``/props`` ``modalities.vision`` (None when it does not say)."""
    modalities = props.get("modalities") if isinstance(props, Mapping) else None
    vision = modalities.get("vision") if isinstance(modalities, Mapping) else None
    return vision if isinstance(vision, bool) else None


def vision_of_model(item: Any, listing: Any = None) -> bool | None:
    """Whether a ``/v1/models`` entry says its model takes images (None: it does not
    say): OpenRouter's ``architecture.input_modalities``, LM Studio's ``type``,
    ``capabilities`` on the entry or in llama-server's Ollama-style ``models`` list."""
    if not isinstance(item, Mapping):
        return None
    arch = item.get("architecture")
    inputs = arch.get("input_modalities") if isinstance(arch, Mapping) else None
    if isinstance(inputs, list) and inputs:
        return "image" in inputs
    if item.get("type") in ("vlm", "llm"):
        return item.get("type") == "vlm"
    caps = item.get("capabilities")
    if not isinstance(caps, list):
        caps = _listed_capabilities(item.get("id"), listing)
    if isinstance(caps, list) and caps:
        return any(c in ("vision", "multimodal") for c in caps)
    return None


def _listed_capabilities(ident: Any, listing: Any) -> Any:
    models = listing.get("models") if isinstance(listing, Mapping) else None
    for entry in models[:100] if isinstance(models, list) else []:
        if isinstance(entry, Mapping) and ident in (entry.get("model"), entry.get("name")):
            return entry.get("capabilities")
    return None


def media_marker(props: Any) -> str:
    marker = props.get("media_marker") if isinstance(props, Mapping) else None
    if isinstance(marker, str) and 3 <= len(marker) <= 100:
        return marker
    return DEFAULT_MEDIA_MARKER


def multimodal_prompt(
    text: str, images: Mapping[str, ImagePart], marker: str, bos: str
) -> dict[str, Any]:
    """llama-server's prompt object for rendered ``text`` whose image markers name
    ``images`` (by digest): each at ``marker``, the images' base64 in order.

    Raises:
        ImageError: a marker names an image not in ``images``.
    """
    out: list[str] = []
    data: list[str] = []
    for is_image, piece in split_markers(text):
        if not is_image:
            out.append(piece.replace(marker, ""))  # text cannot add media of its own
            continue
        image = images.get(piece)
        if image is None:
            raise ImageError("An image of this conversation is missing; attach it again.")
        out.append(marker)
        data.append(base64.b64encode(image.data).decode("ascii"))
    prompt = "".join(out)
    if bos and prompt.startswith(bos):  # the server's tokenizer adds BOS itself
        prompt = prompt[len(bos) :]
    return {"prompt_string": prompt, "multimodal_data": data}
