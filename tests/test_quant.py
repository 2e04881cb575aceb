"""Weight copies for the served path (common/model/quant.py): the int8 kernel against its torch
reference, row invariance (what lets int8 steps drop the padding rows), fp16 and bf16 decode
steps, bf16 prompt weights (`Runtime.use_prompt_weights`), prefill untouched by decode
weights, and the served path with each on tiny random models."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from kvedge.common.model.batch import ROW_MULTIPLE, decode_logits, decode_step, row_multiple
from kvedge.common.model.quant import Int8Weight, linear, reference
from kvedge.edge.sync import Target
from test_batching import (QUESTIONS, REQUESTS, comparable, concurrently, loaded,  # noqa: F401
                           make_engine, started, state)


def weight(out_features, in_features, seed=0):
    return torch.randn(out_features, in_features,
                       generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("shape", [(320, 64), (64, 128), (37, 32), (1536, 576)])
def test_the_kernel_equals_its_torch_reference_to_bf16_rounding(shape):
    w = Int8Weight(weight(*shape))
    assert w.fast
    x = torch.randn(5, shape[1], generator=torch.Generator().manual_seed(1))
    want = reference(x.to(torch.bfloat16), w).float()
    got = w(x)
    assert got.dtype == torch.float32 and got.shape == (5, shape[0])
    # the two sum in different orders, each output rounded once to bf16 (8 bits)
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-3)


def test_a_row_is_its_weight_to_half_a_step_of_its_scale():
    w = weight(64, 128)
    q = Int8Weight(w)
    step = q.scale.float()[:, None]
    assert bool(((q.dequantized() - w).abs() <= step / 2 + 1e-7).all())
    assert q.q.dtype == torch.int8 and int(q.q.abs().max()) <= 127
    assert q.nbytes == 64 * 128 + 2 * 64  # a byte a weight and a bf16 scale a row


@pytest.mark.parametrize("width", [20, 24, 40, 136])
def test_widths_the_kernel_cannot_take_use_the_reference(width):
    """The kernel crashed the process at input widths 4 and 20 (AVX2) and at every width
    ≡ 8 (mod 16) (AVX-512): those keep the reference."""
    w = Int8Weight(weight(16, width))
    assert not w.fast
    x = torch.randn(3, width)
    assert torch.equal(w(x), reference(x.to(torch.bfloat16), w).float())


def test_bias_and_leading_dimensions_are_kept():
    w, bias = weight(32, 64), torch.randn(32)
    x = torch.randn(2, 3, 64)
    got = linear(x, Int8Weight(w), bias)
    assert got.shape == (2, 3, 32)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w, bias), rtol=0.05, atol=0.05)
    assert torch.equal(linear(x, w, bias), torch.nn.functional.linear(x, w, bias))


@pytest.mark.parametrize("shape", [(320, 64), (64, 128), (1536, 576)])
def test_each_row_gets_the_same_bits_whatever_the_row_count(shape):
    w = Int8Weight(weight(*shape))
    x = torch.randn(24, shape[1], generator=torch.Generator().manual_seed(2))
    full = w(x)
    for rows in range(1, 25):
        assert torch.equal(w(x[:rows]), full[:rows])
        assert torch.equal(w(x[rows - 1:rows]), full[rows - 1:rows])


def first_steps(rt):
    """A prompt and its prefill logits (to check prefill untouched later), and REQUESTS
    started: their states, next tokens and positions."""
    prompt = torch.arange(1, 20)
    before = rt.prefill(prompt).logits
    batch = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    ids = torch.tensor([s.token for s in batch])
    pos = torch.tensor([s.next_position() for s in batch])
    return prompt, before, batch, ids, pos


@pytest.mark.parametrize("name", TINY)
def test_int8_decode_is_batch_invariant_unpadded_and_close_to_fp32(name):
    """An int8 step pads nothing (row_multiple 1) yet each request's logits are the same bits
    alone as in a batch; they stay near the fp32 step's; prefill still reads fp32."""
    rt = tiny_runtime(name)
    prompt, before, batch, ids, pos = first_steps(rt)
    exact = [decode_logits(rt, ids[i:i + 1], pos[i:i + 1],
                           [started(rt, kind, n, i)], row_multiple=1)[0]
             for i, (kind, n) in enumerate(REQUESTS)]
    rt.use_decode_weights("int8")
    assert row_multiple(rt, invariant=True) == 1
    together = decode_logits(rt, ids, pos, batch, row_multiple=1)
    for i, (kind, n) in enumerate(REQUESTS):
        alone = decode_logits(rt, ids[i:i + 1], pos[i:i + 1], [started(rt, kind, n, i)], 1)[0]
        assert torch.equal(alone, together[i])
        # random weights: only "close" (int8 steps, bf16 rounding), relative to their spread
        assert float((alone - exact[i]).abs().max()) < 0.1 * float(exact[i].std())
    assert torch.equal(rt.prefill(prompt).logits, before)
    rt.use_decode_weights("fp32")  # padded unless MKL's strict mode made fp32 invariant
    assert row_multiple(rt, invariant=True) == (rt.decode_row_multiple or ROW_MULTIPLE)
    assert rt.decode_layers is rt.layers and rt.decode_head is rt.lm_head


def test_int8_steps_alone_equal_steps_in_a_batch():
    rt = tiny_runtime("tiny-mistral")
    rt.use_decode_weights("int8")
    batch = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    together = [decode_step(rt, batch, 1, spec_rows=8) for _ in range(8)]
    for i, (kind, n) in enumerate(REQUESTS):
        state = started(rt, kind, n, i)
        assert [decode_step(rt, [state], 1)[0] for _ in range(8)] == [t[i] for t in together]


def test_int8_steps_draft_fewer_rows_by_default():
    """An int8 row costs more than an fp32 one (batch.INT8_SPEC_ROWS); drafts stay exact:
    greedy generation with drafts equals it without, on int8 steps too."""
    from kvedge.common.model.batch import INT8_SPEC_ROWS, SPEC_ROWS, spec_rows_for
    from kvedge.common.model.decoding import Prompt
    from kvedge.common.model.generate import decode

    rt = tiny_runtime("tiny-llama")
    assert spec_rows_for(rt) == SPEC_ROWS
    rt.use_decode_weights("int8")
    assert spec_rows_for(rt) == INT8_SPEC_ROWS < SPEC_ROWS
    ids = torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7])

    def answer(lookup):
        prompt = Prompt(rt.empty_cache(reserve=40), ids, torch.arange(len(ids)))
        return list(decode(rt, prompt, 16, lookup=lookup))
    assert answer(ids.tolist()) == answer(None)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("name", TINY)
def test_half_decode_pads_as_its_probe_says_and_stays_near_fp32(name, fmt):
    """fp16 / bf16 decode weights: steps padded to ROW_MULTIPLE rows unless the load-time
    probe found the products row-invariant on this CPU, and either way each request's logits
    are the same bits alone as in a batch; drafts: fp16 only into padding rows, bf16 up to
    SPEC_ROWS (its GEMM is nearly flat in rows, as fp32 BLAS is); logits near the fp32
    step's (fp16's 11-bit mantissas within 2 % of their spread, bf16's 8-bit within 10 %);
    prefill untouched."""
    from kvedge.common.model.batch import SPEC_ROWS, spec_rows_for
    from kvedge.common.model.quant import Bf16Weight, Fp16Weight, invariant_multiple, products

    cls, dtype, spread = {"fp16": (Fp16Weight, torch.float16, 0.02),
                          "bf16": (Bf16Weight, torch.bfloat16, 0.1)}[fmt]
    rt = tiny_runtime(name)
    prompt, before, batch, ids, pos = first_steps(rt)
    exact = decode_logits(rt, ids, pos, batch)
    rt.use_decode_weights(fmt)
    assert isinstance(rt.decode_head, cls) and rt.decode_head.w.dtype == dtype
    assert rt.decode_row_multiple == invariant_multiple(products(rt.decode_layers,
                                                                 rt.decode_head))
    rows = row_multiple(rt, invariant=True)
    assert rows == (rt.decode_row_multiple or ROW_MULTIPLE)
    assert spec_rows_for(rt) == (rows if fmt == "fp16" else SPEC_ROWS)
    again = [started(rt, kind, n, seed) for seed, (kind, n) in enumerate(REQUESTS)]
    near = decode_logits(rt, ids, pos, again, rows)
    for i, (kind, n) in enumerate(REQUESTS):
        alone = decode_logits(rt, ids[i:i + 1], pos[i:i + 1], [started(rt, kind, n, i)], rows)
        assert torch.equal(alone[0], near[i])
    assert float((near - exact).abs().max()) < spread * float(exact.std())
    assert torch.equal(rt.prefill(prompt).logits, before)


@pytest.mark.parametrize("shape", [(64, 128), (1536, 576), (576, 1536)])
def test_a_bf16_weight_is_the_product_of_the_operands_rounded_to_bf16(shape):
    from kvedge.common.model.quant import Bf16Weight

    w, x = weight(*shape), torch.randn(6, shape[1], generator=torch.Generator().manual_seed(3))
    got = Bf16Weight(w)(x, bias=torch.ones(shape[0]))
    want = torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float() + 1
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert Bf16Weight(w).nbytes == 2 * w.numel()


@pytest.mark.parametrize("name", TINY)
def test_bf16_prompt_weights_run_every_forward_near_fp32_and_fp32_is_exact_again(name):
    """`Runtime.use_prompt_weights("bf16")`: every forward reads bf16 copies of the layers
    (shared with bf16 decode weights), its logits near the exact runtime's; back on "fp32"
    the forward is bit for bit what it was; an unknown format is refused."""
    from kvedge.common.errors import InvalidOption
    from kvedge.common.model.quant import Bf16Weight

    rt = tiny_runtime(name)
    prompt = torch.arange(1, 20)
    exact = rt.prefill(prompt, logits="all").logits
    rt.use_prompt_weights("bf16")
    assert rt.prompt_format == "bf16" and isinstance(rt.prompt_layers[0].wq, Bf16Weight)
    near = rt.prefill(prompt, logits="all").logits
    assert not torch.equal(near, exact)
    assert float((near - exact).abs().max()) < 0.1 * float(exact.std())
    rt.use_decode_weights("bf16")
    assert rt.decode_layers is rt.prompt_layers  # one set of copies
    rt.use_prompt_weights("fp32")
    assert rt.prompt_layers is rt.layers
    assert torch.equal(rt.prefill(prompt, logits="all").logits, exact)
    with pytest.raises(InvalidOption, match="fp32"):
        rt.use_prompt_weights("int8")


class RowCounted:
    """A product whose result moves at the row counts in `moves` (as BLAS's rounding moves
    with the row count on some CPUs); otherwise it runs row by row, the same per row
    whatever the count."""

    moves = (2, 3)

    def __init__(self, weight):
        self.w, self.shape, self.device = weight, weight.shape, weight.device

    def __call__(self, x, bias=None):
        rows = [torch.nn.functional.linear(row[None], self.w) for row in x]
        return torch.cat(rows) + 1e-6 * (x.shape[0] in self.moves)


class RowByRow(RowCounted):
    """Row-invariant by construction, on any CPU (where fp16's matmul is on some and not on
    others: an AVX-512/AMX Xeon, 2026-12-01, is one where it is not)."""

    moves = ()


class MatrixVector(RowCounted):
    """One row rounds otherwise than every count from 2 on (fp16's CPU matmul on an
    AVX-512/AMX Xeon, 2026-12-01: a matrix-vector path for one row)."""

    moves = (1,)


class ByPlace(RowByRow):
    """Rounds a row by its place in the product (odd places otherwise): no padding helps."""

    def __call__(self, x, bias=None):
        return super().__call__(x) + 1e-6 * (torch.arange(len(x)) % 2)[:, None]


def test_the_row_probe_finds_a_product_that_rounds_by_row_count():
    from kvedge.common.model.quant import invariant_multiple, rows_invariant

    steady = [Int8Weight(weight(64, 128)), RowByRow(weight(96, 64))]
    assert rows_invariant(steady)
    assert not rows_invariant(steady + [RowCounted(weight(32, 64))])
    assert not rows_invariant([RowCounted(weight(32, 64))], rows=(1, 2))
    assert rows_invariant([RowCounted(weight(32, 64))], rows=(1, 4, 8))
    # the least padding that holds: every weight's product must hold at it
    assert invariant_multiple(steady) == 1
    assert invariant_multiple(steady + [MatrixVector(weight(32, 64))]) == 2
    assert invariant_multiple(steady + [RowCounted(weight(32, 64))]) == 4  # moves at 2, 3
    assert invariant_multiple([MatrixVector(weight(32, 64)), RowCounted(weight(32, 64))]) == 4
    assert invariant_multiple([ByPlace(weight(32, 64))]) is None
    assert not rows_invariant([ByPlace(weight(32, 64))], rows=(2, 4), multiple=2)


def fake_passes(monkeypatch, ms: dict):
    """`quant.pass_s` as the runtime's auto choices call it, answering from `ms`:
    {(format, rows): milliseconds}, the format read off the sample's first weight."""
    import kvedge.common.model.runtime as runtime
    from kvedge.common.model.quant import Bf16Weight, Fp16Weight

    def timed(sample, rows=1, reps=3, beyond=None):
        kind = {Fp16Weight: "fp16", Bf16Weight: "bf16"}.get(type(sample[0]), "fp32")
        ms["threads", kind] = torch.get_num_threads()  # what the probe timed it on
        return ms[kind, rows] / 1e3

    monkeypatch.setattr(runtime, "pass_s", timed)


def test_auto_takes_fp16_only_where_it_is_row_invariant_and_fast(monkeypatch):
    """`decode_weights="auto"`: the load-time probe decides — fp16 when its products are
    row-invariant and the timed pass beats fp32's by AUTO_SPEEDUP, else fp32 with the fp16
    copies dropped; each choice says why."""
    import kvedge.common.model.runtime as runtime

    rt = tiny_runtime("tiny-llama")
    monkeypatch.setattr(runtime, "AUTO_SPEEDUP", 0.0)  # any fp16 pass is fast enough
    monkeypatch.setattr(runtime, "invariant_multiple", lambda weights: 1)
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp16" and rt.decode_row_multiple == 1
    assert "row-invariant padded to 1 row;" in rt.decode_choice
    assert row_multiple(rt, invariant=True) == 1
    monkeypatch.setattr(runtime, "AUTO_SPEEDUP", 1e9)  # no pass is fast enough
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp32" and "fp16 pass of 1 row" in rt.decode_choice
    assert "fp16" not in rt._decode  # its copies are not kept
    monkeypatch.setattr(runtime, "AUTO_SPEEDUP", 0.0)
    monkeypatch.setattr(runtime, "invariant_multiple", lambda weights: None)
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp32" and "not row-invariant" in rt.decode_choice
    assert "fp16" not in rt._decode
    rt.use_decode_weights("int8")
    assert rt.decode_choice == "as asked"


def test_auto_prompt_takes_bf16_where_a_start_sized_pass_is_fast(monkeypatch):
    from kvedge.common.model.quant import AUTO_PROMPT_ROWS, Bf16Weight

    rt = tiny_runtime("tiny-llama")
    threads = torch.get_num_threads()
    ms = {("fp32", AUTO_PROMPT_ROWS): 326, ("bf16", AUTO_PROMPT_ROWS): 109}
    fake_passes(monkeypatch, ms)
    rt.use_prompt_weights("auto")
    assert rt.prompt_format == "bf16" and isinstance(rt.prompt_layers[0].wq, Bf16Weight)
    assert "bf16 109.0" in rt.prompt_choice
    # timed on one thread (a busy CPU cannot skew the ratio), the threads then put back
    assert ms["threads", "fp32"] == ms["threads", "bf16"] == 1
    assert torch.get_num_threads() == threads
    fake_passes(monkeypatch, {("fp32", AUTO_PROMPT_ROWS): 326, ("bf16", AUTO_PROMPT_ROWS): 300})
    rt.use_prompt_weights("auto")
    assert rt.prompt_format == "fp32" and rt.prompt_layers is rt.layers
    assert "bf16" not in rt._decode
    rt.use_prompt_weights("bf16")
    assert rt.prompt_choice == "as asked"


def test_the_timed_sample_holds_enough_weights_and_a_pass_is_timed():
    from kvedge.common.model.quant import TIMED_BYTES, pass_s, products, timed_layers

    rt = tiny_runtime("tiny-llama")
    assert timed_layers(rt.layers) == len(rt.layers)  # a tiny model is timed whole
    per_layer = sum(4 * w.numel() for w in products(rt.layers[:1], rt.lm_head)[:-1])
    assert timed_layers(rt.layers * (TIMED_BYTES // per_layer + 5)) == \
        -(-TIMED_BYTES // per_layer)
    assert pass_s(products(rt.layers, rt.lm_head), reps=2) > 0
    assert pass_s(products(rt.layers, rt.lm_head), rows=16, reps=2) > 0


class Counted:
    """A weight's product that counts its calls (one per pass over a one-weight sample)."""

    def __init__(self, w: torch.Tensor):
        self.w, self.shape, self.device, self.calls = w, w.shape, w.device, 0

    def __call__(self, x, bias=None):
        self.calls += 1
        return x @ self.w.T


def test_a_timed_pass_stops_once_one_pass_is_beyond_the_bound():
    from kvedge.common.model.quant import pass_s

    sample = Counted(weight(32, 64))
    assert pass_s([sample], reps=3) > 0 and sample.calls == 4  # a warm-up, then three
    sample.calls = 0
    assert pass_s([sample], reps=3, beyond=0.0) > 0 and sample.calls == 1  # its warm-up only
    sample.calls = 0
    assert pass_s([sample], reps=3, beyond=60.0) > 0 and sample.calls == 4


def test_unknown_format_and_a_model_off_the_cpu_are_refused():
    from kvedge.common.errors import InvalidOption
    from kvedge.common.model.quant import decode_weights

    rt = tiny_runtime("tiny-llama")
    with pytest.raises(InvalidOption, match="int8"):
        rt.use_decode_weights("int3")
    with pytest.raises(InvalidOption, match="CPU kernel"):
        decode_weights([], torch.empty(32, 64, device="meta"), "int8")


@pytest.mark.parametrize("fmt, prompt", [("int8", "fp32"), ("fp16", "fp32"),
                                         ("bf16", "bf16")])
def test_served_answers_are_the_same_alone_and_batched(loaded, state, fmt, prompt):
    """`EdgeEngine(decode_weights=fmt)`: int8 steps pad nothing, fp16 and bf16 steps pad
    unless the load-time probe found them row-invariant; either way concurrent answers equal
    the same questions asked one at a time — with bf16 starts too (`prompt_weights`: a
    start runs alone, so batching cannot change it)."""
    engine = make_engine(loaded, state, decode_weights=fmt, prompt_weights=prompt)

    def ask(question):
        return comparable(list(engine.ask(Target("default", "facts"), question,
                                          max_new_tokens=12)))

    try:
        assert (engine.rt.decode_format, engine.rt.prompt_format) == (fmt, prompt)
        alone = [ask(q) for q in QUESTIONS]
        assert concurrently(ask, QUESTIONS) == alone
    finally:
        engine.close()


def test_serve_offers_the_formats_and_refuses_others():
    from click.testing import CliRunner

    from kvedge.edge.cli import main

    result = CliRunner().invoke(main, ["serve", "--kb", "x", "--decode-weights", "int4"])
    assert result.exit_code == 2 and "'fp32'" in result.output and "'int8'" in result.output
    assert "'fp16'" in result.output and "'bf16'" in result.output
    assert "'auto'" in result.output
    result = CliRunner().invoke(main, ["serve", "--kb", "x", "--prompt-weights", "fp16"])
    assert result.exit_code == 2 and "'fp32'" in result.output and "'bf16'" in result.output
    helped = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert "DECODE_WEIGHTS; default: auto]" in " ".join(helped.output.split())
    assert "[fp32|bf16|auto] weights every forward over a prompt" in " ".join(
        helped.output.split())


def test_the_row_probe_runs_only_for_a_runtime_that_decodes(monkeypatch):
    """A runtime that never decodes — the cloud's prefill, an eviction method's scoring —
    never probes its rows; the first read does, once a format; asking for decode weights
    probes at once (the edge asks at load, so that its first answer does not wait);
    bf16 prompt weights alone need no probe."""
    import kvedge.common.model.runtime as runtime

    probed = []
    monkeypatch.setattr(runtime, "invariant_multiple",
                        lambda weights: probed.append(type(weights[0]).__name__) or 1)
    rt = tiny_runtime("tiny-llama")
    rt.prefill(torch.arange(12))
    rt.use_prompt_weights("bf16")
    assert probed == []
    assert rt.decode_row_multiple == 1 and rt.decode_row_multiple == 1
    assert probed == ["Parameter"]  # fp32: the model's own weights, once
    rt.use_decode_weights("fp16")
    assert probed == ["Parameter", "Fp16Weight"]
    rt.use_decode_weights("fp32")  # probed already: not again
    assert probed == ["Parameter", "Fp16Weight"] and row_multiple(rt, invariant=True) == 1


def test_auto_times_each_format_at_the_rows_a_lone_step_pads_to(monkeypatch):
    """fp16 that holds only padded to 2 rows is timed at 2 rows, against fp32 at the rows
    its own probe padded it to (1 in MKL's strict mode; 4 where nothing held); it is taken
    where that 2-row pass still wins, and steps then pad (and draft) to 2 rows."""
    import kvedge.common.model.runtime as runtime
    from kvedge.common.model.batch import spec_rows_for

    rt = tiny_runtime("tiny-llama")
    rt._multiples.clear()  # probe fp32 again, under the fake below
    multiple = {True: 1, False: 2}  # fp32's weights are plain tensors, fp16's are not
    monkeypatch.setattr(runtime, "invariant_multiple",
                        lambda weights: multiple[isinstance(weights[0], torch.Tensor)])
    ms = {("fp32", 1): 135, ("fp16", 2): 60}
    fake_passes(monkeypatch, ms)
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp16" and rt.decode_row_multiple == 2
    assert rt.decode_choice == ("fp16 steps row-invariant padded to 2 rows; fp16 pass of "
                                "2 rows 60.0 ms against fp32's of 1 row 135.0")
    assert row_multiple(rt, invariant=True) == spec_rows_for(rt) == 2
    assert ms["threads", "fp32"] == ms["threads", "fp16"] == 1  # a busy CPU cannot tip it
    assert row_multiple(rt, invariant=False) == 1
    fake_passes(monkeypatch, {("fp32", 1): 135, ("fp16", 2): 100})  # not 1.5x faster
    rt._drop_copies("fp16")
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp32" and rt.decode_choice.endswith("(< 1.5x faster)")
    multiple[True] = None  # fp32 held at no multiple: timed at the most padding, 4 rows
    rt._multiples.clear()
    fake_passes(monkeypatch, {("fp32", 4): 160, ("fp16", 2): 100})
    rt.use_decode_weights("auto")
    assert rt.decode_format == "fp16" and "fp32's of 4 rows 160.0" in rt.decode_choice
