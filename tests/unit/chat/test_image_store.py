"""The image store: content-addressed pictures in the data folder (issue 30)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

import app.chat.image_store as image_store
from app.chat.image_store import ImageStore, image_ref, is_digest, read_image_refs
from app.chat.store import ConversationStore
from app.util.errors import ImageError


def picture(fmt: str = "PNG", size: tuple[int, int] = (8, 6), color: str = "red") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format=fmt)
    return out.getvalue()


@pytest.fixture()
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path)


def test_put_then_get_round_trips_and_names_the_file_by_content(store: ImageStore) -> None:
    data = picture()
    part = store.put(data, "cat.png")
    assert part.digest == hashlib.sha256(data).hexdigest()
    assert (part.mime, part.width, part.height, part.name) == ("image/png", 8, 6, "cat.png")
    path = store.path(part.digest)
    assert path == store.images_dir / part.digest[:2] / f"{part.digest}.png"
    assert path.read_bytes() == data
    back = store.get(part.digest, "cat.png")
    assert back == part and back.data == data
    assert store.exists(part.digest)
    jpeg = store.put(picture("JPEG"))
    assert jpeg.mime == "image/jpeg" and str(store.path(jpeg.digest)).endswith(".jpg")


def test_put_is_idempotent_and_repairs_a_damaged_copy(store: ImageStore) -> None:
    data = picture()
    part = store.put(data)
    path = store.path(part.digest)
    assert path is not None
    before = path.stat().st_mtime_ns
    assert store.put(data, "again.png").digest == part.digest
    assert path.stat().st_mtime_ns == before  # not written again
    assert [p for p in store.images_dir.rglob("*") if p.is_file()] == [path]
    path.write_bytes(data[:-1] + b"\0")  # same size, other bytes
    store.put(data)
    assert path.read_bytes() == data


def test_bad_data_is_refused_before_anything_is_written(store: ImageStore) -> None:
    for bad in (b"", b"not an image", picture()[:40]):
        with pytest.raises(ImageError):
            store.put(bad)
    assert not store.images_dir.exists() or not any(store.images_dir.rglob("*.*"))


@pytest.mark.parametrize(
    "digest",
    ["", "abc", "../" * 21 + "x", "A" * 64, "g" * 64, "0" * 63, "0" * 65, "/etc/passwd", None, 7],
)
def test_a_digest_that_is_not_64_hex_digits_names_no_file(
    store: ImageStore, digest: object
) -> None:
    assert not is_digest(digest)
    assert store.path(digest) is None  # type: ignore[arg-type]
    assert not store.exists(digest)  # type: ignore[arg-type]
    with pytest.raises(ImageError, match="does not name a stored image"):
        store.get(digest)  # type: ignore[arg-type]


def test_missing_and_changed_files_say_so_by_name(store: ImageStore) -> None:
    part = store.put(picture(), "holiday.png")
    path = store.path(part.digest)
    assert path is not None
    assert store.get(part.digest).data  # cached now: a change must still be seen
    path.write_bytes(picture(color="blue"))
    with pytest.raises(ImageError, match=r"“holiday\.png” was changed on disk"):
        store.get(part.digest, "holiday.png")
    path.unlink()
    with pytest.raises(ImageError, match=r"“holiday\.png” is missing from the data folder"):
        store.get(part.digest, "holiday.png")
    with pytest.raises(ImageError, match=f"{part.digest[:12]} is missing"):
        store.get(part.digest)


def test_a_link_or_a_folder_in_the_store_is_not_an_image(store: ImageStore, tmp_path: Path) -> None:
    data = picture()
    digest = hashlib.sha256(data).hexdigest()
    outside = tmp_path / "outside.png"
    outside.write_bytes(data)
    folder = store.images_dir / digest[:2]
    folder.mkdir(parents=True)
    if hasattr(os, "symlink"):
        (folder / f"{digest}.png").symlink_to(outside)
        assert store.path(digest) is None
    (folder / f"{digest}.jpg").mkdir()
    assert store.path(digest) is None
    with pytest.raises(ImageError, match="missing"):
        store.get(digest)


def test_reads_are_capped(store: ImageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    part = store.put(picture(size=(64, 64)))
    monkeypatch.setattr(image_store, "MAX_IMAGE_BYTES", 20)
    with pytest.raises(ImageError, match="could not be read from the data folder"):
        ImageStore(store.images_dir.parent).get(part.digest)


def test_a_damaged_file_with_a_matching_digest_is_refused(store: ImageStore) -> None:
    """A file someone wrote under its own digest: still checked before the model sees it."""
    junk = b"\x89PNG\r\n\x1a\n" + b"\0" * 30
    digest = hashlib.sha256(junk).hexdigest()
    path = store.images_dir / digest[:2] / f"{digest}.png"
    path.parent.mkdir(parents=True)
    path.write_bytes(junk)
    with pytest.raises(ImageError, match="in the data folder is damaged"):
        store.get(digest)


def test_the_cache_stays_bounded(store: ImageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_store, "CACHE_BYTES", 1)
    parts = [store.put(picture(color=c)) for c in ("red", "green", "blue")]
    for p in parts:
        assert store.get(p.digest).data == p.data
    assert len(store._cache) == 1


def test_the_conversation_store_keeps_images_beside_the_transcripts(tmp_path: Path) -> None:
    conversations = ConversationStore(tmp_path)
    part = conversations.images.put(picture())
    assert conversations.images.path(part.digest) is not None
    assert (tmp_path / "images").is_dir() and (tmp_path / "conversations").is_dir()


def test_refs_round_trip_and_odd_ones_are_repaired_or_dropped(store: ImageStore) -> None:
    part = store.put(picture(), "a\nb\x00c.png")
    ref = image_ref(part)
    assert ref == {"digest": part.digest, "mime": "image/png", "width": 8, "height": 6,
                   "name": "abc.png"}  # fmt: skip
    assert read_image_refs([ref]) == [ref]
    odd = {"digest": part.digest, "mime": "text/html", "width": -1, "height": True, "name": 5}
    assert read_image_refs([odd, {"digest": "../x"}, "x", None, [ref]]) == [
        {"digest": part.digest, "mime": "image/png", "width": 0, "height": 0, "name": ""}
    ]
    assert read_image_refs("nope") == [] and read_image_refs(None) == []
    assert len(read_image_refs([ref] * 100)) == image_store.MAX_IMAGES
    long = read_image_refs([{**ref, "name": "n" * 10_000, "width": 2**80}])[0]
    assert len(long["name"]) == image_store.IMAGE_NAME_CHARS and long["width"] == 0


def test_prune_removes_old_temp_files_of_interrupted_image_writes(tmp_path: Path) -> None:
    conversations = ConversationStore(tmp_path)
    part = conversations.images.put(picture())
    folder = conversations.images.images_dir / part.digest[:2]
    old, new = folder / f".{part.digest}.png.1.tmp", folder / f".{part.digest}.png.2.tmp"
    for tmp in (old, new):
        tmp.write_bytes(b"x")
    os.utime(old, (1, 1))
    conversations.prune()
    assert not old.exists() and new.exists()
    assert conversations.images.path(part.digest) is not None
