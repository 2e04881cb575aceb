"""The generated benchmark tasks: seeded, of the asked length, answers really in the context.

Each checker re-derives the answer from the context text alone (parsing it independently of
the generator's bookkeeping), so a generator bug cannot vouch for itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from kvedge.bench.prompts import SYSTEM, item_messages, to_messages
from kvedge.bench.tasks import TASKS, Item, UnknownTask, estimate_tokens, generate
from kvedge.bench.tasks.niah import needle
from kvedge.bench.tasks.values import KEY_ADJECTIVES, KEY_NOUNS

LENGTH = 2048
NEEDLE = re.compile(r"One of the special magic (number|string)s for ([a-z-]+) is: ([a-z0-9]+)\.")


def digest(item: Item) -> str:
    return hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def items() -> dict[str, Item]:
    return {name: generate(name, LENGTH, seed=7) for name in TASKS}


# ---------------------------------------------------------------- every task


@pytest.mark.parametrize("name", sorted(TASKS))
def test_seeded(name, items):
    item = items[name]
    assert generate(name, LENGTH, seed=7) == item
    assert generate(name, LENGTH, seed=8).context != item.context
    assert item.task == name and item.seed == 7 and item.target_length == LENGTH
    again = generate(item.task, item.target_length, item.seed, **item.metadata["params"])
    assert again == item


@pytest.mark.parametrize("name", sorted(TASKS))
def test_length_near_target(name, items):
    n = estimate_tokens(items[name].context)
    assert abs(n - LENGTH) <= 0.05 * LENGTH
    assert items[name].metadata["context_tokens"] == n


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_answer_is_in_the_context(name, items):
    item = items[name]
    assert item.questions
    for q in item.questions:
        assert q.answers and q.instruction
        assert all(a in item.context for a in q.answers), q


@pytest.mark.parametrize("name", sorted(TASKS))
def test_any_token_counter(name):
    """Lengths follow the counter given (here: one token per four characters)."""
    def by_chars(s: str) -> int:
        return len(s) // 4
    item = generate(name, 3000, seed=1, count_tokens=by_chars)
    assert abs(by_chars(item.context) - 3000) <= 0.05 * 3000


@pytest.mark.parametrize("name", sorted(TASKS))
def test_100k_tokens_come_out_at_their_length(name):
    """Long items hit their length too (how fast they are made is not a unit test's to time:
    a loaded CI runner failed the 3-second bound this test had)."""
    item = generate(name, 100_000, seed=3)
    assert abs(item.metadata["context_tokens"] - 100_000) <= 2_000


def test_same_items_in_another_process(items):
    """No dependence on string hashing (set order) or anything else per process."""
    code = ("import hashlib, json; from kvedge.bench.tasks import TASKS, generate\n"
            "for n in sorted(TASKS):\n"
            f"    d = generate(n, {LENGTH}, seed=7).to_dict()\n"
            "    print(hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    assert out == [digest(items[n]) for n in sorted(TASKS)]


def test_round_trip_through_dict(items):
    for item in items.values():
        assert Item.from_dict(json.loads(json.dumps(item.to_dict()))) == item


def test_unknown_task_names_the_known_ones():
    with pytest.raises(UnknownTask, match="niah_single_prose"):
        generate("niah_single", LENGTH)


@pytest.mark.parametrize("name, bad", [
    ("niah_single_prose", {"haystack": "books"}), ("niah_single_prose", {"value_kind": "uuid"}),
    ("niah_single_prose", {"depth": 1.5}), ("variable_tracking", {"hops": 0}),
    ("kb_multiquery", {"kinds": ["summaries"]}), ("multidoc_qa", {"depth": -0.1}),
])
def test_bad_parameters_are_refused(name, bad):
    with pytest.raises(ValueError):
        generate(name, LENGTH, **bad)


# ---------------------------------------------------------------- needles (RULER NIAH)


def _needles(context: str) -> list[tuple[str, str, str]]:
    return NEEDLE.findall(context)


@pytest.mark.parametrize("name", [n for n in sorted(TASKS) if n.startswith("niah")])
def test_needles_hold_the_answers(name, items):
    item = items[name]
    q, = item.questions
    kind = TASKS[name].params.get("value_kind", "number")
    found = _needles(item.context)
    asked = [k for _, k, _ in found if k in q.text]
    by_key: dict[str, list[str]] = {}
    for _, key, value in found:
        by_key.setdefault(key, []).append(value)
    assert sorted(v for k in set(asked) for v in by_key[k]) == sorted(q.answers)
    for key in set(asked):
        for value in by_key[key]:
            assert needle(key, value, kind) in item.context
    for value in q.answers:
        assert item.context.count(value) == 1
        assert (value.isdigit() and len(value) == 7) == (kind == "number")


def test_niah_variants_have_their_shape(items):
    assert len(items["niah_multivalue"].questions[0].answers) == 4
    assert len(_needles(items["niah_multivalue"].context)) == 4
    assert len(items["niah_multiquery"].questions[0].answers) == 4
    assert len(_needles(items["niah_multikey_prose"].context)) == 4
    assert len(_needles(items["niah_single_noise"].context)) == 1
    hay = items["niah_multikey_needles"].context
    assert hay.count("One of the special magic") == len(_needles(hay)) > 50
    keys = [k for _, k, _ in _needles(hay)]
    assert len(keys) == len(set(keys))  # every key once: the asked one is unambiguous


def test_needle_keys_stay_distinct_past_the_two_word_space():
    """Past ~70K tokens a needle haystack needs three-word keys; none may extend another."""
    keys = [k for _, k, _ in _needles(generate("niah_multikey_needles", 150_000, 1).context)]
    assert len(set(keys)) == len(keys)
    assert any(k.count("-") == 2 for k in keys)
    assert not any(k.rsplit("-", 1)[0] in set(keys) for k in keys if k.count("-") == 2)


def test_no_key_word_is_part_of_another():
    """So no key ("early-fox") can hide in another ("pearly-fox") for substring scoring."""
    words = KEY_ADJECTIVES + KEY_NOUNS
    assert not [(a, b) for a in words for b in words if a != b and a in b]


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_needle_depth(depth):
    item = generate("niah_single_prose", LENGTH, seed=2, depth=depth)
    placed = item.metadata["needles"][0]
    assert placed["asked"] and abs(placed["depth"] - depth) < 0.03
    at = item.context.index(needle(placed["key"], placed["value"], "number"))
    assert abs(at / len(item.context) - depth) < 0.05


def test_noise_haystack_is_the_ruler_noise(items):
    text = NEEDLE.sub("", items["niah_single_noise"].context)
    assert set(s.strip() for s in text.split(".") if s.strip()) == {
        "The grass is green", "The sky is blue", "The sun is yellow", "Here we go",
        "There and back again"}


def test_prose_is_varied_and_clean():
    item = generate("niah_single_prose", 20_000, seed=4)
    sentences = [s for s in re.split(r"(?<=\.)\s+", NEEDLE.sub("", item.context)) if s]
    assert len(set(sentences)) > 0.95 * len(sentences)
    assert not re.search(r"\d|-|magic|special", NEEDLE.sub("", item.context))
    other = generate("niah_single_prose", 20_000, seed=5).context
    assert len(set(sentences) & set(re.split(r"(?<=\.)\s+", other))) < 0.05 * len(sentences)


# ---------------------------------------------------------------- variable tracking


def resolve_variables(context: str) -> dict[str, str]:
    """Every VAR's value, by executing the assignments in text order."""
    values: dict[str, str] = {}
    for name, number, source in re.findall(r"VAR ([A-Z]+) = (?:(\d+)|VAR ([A-Z]+))\.", context):
        values[name] = number or values[source]
    return values


@pytest.mark.parametrize("chains, haystack", [(1, "noise"), (3, "noise"), (2, "prose")])
def test_variable_tracking_resolves(chains, haystack):
    item = generate("variable_tracking", LENGTH, seed=5, chains=chains, haystack=haystack)
    q, = item.questions
    values = resolve_variables(item.context)
    assert len(values) == chains * 5
    value = re.search(r"value (\d+)", q.text).group(1)
    assert sorted(q.answers) == sorted(n for n, v in values.items() if v == value)
    assert len(set(values.values())) == chains
    for name in q.answers:  # no variable name hides in the haystack's words
        assert item.context.lower().count(name.lower()) == item.context.count(f" {name}")


# ---------------------------------------------------------------- CWE / FWE


def test_common_words_are_the_most_common():
    item = generate("cwe", LENGTH, seed=6)
    entries = re.findall(r"^(\d+)\. (\w+)$", item.context, flags=re.M)
    assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
    counts = Counter(w for _, w in entries).most_common()
    q, = item.questions
    top = len(q.answers)
    assert sorted(w for w, _ in counts[:top]) == sorted(q.answers)
    assert counts[top - 1][1] > counts[top][1]
    words = list(dict(counts))
    assert not any(a != b and a in b for a in words for b in words)


@pytest.mark.parametrize("length", [600, LENGTH, 8000])
def test_frequent_words_are_the_most_frequent(length):
    item = generate("fwe", length, seed=6)
    words = item.context.split("\n\n", 1)[1].split()
    counts = Counter(words).most_common()
    q, = item.questions
    assert [w for w, _ in counts[:3]] == q.answers
    assert counts[2][1] > counts[3][1]


# ---------------------------------------------------------------- knowledge base (SCBench)


def _section(context: str, header: str) -> str:
    return context.split(f"{header}\n", 1)[1].split("\n\n", 1)[0]


def test_knowledge_base_answers_resolve():
    item = generate("kb_multiquery", 4096, seed=9, questions=9)
    record = json.loads(_section(item.context, "Record:"))
    strings = _section(item.context, "Strings:").splitlines()
    links = dict(line.split(" -> ") for line in _section(item.context, "Links:").splitlines())
    assert len(links) == len(_section(item.context, "Links:").splitlines())
    assert len(set(strings)) == len(strings) and len(set(links.values())) == len(links)
    kinds = [q.kind for q in item.questions]
    assert kinds == ["kv", "prefix_suffix", "multi_hop"] * 3
    assert len({q.text for q in item.questions}) == 9
    for q in item.questions:
        quoted = re.findall(r'"([^"]+)"', q.text)
        if q.kind == "kv":
            assert [record[quoted[0]]] == q.answers
        elif q.kind == "prefix_suffix":
            prefix, suffix = quoted
            assert [s for s in strings if s.startswith(prefix) and s.endswith(suffix)] == q.answers
            assert sum(s.startswith(prefix) for s in strings) >= 2  # the suffix matters too
            assert sum(s.endswith(suffix) for s in strings) >= 2    # and the prefix
        else:
            node = quoted[0]
            for _ in range(int(re.search(r"links (\d+) times", q.text).group(1))):
                node = links[node]
            assert [node] == q.answers


def test_knowledge_base_kinds_can_be_chosen():
    item = generate("kb_multiquery", LENGTH, seed=1, kinds=["kv"], questions=3)
    assert [q.kind for q in item.questions] == ["kv"] * 3
    assert "Strings:" not in item.context and "Record:" in item.context


# ---------------------------------------------------------------- multi-document QA


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multidoc_facts_live_in_the_needed_documents(seed):
    item = generate("multidoc_qa", 4096, seed=seed, questions=5)
    ids = [d.doc_id for d in item.documents]
    assert len(set(ids)) == len(ids) >= 6 and item.context == "\n\n".join(
        d.text for d in item.documents)
    assert {q.kind for q in item.questions} == {"two_hop", "year", "designer", "birthplace",
                                               "town"}
    for q in item.questions:
        needed = [item.document(d).text for d in q.needed_docs]
        assert 1 <= len(needed) <= 2
        assert q.answers[0] in needed[-1]
        for doc in item.documents:
            if doc.doc_id not in q.needed_docs:
                assert not any(a.lower() in doc.text.lower() for a in q.answers), (q, doc.doc_id)
        if q.kind == "two_hop":  # the first document names the person the second is about
            person = needed[1].split("\n", 1)[0]
            assert f"designed by the architect {person}." in needed[0]
            assert f"{person} was born in the town of {q.answers[0]}." in needed[1]


def test_multidoc_documents_are_a_few_hundred_tokens():
    item = generate("multidoc_qa", 6000, seed=3, doc_tokens=300)
    sizes = [estimate_tokens(d.text) for d in item.documents]
    assert 18 <= len(sizes) <= 22 and all(180 <= n <= 420 for n in sizes)


def test_multidoc_order_and_position():
    orders = {tuple(generate("multidoc_qa", LENGTH, seed=s).metadata["order"]) for s in range(4)}
    assert len(orders) == 4
    for depth in (0.0, 1.0):
        item = generate("multidoc_qa", 6000, seed=2, depth=depth, questions=2)
        gold = {d for q in item.questions for d in q.needed_docs}
        at = [i for i, d in enumerate(item.documents) if d.doc_id in gold]
        assert at == list(range(at[0], at[0] + len(gold)))
        assert at[0] == 0 if depth == 0.0 else at[-1] == len(item.documents) - 1


@pytest.mark.parametrize("n_docs, seed", [(3, 0), (3, 5), (8, 1)])
def test_fact_documents_each_answer_in_one_document_among_its_kind(n_docs, seed):
    from kvedge.bench.tasks.multidoc import fact_documents

    item = fact_documents(n_docs, seed, questions=2 * n_docs, doc_tokens=300)
    assert len(item.documents) == n_docs == len({d.doc_id for d in item.documents})
    # every document is a distractor of the same kind: the same three facts, other values
    for doc in item.documents:
        assert re.search(r"was designed by the architect [A-Z]\w+ [A-Z]\w+\.", doc.text)
        assert re.search(r"Construction of the .+ was completed in \d{4}\.", doc.text)
        assert re.search(r"stands in the town of [A-Z]\w+\.", doc.text)
    asked = [q.needed_docs[0] for q in item.questions]
    assert len(set(asked[:n_docs])) == n_docs  # every document asked before any twice
    assert {q.kind for q in item.questions} == {"year", "town", "designer"}
    for q in item.questions:
        holding = [d.doc_id for d in item.documents
                   if any(a.lower() in d.text.lower() for a in q.answers)]
        assert holding == q.needed_docs, q
    sizes = [estimate_tokens(d.text) for d in item.documents]
    assert abs(sum(sizes) - 300 * n_docs) <= 0.1 * 300 * n_docs
    assert all(200 <= n <= 400 for n in sizes)
    assert fact_documents(n_docs, seed, questions=2 * n_docs, doc_tokens=300) == item


def test_fact_items_count_questions_and_place_answers_at_random():
    from kvedge.bench.datasets import QUESTIONS_PER_PROMPT, fact_items

    items = fact_items(3, 2 * QUESTIONS_PER_PROMPT + 1, seed=0)
    assert [len(i.questions) for i in items] == [QUESTIONS_PER_PROMPT] * 2 + [1]
    assert len({i.key for i in items}) == 3
    for item in items:
        for q, at in zip(item.questions, item.answer_at):
            assert any(a in item.documents[at] for a in q.answers)
    spots = Counter(at for i in fact_items(3, 60, seed=0) for at in i.answer_at)
    assert set(spots) == {0, 1, 2} and min(spots.values()) >= 10


@pytest.mark.parametrize("n_docs", [2, 3])
def test_fact_prompts_ask_up_to_three_distinct_questions_per_document(n_docs):
    """Any number of questions per prompt up to 3 per document: distinct, spread over the
    documents (each asked ⌊N/n⌋ or ⌈N/n⌉ times), and the first ones those of fewer."""
    from kvedge.bench.datasets import fact_items
    from kvedge.bench.tasks.multidoc import fact_documents

    fewer = None
    for n in range(1, 3 * n_docs + 1):
        item = fact_documents(n_docs, 4, questions=n, doc_tokens=100)
        assert len({q.text for q in item.questions}) == n
        asked = Counter(q.needed_docs[0] for q in item.questions)
        assert max(asked.values()) - min(asked.values(), default=0) <= 1
        assert len(asked) == min(n, n_docs)
        if fewer is not None:
            assert item.questions[:-1] == fewer.questions and item.documents == fewer.documents
        fewer = item
    with pytest.raises(ValueError, match="distinct questions"):
        fact_items(n_docs, 10, seed=0, per_prompt=3 * n_docs + 1)
    items = fact_items(n_docs, 10, seed=0, per_prompt=4)
    assert [len(i.questions) for i in items] == [4, 4, 2]
    assert [i.questions[:2] for i in items] == [i.questions for i in fact_items(n_docs, 6, 0)]


# ---------------------------------------------------------------- prompts


def test_messages_put_the_question_after_the_context(items):
    item = items["multidoc_qa"]
    conversations = item_messages(item)
    assert len(conversations) == len(item.questions)
    system, user = conversations[0]
    assert system == {"role": "system", "content": SYSTEM}
    q = item.questions[0]
    assert user["role"] == "user"
    assert user["content"] == f"{item.context}\n\nQuestion: {q.text}\n{q.instruction}"
    assert to_messages(item.documents, q) == conversations[0]
    assert to_messages("ctx", "What?", "Answer with the number only.", system=None) == [
        {"role": "user", "content": "ctx\n\nQuestion: What?\nAnswer with the number only."}]
