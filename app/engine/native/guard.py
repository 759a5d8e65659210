"""Before a load: check the risky native paths it would use (once per build and CPU), and
switch off those that crash here.

The engine asks :meth:`NativeGuard.prepare` before each load. A path the load
would use and that has no verdict for this machine yet is tried first in a
child process (``app/engine/native/path_probe.py``, about a second, once); a path
whose child crashed, or that the user turned off after a crash, is switched off
for the load, and the load's notes say so and what it costs. Only paths a load
uses are checked: the repacked weights (always, on the CPU), flash attention
(when asked for, or for the q8_0 KV cache) and GPU offload (with a GPU).

A load with a vision projector has it checked too (``projector_guard``: loaded in a
child first, once per file), and a projector that ends the process is left out.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from app.config.setting_records import LoadConfig
from app.engine.native.path_probe import ProbeResult, run_probe
from app.engine.native.paths import FILE_NAME, PathVerdicts, RiskyPath
from app.engine.native.projector_guard import ProjectorGuard
from app.gguf.projector_checks import FILE_NAME as CHECKS_FILE
from app.gguf.projector_checks import ProjectorChecks
from app.util.errors import ModelLoadError

log = logging.getLogger(__name__)

STORE_ENV = "LAMPLIGHT_NATIVE_PATHS_FILE"  # one store for many data folders (the test suite)

ProbeFn = Callable[[RiskyPath | None, Path, int], ProbeResult]  # None: the control run


@dataclass(frozen=True)
class Prepared:
    """A load with the paths that are off here taken out."""

    config: LoadConfig
    extra_bufts: bool
    notes: tuple[str, ...]
    off: frozenset[RiskyPath]


def wanted_paths(config: LoadConfig, gpu: bool) -> tuple[RiskyPath, ...]:
    """The risky paths a load with ``config`` would run (``gpu``: the build has a GPU)."""
    out = [RiskyPath.EXTRA_BUFTS]
    if config.flash_attn or config.kv_type != "f16":
        out.append(RiskyPath.FLASH_ATTN)
    if gpu and config.n_gpu_layers != 0:
        out.append(RiskyPath.GPU_OFFLOAD)
    return tuple(out)


def default_guard() -> NativeGuard | None:
    """A guard on ``LAMPLIGHT_NATIVE_PATHS_FILE`` when it is set (engines made without a
    data folder: the test suite, the benches), else None."""
    override = os.environ.get(STORE_ENV, "").strip()
    return NativeGuard(Path(override)) if override else None


def store_file(data_root: Path) -> Path:
    """Where the verdicts live: the data folder, unless ``LAMPLIGHT_NATIVE_PATHS_FILE`` says."""
    override = os.environ.get(STORE_ENV, "").strip()
    return Path(override) if override else data_root / FILE_NAME


def projector_checks_file(data_root: Path) -> Path:
    """Where the verdicts on projector files live: beside the native paths' verdicts."""
    return store_file(data_root).with_name(CHECKS_FILE)


CONTROL_CRASH = (
    "Loading a model crashed llama.cpp in a test process even with every risky path off "
    "({detail}), so it would crash Lamplight too: it was not loaded, and nothing is lost. "
    "This llama.cpp build does not run on this system as it is. Restart Lamplight to "
    "check again."
)  # One such case, a second C++ runtime in the process: docs/notes/gpu.md.


def off_note(path: RiskyPath, why: str) -> str:
    return (
        f"{path.label} is off on this computer: {why}. Without it, {path.cost}. "
        "Help → Hardware and backends can check it again."
    )


class NativeGuard:
    """Verdicts for this machine, probing the unknown ones; used on the engine thread.

    ``key`` is computed on first use (after the backends are loaded, since the CPU
    variant is part of it); ``probe`` is :func:`run_probe` unless a test injects one.
    """

    def __init__(
        self,
        file: Path,
        probe: ProbeFn | None = None,
        key: Callable[[], str] | None = None,
        probe_model: Callable[[], Path | None] | None = None,
        projectors: ProjectorGuard | None = None,
    ) -> None:
        self._file = file
        # Projector files, with their verdicts beside this file's.
        self.projectors = projectors or ProjectorGuard(ProjectorChecks(file.with_name(CHECKS_FILE)))
        self._probe = probe or (lambda p, m, t: run_probe(p, m, threads=t))
        self._key = key
        self._probe_model = probe_model
        self._store: PathVerdicts | None = None
        self._lock = threading.Lock()
        self._inconclusive: set[RiskyPath] = set()  # not tried again in this process
        self._unsaved: dict[RiskyPath, tuple[bool, str]] = {}  # the file could not be written
        self._control_crash = ""  # a control run crashed: no load is safe in this process

    @property
    def store(self) -> PathVerdicts:
        with self._lock:
            if self._store is None:
                if self._key is None:
                    from app.engine.native.libs import machine_key

                    self._key = machine_key
                self._store = PathVerdicts(self._file, self._key())
            return self._store

    def off(self) -> dict[RiskyPath, str]:
        """The paths that are off here, with why."""
        out = {p: v.reason for p, v in self.store.verdicts().items() if not v.ok}
        out.update({p: why for p, (ok, why) in self._unsaved.items() if not ok})
        return out

    def prepare(self, model: Path, config: LoadConfig, gpu: bool) -> Prepared:
        """``config`` with what crashes here switched off (a projector among them);
        unknown paths and projectors are checked first.

        Raises:
            ModelLoadError: a load crashed even with every risky path off (the control
                run): loading in this process would crash the app.
        """
        wanted = wanted_paths(config, gpu)
        store = self.store
        unknown = [
            p
            for p in store.unknown(wanted)
            if p not in self._inconclusive and p not in self._unsaved
        ]
        if unknown:
            target = (self._probe_model() if self._probe_model else None) or model
            for path in unknown:
                self._check(path, target, config.threads())
        if self._control_crash:
            raise ModelLoadError(CONTROL_CRASH.format(detail=self._control_crash))
        off = {p: why for p, why in self.off().items() if p in wanted}
        notes = tuple(off_note(p, why) for p, why in off.items())
        if RiskyPath.FLASH_ATTN in off:
            config = replace(config, flash_attn=False, kv_type="f16")
        if RiskyPath.GPU_OFFLOAD in off:
            config = replace(config, n_gpu_layers=0)
        config, left_out = self.projectors.vet(model, config)  # loaded as the engine would
        notes += (left_out,) if left_out else ()
        return Prepared(config, RiskyPath.EXTRA_BUFTS not in off, notes, frozenset(off))

    def _check(self, path: RiskyPath, model: Path, threads: int) -> None:
        log.info("checking %s on this machine (%s)", path.value, model.name)
        result = self._probe(path, model, threads)
        log.info("check of %s: %s in %.2f s", path.value, result.detail, result.seconds)
        if result.crashed:
            # Only the path's fault if the same run with every risky path off survives.
            control = self._probe(None, model, threads)
            log.info("control run: %s", control.detail)
            if control.crashed or not control.conclusive:
                log.warning("the control run failed too: %s is not to blame", path.value)
                result = replace(result, conclusive=False)
            if control.crashed:
                self._control_crash = control.detail
        if not result.conclusive:
            self._inconclusive.add(path)
            return
        try:
            self.store.record(path, not result.crashed, result.detail, "probe")
        except OSError as exc:  # kept for this run; checked again next start
            log.warning("native path verdict not saved: %s", exc)
            self._unsaved[path] = (not result.crashed, result.detail)
