"""The user's standing answers to "may this tool run?" (``mcp_approvals.json``).

Only the "always" answers are kept: for one tool of a server, or for every tool of a
server (``"*"``). Each rule names the server's configuration (``ServerConfig.server_id``:
its command, arguments, folder and environment, or its URL and headers) as well as its
name, so a name pointed at another command or address in ``mcp.json`` asks again. A
rule of an older Lamplight names the server alone: it grants nothing and is dropped.
Written atomically; a damaged file is set aside and the store starts empty (the user
is asked again: the safe side).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Literal, NamedTuple

from app.mcp.state import read_object
from app.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

Decision = Literal["once", "always_tool", "always_server", "deny"]
ANY_TOOL = "*"
MAX_RULES = 4096
MAX_PART = 256  # characters of a server name, id or tool name in a rule


class Rule(NamedTuple):
    """An "always": ``tool`` ("*": every tool) of ``server`` configured as ``server_id``."""

    server: str
    server_id: str
    tool: str


class ApprovalStore:
    """Standing approvals; thread-safe, each change saved at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        data, self.note = read_object(path, "every tool asks again")
        rules = data.get("always")
        self._rules: list[Rule] = []
        old = 0
        if isinstance(rules, list):
            for item in rules[:MAX_RULES]:
                rule = _rule(item)
                if rule is not None and rule not in self._rules:
                    self._rules.append(rule)
                old += _old_rule(item)
        if old:
            self.note = self.note or (
                f"{old} tool approval(s) of an older Lamplight named a server but not what "
                "it runs; those tools ask once more."
            )
            self._save()  # once: the old rules are gone from the file

    def allowed(self, server: str, server_id: str, tool: str) -> bool:
        """Whether an "always" rule for ``server`` configured exactly as ``server_id``
        lets ``tool`` run without asking (an empty ``server_id`` never is)."""
        if not server_id:
            return False
        with self._lock:
            return (
                Rule(server, server_id, tool) in self._rules
                or Rule(server, server_id, ANY_TOOL) in self._rules
            )

    def remember(self, server: str, server_id: str, tool: str, decision: Decision) -> None:
        """Keep an "always" decision (a "once" or "deny", or a call without a server
        configuration to name, is not stored)."""
        if decision == "always_tool":
            if tool == ANY_TOOL:
                return  # a tool a server named "*": not kept, it would allow every tool
            rule = Rule(server, server_id, tool)
        elif decision == "always_server":
            rule = Rule(server, server_id, ANY_TOOL)
        else:
            return
        if _rule(list(rule)) is None:
            return
        with self._lock:
            if rule in self._rules or len(self._rules) >= MAX_RULES:
                return
            self._rules.append(rule)
        self._save()

    def rules(self) -> list[Rule]:
        """Each standing approval, oldest first."""
        with self._lock:
            return list(self._rules)

    def forget(self, rule: Rule) -> None:
        """Drop ``rule`` (as ``rules`` gave it)."""
        with self._lock:
            if rule not in self._rules:
                return
            self._rules.remove(rule)
        self._save()

    def _save(self) -> None:
        with self._lock:
            text = json.dumps({"always": [list(r) for r in self._rules]}, indent=2)
        try:
            atomic_write_text(self.path, text + "\n")
        except OSError:
            log.warning("could not save %s", self.path, exc_info=True)


def _rule(item: object) -> Rule | None:
    """A stored rule: [server, server_id, tool], each a non-empty bounded string."""
    if (
        isinstance(item, list)
        and len(item) == 3
        and all(isinstance(x, str) and 0 < len(x) <= MAX_PART for x in item)
    ):
        return Rule(item[0], item[1], item[2])
    return None


def _old_rule(item: object) -> bool:
    """[server, tool]: a rule of an older Lamplight, bound to the name alone."""
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
