"""``ApiConfig``: the API server's settings, and why they cannot be used."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from app.config.api_settings import is_host, is_loopback, is_origin
from app.host.kv_pool import LOCAL_API
from app.util.errors import LamplightError

MIN_BODY = 1024
# A chat's text is a few MB at most; images are what make bodies large: one of
# ``app.util.images.MAX_IMAGE_BYTES`` (32 MiB) is ~43 MB as base64, a phone photo
# (5-12 MB) 7-16 MB. Parse time is bounded by ``schema.load_body``'s item count, not
# by the size (a long base64 string parses at memory speed).
MAX_BODY_MB = 64
MAX_WAIT_S = 300.0  # a request still waiting after this gets 503 + Retry-After


def api_party(api_key: str) -> str:
    """The KV cache party of requests made with ``api_key`` (``KvPool``): one per key, so
    a client never reuses, or learns of, a conversation made with another key (or the
    window's). A digest, so the key itself is kept nowhere else."""
    if not api_key:
        return LOCAL_API
    return "api:" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


class ApiConfigError(LamplightError):
    """The server settings cannot be used (``ApiConfig.problem`` says why)."""


@dataclass(frozen=True)
class ApiConfig:
    host: str = "127.0.0.1"
    port: int = 1234
    api_key: str = ""
    cors_origins: tuple[str, ...] = ()
    max_queue: int = 32  # running or waiting; a waiting request costs a deque slot
    max_body_bytes: int = MAX_BODY_MB * 2**20
    max_wait_s: float = MAX_WAIT_S

    def problem(self) -> str:
        """Why these settings cannot be used ("" when they can)."""
        host = self.host.strip("[]")
        if not is_host(host):
            return f"The address {self.host!r} is not an IP address or a host name."
        if isinstance(self.port, bool) or not 0 <= self.port <= 65535:
            return f"The port must be between 0 and 65535 (got {self.port})."
        if self.api_key and not all(33 <= ord(c) <= 126 for c in self.api_key):
            return "The API key may hold only visible ASCII characters (no spaces)."
        if not is_loopback(host) and not self.api_key:
            return (
                f"Listening on {self.host} lets other computers reach the model: "
                "set an API key first (or listen on 127.0.0.1)."
            )
        bad = [o for o in self.cors_origins if not is_origin(o)]
        if bad:
            return f"{bad[0]!r} is not a web origin (https://host:port)."
        if "*" in self.cors_origins and not self.api_key:
            return (
                "Allowing every web origin (*) lets any web page you visit use the model "
                "and read its replies: set an API key first (or list the pages' origins)."
            )
        if self.max_queue < 1:
            return "The queue must hold at least one request."
        if self.max_body_bytes < MIN_BODY:
            return f"The request size limit must be at least {MIN_BODY} bytes."
        if self.max_body_bytes > MAX_BODY_MB * 2**20:
            return (
                f"The request size limit can be at most {MAX_BODY_MB} MB "
                f"(got {self.max_body_bytes / 2**20:g} MB)."
            )
        if not self.max_wait_s > 0:
            return "The longest wait in the queue must be more than 0 seconds."
        return ""
