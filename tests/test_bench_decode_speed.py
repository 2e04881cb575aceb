"""bench/decode_speed.py runs on the tiny random model and prints every path's row."""
from kvedge.bench.decode_speed import main


def test_every_decode_path_and_weight_precision_is_timed(capsys):
    main(["--model", "tiny-llama", "--context", "32", "--steps", "3", "--threads", "1"])
    out = capsys.readouterr().out
    for row in ("batch of 1 unpadded", "forward of 1", "transformers forward", "| bfloat16 |",
                "| 8 |", "| 128 |", "batch of 4, int8 weights", "batch of 4, fp16 weights",
                "batch of 4, bf16 weights", "fp16 weights, ms", "bf16 weights, ms per pass"):
        assert row in out, out


def test_the_static_step_is_timed_eager_and_compiled():
    from kvedge.bench.decode_speed import static_rows

    rows = static_rows("tiny-llama", context=16, steps=2)
    for weights in ("fp32", "int8"):
        assert rows[f"static step, {weights}, eager"] > 0
        assert rows[f"static step, {weights}, torch.compile"] > 0
        assert rows[f"static step, {weights}: max |Δlogits| compiled vs eager"] < 1.0
