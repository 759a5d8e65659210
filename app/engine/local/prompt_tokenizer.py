"""Prompt text to token ids for one loaded model, image markers included.

A prompt's text holds a marker for each picture (``image_part``); the vision projector
turns the request's image of that digest into tokens (``Projector.sequence``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import has_markers, image_token_id, split_markers
from app.engine.local.vocab import Vocab
from app.engine.prompt.pipeline import least_tokens
from app.util.errors import ImageError

if TYPE_CHECKING:
    from app.engine.local.vision import ImageSeq, Projector

NOT_SEEN = (
    "This model does not see images: load it with its vision projector "
    "(an mmproj file) to send pictures."
)
NO_PROJECTOR = "This model does not see images (no vision projector is loaded)."


class PromptTokenizer:
    """Tokenizes for ``llm`` (a ``llama_cpp.Llama``), with the images of the request
    being rendered: what the image markers in its prompt text stand for."""

    def __init__(
        self, llm: Any, vocab: Vocab, projector: Projector | None, head: tuple[int, ...]
    ) -> None:
        self._llm = llm
        self._vocab = vocab
        self._projector = projector  # owned by the loaded model
        self._head = head
        self._images: dict[str, ImagePart] = {}  # by digest

    @property
    def has_images(self) -> bool:
        """The request being rendered shows pictures."""
        return bool(self._images)

    def tokenize(self, text: str, bos: bool) -> list[int]:
        """Token ids for prompt text; each image marker becomes its image's tokens.

        Raises:
            ImageError: an image cannot be read, or is not among the request's images.
        """
        if not text:
            return []
        if self._projector is None or not has_markers(text):
            data = text.encode("utf-8", "replace")
            return list(self._llm.tokenize(data, add_bos=bos, special=True))
        out: list[int] = []
        for is_image, part in split_markers(text):
            if is_image:
                image = self._images.get(part)
                if image is None:
                    raise ImageError("An image in this conversation is no longer available.")
                out += ([*self._head] if bos and not out else []) + self.image_seq(image).tokens
            else:
                data = part.encode("utf-8", "replace")
                out += list(self._llm.tokenize(data, add_bos=bos and not out, special=True))
        return out

    def least_tokens(self, text: str) -> int:
        """At least how many tokens ``tokenize`` makes of ``text``, found without it
        (``Vocab.longest_token``; 0 when the vocabulary gives no bound)."""
        return least_tokens(text, self._vocab.longest_token())

    def use_images(self, messages: Sequence[ChatMessage]) -> None:
        """The images the next renders of ``messages`` may show (by digest).

        Raises:
            ImageError: there are images and this model sees none.
        """
        images = [i for m in messages for i in m.images]
        if images and self._projector is None:
            raise ImageError(NOT_SEEN)
        self._images = {i.digest: i for i in images}

    def image_seq(self, image: ImagePart) -> ImageSeq:
        """``image`` tokenized by the projector (cached).

        Raises:
            ImageError.
        """
        if self._projector is None:
            raise ImageError(NO_PROJECTOR)
        return self._projector.sequence(image)

    def kept_image(self, token_id: int) -> ImageSeq | None:
        """The tokenized image whose pseudo-token is ``token_id``: the projector's, or the
        request's image of that id tokenized again (the projector keeps only the last
        few). Valid until the next tokenization; None when no image of the request has
        that id.

        Raises:
            ImageError: the request's image can no longer be read.
        """
        if self._projector is None:
            return None
        seq = self._projector.known(token_id)
        if seq is not None:
            return seq
        for image in self._images.values():
            if image_token_id(image.digest) == token_id:
                return self._projector.sequence(image)
        return None

    def image_shape(self, token_id: int) -> tuple[int, int] | None:
        """``(n_tokens, n_pos)`` of the image ``token_id`` (None: not one this engine knows)."""
        if self._projector is None:
            return None
        shape = self._projector.shape(token_id)
        if shape is None:
            seq = self.kept_image(token_id)
            shape = (seq.n_tokens, seq.n_pos) if seq is not None else None
        return shape
