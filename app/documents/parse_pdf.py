"""PDF text with pypdf, page by page (pypdf's own limits bound every decompressed stream)."""

from __future__ import annotations

import io
import logging

from pypdf import PageObject, PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError

from app.documents.parse_text import RawBlock, paragraphs
from app.util.errors import DocumentError

log = logging.getLogger(__name__)
MAX_PAGES = 20_000


def parse_pdf(data: bytes, name: str, max_chars: int) -> tuple[str, list[RawBlock], int]:
    """(title, blocks, page count); stops taking text after ``max_chars``."""
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        _unlock(reader, name)
        pages = reader.pages
        count = len(pages)
        blocks: list[RawBlock] = []
        taken = 0
        for no in range(1, min(count, MAX_PAGES) + 1):
            if taken >= max_chars:
                log.warning("%s: text cut at %d characters, page %d of %d", name, taken, no, count)
                break
            text = _page_text(pages[no - 1], name, no)
            taken += len(text)
            blocks.extend(paragraphs(text, no))
        return _title(reader), blocks, count
    except LimitReachedError as exc:
        raise DocumentError(
            f"Lamplight could not read {name}: part of it unpacks to more data than "
            "Lamplight reads from one file."
        ) from exc
    except (DependencyError, FileNotDecryptedError) as exc:
        raise _locked(name) from exc


def _unlock(reader: PdfReader, name: str) -> None:
    """Open a PDF encrypted with the empty password (common: "no copying" PDFs)."""
    if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
        raise _locked(name)


def _locked(name: str) -> DocumentError:
    return DocumentError(
        f"Lamplight could not read {name}: it is password-protected. Save an unprotected "
        "copy and add that instead."
    )


def _page_text(page: PageObject, name: str, no: int) -> str:
    """One page's text; a damaged page is skipped (logged), the rest still count."""
    try:
        return page.extract_text()
    except LimitReachedError:
        raise
    except Exception as exc:  # damaged content stream: pypdf raises many kinds
        log.warning("%s: page %d unreadable (%s: %s)", name, no, type(exc).__name__, exc)
        return ""


def _title(reader: PdfReader) -> str:
    try:
        meta = reader.metadata
        title = meta.title if meta is not None else None
    except Exception:  # a damaged info dictionary: no title, not an unreadable file
        return ""
    return " ".join(str(title).split())[:300] if title else ""
