"""bench/layer_sensitivity.py on the tiny random model and a tiny wheel of SQuAD's layout:
every layer gets a key and a value increment, the bytes at every listed width fall with the
width, and the allocation it prints is a kivi spec that fits the asked ratio and encodes."""
import json

from test_bench_real import data_home, fake_data  # noqa: F401 - fixtures

from kvedge.bench.layer_sensitivity import allocate, main
from kvedge.common.pack.codecs import get_codec


def test_layers_measured_and_widths_allocated(fake_data, tmp_path, capsys):
    out = tmp_path / "row.json"
    main(["--model", "tiny-llama", "--items", "2", "--questions", "2", "--length", "64",
          "--key-widths", "8,4", "--value-widths", "8,4,2", "--ratio", "3", "--out", str(out)])
    row = json.loads(out.read_text())
    layers = len(row["K"])
    assert layers == len(row["V"]) > 1 and row["questions"] == 2 and row["base_kl"] >= 0
    for kind, widths in (("K", ("8", "4")), ("V", ("8", "4", "2"))):
        sizes = [sum(row["bytes"][kind][w]) for w in widths]
        assert sizes == sorted(sizes, reverse=True)  # fewer bits, fewer bytes
    keys, values, size = allocate(row, 3)
    assert size <= row["fp16_bytes"] / row["tokens"] / 3
    assert set(keys) <= {8, 4} and set(values) <= {8, 4, 2} and len(keys) == layers
    printed = capsys.readouterr().out
    spec = next(line for line in printed.splitlines() if line.startswith("kivi+zstd:"))
    assert spec.endswith(f"value_layers={''.join(map(str, values))}")
    assert get_codec(spec).inner.value_layers == values  # a spec the registry takes
    main(["--load", str(out), "--ratio", "3"])  # allocates again from the saved measure
    assert spec in capsys.readouterr().out
    # widths neither base nor measured are added to a saved measure by encoding only
    main(["--load", str(out), "--key-widths", "8,4,6", "--ratio", "2.5", "--out",
          str(tmp_path / "more.json")])
    more = json.loads((tmp_path / "more.json").read_text())
    assert more["key_widths"] == [8, 4, 6] and more["K"] == row["K"]
    sizes = [sum(more["bytes"]["K"][w]) for w in ("8", "6", "4")]
    assert sizes == sorted(sizes, reverse=True)
    spec = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("kivi+zstd:"))
    assert set(get_codec(spec).inner.key_layers) <= {8, 6, 4}
