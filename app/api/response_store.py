"""Stored responses (issue 46): ``store`` keeps a response and the items it was made
from, so a later request can go on from it (``previous_response_id``) without
sending them again; ``GET`` / ``DELETE /v1/responses/{id}`` read and drop one.

One JSON file per response in ``<data>/responses/``, written atomically, holding its
owner (a digest of the API party: a key reads and drops only what its requests
stored, and another key's response is the same 404 as a missing one), the items (the
input chain and the output) and the response body. Bounded: at most ``MAX_RECORDS``
files and ``MAX_BYTES`` in all, the least recently used going first; a file is read
back defensively (size, depth, shape), as anything in the data folder is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.host.prompt_cache import owner
from app.util.atomic import atomic_write_bytes
from app.util.datafiles import DataFileError, parse_json
from app.util.lru_files import trim

MAX_RECORDS = 1000
MAX_BYTES = 1 << 30
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 64
ID = re.compile(r"resp_[A-Za-z0-9]{1,64}")


@dataclass(frozen=True)
class StoredResponse:
    """A stored response: the items to go on from, and the body to show."""

    id: str
    items: list[dict[str, Any]]
    body: dict[str, Any]


class ResponseStore:
    """The responses under ``folder``; every method may be called from any one thread
    at a time (the server's parser thread)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, response_id: str) -> Path | None:
        return self.folder / f"{response_id}.json" if ID.fullmatch(response_id) else None

    def save(self, party: str, stored: StoredResponse) -> None:
        """Keep ``stored`` for ``party`` (the oldest go past the bounds).

        Raises:
            OSError: it could not be written.
        """
        path = self._path(stored.id)
        if path is None:
            return
        record = {
            "version": 1,
            "owner": owner(party),
            "items": stored.items,
            "response": stored.body,
        }
        data = json.dumps(record, ensure_ascii=False).encode()
        if len(data) > MAX_RECORD_BYTES:
            return  # too large to keep: a later request sends the items itself
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        trim(self.folder, "resp_*.json", path, MAX_BYTES, MAX_RECORDS)

    def load(self, party: str, response_id: str) -> StoredResponse | None:
        """``party``'s stored response ``response_id`` (None: none, another's, or a file
        that cannot be read)."""
        path = self._path(response_id)
        if path is None:
            return None
        try:
            if path.stat().st_size > MAX_RECORD_BYTES:
                return None
            record = parse_json(path.read_bytes(), max_depth=MAX_DEPTH)
        except (OSError, DataFileError):
            return None
        if not isinstance(record, dict) or record.get("owner") != owner(party):
            return None
        items, body = record.get("items"), record.get("response")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return None
        if not isinstance(body, dict):
            return None
        with contextlib.suppress(OSError):  # the most recently used: the last to go
            os.utime(path)
        return StoredResponse(response_id, items, body)

    def delete(self, party: str, response_id: str) -> bool:
        """Drop ``party``'s response ``response_id``; whether there was one."""
        if self.load(party, response_id) is None:
            return False
        path = self._path(response_id)
        assert path is not None
        path.unlink(missing_ok=True)
        return True
