"""Conversations as prompts (edge.conversation) and their prefixes' KV kept across turns
(edge.sessions), on the tiny random model's ChatML template and runtime."""
import pytest
import torch

from conftest import tiny_runtime
from kvedge.common.errors import BadInput, ContextLengthExceeded
from kvedge.common.model.tokenizer import chat_turn
from kvedge.edge.conversation import Conversation
from kvedge.edge.sessions import PrefixCache

HISTORY = [("system", "Answer in one word."), ("user", "Who keeps the archive?"),
           ("assistant", "Gamma."), ("user", "And who directed it?")]


@pytest.fixture(scope="module")
def rt():
    return tiny_runtime("tiny-llama")


def test_messages_become_system_history_and_question():
    chat = Conversation.of_messages([*HISTORY[:1], ("developer", "Be exact."), *HISTORY[1:]])
    assert chat.question == "And who directed it?"
    assert chat.system == "Answer in one word.\n\nBe exact."
    assert chat.history == (("user", "Who keeps the archive?"), ("assistant", "Gamma."))
    assert chat.retrieval_query() == "And who directed it?"
    assert chat.retrieval_query("conversation") == "Who keeps the archive?\nAnd who directed it?"
    with pytest.raises(BadInput, match="no user message"):
        Conversation.of_messages([("system", "hi")])
    with pytest.raises(BadInput, match="last message must be the user's"):
        Conversation.of_messages([*HISTORY, ("assistant", "The")])


@pytest.fixture(scope="module")
def tok():
    from kvedge.common.model.models import load_model

    return load_model("tiny-llama").tokenizer


def test_a_lone_question_has_the_engines_chat_prefix(tok):
    assert Conversation("What?").prefix_ids(tok) == chat_turn(tok)[0]
    chat = Conversation.of_messages(HISTORY)
    text = tok.decode(chat.prefix_ids(tok))
    assert text.index("Answer in one word.") < text.index("Gamma.") < len(text)
    assert text.endswith("<|im_start|>user\n") and "And who directed it?" not in text
    odd = Conversation("q?", (("user", "a \x00 byte"), ("assistant", "\x00")))
    assert tok.decode(odd.prefix_ids(tok)).endswith("\x00<|im_end|>\n<|im_start|>user\n")


def test_the_oldest_turns_are_dropped_to_fit_and_the_system_message_stays(tok):
    turns = [("user", f"question {i} " * 8) if i % 2 == 0 else ("assistant", f"answer {i}")
             for i in range(8)]
    chat = Conversation.of_messages([("system", "Be brief."), *turns, ("user", "last?")])
    whole = len(chat.prefix_ids(tok))
    kept, ids, dropped = chat.fit(tok, whole - 1)
    assert dropped == 1 and kept.history[0] == ("user", "question 2 " * 8)
    assert len(ids) < whole and kept.system == "Be brief."
    assert chat.fit(tok, whole) == (chat, chat.prefix_ids(tok), 0)
    bare = len(Conversation("last?", (), "Be brief.").prefix_ids(tok))
    assert chat.fit(tok, bare)[2] == 4  # every turn gone, the question and system kept
    with pytest.raises(ContextLengthExceeded, match="system message and last question"):
        chat.fit(tok, bare - 1)


def test_a_prefix_extended_from_the_session_cache_equals_its_prefill(rt):
    ids = torch.randint(0, 250, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    sessions = PrefixCache()
    first = sessions.kv(rt, ids[:35])  # turn n: computed whole
    assert first.reused == 0 and sessions.stats.misses == 1
    second = sessions.kv(rt, ids)      # turn n+1: its first 35 tokens' KV reused
    assert second.reused == 35 and sessions.stats.extended == 1
    whole = rt.prefill(torch.tensor(ids), logits="none")
    for mine, ref in zip([*second.keys, *second.values], [*whole.keys, *whole.values]):
        assert mine.shape == ref.shape
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-5)
    assert sessions.kv(rt, ids).reused == 60 and sessions.stats.hits == 1


def test_the_session_cache_keeps_to_its_budget_least_recently_used_first(rt):
    one = PrefixCache().kv(rt, list(range(10, 30))).nbytes  # 20 tokens' KV
    sessions = PrefixCache(budget_bytes=2 * one)
    a, b, c = (list(range(s, s + 20)) for s in (10, 40, 70))
    sessions.kv(rt, a)
    sessions.kv(rt, b)
    sessions.kv(rt, a)  # a used last: b goes first
    sessions.kv(rt, c)
    assert sessions.stats.evictions == 1
    assert sessions.kv(rt, a).reused == 20 and sessions.kv(rt, b).reused == 0


def test_putting_a_prefix_again_counts_its_bytes_once_and_clear_forgets_all(rt):
    a, b = list(range(10, 30)), list(range(40, 60))
    one = PrefixCache().kv(rt, a)
    sessions = PrefixCache(budget_bytes=2 * one.nbytes)
    for _ in range(3):
        sessions.put(tuple(a), one)  # the engine seeds its fixed prefix like this
    sessions.kv(rt, b)
    assert sessions.stats.evictions == 0 and sessions.kv(rt, a).reused == 20
    sessions.clear()
    assert sessions.kv(rt, a).reused == 0
