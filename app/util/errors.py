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

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"This conversation needs {prompt_tokens} tokens but the context holds {n_ctx}. "
            "Drop older messages and continue, start a new chat, shorten the message, or "
            "raise the context size in settings."
        )


class DecodeError(LamplightError):
    """llama_decode failed for a reason other than a requested stop."""
