"""Prefix affinity: a conversation's turns chain onto each other; the table remembers engines."""

from __future__ import annotations

from serving.gateway.routing.prefix_affinity import (
    CHUNK_CHARS,
    PrefixTable,
    prefix_hashes,
    prompt_text,
)

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 4}


def turns(question: str, count: int) -> list[list[dict[str, str]]]:
    """The message lists a client sends over `count` turns of one conversation."""
    messages: list[dict[str, str]] = [SYSTEM]
    sent = []
    for turn in range(count):
        messages = [*messages, {"role": "user", "content": f"{question} (turn {turn})"}]
        sent.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"answer {turn} " * 10}]
    return sent


def hashes_of(messages: list[dict[str, str]]) -> list[int]:
    text = prompt_text("chat", {"messages": messages})
    assert text is not None
    return prefix_hashes(text)


def test_each_turn_extends_the_chain_of_the_turn_before() -> None:
    first, second, third = (hashes_of(m) for m in turns("Why is the sky blue?", 3))
    assert second[: len(first)] == first
    assert third[: len(second)] == second
    assert len(third) > len(second) > len(first) > 0


def test_different_conversations_share_only_their_system_prompt() -> None:
    one = hashes_of(turns("Why is the sky blue? " * 8, 1)[0])
    other = hashes_of(turns("How do tides work? " * 8, 1)[0])
    shared = len("system") + 1 + len(SYSTEM["content"]) + 1 + len("user") + 1
    common = next(i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b)
    assert common == shared // CHUNK_CHARS


def test_message_boundaries_count() -> None:
    whole = [{"role": "user", "content": "ab" * 64}]
    split = [{"role": "user", "content": "a"}, {"role": "user", "content": "b" + "ab" * 63}]
    a = prompt_text("chat", {"messages": whole})
    b = prompt_text("chat", {"messages": split})
    assert a != b


def test_what_cannot_be_keyed_is_none() -> None:
    assert prompt_text("completion", {"prompt": ["a", "b"]}) is None
    assert prompt_text("completion", {"prompt": [1, 2, 3]}) is None
    assert prompt_text("chat", {"messages": "hi"}) is None
    assert prompt_text("completion", {"prompt": "x" * 200}) == "x" * 200


def test_structured_messages_are_keyed_canonically() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "n"}
    reordered = {"name": "n", "content": [{"text": "hi", "type": "text"}], "role": "user"}
    assert prompt_text("chat", {"messages": [message]}) == prompt_text(
        "chat", {"messages": [reordered]}
    )


def test_a_partial_last_chunk_is_left_out() -> None:
    assert prefix_hashes("x" * (CHUNK_CHARS - 1)) == []
    assert len(prefix_hashes("x" * (2 * CHUNK_CHARS + 5))) == 2


def test_the_end_of_the_previous_turn_names_the_engine() -> None:
    table = PrefixTable()
    first, second, third = (hashes_of(m) for m in turns("Why is the sky blue? " * 4, 3))
    table.remember(first, 1)  # engine 1 served the conversation's first turn
    assert table.longest_match(second, {0, 1}) == 1
    table.remember(second, 1)
    assert table.longest_match(third, {0, 1}) == 1
    assert table.longest_match(second, {0, 1}) == 1  # a regenerated turn stays too
    assert table.longest_match(third, {0}) is None  # engine 1 out of rotation


def test_a_shared_system_prompt_alone_names_no_engine() -> None:
    table = PrefixTable()
    table.remember(hashes_of(turns("Why is the sky blue? " * 4, 1)[0]), 1)
    other = hashes_of(turns("How do tides work? " * 4, 1)[0])
    assert table.longest_match(other, {0, 1}) is None  # balanced like a new request


def test_a_restarted_engine_is_forgotten() -> None:
    table = PrefixTable()
    first = hashes_of(turns("Why is the sky blue?", 1)[0])
    table.remember(first, 1)
    table.forget_engine(1)
    assert table.longest_match(first, {0, 1}) is None
    assert len(table) == 0


def test_the_table_stays_bounded_and_keeps_the_newest() -> None:
    table = PrefixTable(capacity=100)
    for n in range(30):
        table.remember(prefix_hashes(f"{n:04d}" * 64), n % 2)
    assert len(table) <= 100
    newest = prefix_hashes(f"{29:04d}" * 64)
    assert table.longest_match(newest, {0, 1}) == 1


def test_a_messages_conversation_keys_on_its_system_prompt_and_turns() -> None:
    system = "You are a coding agent. " * 8
    turns = [{"role": "user", "content": "Fix the bug in main.py, please."}]
    longer = [*turns, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "x"}]
    first = prompt_text("messages", {"system": system, "messages": turns})
    second = prompt_text("messages", {"system": system, "messages": longer})
    assert first is not None and second is not None
    shared = prefix_hashes(first)
    assert shared and prefix_hashes(second)[: len(shared) - 1] == shared[:-1]
