"""The user's standing answers to "may this tool run?" (``mcp_approvals.json``).

Only the "always" answers are kept: for one tool of a server, or for every tool of a
server (``"*"``). Written atomically; a damaged file is set aside and the store starts
empty (the user is asked again: the safe side).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Literal

from app.mcp.state import read_object
from app.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

Decision = Literal["once", "always_tool", "always_server", "deny"]
ANY_TOOL = "*"
MAX_RULES = 4096


class ApprovalStore:
    """Standing approvals; thread-safe, each change saved at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        data, self.note = read_object(path, "every tool asks again")
        rules = data.get("always")
        self._rules: list[tuple[str, str]] = []
        if isinstance(rules, list):
            for rule in rules[:MAX_RULES]:
                if (
                    isinstance(rule, list)
                    and len(rule) == 2
                    and all(isinstance(x, str) and x for x in rule)
                    and (rule[0], rule[1]) not in self._rules
                ):
                    self._rules.append((rule[0], rule[1]))

    def allowed(self, server: str, tool: str) -> bool:
        """Whether an "always" rule lets ``tool`` of ``server`` run without asking."""
        with self._lock:
            return (server, tool) in self._rules or (server, ANY_TOOL) in self._rules

    def remember(self, server: str, tool: str, decision: Decision) -> None:
        """Keep an "always" decision (a "once" or "deny" is not stored)."""
        if decision == "always_tool":
            rule = (server, tool)
        elif decision == "always_server":
            rule = (server, ANY_TOOL)
        else:
            return
        with self._lock:
            if rule in self._rules:
                return
            self._rules.append(rule)
        self._save()

    def rules(self) -> list[tuple[str, str]]:
        """(server, tool or "*") of each standing approval."""
        with self._lock:
            return list(self._rules)

    def forget(self, server: str, tool: str) -> None:
        """Drop the rule (server, tool); ``tool`` may be "*"."""
        with self._lock:
            if (server, tool) not in self._rules:
                return
            self._rules.remove((server, tool))
        self._save()

    def _save(self) -> None:
        with self._lock:
            text = json.dumps({"always": [list(r) for r in self._rules]}, indent=2)
        try:
            atomic_write_text(self.path, text + "\n")
        except OSError:
            log.warning("could not save %s", self.path, exc_info=True)
