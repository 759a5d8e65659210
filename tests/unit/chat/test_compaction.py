"""Compaction as data (issue 45): what is summarised, the version it makes, what the
model reads after it, a second compaction over the first, and Undo."""

from __future__ import annotations

from app.chat import compaction
from app.chat.conversation import SUMMARY_HEADING, Conversation, Message


def chat(turns: int, system: str = "Be brief.") -> Conversation:
    conv = Conversation(system_prompt=system)
    offset = 10
    for i in range(turns):
        conv.messages.append(Message("user", f"question {i}", token_offset=offset))
        conv.messages.append(Message("assistant", f"answer {i}", token_offset=offset + 8))
        offset += 20
    conv.n_tokens = offset
    return conv


def test_too_little_is_not_compacted() -> None:
    assert compaction.plan(chat(2)) is None  # the two kept turns are all there is
    found = compaction.plan(chat(3))
    assert found is not None and (found.start, found.end, found.summarised) == (0, 2, 2)


def test_a_compaction_is_a_version_the_model_reads_through_the_system_turn() -> None:
    conv = chat(5)
    before = [m.id for m in conv.messages]
    found = compaction.plan(conv)
    assert found is not None and (found.start, found.end) == (0, 6)
    assert (found.freed, found.kept_tokens) == (60, 40)
    req = compaction.request(conv.chat(), conv, found)
    assert req[-1].role == "user" and "last 4 messages" in req[-1].content
    assert [m.content for m in req[1:-1]] == [m.content for m in conv.messages]
    summary = compaction.apply(conv, found, "They asked 0 to 2.")
    assert summary.summary_of == before[0]
    assert [m.summarised for m in conv.messages] == [True] * 6 + [False] * 5
    assert compaction.summarised_before(conv.messages, 6) == 6
    assert conv.system_text() == f"Be brief.\n\n{SUMMARY_HEADING}\nThey asked 0 to 2."
    sent = conv.chat()
    assert [m.role for m in sent] == ["system", "user", "assistant", "user", "assistant"]
    assert [m.content for m in sent[1:]] == ["question 3", "answer 3", "question 4", "answer 4"]
    assert conv.version_of(0) == (2, 2) and compaction.compacted(conv) == 0
    again = Conversation.from_dict(conv.to_dict())
    assert again.system_text() == conv.system_text() and again.chat() == sent
    # Undo: the replaced tail is shown again, word for word.
    assert compaction.undo(conv) == summary.id
    assert [m.id for m in conv.messages] == before and conv.system_text() == "Be brief."
    assert compaction.undo(conv) is None


def test_a_second_compaction_summarises_the_first_and_undoes_to_it() -> None:
    conv = chat(4, system="")
    first = compaction.plan(conv)
    assert first is not None
    s1 = compaction.apply(conv, first, "Early talk.")
    for i in range(4, 7):
        conv.messages.append(Message("user", f"question {i}"))
        conv.messages.append(Message("assistant", f"answer {i}"))
    second = compaction.plan(conv)
    assert second is not None and conv.messages[second.start] is s1
    req = compaction.request(conv.chat(), conv, second)
    assert req[0].role == "system" and "Early talk." in req[0].content
    s2 = compaction.apply(conv, second, "Early talk, then 2 to 4.")
    assert conv.active_summary() is s2 and conv.system_text().endswith("then 2 to 4.")
    assert (
        compaction.summarised_before(conv.messages, conv.messages.index(s2)) == 7
    )  # the first summary and six turns
    assert compaction.undo(conv) == s2.id
    assert conv.active_summary() is s1 and conv.system_text().endswith("Early talk.")
    assert compaction.undo(conv) == s1.id and conv.active_summary() is None
