"""Pictures in the transcript, the session and the exports (issue 30)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, Message
from app.chat.image_store import MAX_IMAGES, image_ref
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import export_images, to_markdown
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.metrics import MessageMetrics
from tests.gui.test_alternatives import StubLink, StubView
from tests.hypothesis_budget import examples


def picture(color: str = "red", fmt: str = "PNG") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 3), color).save(out, format=fmt)
    return out.getvalue()


class Link(StubLink):
    """Keeps what each reply was asked with."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[list[ChatMessage]] = []

    def generate(self, conv_id: str, messages: object, params: object) -> int:
        self.sent.append(list(messages))  # type: ignore[call-overload]
        return super().generate(conv_id, messages, params)


class View(StubView):
    pass


@pytest.fixture()
def session(tmp_path: Path) -> ChatSession:
    return ChatSession(ConversationStore(tmp_path), Link(), View())  # type: ignore[arg-type]


def link(session: ChatSession) -> Link:
    return session._link  # type: ignore[return-value]


def view(session: ChatSession) -> View:
    return session._view  # type: ignore[return-value]


def finish(session: ChatSession, text: str = "ok") -> None:
    rid = session.request_id
    assert rid is not None
    session.on_finished(rid, text, MessageMetrics())


def put(session: ChatSession, color: str = "red", name: str = "") -> ImagePart:
    return session.store.images.put(picture(color), name)


# -- the transcript ------------------------------------------------------------------------


def test_images_round_trip_through_the_file_and_old_files_are_unchanged(
    tmp_path: Path,
) -> None:
    store = ConversationStore(tmp_path)
    part = store.images.put(picture(), "cat.png")
    conv = Conversation(messages=[Message("user", "look", images=[image_ref(part)])])
    conv.messages.append(Message("assistant", "a cat"))
    store.save(conv)
    raw = json.loads(store.transcript_path(conv.id).read_text())
    assert raw["messages"][0]["images"] == [image_ref(part)]
    assert "images" not in raw["messages"][1]
    back = store.load(conv.id)
    assert back.messages[0].images == [image_ref(part)]
    # A conversation without pictures is written as it always was.
    plain = Conversation(messages=[Message("user", "hi"), Message("assistant", "hello")])
    data = plain.to_dict()
    assert all("images" not in m for m in data["messages"])
    assert Conversation.from_dict(data).to_dict() == data


def test_hostile_image_references_are_dropped_and_the_message_kept() -> None:
    good = {"digest": "a" * 64, "mime": "image/png", "width": 1, "height": 1, "name": "x"}
    data = Conversation().to_dict()
    data["messages"] = [
        {"role": "user", "content": "hi", "images": [good, {"digest": "../../etc"}, 3]},
        {"role": "assistant", "content": "a", "images": [good]},  # only a user shows them
        {"role": "user", "content": "b", "images": {"digest": "a" * 64}},
    ]
    conv = Conversation.from_dict(data)
    assert [m.content for m in conv.messages] == ["hi", "a", "b"]
    assert conv.messages[0].images == [good]
    assert conv.messages[1].images == [] and conv.messages[2].images == []


@settings(max_examples=examples(150), deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
        lambda inner: (
            st.lists(inner, max_size=6)
            | st.dictionaries(
                st.sampled_from(["digest", "mime", "width", "height", "name", "x"]) | st.text(),
                inner | st.just("b" * 64),
                max_size=6,
            )
        ),
        max_leaves=40,
    )
)
def test_any_stored_images_value_reads_as_a_bounded_valid_list(raw: Any) -> None:
    data = Conversation().to_dict()
    data["messages"] = [{"role": "user", "content": "t", "images": raw}]
    conv = Conversation.from_dict(data)
    images = conv.messages[0].images
    assert len(images) <= MAX_IMAGES
    for ref in images:
        assert set(ref) == {"digest", "mime", "width", "height", "name"}
        assert len(ref["digest"]) == 64 and ref["mime"].startswith("image/")
    assert Conversation.from_dict(conv.to_dict()).messages[0].images == images


# -- the session ---------------------------------------------------------------------------


def test_a_message_with_images_reaches_the_engine_with_their_bytes(
    session: ChatSession,
) -> None:
    part = put(session, name="cat.png")
    assert session.send("What is this?", SamplingParams(), [part])
    sent = link(session).sent[-1][-1]
    assert sent.content == "What is this?" and sent.images == (part,)
    assert sent.images[0].data == part.data and sent.images[0].name == "cat.png"
    finish(session)
    saved = session.store.load(session.conversation.id)
    assert saved.messages[0].images == [image_ref(part)]
    # The follow-up sends the picture again (the engine's cache holds it).
    assert session.send("And now?", SamplingParams())
    history = link(session).sent[-1]
    assert history[0].images == (part,) and history[-1].images == ()


def test_images_only_is_a_message_and_empty_is_not(session: ChatSession) -> None:
    assert not session.send("  ", SamplingParams())
    part = put(session, name="only.png")
    assert session.send("", SamplingParams(), [part])
    assert link(session).sent[-1][-1].images == (part,)
    assert session.conversation.title == "only.png"


def test_edit_keeps_the_images_unless_replaced_and_regenerate_keeps_them(
    session: ChatSession,
) -> None:
    red, blue = put(session, "red"), put(session, "blue")
    session.send("one", SamplingParams(), [red])
    finish(session)
    assert session.begin_edit(0) == "one"
    assert session.send("one, edited", SamplingParams())
    assert link(session).sent[-1][-1].images == (red,)
    finish(session)
    assert session.regenerate(SamplingParams())
    assert link(session).sent[-1][-1].images == (red,)
    finish(session, "again")
    session.begin_edit(0)
    assert session.send("now blue", SamplingParams(), [blue])
    assert link(session).sent[-1][-1].images == (blue,)
    finish(session)
    old = [m for m in session.conversation.every_message() if m.content == "one"]
    assert old and old[0].images == [image_ref(red)]  # the replaced version keeps its own


def test_a_message_merged_into_an_unanswered_one_keeps_both_images(
    session: ChatSession,
) -> None:
    red, blue = put(session, "red"), put(session, "blue")
    session.send("", SamplingParams(), [red])
    session.on_failed(session.request_id or 0, "boom")
    assert session.send("and this", SamplingParams(), [blue])
    msgs = session.conversation.messages
    assert len(msgs) == 1 and msgs[0].content == "and this"
    assert [r["digest"] for r in msgs[0].images] == [red.digest, blue.digest]


def test_too_many_images_are_refused_with_a_note(session: ChatSession) -> None:
    part = put(session)
    assert not session.send("x", SamplingParams(), [part] * (MAX_IMAGES + 1))
    assert "at most 16 images" in view(session).notices[-1]
    assert not session.conversation.messages


def test_room_for_counts_the_references(
    session: ChatSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.chat.transcript_writer as writer_module

    part = put(session)
    monkeypatch.setattr(writer_module, "MAX_TRANSCRIPT_BYTES", writer_module.REPLY_ROOM + 120)
    assert session.room_for("hi")
    assert not session.room_for("hi", [image_ref(part)])


def test_a_missing_image_is_noted_once_and_the_message_goes_without_it(
    session: ChatSession,
) -> None:
    red, blue = put(session, "red", "red.png"), put(session, "blue", "blue.png")
    session.send("two pictures", SamplingParams(), [red, blue])
    finish(session)
    path = session.store.images.path(red.digest)
    assert path is not None
    path.unlink()
    assert session.send("next", SamplingParams())
    assert link(session).sent[-1][0].images == (blue,)
    notes = [n for n in view(session).notices if "red.png" in n]
    assert notes == ["The image “red.png” is missing from the data folder. "
                     "The message is sent without it."]  # fmt: skip
    finish(session)
    session.send("more", SamplingParams())
    assert len([n for n in view(session).notices if "red.png" in n]) == 1
    assert session.conversation.messages[0].images[0]["digest"] == red.digest  # kept


def test_a_fork_keeps_the_images(session: ChatSession) -> None:
    part = put(session)
    session.send("q", SamplingParams(), [part])
    finish(session)
    copy = session.store.fork(session.conversation, 1)
    assert copy.messages[0].images == [image_ref(part)]


# -- exports and search --------------------------------------------------------------------


def test_markdown_links_the_images_and_export_copies_them(
    session: ChatSession, tmp_path: Path
) -> None:
    cat = session.store.images.put(picture(fmt="JPEG"), "my [cat].jpg")
    dog = put(session, "blue", "dog.png")
    session.send("pets", SamplingParams(), [cat, dog])
    finish(session)
    conv = session.conversation
    text = to_markdown(conv)
    assert f"![my \\[cat\\].jpg](images/{cat.digest}.jpg)" in text
    assert f"![dog.png](images/{dog.digest}.png)" in text
    out = tmp_path / "export"
    written = export_images(conv, session.store.images, out)
    assert sorted(p.name for p in written) == sorted([f"{cat.digest}.jpg", f"{dog.digest}.png"])
    assert (out / "images" / f"{cat.digest}.jpg").read_bytes() == cat.data
    path = session.store.images.path(dog.digest)
    assert path is not None
    path.unlink()
    notes: list[str] = []
    assert len(export_images(conv, session.store.images, tmp_path / "again", notes)) == 1
    assert notes and "dog.png" in notes[0]


def test_search_finds_a_picture_by_its_name(session: ChatSession) -> None:
    part = put(session, name="sunset-beach.png")
    session.send("", SamplingParams(), [part])
    finish(session)
    hits = session.store.search("sunset")
    assert [h.conv_id for h in hits] == [session.conversation.id]
