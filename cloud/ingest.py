"""From uploaded files to token segments: validation, paragraph-aware segmentation. Torch-free.

RAG mode: each file is split at paragraph boundaries into segments of at most
`segment_tokens` tokens (a paragraph longer than that is cut by tokens); segments never span
files. KBQA ("whole") mode: the whole KB is one context, if it fits the model's context.
Every segment's text ends with a blank line, so separately prefilled segments concatenate
into a well-formed prompt with no glue tokens between them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from kvedge.common.errors import BadInput
from kvedge.common.pack.manifest import FORMAT_VERSION

SEPARATOR = "\n\n"


@dataclass(frozen=True)
class TextSegment:
    """A piece of an uploaded KB cut for one prefill: its text and token ids."""

    index: int
    source: str           # the file it came from
    text: str
    token_ids: list[int]


def prefill_key(identity: dict, namespace: str, codec: str, anchored: bool,
                token_ids: list[int], side_tensors: bool = True) -> str:
    """What a segment's pack is a function of — the model and tokenizer (`identity`, the
    prefill pool's), the namespace the pack records, the codec spec, whether it was prefilled
    behind the chat prefix, whether it carries SamKV's side tensors, and its tokens — hashed:
    two segments with one key get the same pack, so an ingest reuses a pack its namespace
    already holds for that key (`Catalog.prefilled`) instead of prefilling again. The
    segment's file and index are not in it: a pack does not record them. Side tensors enter
    the key only when off: every pack made before the option had them, and keeps its key."""
    parts = [] if side_tensors else [{"side_tensors": False}]
    return _key(identity["fingerprint"], identity["tokenizer_id"], namespace, codec,
                bool(anchored), list(token_ids), *parts)


PREFILL_KEY_VERSION = 1  # raise when what a pack holds changes without its format version


def compress_key(base_pack: str, method: str, budget: float, codec: str) -> str:
    """What a batch job's pack for one context is a function of: the context's base pack
    (content-addressed: model, namespace, tokens and codec are in it), the method at its
    default options, the budget and the codec. A job run again after the KB changed
    compresses only the contexts whose base pack changed."""
    return _key("job", base_pack, method, float(budget), codec)


def _key(*parts) -> str:
    """sha256 of the parts (JSON), with the key and pack format versions."""
    text = json.dumps([PREFILL_KEY_VERSION, FORMAT_VERSION, *parts])
    return hashlib.sha256(text.encode()).hexdigest()


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]


def segment_file(source: str, text: str, tokenize, segment_tokens: int) -> list[tuple[str, list[int]]]:
    """Greedy packing of whole paragraphs into segments of ≤ segment_tokens tokens."""
    out, current = [], []

    def flush():
        if current:
            body = SEPARATOR.join(current) + SEPARATOR
            out.append((body, tokenize(body)))
            current.clear()

    for para in paragraphs(text):
        candidate = SEPARATOR.join(current + [para]) + SEPARATOR
        if len(tokenize(candidate)) <= segment_tokens:
            current.append(para)
            continue
        flush()
        ids = tokenize(para + SEPARATOR)
        if len(ids) <= segment_tokens:
            current.append(para)
            continue
        for i in range(0, len(ids), segment_tokens):  # an over-long paragraph is cut by tokens
            out.append((None, ids[i:i + segment_tokens]))
    flush()
    return out


def make_segments(files: dict[str, str], tokenize, *, segment_tokens: int, whole: bool,
                  max_tokens: int, detokenize=None) -> list[TextSegment]:
    """files: path → text (in upload order). tokenize(str) → ids; detokenize(ids) → str."""
    if not files:
        raise BadInput("the knowledge base has no files")
    if whole:
        text = "".join(SEPARATOR.join(paragraphs(t)) + SEPARATOR for t in files.values())
        ids = tokenize(text)
        if len(ids) > max_tokens:
            raise BadInput(f"whole-KB mode needs the KB to fit the model's context: {len(ids)} "
                           f"tokens > {max_tokens}; upload without --whole (RAG segments)")
        segments = [("*", text, ids)]
    else:
        limit = min(segment_tokens, max_tokens)  # no segment beyond the model's context
        segments = [(path, body, ids) for path, text in files.items()
                    for body, ids in segment_file(path, text, tokenize, limit)]
    segments = [(src, body if body is not None else (detokenize(ids) if detokenize else ""), ids)
                for src, body, ids in segments if ids]
    if not segments:
        raise BadInput("the knowledge base has no text (every file is empty)")
    return [TextSegment(i, src, body, ids) for i, (src, body, ids) in enumerate(segments)]
