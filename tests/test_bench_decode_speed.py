"""bench/decode_speed.py runs on the tiny random model and prints every path's row."""
from kvedge.bench.decode_speed import main


def test_every_decode_path_and_weight_precision_is_timed(capsys):
    main(["--model", "tiny-llama", "--context", "32", "--steps", "3", "--threads", "1"])
    out = capsys.readouterr().out
    for row in ("batch of 1 unpadded", "forward of 1", "transformers forward", "| bfloat16 |",
                "| 8 |",
                "batch of 4, int8 weights"):
        assert row in out, out
