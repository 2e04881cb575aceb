"""Byte-level BPE tokenizers built offline: the embedded model's (from its GGUF) and the tiny one.

transformers 5.2's GGUF tokenizer conversion gets SmolLM2 wrong (it adds a BOS to plain text,
sets EOS to <|im_start|>, appends CodeLlama FIM tokens past the vocabulary and decodes with
SentencePiece rules), so we build the tokenizer ourselves from the GGUF metadata: the token
list, the merges, the control tokens, the special ids and the chat template.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_tokenizer(tokens: list[str], merges: list[str], specials: list[str], *,
                         bos: str, eos: str, unk: str, pad: str, chat_template: str,
                         split_digits: bool = True) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE: no BOS added to plain text, ByteLevel decoding."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=None))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                      byte_level])
                             if split_digits else byte_level)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos,
                                  unk_token=unk, pad_token=pad)
    tok.add_special_tokens({"additional_special_tokens": [s for s in specials
                                                          if s not in (bos, eos, unk, pad)]})
    tok.chat_template = chat_template
    return tok


def gguf_tokenizer(gguf_path: str) -> PreTrainedTokenizerFast:
    """The tokenizer stored in a GGUF file of model type 'gpt2' (byte-level BPE)."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf_path).fields

    def scalar(key):
        return fields[key].contents()

    def array(key):
        field = fields[key]
        return [field.contents(i) for i in range(len(field.data))]

    if scalar("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_path}: only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    tokens, types = array("tokenizer.ggml.tokens"), array("tokenizer.ggml.token_type")
    control = [t for t, kind in zip(tokens, types) if kind == 3]  # GGUF token type 3: control
    return byte_level_tokenizer(
        tokens, array("tokenizer.ggml.merges"), control,
        bos=tokens[scalar("tokenizer.ggml.bos_token_id")],
        eos=tokens[scalar("tokenizer.ggml.eos_token_id")],
        unk=tokens[scalar("tokenizer.ggml.unknown_token_id")],
        pad=tokens[scalar("tokenizer.ggml.padding_token_id")],
        chat_template=scalar("tokenizer.chat_template"))


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens + ChatML specials (ids 256..258): for random-weight test models."""
    alphabet = [_byte_to_unicode(b) for b in range(256)]  # token id == byte value
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return byte_level_tokenizer(alphabet + specials, [], specials, bos="<|im_start|>",
                                eos="<|im_end|>", unk="<|endoftext|>", pad="<|im_end|>",
                                chat_template=CHATML_TEMPLATE, split_digits=False)


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
