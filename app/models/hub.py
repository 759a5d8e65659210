"""Finding GGUF models on the Hugging Face Hub, through ``huggingface_hub``.

Search pages through ``HfApi.list_models`` (the library follows the Hub's
pagination); repo details come from ``model_info(files_metadata=True)``,
which gives each file's size and LFS sha256. Errors become messages that
say what to do (sign in, accept a license, check the name).

The Hub's answers are untrusted: a repo id or file name that
``app.models.names`` refuses is left out (and counted), a field of the wrong
type or a listing too large to show is a ``HubError``, never another exception.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.models.downloader import explain_http_error
from app.models.names import UnsafeNameError, check_file_name, check_repo_id
from app.models.projectors import rank
from app.models.quant import GgufChoice, RepoFile, group_gguf
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

VISION_TAGS = frozenset({"image-text-to-text", "vision", "multimodal", "llava", "mmproj"})
SORTS = {"downloads": "downloads", "recent": "last_modified", "likes": "likes"}
MAX_FILES = 50_000  # files in one repo listing; the largest GGUF repos have a few hundred
MAX_TAGS = 200
MAX_COUNT = 2**63 - 1


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

    @property
    def vision(self) -> bool:
        """Its tags say it takes images (the repo's files tell for sure)."""
        return any(t.lower() in VISION_TAGS for t in self.tags)


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
    refused: tuple[str, ...] = ()  # GGUF files left out: unsafe name, bad size or sha256

    @property
    def projectors(self) -> tuple[GgufChoice, ...]:
        """Its vision projectors (``mmproj`` files)."""
        return tuple(c for c in self.choices if c.kind == "mmproj" and not c.split)

    @property
    def vision(self) -> bool:
        return bool(self.projectors)

    def projector_for(self, choice: GgufChoice) -> GgufChoice | None:
        """The projector to download with model ``choice``: the one sharing its name,
        else the most precise (F16 first); None for a text-only repo."""
        found = self.projectors
        if not found:
            return None
        return min(found, key=lambda p: rank(choice.name, p.name))


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
                try:
                    repo_id = check_repo_id(m.id)
                except UnsafeNameError as exc:
                    log.info("search result left out: %s", exc)
                    continue
                tags = m.tags if isinstance(m.tags, list) else []
                yield ModelHit(
                    repo_id=repo_id,
                    downloads=_count(m.downloads),
                    likes=_count(m.likes),
                    updated=m.last_modified if isinstance(m.last_modified, datetime) else None,
                    gated=bool(m.gated),
                    tags=tuple(str(t)[:100] for t in tags[:MAX_TAGS]),
                )
        except LamplightError:
            raise
        except Exception as exc:
            raise HubError(_explain(exc, "The search")) from exc

    def page(self, query: str, sort: str, start: int, count: int) -> list[ModelHit]:
        """Results ``start .. start+count`` (the UI's "more results")."""
        return list(itertools.islice(self.search(query, sort), start, start + count))

    def details(self, repo_id: str) -> RepoDetails:
        """The repo's GGUF files grouped into choices, with sizes and sha256.

        Raises:
            UnsafeNameError: ``repo_id`` is refused (nothing is requested).
            HubError: the Hub could not answer, or answered something unusable.
        """
        check_repo_id(repo_id)
        try:
            info = self._api.model_info(repo_id, files_metadata=True)
        except Exception as exc:
            raise HubError(_explain(exc, repo_id)) from exc
        try:
            return self._details(repo_id, info)
        except LamplightError:
            raise
        except Exception as exc:  # a field of the wrong type, a malformed entry
            log.info("unusable answer for %s: %r", repo_id, exc)
            raise HubError(
                f"{repo_id}: the Hub's answer could not be read ({exc.__class__.__name__})."
            ) from exc

    @staticmethod
    def _details(repo_id: str, info: Any) -> RepoDetails:
        siblings = info.siblings or []
        if not isinstance(siblings, list):
            raise HubError(f"{repo_id}: the Hub's file list is not a list.")
        if len(siblings) > MAX_FILES:
            raise HubError(f"{repo_id} lists {len(siblings):,} files; more than this app shows.")
        files, refused = [], []
        for s in siblings:
            lfs: Any = getattr(s, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            if sha is None and isinstance(lfs, dict):
                sha = lfs.get("sha256")
            size = s.size if s.size is not None else getattr(lfs, "size", 0) or 0
            name = s.rfilename
            if not isinstance(name, str) or not name.lower().endswith(".gguf"):
                continue  # only GGUF files are offered; others are never written
            try:
                check_file_name(name)
            except UnsafeNameError as exc:
                log.info("%s: %s", repo_id, exc)
                refused.append(ascii(name)[:120])
                continue
            if not _is_count(size) or not (sha is None or _is_sha256(sha)):
                log.info("%s: %r has a bad size or sha256", repo_id, name)
                refused.append(ascii(name)[:120])
                continue
            files.append(RepoFile(name, size, sha.lower() if sha else None))
        card = getattr(info, "card_data", None)
        license_name = str(getattr(card, "license", "") or "")[:200] if card else ""
        return RepoDetails(
            repo_id=repo_id,  # what we asked for and checked, not what the answer says
            sha=info.sha if isinstance(info.sha, str) and _is_revision(info.sha) else "main",
            gated=bool(info.gated),
            license=license_name,
            choices=tuple(group_gguf(files)),
            downloads=_count(info.downloads),
            likes=_count(info.likes),
            refused=tuple(refused),
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _count(value: object) -> int:
    """A count from the Hub, or 0 for a missing or nonsensical one."""
    return value if isinstance(value, int) and _is_count(value) else 0


def _is_sha256(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(c in "0123456789abcdefABCDEF" for c in value)
    )


def _is_revision(value: str) -> bool:
    """A commit id (the Hub's ``sha``): 40 hex digits."""
    return len(value) == 40 and all(c in "0123456789abcdef" for c in value)


def _explain(exc: BaseException, what: str) -> str:
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        return f"{what}: the Hub did not answer in time. Check your connection and try again."
    if isinstance(exc, httpx2.TransportError):
        return f"{what}: could not reach the Hub ({exc.__class__.__name__}). Are you online?"
    return explain_http_error(exc, what)
