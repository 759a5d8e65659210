"""Finding GGUF models on the Hugging Face Hub, through ``huggingface_hub``.

Search reads the Hub's ``/api/models`` pages itself, through ``huggingface_hub``'s
session and headers: one bounded request per page, never retried, so offline it
fails in seconds. Repo details come from ``model_info(files_metadata=True)``,
which gives each file's size and LFS sha256. Errors become messages that
say what to do (sign in, accept a license, check the name).

The Hub's answers are untrusted: a repo id or file name that
``app.models.names`` refuses is left out (and counted), a field of the wrong
type or a listing too large to show is a ``HubError``, never another exception.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.models.download_errors import explain_http_error
from app.models.names import UnsafeNameError, check_file_name, check_repo_id
from app.models.projectors import rank
from app.models.quant import GgufChoice, RepoFile, group_gguf
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

VISION_TAGS = frozenset({"image-text-to-text", "vision", "multimodal", "llava", "mmproj"})
# The UI's sort names as the Hub's ``/api/models?sort=`` has them (else: downloads).
SORT_PARAMS: defaultdict[str, str] = defaultdict(
    lambda: "downloads", {"downloads": "downloads", "recent": "lastModified", "likes": "likes"}
)
CONNECT_S = 5.0  # an unreachable Hub (offline, a black hole) fails this fast
READ_S = 30.0  # a Hub that connected but stopped answering
MAX_PAGES = 20  # of search results followed in one search
MAX_PAGE_ITEMS = 1000  # the Hub's own page size
MAX_PAGE_BYTES = 32 * 1024 * 1024  # one page of results (a real page of 1000 is ~2 MB)
DETAILS_TIMEOUT_S = 30.0  # a repo page: model_info has no timeout of its own
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

    def search(
        self, query: str, sort: str = "downloads", limit: int | None = None
    ) -> Iterator[ModelHit]:
        """GGUF models matching ``query``, best first; pages are fetched as you iterate
        (``limit``: at most this many are wanted, so pages are no larger).

        One request per page, never retried, within ``search_timeout()``: offline, or
        with the Hub unreachable, it fails in seconds. (``list_models`` retried a failed
        connection five times over 23 s of back-off, with no timeout at all: the window
        said "Searching…" for about a minute offline.)"""
        params: dict[str, str | int] = {"filter": "gguf", "sort": SORT_PARAMS[sort]}
        if query.strip():
            params["search"] = query.strip()
        if limit is not None:
            params["limit"] = max(1, min(limit, MAX_PAGE_ITEMS))
        url: str | None = f"{self._api.endpoint.rstrip('/')}/api/models"
        try:
            for _ in range(MAX_PAGES):
                if url is None:
                    return
                items, url = self._page(url, params)
                params = {}  # the next page's address carries them
                for item in items:
                    hit = _hit(item)
                    if hit is not None:
                        yield hit
        except LamplightError:
            raise
        except Exception as exc:
            raise HubError(_explain(exc, "The search")) from exc

    def _page(self, url: str, params: dict[str, str | int]) -> tuple[list[Any], str | None]:
        """One page of search results (bounded in size) and the next page's address."""
        from huggingface_hub import get_session, hf_raise_for_status

        # Public (documented), but exported lazily: the stubs do not show it.
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

        headers = build_hf_headers(token=self.token)
        with get_session().stream(
            "GET", url, params=params or None, headers=headers, timeout=search_timeout()
        ) as response:
            hf_raise_for_status(response)
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise HubError("The search: the Hub's answer is larger than this app reads.")
            following = response.links.get("next", {}).get("url")
        items = json.loads(body)
        if not isinstance(items, list):
            raise HubError("The search: the Hub's answer is not a list of models.")
        return items, following if isinstance(following, str) and following else None

    def page(self, query: str, sort: str, start: int, count: int) -> list[ModelHit]:
        """Results ``start .. start+count`` (the UI's "more results")."""
        hits = self.search(query, sort, limit=start + count)
        return list(itertools.islice(hits, start, start + count))

    def details(self, repo_id: str) -> RepoDetails:
        """The repo's GGUF files grouped into choices, with sizes and sha256.

        Raises:
            UnsafeNameError: ``repo_id`` is refused (nothing is requested).
            HubError: the Hub could not answer, or answered something unusable.
        """
        check_repo_id(repo_id)
        try:
            info = self._api.model_info(repo_id, files_metadata=True, timeout=DETAILS_TIMEOUT_S)
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


def search_timeout() -> Any:
    """The search's ``httpx2.Timeout``: ``CONNECT_S`` to connect, ``READ_S`` to answer."""
    import httpx2

    return httpx2.Timeout(READ_S, connect=CONNECT_S)


def _hit(item: Any) -> ModelHit | None:
    """A search result from one entry of the Hub's answer (None: left out)."""
    if not isinstance(item, dict):
        raise HubError("The search: the Hub's answer holds something that is not a model.")
    raw_id = item.get("id", item.get("modelId"))
    if not isinstance(raw_id, str):
        raise HubError("The search: a model in the Hub's answer has no name.")
    try:
        repo_id = check_repo_id(raw_id)
    except UnsafeNameError as exc:
        log.info("search result left out: %s", exc)
        return None
    tags = item.get("tags")
    tags = tags if isinstance(tags, list) else []
    gated = item.get("gated")
    return ModelHit(
        repo_id=repo_id,
        downloads=_count(item.get("downloads")),
        likes=_count(item.get("likes")),
        updated=_when(item.get("lastModified")),
        gated=gated in (True, "auto", "manual"),
        tags=tuple(str(t)[:100] for t in tags[:MAX_TAGS]),
    )


def _when(value: object) -> datetime | None:
    """An ISO 8601 time from the Hub ("2024-05-01T10:00:00.000Z"), or None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


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
