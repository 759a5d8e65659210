"""Reading image files defensively: what they are, and their pixels for a projector.

Untrusted bytes (a pasted picture, a dropped file, an API client's ``data:`` URL, a
file in the data folder) are read with Pillow, never handed to native decoders
directly: the size of the file, its pixel count and the formats accepted are bounded,
and any failure is an ``ImageError`` whose message the user can act on.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

from app.util.errors import ImageError

MAX_IMAGE_BYTES = 32 << 20
MAX_PIXELS = 64_000_000  # a 8000×8000 photo; decompression bombs stop here
MAX_SIDE = 2048  # the projector resizes anyway; larger only costs memory and time
FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}


@dataclass(frozen=True)
class ImageInfo:
    mime: str
    width: int
    height: int


def _open(data: bytes) -> object:
    from PIL import Image

    if not data:
        raise ImageError("The image is empty.")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(
            f"The image is too large ({len(data) >> 20} MB; at most {MAX_IMAGE_BYTES >> 20} MB)."
        )
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(FORMATS))
            if img.width * img.height > MAX_PIXELS:
                raise ImageError(
                    f"The image has too many pixels ({img.width}×{img.height}; "
                    f"at most {MAX_PIXELS // 1_000_000} million)."
                )
            return img
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"The image has too many pixels ({exc}).") from exc
    except Exception as exc:  # Pillow raises many types for bad files
        raise ImageError(
            "This file is not an image this app can read (PNG, JPEG, WebP, GIF or BMP)."
        ) from exc


def check_image(data: bytes) -> ImageInfo:
    """The format and size of the image in ``data``, after decoding all of it.

    Raises:
        ImageError: empty, too large, not a supported image, or damaged.
    """
    img = _open(data)
    try:
        fmt = img.format or ""  # type: ignore[attr-defined]
        width, height = img.size  # type: ignore[attr-defined]
        img.load()  # type: ignore[attr-defined]  # a truncated file fails here, not later
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError("The image is damaged: it could not be read to the end.") from exc
    return ImageInfo(FORMATS.get(fmt, "image/png"), int(width), int(height))


def decode_rgb(data: bytes, max_side: int = MAX_SIDE) -> tuple[int, int, bytes]:
    """``(width, height, pixels)``: the image as 8-bit RGB rows, the first frame of an
    animation, transparency over white, the longer side at most ``max_side``.

    Raises:
        ImageError: as ``check_image``.
    """
    from PIL import Image

    img: Any = _open(data)
    try:
        if max(img.size) > max_side:
            # Shrunk first, in the file's own mode (JPEG decodes at a fraction of its
            # size): a large photo never becomes a full-size RGBA copy in memory.
            img.draft("RGB", (max_side, max_side))
            img.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
        frame = img.convert("RGBA")
        rgb = Image.new("RGB", frame.size, (255, 255, 255))
        rgb.paste(frame, mask=frame.getchannel("A"))
        return rgb.width, rgb.height, rgb.tobytes()
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError("The image is damaged: it could not be read to the end.") from exc
