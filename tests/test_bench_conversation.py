"""bench/conversation.py on the tiny random model: turn 3 with session KV finds its whole
history's KV cached (computed while the edge was idle), and gives a fresh request's answer."""
from kvedge.bench.conversation import conversation_ttft
from kvedge.edge import DEFAULT_STRATEGY


def test_turn_3_reuses_the_history_and_answers_as_a_fresh_request(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    for i in range(3):
        (kb / f"doc{i}.md").write_text(f"# Doc {i}\n\n" + f"Fact {i} is about harbours. " * 20)
    out = conversation_ttft("tiny-llama", kb, tmp_path / "work", history_tokens=120,
                            repeats=1, echo=lambda *_: None)
    assert out["same_answer"] and out["strategy"] == DEFAULT_STRATEGY
    assert out["reused_tokens"] == out["history_tokens"] > 0  # the whole history found
    assert out["ttft_session_s"] > 0 and out["ttft_fresh_s"] > 0
