"""Images for the llama-server backend: their tokens in this client's map, their count
on the server, and the multimodal ``/completion`` prompt.

This client tracks the slot's tokens (``ContextMap``); an image there is a run of its
pseudo-token id (``app.engine.image_part.image_token_id``) as long as the server's
count of its tokens, which ``/v1/chat/completions/input_tokens`` gives (the count of a
message with the image less the same message without). A prompt with images goes as
``{"prompt_string", "multimodal_data"}`` (``image_wire.multimodal_prompt``): the server
tokenizes its text itself and matches it against its slot, images by their data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import image_token_id, is_image_token, split_markers
from app.remote.http import ServerError
from app.remote.image_wire import data_url, media_marker, multimodal_prompt, vision_of_props
from app.util.errors import ImageError, LamplightError

log = logging.getLogger(__name__)

GUESS_TOKENS = 256  # an image's tokens when the server cannot count them (older builds)
MAX_KNOWN = 512  # images remembered per connection (their bytes, to send them again)
NO_VISION = (
    "the server was started without a vision projector: start llama-server with "
    "--mmproj FILE to send images"
)
COUNT_PATH = "/v1/chat/completions/input_tokens"

Call = Callable[[str, str, Any], Any]
TextTokenize = Callable[[str, bool], list[int]]


class ServerImages:
    """What one connection knows of images: the server's marker, the images of the
    conversations sent (by digest) and each one's token count."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self.vision = False
        self.marker = ""
        self.bos = ""
        self._images: dict[str, ImagePart] = {}
        self._counts: dict[str, int] = {}

    def reset(self, props: Any, bos: str) -> None:
        """A new connection's ``/props``; ``bos`` is its BOS token's text."""
        self.vision = vision_of_props(props) is True
        self.marker = media_marker(props)
        self.bos = bos
        self._images.clear()
        self._counts.clear()

    def why_not(self) -> dict[str, str]:
        return {} if self.vision else {"vision": NO_VISION}

    def remember(self, messages: Sequence[ChatMessage]) -> None:
        """Keep the images of ``messages`` (their markers are in the prompts to come).

        Raises:
            ImageError: the messages hold images and the server takes none.
        """
        for m in messages:
            for image in m.images:
                if not self.vision:
                    raise ImageError(f"{NO_VISION[0].upper()}{NO_VISION[1:]}.")
                self._images.pop(image.digest, None)
                self._images[image.digest] = image  # the most recent last
        while len(self._images) > MAX_KNOWN:
            self._images.pop(next(iter(self._images)))

    def count(self, image: ImagePart) -> int:
        """The server's count of ``image``'s tokens (0 when it cannot say).

        Raises:
            ImageError: the server takes no images.
        """
        if not self.vision:
            raise ImageError(f"{NO_VISION[0].upper()}{NO_VISION[1:]}.")
        if image.digest not in self._counts:
            self._counts[image.digest] = self._ask_count(image)
        return self._counts[image.digest]

    def _ask_count(self, image: ImagePart) -> int:
        text = {"type": "text", "text": "."}
        picture = {"type": "image_url", "image_url": {"url": data_url(image)}}
        try:
            counts = [
                self._call("POST", COUNT_PATH, {"messages": [{"role": "user", "content": c}]})
                for c in ([picture, text], [text])
            ]
        except LamplightError as exc:
            log.info("the server did not count an image's tokens: %s", exc)
            return 0
        n = [c.get("input_tokens") if isinstance(c, dict) else None for c in counts]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in n):
            return 0
        return max(0, min(1 << 20, int(n[0]) - int(n[1])))  # type: ignore[arg-type]

    def tokenize(self, text: str, bos: bool, text_tokens: TextTokenize) -> list[int]:
        """``text``'s tokens, each image marker a run of its pseudo-token id.

        Raises:
            ImageError: a marker names an image this client does not have.
        """
        out: list[int] = []
        for is_image, piece in split_markers(text):
            if not is_image:
                out += text_tokens(piece, bos and not out)
                continue
            image = self._images.get(piece)
            if image is None:
                raise ImageError("An image of this conversation is missing; attach it again.")
            out += [image_token_id(piece)] * (self.count(image) or GUESS_TOKENS)
        return out

    def prompt(self, tokens: list[int], text: str) -> list[int] | dict[str, Any]:
        """``/completion``'s ``prompt``: the token ids, or the multimodal object for
        ``text`` when the tokens hold images."""
        if not any(is_image_token(t) for t in tokens):
            return tokens
        return multimodal_prompt(text, self._images, self.marker, self.bos)


def save_refused(exc: ServerError, tokens: Sequence[int]) -> LamplightError:
    """What to say when llama-server refuses to save a slot: builds without llama.cpp
    PR 26640 answer 501 for a slot that holds images (older ones, without PR 25076, for
    any slot while a projector is loaded), as their slot files cannot carry images."""
    text = str(exc).lower()
    if exc.status != 501 and "multimodal" not in text and "media" not in text:
        return exc
    if any(is_image_token(t) for t in tokens):
        return LamplightError(
            "this llama-server cannot save a conversation that holds images (newer "
            "llama.cpp builds can); the images are read again when the chat is resumed"
        )
    return LamplightError(
        "this llama-server cannot save conversations while it has a vision projector "
        "loaded (--mmproj; newer llama.cpp builds can)"
    )
