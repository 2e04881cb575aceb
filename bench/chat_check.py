"""A conversation spot check on a real model (issue 27's quality targets, not a benchmark).

`python -m kvedge.bench.chat_check [MODEL]`: in this process, through `EdgeEngine.ask` with a
`Conversation` (the HTTP API's path: `keep=True`, the edge idle between turns), over the
bundled KB: a question; a follow-up that needs it ("its first keeper"), with retrieval on the
last turn and on the whole conversation; two system instructions. Prints each answer.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

QUESTION = "In what year was the Marrowind Lighthouse completed?"
FOLLOW_UP = "Who was its first keeper?"
SYSTEMS = ("Always answer in German.", "Answer with the year only, nothing else.")


def main(argv: list[str] | None = None) -> None:
    from kvedge.apps.demo import DEMO_KB
    from kvedge.bench.load import sync_local_kb
    from kvedge.common.model.models import load_model
    from kvedge.edge.conversation import Conversation
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Target, manifest_path

    args = sys.argv[1:] if argv is None else argv
    model = args[0] if args else "qwen2.5-coder-0.5b"
    # kept between runs: the KB is prefilled once per model
    state, target = Path(tempfile.gettempdir()) / f"chatq-{model}", Target("default", "chat")
    if not manifest_path(state, target).exists():
        sync_local_kb(state, model, DEMO_KB, target.kb)
    loaded = load_model(model)
    engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state)

    def turn(history, question, system=None, retrieval="last"):
        chat = Conversation(question, tuple(history), system)
        *_, done = engine.ask(target, chat, max_new_tokens=32, retrieval=retrieval, keep=True)
        engine.scheduler.settle()  # the user reads the answer
        return done

    first = turn([], QUESTION)
    print("turn 1:", repr(first.answer), first.sources)
    history = [("user", QUESTION), ("assistant", first.answer)]
    for scope in ("last", "conversation"):
        done = turn(history, FOLLOW_UP, retrieval=scope)
        print(f"turn 2 (retrieval={scope}):", repr(done.answer), done.sources,
              f"session reused {done.session_reused}")
    for system in SYSTEMS:
        print(f"system {system!r}:", repr(turn([], QUESTION, system=system).answer))
    engine.close()


if __name__ == "__main__":
    main()
