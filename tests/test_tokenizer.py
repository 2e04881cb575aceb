"""Tokenizers built from a GGUF header (common/model/tokenizer.py): the optional fields are
optional, the pre-tokenizer follows `tokenizer.ggml.pre`, and on the real Qwen2.5 file the result
is transformers' own GGUF tokenizer's."""
import pytest

from kvedge.common.errors import UnsupportedTokenizer
from kvedge.common.model import models
from kvedge.common.model.tokenizer import _byte_to_unicode, gguf_tokenizer, pre_tokenizer
from test_gguf_header import write_gguf

ALPHABET = [_byte_to_unicode(b) for b in range(256)]  # token id == byte value
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"]


def qwen_style(tmp_path, **fields):
    """A GGUF tokenizer as Qwen's is written: no unknown, BOS or padding id."""
    tokens = ALPHABET + SPECIALS + ["hi"]
    defaults = dict(tokens=tokens, types=[1] * 256 + [3, 3, 3, 4, 1], merges=["h i"],
                    eos=tokens.index("<|im_end|>"))
    return write_gguf(tmp_path / "q.gguf", **{**defaults, **fields})


def test_a_gguf_without_unknown_bos_or_padding_ids_builds(tmp_path):
    tok = gguf_tokenizer(str(qwen_style(tmp_path)))
    assert tok.unk_token is None and tok.bos_token is None and tok.pad_token is None
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 258
    assert tok("hi")["input_ids"] == [260]  # the merge, no BOS in front
    assert tok("<tool_call>x<|im_end|>")["input_ids"] == [259, ord("x"), 258]
    assert tok.convert_ids_to_tokens(259) not in tok.all_special_tokens  # user-defined
    assert tok.decode(tok("naïve ✓")["input_ids"]) == "naïve ✓"


def test_qwen2_normalizes_to_nfc_first(tmp_path):
    tok = gguf_tokenizer(str(qwen_style(tmp_path)))
    assert tok("e\u0301")["input_ids"] == tok("\u00e9")["input_ids"] == [0xC3, 0xA9]


def test_pre_tokenizers_split_as_their_models_do():
    def pieces(pre, text):
        return [p for p, _ in pre_tokenizer(pre).pre_tokenize_str(text)]

    assert pieces("qwen2", "12345 ok") == ["1", "2", "3", "4", "5", "Ġok"]
    assert pieces("llama-bpe", "12345 ok") == ["123", "45", "Ġok"]
    assert pieces("smollm", "12345 ok") == ["1", "2", "3", "4", "5", "Ġok"]
    assert pieces(None, "12345") == pieces("smollm", "12345")  # the field absent: as before
    assert pieces("gpt-2", "12345 ok") == ["12345", "Ġok"]


def test_unsupported_tokenizers_are_named_errors(tmp_path):
    with pytest.raises(UnsupportedTokenizer, match="'tekken'.*Hugging Face folder"):
        gguf_tokenizer(str(qwen_style(tmp_path, pre="tekken")))


REAL_IDS = {  # transformers 5.2's GGUF tokenizer (AutoTokenizer, gguf_file=) on the same file
    "Hello world": [9707, 1879],
    "What is the capital of France?": [3838, 374, 279, 6722, 315, 9625, 30],
    "1234567 ✓ Ünïcode\n\n  x": [16, 17, 18, 19, 20, 21, 22, 52375, 30512, 77, 37572, 1851, 271,
                                 220, 856],
    "I'm here, they've": [40, 2776, 1588, 11, 807, 3003],
}
REAL_CHAT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
             "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_real_qwen_gguf_tokenizer_matches_transformers(tmp_path):
    """The tokenizer built from the real Qwen2.5-Coder-0.5B-Instruct GGUF's header.

    The header (tokenizer included) is the file's first 5.9 MB, inside part1's 89 MB member, so
    reading the first 8 MB of the file is reading part1 alone. Where the file comes from: the
    model cache, once `kvctl model pull qwen2.5-coder-0.5b` has run on this machine; otherwise
    the test is skipped. Decision: tests never download it. part1's wheel alone is 82 MB (all
    six 477 MB): too large to fetch on every CI run for one test, while every other model test
    runs on SmolLM2 and the tiny random models. A one-off check of 98 texts (README and paper
    extracts, 48,151 tokens) against transformers found no difference; transformers itself
    takes ~30 s to build it, so the ids below are its output, recorded."""
    gguf, _ = models.pulled_paths(models.QWEN_CODER)
    if not gguf.exists():
        pytest.skip(f"{gguf} absent: run `kvctl model pull qwen2.5-coder-0.5b` to check the "
                    "tokenizer on the real file (tests do not download 82+ MB)")
    head = tmp_path / "part01-head.bin"
    with open(gguf, "rb") as src, open(head, "wb") as dst:
        dst.write(src.read(8 << 20))
    tok = gguf_tokenizer(str(head))
    assert {text: tok(text)["input_ids"] for text in REAL_IDS} == REAL_IDS
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat == REAL_CHAT
    # where it differs from transformers on purpose: the GGUF's own EOS (transformers says
    # <|endoftext|>), and <tool_call> whole, as the GGUF marks it user-defined
    assert tok.eos_token == "<|im_end|>" and len(tok) == 151936
    assert tok("<tool_call>")["input_ids"] == [151657]
