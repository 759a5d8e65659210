"""Finding GGUF models on the Hugging Face Hub, through ``huggingface_hub``.

Search pages through ``HfApi.list_models`` (the library follows the Hub's
pagination); repo details come from ``model_info(files_metadata=True)``,
which gives each file's size and LFS sha256. Errors become messages that
say what to do (sign in, accept a license, check the name).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.models.downloader import explain_http_error
from app.models.quant import GgufChoice, RepoFile, group_gguf
from app.util.errors import LamplightError

SORTS = {"downloads": "downloads", "recent": "last_modified", "likes": "likes"}


class HubError(LamplightError):
    """The Hub could not answer; the message says why in plain words."""


@dataclass(frozen=True)
class ModelHit:
    """A search result."""

    repo_id: str
    downloads: int
    likes: int
    updated: datetime | None
    gated: bool
    tags: tuple[str, ...]


@dataclass(frozen=True)
class RepoDetails:
    """A repo page: its GGUF choices and what else it says."""

    repo_id: str
    sha: str
    gated: bool
    license: str
    choices: tuple[GgufChoice, ...]
    downloads: int
    likes: int


class HubClient:
    """Thin, typed wrapper over ``HfApi``; one per endpoint/token."""

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None) -> None:
        from huggingface_hub import HfApi

        self.endpoint = endpoint
        self.token = token
        self._api = HfApi(endpoint=endpoint, token=token)

    def search(self, query: str, sort: str = "downloads") -> Iterator[ModelHit]:
        """GGUF models matching ``query``, best first; pages are fetched as you iterate."""
        try:
            models = self._api.list_models(
                search=query.strip() or None,
                filter="gguf",
                sort=SORTS.get(sort, "downloads"),  # type: ignore[arg-type]
                limit=None,
            )
            for m in models:
                yield ModelHit(
                    repo_id=m.id,
                    downloads=int(m.downloads or 0),
                    likes=int(m.likes or 0),
                    updated=m.last_modified,
                    gated=bool(m.gated),
                    tags=tuple(m.tags or ()),
                )
        except LamplightError:
            raise
        except Exception as exc:
            raise HubError(_explain(exc, "The search")) from exc

    def page(self, query: str, sort: str, start: int, count: int) -> list[ModelHit]:
        """Results ``start .. start+count`` (the UI's "more results")."""
        return list(itertools.islice(self.search(query, sort), start, start + count))

    def details(self, repo_id: str) -> RepoDetails:
        """The repo's GGUF files grouped into choices, with sizes and sha256."""
        try:
            info = self._api.model_info(repo_id, files_metadata=True)
        except Exception as exc:
            raise HubError(_explain(exc, repo_id)) from exc
        files = []
        for s in info.siblings or []:
            lfs: Any = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha is None and isinstance(lfs, dict):
                sha = lfs.get("sha256")
            size = s.size if s.size is not None else getattr(lfs, "size", 0) or 0
            files.append(RepoFile(s.rfilename, int(size), sha))
        card = getattr(info, "card_data", None)
        license_name = str(getattr(card, "license", "") or "") if card else ""
        return RepoDetails(
            repo_id=info.id,
            sha=info.sha or "main",
            gated=bool(info.gated),
            license=license_name,
            choices=tuple(group_gguf(files)),
            downloads=int(info.downloads or 0),
            likes=int(info.likes or 0),
        )


def _explain(exc: BaseException, what: str) -> str:
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        return f"{what}: the Hub did not answer in time. Check your connection and try again."
    if isinstance(exc, httpx2.TransportError):
        return f"{what}: could not reach the Hub ({exc.__class__.__name__}). Are you online?"
    return explain_http_error(exc, what)
