"""The edge on a GPU, end to end: `EdgeEngine` with its model on CUDA (retrieval, the packs'
load and realign, a reuse strategy's start, the scheduler's decode), set against the same
engine on the CPU, in one short run a session with a device makes.

    python -m kvedge.bench.gpu_edge --model-files DIR --out OUT [--quick]

The model: SmolLM2-135M's configuration and tokenizer (`--model-files`: the folder
`export_model_files` writes from the embedded model, 3.4 MB) with seeded random weights — the
real weights (98 MB) cannot travel to the device machine, and what this measures is code paths
and time, not answers. Random weights answer noise and rarely pick the end-of-turn token, so
answers run to `max_new_tokens`.

The KB: the demo KB (`kvedge.apps.demo.DEMO_KB`), prefilled on the CPU by the cloud's
`PrefillEngine` and synced into an edge state folder as the edge's `Syncer` does.

Settings: cpu fp32 (the reference), cuda fp32, cuda bf16, each with the scheduler's graph
decode off and, on CUDA, on (`Scheduler(graph_decode=...)`: a lone answer's steps replayed as
a CUDA graph). For each: every question asked alone with each strategy — the answer text,
compared with the CPU's, median TTFT and TPOT, and where the TTFT went (`AskResult.phases`)
— then `--clients` asks at once (the same questions), answers/s against one at a time.
Prints the tables last; everything goes to OUT/gpu_edge.json.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

STRATEGIES = ("recompute", "legolink", "epic", "sparsex", "cacheblend", "a3", "samkv", "pie",
              "full-reuse")


def export_model_files(out: Path) -> Path:
    """The embedded model's config and tokenizer files (no weights) into `out`."""
    from kvedge.common.model.models import DEFAULT_MODEL, load_model

    loaded = load_model(DEFAULT_MODEL)
    out.mkdir(parents=True, exist_ok=True)
    loaded.tokenizer.save_pretrained(str(out))
    loaded.config.save_pretrained(str(out))
    return out


def random_model_folder(files: Path, out: Path, seed: int = 0) -> Path:
    """A loadable model folder: `files`' config and tokenizer, seeded random fp32 weights."""
    from transformers import AutoConfig, AutoTokenizer

    from kvedge.common.model.models import build_random_model

    config = AutoConfig.from_pretrained(str(files))
    build_random_model(config, seed).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(files)).save_pretrained(str(out))
    return out


def _answer(engine, target, question: str, strategy: str, max_new_tokens: int) -> dict:
    *_, done = engine.ask(target, question, strategy=strategy, max_new_tokens=max_new_tokens)
    return {"answer": done.answer, "tokens": done.tokens, "ttft_s": done.ttft_s,
            "tpot_s": done.tpot_s, "phases": done.phases}


def _together(fn, items) -> list:
    """fn over items, each on its own thread, released at once; results in order."""
    results, gate = [None] * len(items), threading.Barrier(len(items))

    def run(i):
        gate.wait()
        try:
            results[i] = fn(items[i])
        except Exception as err:  # noqa: BLE001 - reported with the round
            results[i] = {"error": repr(err)}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def run_setting(folder: Path, state: Path, target, questions: list[str], device: str,
                dtype: torch.dtype, graph: bool, max_new_tokens: int, clients: int) -> dict:
    from kvedge.common.model.models import load_model, placed
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache

    loaded = placed(load_model(str(folder), cache=False), device, dtype)
    engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state,
                        graph_decode=graph)
    out: dict = {"device": device, "dtype": str(dtype).split(".")[1], "graph": graph}
    try:
        _answer(engine, target, questions[0], STRATEGIES[0], 4)  # first-use costs out
        for strategy in STRATEGIES:  # one failing is reported, the others still run
            try:
                out[strategy] = [_answer(engine, target, q, strategy, max_new_tokens)
                                 for q in questions]
            except Exception:  # noqa: BLE001
                out[f"{strategy}_error"] = traceback.format_exc()
                print(out[f"{strategy}_error"], file=sys.stderr, flush=True)
        asked = [questions[i % len(questions)] for i in range(clients)]
        start = time.perf_counter()
        alone = [_answer(engine, target, q, "legolink", max_new_tokens) for q in asked]
        out["alone_per_s"] = len(asked) / (time.perf_counter() - start)
        start = time.perf_counter()
        together = _together(lambda q: _answer(engine, target, q, "legolink",
                                               max_new_tokens), asked)
        out["together_per_s"] = len(asked) / (time.perf_counter() - start)
        out["together_errors"] = [r["error"] for r in together if "error" in r]
        out["together_same_as_alone"] = sum(
            a.get("answer") == b["answer"] for a, b in zip(together, alone))
        out["together_tpot_ms"] = statistics.median(
            r["tpot_s"] * 1e3 for r in together if r.get("tpot_s"))
        out["graph_steps"] = getattr(engine.scheduler, "graph_steps", None)
    finally:
        engine.close()
    return out


def summary(settings: list[dict], questions: int) -> list[dict]:
    """Per setting: answers equal to the CPU's (per strategy), median TTFT and TPOT (ms)."""
    ref = next((s for s in settings if s.get("device") == "cpu"), None)
    rows = []
    for s in settings:
        if "error" in s:
            rows.append({"setting": s["name"], "error": s["error"].strip().splitlines()[-1]})
            continue
        row = {"setting": s["name"]}
        for strategy in STRATEGIES:
            if f"{strategy}_error" in s:
                row[f"{strategy}_same"] = s[f"{strategy}_error"].strip().splitlines()[-1][:60]
                continue
            answers = s.get(strategy, [])
            if ref is not None and strategy in ref:
                same = sum(a["answer"] == b["answer"] for a, b in zip(answers, ref[strategy]))
                row[f"{strategy}_same"] = f"{same}/{questions}"
            row[f"{strategy}_ttft_ms"] = statistics.median(a["ttft_s"] for a in answers) * 1e3
            row[f"{strategy}_tpot_ms"] = statistics.median(
                a["tpot_s"] for a in answers if a["tpot_s"]) * 1e3
        row.update({k: s.get(k) for k in ("alone_per_s", "together_per_s",
                                           "together_same_as_alone", "together_tpot_ms",
                                           "graph_steps")})
        rows.append(row)
    return rows


def start_phases(settings: list[dict]) -> list[dict]:
    """Per setting and strategy, where a lone ask's time to first token went (median ms of
    each of `AskResult.phases`: retrieval, packs, the scheduler's queue, the model's part)."""
    rows = []
    for s in settings:
        for strategy in STRATEGIES:
            answers = [a for a in s.get(strategy, []) if a.get("phases")]
            if answers:
                rows.append({"setting": s["name"], "strategy": strategy,
                             **{name: statistics.median(a["phases"][name] for a in answers) * 1e3
                                for name in answers[0]["phases"]}})
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from kvedge.bench.gpu_check import _table
    from kvedge.bench.load import kb_files, questions_in, sync_local_kb
    from kvedge.cloud.workers import PrefillEngine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-files", required=True, help="export_model_files' folder")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="a CPU smoke run: fewer questions")
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    from kvedge.apps.demo import DEMO_KB as kb

    work = Path(tempfile.mkdtemp(prefix="gpu-edge-"))
    folder = random_model_folder(Path(args.model_files), work / "model")
    state = work / "edge"
    began = time.perf_counter()
    target = sync_local_kb(state, str(folder), kb, "demo", segment_tokens=256,
                           engine=PrefillEngine(str(folder)))
    result: dict = {"files": len(kb_files(kb)), "sync_s": time.perf_counter() - began}
    n = 2 if args.quick else args.questions
    questions = questions_in(kb)[:n]
    clients = 3 if args.quick else args.clients
    settings = [("cpu fp32", "cpu", torch.float32, False)]
    if torch.cuda.is_available():
        settings += [("cuda fp32", "cuda", torch.float32, False),
                     ("cuda bf16", "cuda", torch.bfloat16, False),
                     ("cuda bf16 graph", "cuda", torch.bfloat16, True),
                     ("cuda fp32 graph", "cuda", torch.float32, True)]
    elif args.quick:
        settings += [("cpu fp32 static", "cpu", torch.float32, True)]
    result["settings"] = []
    for name, device, dtype, graph in settings:
        start = time.perf_counter()
        try:
            row = run_setting(folder, state, target, questions, device, dtype, graph,
                              args.max_new_tokens, clients)
        except Exception:  # noqa: BLE001 - a failed setting is reported, the rest still run
            row = {"error": traceback.format_exc()}
            print(row["error"], file=sys.stderr, flush=True)
        row.update(name=name, seconds=time.perf_counter() - start)
        result["settings"].append(row)
        print(f"{name}: {row['seconds']:.1f} s", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_edge.json"), "w") as f:  # what a cut run had
            json.dump(result, f, indent=1)
    print(_table("a lone ask's time to first token, median ms by phase",
                 start_phases(result["settings"])))
    print(_table(f"the edge, {n} questions, {clients} clients",
                 summary(result["settings"], n)))
    return 1 if any("error" in s for s in result["settings"]) else 0


if __name__ == "__main__":
    sys.exit(main())
