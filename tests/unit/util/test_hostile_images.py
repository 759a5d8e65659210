"""Hostile and damaged image files: an ImageError with a readable message or a good
image, never another exception, never a long wait (issue 30, "hostile image files").

Inputs are small valid PNG, JPEG, WebP, GIF and BMP files (made with Pillow) with bytes
flipped, inserted or cut off, and crafted headers that declare huge pictures.
"""

from __future__ import annotations

import io
import struct
import time
import zlib
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.image_store import ImageStore
from app.util.errors import ImageError
from app.util.images import MAX_PIXELS, check_image, decode_rgb
from tests.hypothesis_budget import examples

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
TIME_BUDGET_S = 2.0


@cache
def sample(fmt: str) -> bytes:
    """A small picture with some structure (a gradient and a shape), so that mutations
    land in real compressed data, not only in a header."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (24, 16))
    img.putdata([(x * 10, y * 15, (x * y) % 256) for y in range(16) for x in range(24)])
    ImageDraw.Draw(img).ellipse((4, 2, 18, 12), fill=(250, 30, 30))
    out = io.BytesIO()
    if fmt == "GIF":
        img.convert("P").save(out, format="GIF")
    else:
        img.save(out, format=fmt)
    return out.getvalue()


def readable(exc: ImageError) -> bool:
    text = str(exc)
    return 10 < len(text) < 300 and text[0].isupper() and text.endswith((".", ")"))


def survives(data: bytes, store: ImageStore) -> None:
    """Every door an untrusted file goes through: an ImageError or success, quickly."""
    started = time.monotonic()
    for read in (check_image, lambda d: decode_rgb(d, 64), store.put):
        try:
            read(data)
        except ImageError as exc:
            assert readable(exc), str(exc)
    assert time.monotonic() - started < TIME_BUDGET_S


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(sample(draw(st.sampled_from(FORMATS))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        else:
            del data[at:]
    return bytes(data)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ImageStore:
    return ImageStore(tmp_path_factory.mktemp("images"))


def test_the_samples_are_good_images(store: ImageStore) -> None:
    for fmt in FORMATS:
        info = check_image(sample(fmt))
        assert (info.width, info.height) == (24, 16)
        assert decode_rgb(sample(fmt))[:2] == (24, 16)
        assert store.put(sample(fmt)).mime == info.mime


@settings(
    max_examples=examples(300),
    deadline=int(TIME_BUDGET_S * 1000),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutated())
def test_mutated_images_give_an_image_error_or_an_image(store: ImageStore, data: bytes) -> None:
    survives(data, store)


@settings(max_examples=examples(100), deadline=int(TIME_BUDGET_S * 1000))
@given(st.binary(max_size=512))
def test_random_bytes_are_refused_readably(data: bytes) -> None:
    with pytest.raises(ImageError) as caught:
        check_image(data)
    assert readable(caught.value)


def png_header(width: int, height: int, idat: bytes = b"") -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(100_000, 100_000), (2**31 - 1, 2**31 - 1), (MAX_PIXELS, 2)])
def test_a_decompression_bomb_is_refused_before_decoding(
    store: ImageStore, size: tuple[int, int]
) -> None:
    bomb = png_header(*size, zlib.compress(b"\0" * 4096))
    started = time.monotonic()
    for read in (check_image, decode_rgb, store.put):
        with pytest.raises(ImageError, match="too many pixels") as caught:
            read(bomb)
        assert readable(caught.value)
    assert time.monotonic() - started < TIME_BUDGET_S


def test_a_gif_declaring_a_huge_screen_is_refused(store: ImageStore) -> None:
    gif = bytearray(sample("GIF"))
    gif[6:10] = struct.pack("<HH", 65535, 65535)  # the logical screen
    survives(bytes(gif), store)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_truncated_files_say_what_is_wrong(store: ImageStore, fmt: str) -> None:
    with pytest.raises(ImageError, match="empty"):
        store.put(b"")
    data = sample(fmt)
    for cut in (1, 8, len(data) // 2, len(data) - 1):
        try:
            check_image(data[:cut])
        except ImageError as exc:
            assert readable(exc)
            assert "not an image" in str(exc) or "damaged" in str(exc)
        else:  # a format whose last bytes are padding may still decode
            assert cut > len(data) // 2


def test_a_too_large_file_is_refused_by_size(
    store: ImageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.util.images as images

    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ImageError, match="too large"):
        store.put(sample("PNG") + b"\0" * 200)
    assert not any(Path(store.images_dir).rglob("*.tmp"))
