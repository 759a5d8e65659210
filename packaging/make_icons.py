#!/usr/bin/env python3
"""Render ``resources/icons/lamplight.svg`` to the PNG, .ico and .icns icons beside it.

    python packaging/make_icons.py

Renders with Qt (QSvgRenderer on an offscreen QImage), so it needs only the
project's environment. The .ico and .icns containers hold PNG entries and are
written here directly: both are a short header and a table of contents.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"
SVG = ICONS / "lamplight.svg"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)  # an .ico entry is at most 256 px
# (type, pixels): PNG-payload types of the icns format; ic11..ic14 are the @2x variants.
ICNS_TYPES = (
    (b"icp4", 16),
    (b"icp5", 32),
    (b"ic11", 32),
    (b"ic12", 64),
    (b"ic07", 128),
    (b"ic13", 256),
    (b"ic08", 256),
    (b"ic14", 512),
    (b"ic09", 512),
    (b"ic10", 1024),
)


def render_png(svg: Path, size: int) -> bytes:
    """The SVG rendered at ``size`` x ``size`` pixels, as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    if QGuiApplication.instance() is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        render_png.app = QGuiApplication(sys.argv[:1])  # type: ignore[attr-defined]  # keep alive
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    png = image.convertToFormat(QImage.Format.Format_ARGB32)
    # The stubs want bytes for the format; PySide6 6.11 accepts only str at run time.
    if not png.save(buf, "PNG"):  # type: ignore[call-overload]
        raise OSError(f"Qt could not encode a {size} px PNG")
    buf.close()
    return bytes(data.data())


def pack_ico(pngs: dict[int, bytes]) -> bytes:
    """An ICO file whose entries are the given PNGs (Windows Vista and later read these)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        data = pngs[size]
        side = 0 if size >= 256 else size  # 0 means 256
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(data), offset)
        blobs += data
        offset += len(data)
    return header + entries + blobs


def pack_icns(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An ICNS file of (type, PNG bytes) entries."""
    body = b"".join(kind + struct.pack(">I", 8 + len(data)) + data for kind, data in entries)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.write_bytes(data)
    return True


def main() -> int:
    rendered = {size: render_png(SVG, size) for size in {*PNG_SIZES, *(s for _, s in ICNS_TYPES)}}
    outputs = {ICONS / f"lamplight-{size}.png": rendered[size] for size in PNG_SIZES}
    outputs[ICONS / "lamplight.ico"] = pack_ico({s: rendered[s] for s in ICO_SIZES})
    outputs[ICONS / "lamplight.icns"] = pack_icns([(k, rendered[s]) for k, s in ICNS_TYPES])
    for path, data in outputs.items():
        state = "written" if write_if_changed(path, data) else "unchanged"
        print(f"{path.relative_to(ICONS.parent.parent)}: {len(data):,} bytes, {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
