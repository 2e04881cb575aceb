"""A conversation's later turn with and without session KV: its time to the first token.

`python -m kvedge.bench.conversation` (issue 27's target: turn 3 over a ~1,500-token history at
≤ 0.3× the TTFT of a fresh request for the same conversation). In this process, over a KB
synced into an edge state folder (`bench.load.sync_local_kb`), through `EdgeEngine.ask` — the
served path, retrieval and the scheduler included:

- *with session KV*: the session cache emptied, turns 1 and 2 asked as a chat client asks
  them (`keep=True`: after each answer the next turn's prefix is computed while the edge is
  idle, and the benchmark waits for the edge to be idle between turns, as a reading user
  would), then turn 3, which finds its whole history's KV cached;
- *fresh*: the session cache emptied, then the same turn 3: its whole history is computed.

The two alternate, `repeats` times each, so the machine's load hits them alike. A turn's
user message carries `history_tokens / 2` tokens of KB text (a user pasting a passage), so
turn 3's history is about `history_tokens` long. Greedy: the two turn-3 answers must match.
"""
from __future__ import annotations

import time
from pathlib import Path
from statistics import median

QUESTIONS = ("What does the first passage say?", "And what does the second one add?",
             "Summarize both in one sentence.")


def passages(engine, folder: Path, tokens: int) -> list[str]:
    """Two texts of about `tokens` tokens each, cut from the KB's files."""
    text = " ".join(p.read_text() for p in sorted(Path(folder).glob("*.md")))
    ids = engine.tok(text)["input_ids"]
    return [engine.tok.decode(ids[i * tokens:(i + 1) * tokens]) for i in range(2)]


def history(engine, target, texts: list[str], strategy: str,
            max_new_tokens: int) -> list[tuple[str, str]]:
    """Turns 1 and 2, asked once: (role, text) of their questions and answers (greedy: the
    same answers in every round)."""
    from kvedge.edge.conversation import Conversation

    turns: list[tuple[str, str]] = []
    for passage, question in zip(texts, QUESTIONS):
        asked = f"{passage}\n\n{question}"
        *_, done = engine.ask(target, Conversation(asked, tuple(turns)), strategy=strategy,
                              max_new_tokens=max_new_tokens)
        turns += [("user", asked), ("assistant", done.answer)]
    return turns


def turn_3(engine, target, turns: list[tuple[str, str]], strategy: str, max_new_tokens: int,
           warm: bool):
    """Turn 3's AskResult from an empty session cache; `warm`: turns 1 and 2 asked first, as
    the conversation went (their prefixes cached, not timed)."""
    from kvedge.edge.conversation import Conversation

    engine.sessions.clear()
    asks = [Conversation(turns[k][1], tuple(turns[:k])) for k in (0, 2)] if warm else []
    for chat in [*asks, Conversation(QUESTIONS[2], tuple(turns))]:
        engine.scheduler.settle()  # the user reads the answer: the edge is idle meanwhile
        *_, done = engine.ask(target, chat, strategy=strategy, max_new_tokens=max_new_tokens,
                              keep=True)
    return done


def conversation_ttft(model: str, folder: Path, work: Path, history_tokens: int = 1500,
                      repeats: int = 3, strategy: str = "", max_new_tokens: int = 16,
                      echo=print) -> dict:
    from kvedge.bench.load import sync_local_kb
    from kvedge.common.model.models import load_model
    from kvedge.edge import DEFAULT_STRATEGY
    from kvedge.edge.conversation import Conversation
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import manifest_path

    state = Path(work) / Path(model).name / "edge"
    target = sync_local_kb(state, model, folder, "chat") \
        if not manifest_path(state, _target()).exists() else _target()
    loaded = load_model(model)
    engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state)
    texts = passages(engine, folder, history_tokens // 2)
    strategy = strategy or DEFAULT_STRATEGY
    turns = history(engine, target, texts, strategy, max_new_tokens)
    rows = {"session": [], "fresh": []}
    answers = {"session": set(), "fresh": set()}
    for _ in range(repeats):
        for label, warm in (("session", True), ("fresh", False)):
            t0 = time.perf_counter()
            done = turn_3(engine, target, turns, strategy, max_new_tokens, warm)
            rows[label].append((done.ttft_s, done.session_reused, done.prompt_tokens))
            answers[label].add(done.answer)
            echo(f"{label}: TTFT {done.ttft_s:.2f} s, reused {done.session_reused} of "
                 f"{done.prompt_tokens} prompt tokens ({time.perf_counter() - t0:.0f} s)")
    engine.close()
    n_history = len(Conversation(QUESTIONS[2], tuple(turns)).prefix_ids(engine.tok))
    med = {k: median(r[0] for r in v) for k, v in rows.items()}
    return {"model": model, "strategy": strategy, "history_tokens": n_history,
            "ttft_session_s": med["session"], "ttft_fresh_s": med["fresh"],
            "ratio": med["session"] / med["fresh"], "repeats": repeats,
            "reused_tokens": rows["session"][0][1],
            "same_answer": answers["session"] == answers["fresh"] and len(answers["fresh"]) == 1}


def _target():
    from kvedge.edge.sync import Target

    return Target("default", "chat")


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from kvedge.apps.demo import DEMO_KB

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--kb", type=Path, default=DEMO_KB, help="a folder of .md files")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvedge-conversation"))
    ap.add_argument("--history-tokens", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--strategy", default="")
    args = ap.parse_args(argv)
    print(json.dumps(conversation_ttft(args.model, args.kb, args.work, args.history_tokens,
                                       args.repeats, args.strategy), indent=1))


if __name__ == "__main__":
    main()
