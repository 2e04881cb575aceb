"""Byte-level BPE tokenizers built offline: a GGUF file's (the embedded model's, Qwen2.5's) and
the tiny one.

transformers 5.2's GGUF tokenizer conversion gets SmolLM2 wrong (it adds a BOS to plain text,
sets EOS to <|im_start|>, appends CodeLlama FIM tokens past the vocabulary and decodes with
SentencePiece rules), and gives Qwen2.5 <|endoftext|> as EOS where its GGUF says <|im_end|>, so
we build the tokenizer ourselves from the GGUF metadata: the token list, the merges, the
control and user-defined tokens, the special ids, the chat template, and how text is split
before BPE (`tokenizer.ggml.pre`). Only the token list, its types and the merges are required;
a GGUF may leave out any special id (Qwen's and Llama 3's have no unknown token) or the template.

No BOS is ever added to plain text, whatever `tokenizer.ggml.add_bos_token` says: the chat
template writes a BOS where the model wants one, and the edge tokenizes each segment on its own.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvedge.common.errors import UnsupportedTokenizer
from kvedge.common.model.gguf_header import read_metadata

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# how each `tokenizer.ggml.pre` splits text before the byte-level BPE: the regexes are the
# ones the models' own Hugging Face tokenizers hold (llama.cpp's names)
_SPLIT_REGEX = {
    "qwen2": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama-bpe": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
_NFC = {"qwen2"}  # Qwen2's tokenizer normalizes to NFC first; Llama 3's does not
# GPT-2's own regex behind single-digit splitting (SmolLM2); a GGUF without the field was read
# this way before the field was looked at, so it still is
_DIGITS_THEN_GPT2 = {"smollm", None}
SUPPORTED_PRE = sorted(["gpt-2", "default", *_SPLIT_REGEX, "smollm"])


def pre_tokenizer(pre: str | None):
    """The pre-tokenizer for a GGUF's `tokenizer.ggml.pre` value (None: the field is absent)."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt-2", "default"):
        return byte_level
    if pre in _SPLIT_REGEX:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_REGEX[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise UnsupportedTokenizer(f"GGUF pre-tokenizer {pre!r} is not supported (supported: "
                               f"{', '.join(SUPPORTED_PRE)}); convert the model to a Hugging "
                               "Face folder (config.json, tokenizer.json) and pass its path")


def byte_level_tokenizer(tokens: list[str], merges: list[str], specials: list[str], *,
                         bos: str | None, eos: str | None, unk: str | None, pad: str | None,
                         chat_template: str | None, pre: str | None = None,
                         added: list[str] = ()) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE: no BOS added to plain text, ByteLevel decoding.

    `specials` are control tokens (skipped when decoding with skip_special_tokens); `added`
    are user-defined tokens (Qwen's <tool_call>): whole tokens in text, but not special.
    `pre` picks the split before BPE (`pre_tokenizer`: a `tokenizer.ggml.pre` value)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=None))
    backend.pre_tokenizer = pre_tokenizer(pre)
    if pre in _NFC:
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos,
                                  unk_token=unk, pad_token=pad)
    tok.add_special_tokens({"additional_special_tokens": [s for s in specials
                                                          if s not in (bos, eos, unk, pad)]})
    if added:
        tok.add_tokens(list(added))
    tok.chat_template = chat_template
    return tok


# GGUF token types (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4
_REQUIRED = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")


def gguf_tokenizer(gguf_path: str) -> PreTrainedTokenizerFast:
    """The tokenizer stored in a GGUF file of model type 'gpt2' (byte-level BPE)."""
    return tokenizer_from_metadata(read_metadata(gguf_path), gguf_path)


def tokenizer_from_metadata(meta: dict, where: str = "GGUF") -> PreTrainedTokenizerFast:
    """The tokenizer a GGUF header describes (`gguf_header.read_metadata`'s dict)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedTokenizer(f"{where}: only byte-level BPE ('gpt2') GGUF tokenizers are "
                                   f"supported, not {kind!r}; convert the model to a Hugging "
                                   "Face folder and pass its path")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise UnsupportedTokenizer(f"{where}: the GGUF has no {', '.join(missing)}, which a "
                                   "byte-level BPE tokenizer needs")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]

    def token(role):
        index = meta.get(f"tokenizer.ggml.{role}_token_id")
        return None if index is None else tokens[index]

    return byte_level_tokenizer(
        tokens, meta["tokenizer.ggml.merges"],
        [t for t, kind in zip(tokens, types) if kind == _CONTROL],
        added=[t for t, kind in zip(tokens, types) if kind == _USER_DEFINED],
        bos=token("bos"), eos=token("eos"), unk=token("unknown"), pad=token("padding"),
        chat_template=meta.get("tokenizer.chat_template"), pre=meta.get("tokenizer.ggml.pre"))


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens + ChatML specials (ids 256..258): for random-weight test models."""
    alphabet = [_byte_to_unicode(b) for b in range(256)]  # token id == byte value
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return byte_level_tokenizer(alphabet + specials, [], specials, bos="<|im_start|>",
                                eos="<|im_end|>", unk="<|endoftext|>", pad="<|im_end|>",
                                chat_template=CHATML_TEMPLATE, pre="gpt-2")


def _byte_to_unicode(b: int) -> str:
    """GPT-2's printable stand-in for byte b (the ByteLevel pre-tokenizer's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if x not in printable))


def chat_turn(tokenizer) -> tuple[list[int], str]:
    """One user turn of the chat template split where its content goes: (the token ids before
    it — what the edge puts before the segments and what the cloud anchors segments behind —
    and the text after it, up to the assistant header)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}],
                                         add_generation_prompt=True, tokenize=False)
    head, tail = text.split("\x00")
    return tokenizer(head)["input_ids"], tail
