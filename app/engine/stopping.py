"""Stop strings in streamed text: hold back only what could still become a stop string."""

from __future__ import annotations

from collections.abc import Iterable


class StopStringFilter:
    """Feeds text pieces through; cuts the stream at the first stop string.

    Text that might be the start of a stop string is held until the next piece
    decides it, so a stop string never reaches the user even split over tokens.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(s for s in dict.fromkeys(stops) if s)
        self._held = ""
        self.hit = False
        self.matched = ""  # the stop string that ended the text, once ``hit``

    def feed(self, piece: str) -> str:
        """Text that is safe to show now; sets ``hit`` when a stop string completes."""
        if self.hit:
            return ""
        text = self._held + piece
        found = [(i, s) for s in self._stops if (i := text.find(s)) >= 0]
        first = min(i for i, _ in found) if found else -1
        if first >= 0:
            self.hit = True
            self.matched = next(s for i, s in found if i == first)
            self._held = ""
            return text[:first]
        keep = self._longest_partial(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held tail, once the stream has ended without a stop string."""
        out, self._held = self._held, ""
        return out

    def _longest_partial(self, text: str) -> int:
        return partial_suffix(text, self._stops)


def partial_suffix(text: str, strings: Iterable[str]) -> int:
    """How many trailing characters of ``text`` could begin one of ``strings`` (the most
    that must be held back until the next piece decides)."""
    best = 0
    for s in strings:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
