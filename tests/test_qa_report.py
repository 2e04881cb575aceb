"""The report's real-QA tables: each reuse strategy against recompute and, paired question by
question, against the edge's default strategy on the same questions."""
from kvedge.bench.qa_report import qa_tables
from kvedge.edge import DEFAULT_STRATEGY


def cell(method, f1s, contains, *, suite="reuse", codec="int8+zstd", options=None):
    n = len(f1s)
    return {"suite": suite, "task": "hotpot-fixed", "length": 10, "items": n, "seed": 0,
            "method": method, "budget": 1, "codec": codec, "options": options or "",
            "questions": n, "em": 0.0, "f1": sum(f1s) / n, "contain": sum(contains) / n,
            "per_question": [{"f1": f, "contain": c} for f, c in zip(f1s, contains)]}


def table(rows):
    """{setting: {column: cell}} of the one table qa_tables writes for `rows`."""
    lines = [l for l in qa_tables(rows) if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    body = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    return {r[0]: dict(zip(head, r)) for r in body}


F1_COL = f"F1 − {DEFAULT_STRATEGY} [95 % CI]"
CONTAIN_COL = f"contain − {DEFAULT_STRATEGY} [95 % CI]"


def test_each_strategy_is_set_against_the_default_on_the_same_questions():
    rows = [cell("recompute", [1, 1, 0, 1], [1, 1, 0, 1]),
            cell(DEFAULT_STRATEGY, [1, 0.5, 0, 1], [1, 0, 0, 1]),
            cell("epic", [0, 0.5, 0, 1], [0, 0, 0, 1])]
    t = table(rows)
    assert t[DEFAULT_STRATEGY][F1_COL] == "—"
    # epic − the default: (0 − 1 + 0 + 0 + 0) / 4, its interval from paired resamples
    assert t["epic"][F1_COL].startswith("-0.250 [")
    assert t["epic"][CONTAIN_COL].startswith("-0.250 [")
    low, high = map(float, t["epic"][F1_COL].split("[")[1].rstrip("]").split(","))
    assert low <= -0.25 <= high
    assert t["recompute"][F1_COL].startswith("+0.125 [")


def test_a_cell_of_another_codec_is_not_paired_with_the_default():
    rows = [cell(DEFAULT_STRATEGY, [1, 0], [1, 0]),
            cell("epic", [0, 0], [0, 0], codec="fp16")]
    assert table(rows)["epic"][F1_COL] == "—"


def test_without_a_default_cell_or_on_eviction_the_columns_are_left_out():
    plain = [cell("recompute", [1, 0], [1, 0]), cell("epic", [0, 0], [0, 0])]
    assert F1_COL not in table(plain)["epic"]
    evict = [cell("full", [1, 0], [1, 0], suite="evict"),
             cell(DEFAULT_STRATEGY, [1, 0], [1, 0], suite="evict")]
    assert F1_COL not in table(evict)["full"]


def test_a_default_with_options_is_not_the_default_as_it_ships():
    rows = [cell(DEFAULT_STRATEGY, [1, 0], [1, 0], options="edge=10"),
            cell("epic", [0, 0], [0, 0])]
    assert F1_COL not in table(rows)["epic"]


def a_default_option() -> tuple[str, object]:
    """(name, shipped value) of one option of the default strategy other than a ratio."""
    from kvedge.common.registry import options_of
    from kvedge.edge.strategies import STRATEGIES

    f = next(f for f in options_of(STRATEGIES[DEFAULT_STRATEGY]) if f.name != "ratio")
    return f.name, f.default


def test_a_sweep_cell_set_as_the_default_ships_is_the_default():
    name, value = a_default_option()
    shipped = f"{DEFAULT_STRATEGY}[{name}={value}]"
    other = f"{DEFAULT_STRATEGY}[{name}={value + 1}]"
    rows = [cell(DEFAULT_STRATEGY, [1, 1, 0, 1], [1, 1, 0, 1], options=f"{name}={value}"),
            cell(DEFAULT_STRATEGY, [0, 1, 0, 1], [0, 1, 0, 1], options=f"{name}={value + 1}")]
    t = table(rows)
    assert t[shipped][F1_COL] == "—"  # it is the default
    assert t[other][F1_COL].startswith("-0.250 [")  # set against it
    # beside a cell without options, that one is the default
    t = table([cell(DEFAULT_STRATEGY, [0, 0, 0, 0], [0, 0, 0, 0]), *rows])
    assert t[DEFAULT_STRATEGY][F1_COL] == "—" and t[shipped][F1_COL].startswith("+0.750 [")


def test_eviction_methods_are_set_against_contrastkv_at_their_budget():
    """Issue 29 asks whether ContrastKV beats KVzip beyond the interval: each method is
    paired with ContrastKV at the same budget and codec."""
    from kvedge.bench.qa_report import EVICT_REFERENCE

    def evicting(method, budget, f1s):
        row = cell(method, f1s, f1s, suite="evict")
        row["budget"] = budget
        for n, q in enumerate(row["per_question"]):
            q["item"] = f"article-{n // 2}"  # two questions per article
        return row

    rows = [evicting("full", 1, [1, 1, 1, 1]),
            evicting(EVICT_REFERENCE, 0.2, [1, 1, 1, 0]),
            evicting("kvzip", 0.2, [0, 0, 1, 0]),
            evicting("kvzip", 0.1, [0, 0, 0, 0])]
    column = f"F1 − {EVICT_REFERENCE} [95 % CI]"
    t = table(rows)
    assert t["kvzip @0.2"][column].startswith("-0.500 [")
    assert t["kvzip @0.2"][column] == "-0.500 [-1.00, 0.00]"  # 2 articles: anything goes
    assert t["kvzip @0.1"][column] == t["full"][column] == "—"  # no ContrastKV there
    assert t[f"{EVICT_REFERENCE} @0.2"][column] == "—"
