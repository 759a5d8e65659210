"""Which library models can draft for a target model (``EngineHost.list_drafts``)."""

from __future__ import annotations

from pathlib import Path

from app.host.jobs import DraftCandidate
from app.util.sysinfo import size_text

MAX_DRAFT_CANDIDATES = 64  # library models checked as drafts, smallest first
DRAFT_CHECKS_KEPT = 256  # remembered answers of draft_problem, by both files' versions


def draft_candidates(
    models_dir: Path,
    target: Path,
    library_file: Path,
    extra: list[Path],
    checks: dict[tuple[object, ...], str],
) -> list[DraftCandidate]:
    """The library's models (and ``extra``) as drafts for ``target``, usable ones first.

    Only header metadata is read (``app.gguf.vocab_compat``); ``checks`` keeps the
    answers per file version, so a second look costs a directory scan.
    """
    from app.gguf.vocab_compat import draft_problem
    from app.models.library import Library

    library = Library(models_dir, library_file)
    library.imported = extra
    try:
        target_st = target.stat()
        target_key = (str(target.resolve()), target_st.st_size, target_st.st_mtime_ns)
    except OSError:
        return []
    entries = sorted(
        (
            e
            for e in library.scan()
            if e.valid and not e.is_adapter and str(e.path.resolve()) != target_key[0]
        ),
        key=lambda e: e.size,
    )[:MAX_DRAFT_CANDIDATES]
    out: list[DraftCandidate] = []
    for e in entries:
        if e.size >= target_st.st_size:
            problem = (
                f"It is not smaller than the model ({size_text(e.size)} vs "
                f"{size_text(target_st.st_size)}), so drafting with it would be slower."
            )
        else:
            try:
                st = e.path.stat()
            except OSError as exc:
                problem = f"It cannot be read ({exc.strerror or exc})."
            else:
                key = (*target_key, str(e.path), st.st_size, st.st_mtime_ns)
                if key not in checks:
                    if len(checks) >= DRAFT_CHECKS_KEPT:
                        checks.clear()
                    checks[key] = draft_problem(target, e.path)
                problem = checks[key]
        out.append(DraftCandidate(e.path, e.name, e.size, problem))
    out.sort(key=lambda c: (bool(c.problem), c.size))
    return out
