"""Writing a ``ChatSession``'s open transcript, and the room left in it.

A transcript never grows past what the store can read back (``MAX_TRANSCRIPT_BYTES``):
its size when last written is kept, and a new message, or a round's tool results,
must leave room for a reply of the largest size (``REPLY_ROOM``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from app.chat.conversation import Conversation, ConversationError
from app.chat.image_store import MAX_IMAGES
from app.chat.session_link import SessionView
from app.chat.store import MAX_TRANSCRIPT_BYTES, ConversationStore
from app.engine.backend import MAX_REPLY_BYTES, ModelInfo

log = logging.getLogger(__name__)

# Room kept in a transcript for the next reply: every backend caps a reply's text at
# MAX_REPLY_BYTES, and JSON's escapes can make that up to four times as long on disk.
REPLY_ROOM = 4 * MAX_REPLY_BYTES


class TranscriptWriter:
    """Saves the open conversation into ``store``; notes go to ``view``.

    ``unsaved``: the last write failed (the session retries at the next action).
    """

    def __init__(self, store: ConversationStore, view: SessionView) -> None:
        self._store = store
        self._view = view
        self.unsaved = False
        self._saved_bytes = 0  # the open transcript's size when last written (room_for)
        self._deleted: set[str] = set()  # conversations deleted: never written again

    def write(self, conv: Conversation, model: ModelInfo | None) -> bool:
        """Write ``conv`` if it has messages, naming ``model`` in it; False (and a note)
        when that failed."""
        if not conv.messages or conv.id in self._deleted:
            self.unsaved = False
            return True
        conv.auto_title()
        if model is not None:
            conv.model_name = model.name
            conv.model_path = str(model.path)
        try:
            self._saved_bytes = self._store.save(conv)
        except (OSError, ConversationError) as exc:
            log.warning("saving %s failed: %s", conv.id, exc)
            self.unsaved = True
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._view.notice(
                f"The conversation could not be saved ({reason}). It stays open, and saving "
                "is tried again with your next action."
            )
            return False
        self.unsaved = False
        self._view.row_saved(conv.id)
        return True

    def deleted(self, conv_id: str) -> None:
        """``conv_id`` was deleted: a write of it does nothing from now on."""
        self._deleted.add(conv_id)

    def room_for(self, text: str, images: Sequence[dict[str, Any]] = ()) -> bool:
        """Whether ``text`` with references to ``images`` (their bytes are kept apart)
        and a reply of the largest size still fit in the transcript, and the images in
        a message; a note says so when not."""
        if not self.images_fit(images):
            return False
        needed = self._saved_bytes + len(json.dumps([text, *images])) + REPLY_ROOM
        if needed <= MAX_TRANSCRIPT_BYTES:
            return True
        self._view.notice(
            "This conversation is full: a saved conversation holds at most "
            f"{MAX_TRANSCRIPT_BYTES >> 20} MB. Fork it or start a new chat to go on; "
            "your message stays in the box."
        )
        return False

    def images_fit(self, images: Sequence[object]) -> bool:
        """Whether a message may hold ``images``; a note says so when not."""
        if len(images) <= MAX_IMAGES:
            return True
        self._view.notice(f"A message can show at most {MAX_IMAGES} images.")
        return False

    def result_room(self) -> int:
        """Bytes the transcript has left for a round's tool results."""
        return MAX_TRANSCRIPT_BYTES - REPLY_ROOM - self._saved_bytes
