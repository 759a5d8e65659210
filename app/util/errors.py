"""Errors the core raises; each message is written for the person using the app."""


class LamplightError(Exception):
    """Base of every error the core reports to the user."""


class ModelFileError(LamplightError):
    """The model file is missing, unreadable or not a usable GGUF."""


class ModelLoadError(LamplightError):
    """llama.cpp refused to load a file that looked valid."""


class NoModelLoaded(LamplightError):
    """A request arrived before any model was loaded."""


class ContextOverflowError(LamplightError):
    """The prompt does not fit the context window (and the policy is to stop)."""

    MARK = "but the context holds"  # in every message of this kind, for the UI to offer a way on

    def __init__(self, prompt_tokens: int, n_ctx: int, at_least: bool = False) -> None:
        """``at_least``: ``prompt_tokens`` is a lower bound (the prompt was not tokenized)."""
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        needs = f"at least {prompt_tokens}" if at_least else f"{prompt_tokens}"
        super().__init__(
            f"This conversation needs {needs} tokens but the context holds {n_ctx}. "
            "Drop older messages and continue, start a new chat, shorten the message, or "
            "raise the context size in settings."
        )


class DecodeError(LamplightError):
    """llama_decode failed for a reason other than a requested stop."""


class DraftError(LamplightError):
    """A draft model cannot draft for the loaded model (or could not be loaded)."""


class ServerOverflowError(ContextOverflowError):
    """``ContextOverflowError`` for a server's context: its size is set on the server, and
    either number may be unknown (0) when the server's message does not give it."""

    def __init__(self, prompt_tokens: int, n_ctx: int, at_least: bool = False) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        needs = f"{prompt_tokens} tokens" if prompt_tokens > 0 else "more tokens than that"
        needs = f"at least {needs}" if at_least and prompt_tokens > 0 else needs
        holds = f"{n_ctx}" if n_ctx > 0 else "(the server did not say how many)"
        if prompt_tokens <= 0 and n_ctx > 0:
            needs = f"more than {n_ctx} tokens"
        elif prompt_tokens <= 0:
            needs = "more tokens than the server's model takes"
        LamplightError.__init__(
            self,
            f"This conversation needs {needs} but the context holds {holds}. Drop older "
            "messages and continue, start a new chat, shorten the message, or start the "
            "server with a larger context.",
        )


class ApiKeyRefused(LamplightError):
    """The server refused the API key (401/403)."""


class ImageError(LamplightError):
    """An image that cannot be shown to the model: not an image, damaged, too large, or
    a model that does not see images. The message says which, for the user."""


class ProjectorError(ModelFileError):
    """A vision projector (``mmproj``) file refused before llama.cpp reads it: the reason
    (not a projector, damaged, made for another model) is the message."""


class DocumentError(LamplightError):
    """A document that cannot be read or indexed; the message says why, for the user."""


class DocumentCancelled(DocumentError):
    """Reading or indexing documents was cancelled by the user."""


class EmbedderError(ModelFileError):
    """An embedding model that cannot be used (not an embedder, or damaged)."""
