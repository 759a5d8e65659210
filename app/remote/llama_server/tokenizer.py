"""The server's tokenizer (``/tokenize``), as the llama-server backend uses it: prompt
text to token ids, an image marker as a run of its pseudo-token."""

from __future__ import annotations

from collections.abc import Callable

from app.engine.chat_message import ImagePart
from app.engine.image_part import has_markers
from app.remote.http import ServerError
from app.remote.llama_server.images import Call, ServerImages
from app.remote.llama_server.wire import int_or, tokens_error
from app.util.errors import LamplightError


class ServerTokenizer:
    """Token ids from the server, and which texts are one token of its vocabulary.

    ``n_ctx`` says the context size of the model in use (0 when none), for the error
    of a text the server will not tokenize.
    """

    def __init__(self, call: Call, media: ServerImages, n_ctx: Callable[[], int]) -> None:
        self._call = call
        self._media = media
        self._n_ctx = n_ctx
        self._special: dict[str, bool] = {}  # which texts are one token of the vocabulary

    def reset(self) -> None:
        """Another server's vocabulary, maybe: forget what was learnt of it."""
        self._special = {}

    def tokenize(self, text: str, bos: bool = False) -> list[int]:
        """Token ids of prompt text; an image marker is a run of its pseudo-token."""
        if has_markers(text):
            return self._media.tokenize(text, bos, self._text_tokens)
        return self._text_tokens(text, bos)

    def _text_tokens(self, text: str, bos: bool = False) -> list[int]:
        if not text:
            return []
        try:
            answer = self._call(
                "POST", "/tokenize", {"content": text, "add_special": bos, "parse_special": True}
            )
        except ServerError as exc:
            raise tokens_error(exc, self._n_ctx()) from None
        ids = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(ids, list) or not all(int_or(i, -1) >= 0 for i in ids):
            raise ServerError(0, "The server's /tokenize answer has no token list.")
        return [int(i) for i in ids]

    def image_tokens(self, image: ImagePart) -> int:
        """The server's count of ``image``'s tokens (0 when it cannot say).

        Raises:
            ImageError: the server takes no images.
        """
        return self._media.count(image)

    def has_token(self, text: str) -> bool:
        if text not in self._special:
            try:
                ids = self.tokenize(text)
            except LamplightError:
                ids = []
            self._special[text] = len(ids) == 1
        return self._special[text]
