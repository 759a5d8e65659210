"""Before a load with a vision projector: load the projector in a child process first
(once per file and llama.cpp version), and leave out one that ends the process.

``NativeGuard.prepare`` asks :meth:`ProjectorGuard.vet`. A projector with no
verdict yet is loaded by ``app/engine/native/projector_probe.py`` (about a second); the
verdict is kept in ``projector_checks.json`` (``app.gguf.projector_checks``), which
pairing also reads, so a refused projector is not paired again. A refused one is
left out of the load, which goes on without it, and the load's notes say why. A
check that cannot conclude (it timed out, or could not start) decides nothing: the
projector loads, and is checked again at the next load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from app.config.setting_records import LoadConfig
from app.engine.native.projector_probe import ProjectorProbe, run_projector_probe
from app.gguf.header import shown
from app.gguf.projector import ProjectorInfo, read_projector
from app.gguf.projector_checks import ProjectorChecks, ProjectorVerdict
from app.util.errors import ProjectorError

log = logging.getLogger(__name__)

LEFT_OUT = "The model is loaded without its vision projector: "
ProbeFn = Callable[[Path, Path, int, bool], ProjectorProbe]  # model, projector, threads, GPU


class ProjectorGuard:
    """Verdicts on projector files, checking the unknown ones; used on the engine thread.

    ``checks`` None keeps verdicts for this process only; ``probe`` is
    :func:`run_projector_probe` unless a test injects one.
    """

    def __init__(self, checks: ProjectorChecks | None, probe: ProbeFn | None = None) -> None:
        self.checks = checks
        self._probe = probe or (
            lambda model, proj, threads, gpu: run_projector_probe(
                model, proj, threads=threads, gpu=gpu
            )
        )
        self._unsaved: dict[str, ProjectorVerdict] = {}  # by fingerprint: no file, or unwritable

    def vet(self, model: Path, config: LoadConfig) -> tuple[LoadConfig, str]:
        """``config`` without its projector when that projector is refused here, and the
        sentence that says why ('' when it is kept)."""
        if not config.mmproj:
            return config, ""
        try:
            info = read_projector(config.mmproj)
        except ProjectorError:
            return config, ""  # the engine's own header check refuses it, in its words
        verdict = self._known(info) or self._check(model, info, config)
        if verdict is None or (isinstance(verdict, ProjectorVerdict) and verdict.ok):
            return config, ""
        sentence = verdict.refusal(info.name) if isinstance(verdict, ProjectorVerdict) else verdict
        log.warning("projector %s left out: %s", info.name, sentence)
        return replace(config, mmproj=""), f"{LEFT_OUT}{sentence}"

    def _known(self, info: ProjectorInfo) -> ProjectorVerdict | None:
        known = self._unsaved.get(info.fingerprint)
        if known is None and self.checks is not None:
            known = self.checks.get(info)
        return known

    def _check(
        self, model: Path, info: ProjectorInfo, config: LoadConfig
    ) -> ProjectorVerdict | str | None:
        """The child's verdict (remembered), a clean refusal's sentence (not remembered: it
        may depend on the model), or None: nothing learnt."""
        log.info("checking the projector %s in a separate process", info.name)
        result = self._probe(model, info.path, config.threads(), config.n_gpu_layers != 0)
        log.info("projector check: %s in %.2f s", result.detail, result.seconds)
        if not result.conclusive:
            return None
        if not result.crashed and not result.loaded:  # the parent's load would fail alike
            return f"{shown(info.name)} cannot be used: {result.detail}."
        verdict = ProjectorVerdict(not result.crashed, result.detail, "probe", info.name, 0.0)
        if self.checks is not None:
            try:
                self.checks.record(info, verdict.ok, verdict.reason, "probe")
                return verdict
            except OSError as exc:  # kept for this run; checked again next start
                log.warning("projector verdict not saved: %s", exc)
        self._unsaved[info.fingerprint] = verdict
        return verdict
