"""Run a bench script again in a fresh process and read the JSON object it prints last.

The benches measure in child processes so that each configuration starts cold (its own
peak RSS, no thread pools or caches left by another) and its environment can differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_json(
    script: str,
    args: list[str],
    what: str,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """``python script *args`` from the repository root; its last stdout line as JSON.

    A child that fails ends the bench (SystemExit naming ``what``) after its stderr tail.
    """
    proc = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env if env is not None else dict(os.environ),
        timeout=timeout,
    )
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit {proc.returncode})")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
