"""bench/answer_kl.py on the tiny random model and a tiny wheel of SQuAD's layout: the
reference codec diverges from itself by nothing, a near-lossless codec by almost nothing, a
2-bit one by more; `same` is whether every teacher-forced argmax is the reference's token."""
import json

import torch
from test_bench_real import data_home, fake_data  # noqa: F401 - fixtures

from kvedge.bench.answer_kl import divergence, main


def test_divergence_of_a_distribution_from_itself_is_zero_and_same():
    logp = torch.randn(3, 10).log_softmax(-1)
    answer = logp.argmax(-1).tolist()
    d = divergence(logp, logp, answer)
    assert d == {"kl": 0.0, "agree": 3, "tokens": 3, "same": True}
    other = logp.clone()
    other[1, answer[1]] = -1e9  # the second token is no longer the argmax
    d = divergence(logp, other.log_softmax(-1), answer)
    assert d["kl"] > 0 and d["agree"] == 2 and not d["same"]


def test_codecs_ranked_by_how_far_they_move_the_reference_answer(fake_data, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    main(["--model", "tiny-llama", "--items", "2", "--questions", "3", "--length", "64",
          "--codec", "fp16", "--codec", "fp32", "--codec", "int2", "--out", str(out)])
    rows = {r["codec"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert [r["questions"] for r in rows.values()] == [2, 2, 2]  # one answerable per article
    ref, exact, lossy = rows["fp16"], rows["fp32"], rows["int2"]
    assert ref["kl"] == 0 and ref["agree"] == 1 and ref["same"] == 1
    assert exact["kl"] < 1e-3 < lossy["kl"]
    assert lossy["ratio"] > 3 * exact["ratio"]  # 2-bit codes against fp32's, sizes as shipped
    assert "| int2 |" in capsys.readouterr().out


def test_a_stacked_setting_evicts_before_it_encodes(fake_data, tmp_path):
    out = tmp_path / "rows.jsonl"
    main(["--model", "tiny-llama", "--items", "2", "--questions", "3", "--length", "64",
          "--codec", "fp16", "--codec", "int8", "--codec", "snapkv@0.5/int8",
          "--out", str(out)])
    rows = {r["codec"]: r for r in map(json.loads, out.read_text().splitlines())}
    whole, half = rows["int8"], rows["snapkv@0.5/int8"]
    assert 1.6 * whole["ratio"] < half["ratio"] < 2.4 * whole["ratio"]  # half the rows shipped
    assert half["kl"] > whole["kl"]  # dropping half the context moves answers more
