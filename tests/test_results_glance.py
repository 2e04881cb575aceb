"""docs/results.md's "At a glance" tables are written by hand from the sections below them;
every figure there that a reference store (bench/reference/) holds the rows of is checked
against those rows here, at the precision the table prints — so a figure copied wrong, or a
store updated without its table, fails. (The Qwen hotpot-kb and squad-evict cells' rows are
not kept in the repository: those figures are not checked.)"""
import re
from pathlib import Path

import pytest

from kvedge.bench import unfinished
from kvedge.bench.ceilings import read_entries
from kvedge.bench.pair import pair
from kvedge.bench.report import f1_of_full, f1_of_full_interval, load, name
from kvedge.bench.runner import codec_of

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "bench" / "reference"
NUMBER = r"[−+-]?\d+(?:\.\d+)?"


def _glance() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index("## At a glance")
    return text[start:text.index("\n## ", start + 1)]


def _table(label: str) -> dict[str, list[str]]:
    """The first table after `label` in the section: each row's cells (markup dropped) by its
    first cell."""
    section = _glance()
    lines = section[section.index(label):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[start + 2:]:  # below the header and its rule
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("**", "").strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _numbers(cell: str) -> list[str]:
    return re.findall(NUMBER, cell)


def _printed(text: str, value: float) -> None:
    """`text` ("−0.023", "+0.00", "0.272") is `value` at its printed precision."""
    digits = len(text.partition(".")[2])
    assert float(text.replace("−", "-")) == pytest.approx(round(value, digits), abs=1e-9), \
        f"printed {text}, the rows give {value:.{digits + 2}f}"


def _interval(cell: str, estimate: float, low: float, high: float) -> None:
    value, lo, hi = _numbers(cell)[:3]
    for text, x in ((value, estimate), (lo, low), (hi, high)):
        _printed(text, x)


def _rows(store: str) -> list[dict]:
    return load(REFERENCE / store / "results.jsonl")


def _cell(rows: list[dict], method: str, **fields) -> dict:
    def matches(r: dict, field: str, value) -> bool:
        if field == "codec":  # a codec's spec begins with what is given
            return codec_of(r).startswith(value)
        return str(r.get(field)) == str(value)

    found = [r for r in rows if r["method"] == method
             and all(matches(r, k, v) for k, v in fields.items())]
    assert len(found) == 1, (method, fields, len(found))
    return found[0]


def _f1_diff(cell: str, row: dict, ceiling: dict, what: str = "diff") -> None:
    """`cell` is F1 − the ceiling's (`what` "ratio": F1 / the ceiling's) with its interval as
    the run's report gave them (the row's own intervals) or as `kvctl bench pair` gives them:
    the sections quote one or the other, two draws of the same bootstrap whose ends can
    differ in the third decimal."""
    (f1,), _, _ = pair(row, ceiling, metrics=("f1",))
    paired = getattr(f1, what)
    drawn = [row["intervals"]["f1"][what], [paired.value, paired.low, paired.high]]
    errors = []
    for values in drawn:
        try:
            return _interval(cell, *values)
        except AssertionError as e:
            errors.append(str(e))
    raise AssertionError(f"{cell!r} is neither the report's nor pair's figure: {errors}")


def test_hotpot_fixed_qwen_column_is_the_reference_rows():
    table, rows = _table("**hotpot-fixed**"), _rows("hotpot-fixed-qwen")
    qwen = {label: cells[0] for label, cells in table.items()}
    recompute = _cell(rows, "recompute")
    _printed(qwen["recompute (the ceiling's F1)"], recompute["f1"])
    _f1_diff(qwen["legolink (the default)"], _cell(rows, "legolink"), recompute)
    _f1_diff(qwen["a3 @ 0.15, `segment_head=4`"], _cell(rows, "a3", options="segment_head=4"),
             recompute)
    target = _table("**The issue's targets**")
    measured = next(cells[0] for label, cells in target.items() if "10 paragraphs" in label)
    assert measured.startswith("legolink ")
    _f1_diff(measured, _cell(rows, "legolink"), recompute, "ratio")


STRATEGIES = {"recompute", "legolink", "sparsex", "cacheblend", "epic", "a3", "samkv", "pie",
              "full-reuse"}


def test_hotpot_kb_smollm2_column_is_the_reference_rows():
    table, rows = _table("**hotpot-kb**"), _rows("hotpot-kb-smollm2")
    assert {label.split()[0] for label in table} == STRATEGIES
    for label, (_, smollm2) in table.items():
        row = _cell(rows, label.split()[0])
        if row["method"] == "recompute":
            _printed(smollm2, row["f1"])
        else:
            _f1_diff(smollm2, row, _cell(rows, "recompute"))
    int8 = _rows("hotpot-kb-smollm2-int8")
    packs = table["legolink (the default)"][1].partition("int8+zstd packs:")[2]
    _f1_diff(packs, _cell(int8, "legolink", codec="int8+zstd"), _cell(int8, "recompute"))


def test_squad_evict_smollm2_column_is_the_reference_rows():
    table, rows = _table("**squad-evict**"), _rows("squad-evict-smollm2-28")
    fp16 = [q["full_kv_f1"] for q in _cell(rows, "contrastkv", budget=0.3)["per_question"]]
    _printed(table["full KV, fp16 (the ceiling's F1)"][2], sum(fp16) / len(fp16))
    checked = 0
    for label, (_, _, smollm2) in table.items():
        if "@" in label:
            method, budget = label.split()[0], float(label.split("@")[1].split()[0])
            row = _cell(rows, method, budget=budget)
        elif label.startswith("full KV, the default codec"):
            row = _cell(rows, "full", codec="rdq:calibrated=true")
        else:
            continue
        # as the report's F1 frontier prints it: the pooled ratio, the paired interval's ends
        ratio = f1_of_full(rows)[(name(row), row["budget"], codec_of(row))].of_ceiling
        paired = f1_of_full_interval(rows, row).ratio
        _interval(smollm2, ratio, paired.low, paired.high)
        checked += 1
    assert checked == 10


def _contained(cells: list[dict], method: str, budget: float) -> int:
    cell = _cell(cells, method, budget=budget)
    return round(sum(q["contain"] for q in cell["per_question"]))


def _full_kv(cells: list[dict]) -> list[int]:
    """Needles full KV found: [in fp16 (the ceiling), in the default codec]. An unfinished
    run keeps both as its ceilings (ceilings.jsonl, two an item, not told apart there): their
    sum is checked, split evenly."""
    if cells[0].get("unfinished"):
        entries = read_entries(REFERENCE / "ruler-niah-qwen-8k" / "ceilings.jsonl").values()
        assert len(entries) == 2 * cells[0]["items"]
        found = round(sum(r["contain"] for e in entries for r in e["rows"]))
        return [found // 2, found - found // 2]
    full = _cell(cells, "full")
    return [round(full["ceiling_contain"] * full["questions"]),
            round(full["contain"] * full["questions"])]


def test_ruler_niah_columns_are_the_reference_rows():
    table = _table("**ruler-niah**")
    header = next(line for line in _glance().splitlines() if line.startswith("| method |"))
    at_4k, at_8k = _rows("ruler-niah-qwen"), unfinished.cells(REFERENCE / "ruler-niah-qwen-8k")
    if (REFERENCE / "ruler-niah-qwen-8k" / "results.jsonl").is_file():  # finished since
        at_8k = _rows("ruler-niah-qwen-8k")
    (items,) = {c["items"] for c in at_8k}  # a by-item run: every cell as far as the others
    assert (f"8K, first {items} items" if at_8k[0].get("unfinished") else f"8K, {items} items") \
        in header
    for label, columns in table.items():
        method = label.split()[0]
        for cells, column in zip((at_4k, at_8k), columns):
            found = [int(n) for n in _numbers(column)]
            if method == "full":  # fp16's (the ceiling) and the default codec's
                assert found == _full_kv(cells), label
                continue
            assert found == [_contained(cells, method, b) for b in (0.3, 0.2, 0.1)], label
