"""Prefill workers: an engine class that turns segments into packs, and its thin Ray shim.

`PrefillEngine` is plain Python (tests and tools construct it without Ray); `PrefillPool`
wraps it in Ray actors, one model copy per actor, and spreads segments over them (Ray Serve
LLM's pattern: the Ray layer is a shim over an engine passed in).

A segment is prefilled alone from position 0, or — `anchored` (docs/design.md, decision 9) —
behind the chat prefix the edge puts before the segments, keeping only the segment's KV: its first
tokens then do not turn into an attention sink, and as the first segment of a prompt its KV is
exactly what a full prefill computes. The pack records the anchor's token ids either way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import torch

from kvedge.cloud.ingest import TextSegment, make_segments
from kvedge.common.pack.manifest import KVShape


def chat_prefix_ids(tokenizer) -> list[int]:
    """The tokens the edge puts before the segments (`EdgeEngine.prefix_ids`)."""
    from kvedge.common.model.tokenizer import chat_turn

    return chat_turn(tokenizer)[0]


@dataclass(frozen=True)
class EncodedSegment:
    index: int
    pack_id: str
    data: bytes
    n_tokens: int
    seconds: float = 0.0
    # (digest, file bytes) of kvtc transforms the pack names that this worker has not shipped
    # before: a worker on another machine calibrates into its own transforms folder, and
    # the gateway serves edges from its own (`install_transforms`)
    transforms: tuple[tuple[str, bytes], ...] = ()


def install_transforms(enc: EncodedSegment, store=None) -> None:
    """Put the transforms a worker shipped with a pack into the gateway's transforms folder
    (checked against their digests) before the pack is stored, so every pack the gateway
    holds can be served with what it needs (FetchTransform)."""
    if not enc.transforms:
        return
    from kvedge.common.pack.codecs.kvtc import default_store

    store = store or default_store()
    for digest, data in enc.transforms:
        if not store.has(digest):
            store.add(digest, data)


class PrefillEngine:
    """Holds one model; tokenizes and segments KBs, prefills segments into packs."""

    def __init__(self, model_name: str, threads: int | None = None):
        from kvedge.common.model.models import load_model
        from kvedge.common.model.runtime import Runtime

        if threads:  # Ray sets OMP_NUM_THREADS=1 in workers; use the CPUs the actor was given
            torch.set_num_threads(threads)
        self.loaded = load_model(model_name)
        self.rt = Runtime(self.loaded)
        self._shipped: set[str] = set()  # transforms already sent with a pack (_unshipped)

    def identity(self) -> dict:
        cfg = self.loaded.config
        return {"fingerprint": self.loaded.fingerprint, "tokenizer_id": self.loaded.tokenizer_id,
                "max_tokens": cfg.max_position_embeddings, "model": self.loaded.name,
                "kv_shape": self.kv_shape}

    @property
    def kv_shape(self) -> KVShape:
        """The model's KV per token, which every pack it encodes has."""
        return KVShape(self.rt.n_layers, self.rt.n_kv, self.rt.head_dim)

    def segment(self, files: dict[str, str], segment_tokens: int,
                whole: bool) -> list[TextSegment]:
        tok = self.loaded.tokenizer
        return make_segments(files, lambda s: tok(s)["input_ids"], segment_tokens=segment_tokens,
                             whole=whole, max_tokens=self.loaded.config.max_position_embeddings,
                             detokenize=tok.decode)

    def encode(self, segment: TextSegment, namespace: str, codec: str,
               anchored: bool = False, side_tensors: bool = True) -> EncodedSegment:
        """Prefill one segment (alone from position 0, or behind the chat prefix) and encode
        its pre-RoPE KV as a pack (with SamKV's side tensors, or without: `side_tensors`)."""
        return self.encode_context(segment, self.context(segment, namespace, anchored,
                                                         side_tensors), codec)

    def context(self, segment: TextSegment, namespace: str, anchored: bool = False,
                side_tensors: bool = True):
        """`encode`'s prefill: the segment's KVContext, to encode in one codec or several."""
        from kvedge.common.pack.prefill import segment_context

        return segment_context(self.rt, segment.token_ids, fingerprint=self.loaded.fingerprint,
                               tokenizer_id=self.loaded.tokenizer_id, namespace=namespace,
                               anchor=self.anchor if anchored else None,
                               side_tensors=side_tensors)

    def encode_context(self, segment: TextSegment, ctx, codec: str) -> EncodedSegment:
        """`encode`'s encoding of the segment's `context` in `codec`."""
        from kvedge.common.pack.codecs import codec_for_model
        from kvedge.common.pack.container import pack_id
        from kvedge.common.pack.format import encode_pack

        data = encode_pack(ctx, codec_for_model(codec, self.rt))  # kvtc: the model's transform
        return EncodedSegment(segment.index, pack_id(data), data, ctx.n_tokens,
                              transforms=self._unshipped(data))

    def _unshipped(self, data: bytes) -> tuple[tuple[str, bytes], ...]:
        """The transform files this pack names that this engine has not shipped yet (each
        once per engine: a restarted actor ships again; the gateway skips what it has)."""
        from kvedge.common.pack.codecs.kvtc import default_store, referenced_transforms
        from kvedge.common.pack.container import read_manifest

        digests = sorted(referenced_transforms(read_manifest(data)) - self._shipped)
        self._shipped.update(digests)
        return tuple((d, default_store().path(d).read_bytes()) for d in digests)

    def prefill_segment(self, token_ids: list[int], anchored: bool = False):
        """(keys, values, queries) per layer of the segment's tokens only, pre-RoPE, each
        (H, T, D): from position 0, or behind the chat prefix
        (`kvedge.common.pack.prefill.prefill_segment`)."""
        from kvedge.common.pack.prefill import prefill_segment

        return prefill_segment(self.rt, token_ids, self.anchor if anchored else None)

    @cached_property
    def anchor_ids(self) -> list[int]:
        return chat_prefix_ids(self.loaded.tokenizer)

    @cached_property
    def anchor(self):
        """The chat prefix with its pre-RoPE keys and values per layer, prefilled once."""
        from kvedge.common.pack.prefill import Anchor

        res = self.rt.prefill(torch.tensor(self.anchor_ids), logits="none")
        return Anchor(self.anchor_ids, res.keys, res.values)

    def compress(self, index: int, pack: bytes, method: str, budget: float,
                 codec: str) -> EncodedSegment:
        """Evict (query-agnostic) and re-encode one context's base pack."""
        import time

        from kvedge.cloud.eviction import evict_context
        from kvedge.common.pack.codecs import codec_for_model
        from kvedge.common.pack.container import pack_id
        from kvedge.common.pack.format import encode_pack, read_pack

        start = time.perf_counter()
        ctx = evict_context(self.rt, read_pack(pack, self.loaded.fingerprint), method, budget)
        data = encode_pack(ctx, codec_for_model(codec, self.rt))  # kvtc: the model's transform
        return EncodedSegment(index, pack_id(data), data, ctx.n_tokens,
                              time.perf_counter() - start, self._unshipped(data))


TASK_RETRIES = 3


class PrefillPool:
    """N Ray actors running PrefillEngine; started on first use."""

    def __init__(self, model_name: str, actors: int = 1, cpus_per_actor: int = 1):
        self.model_name, self.n, self.cpus = model_name, actors, cpus_per_actor
        self._actors = None
        self._next = 0

    def _ensure(self):
        import ray

        if self._actors is None:
            # an actor killed (OOM, node loss) is restarted however often it happens in the
            # gateway's lifetime; a task it was running is retried a few times, so one that
            # kills every actor it runs on fails instead of looping
            actor = ray.remote(num_cpus=self.cpus, max_restarts=-1,
                               max_task_retries=TASK_RETRIES)(PrefillEngine)
            self._actors = [actor.remote(self.model_name, self.cpus) for _ in range(self.n)]
        return self._actors

    def identity(self) -> dict:
        import ray

        return ray.get(self._ensure()[0].identity.remote())

    def segment(self, files, segment_tokens, whole):
        import ray

        return ray.get(self._ensure()[0].segment.remote(files, segment_tokens, whole))

    def encode_all(self, segments: list[TextSegment], namespace: str, codec: str,
                   anchored: bool = False, side_tensors: bool = True):
        """Yield EncodedSegments as actors finish them (round-robin over actors)."""
        import ray

        actors = self._ensure()
        pending = []
        for seg in segments:
            actor = actors[self._next % len(actors)]
            pending.append(actor.encode.remote(seg, namespace, codec, anchored, side_tensors))
            self._next += 1
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def compress_all(self, packs: list[tuple[int, bytes]], method: str, budget: float,
                     codec: str, cancelled=None):
        """Yield (index, EncodedSegment | Exception) per context as actors finish them.
        A task whose actor died is retried by Ray (max_task_retries); what still fails comes
        back as the exception, and the other contexts go on."""
        import ray

        actors = self._ensure()
        pending = {}
        for i, (index, data) in enumerate(packs):
            ref = actors[i % len(actors)].compress.remote(index, data, method, budget, codec)
            pending[ref] = index
        while pending:
            if cancelled is not None and cancelled.is_set():
                for ref in pending:
                    ray.cancel(ref)
                return
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in done:
                index = pending.pop(ref)
                try:
                    yield index, ray.get(ref)
                except Exception as err:  # noqa: BLE001 - reported per context
                    yield index, getattr(err, "cause", None) or err

    def shutdown(self):
        import ray

        for actor in self._actors or ():
            ray.kill(actor)
        self._actors = None


class LocalPool:
    """PrefillPool's calls on one PrefillEngine in this process, one segment after another:
    for benchmarks and tests that serve a gateway without Ray (PrefillPool is a thin Ray
    shim over the same engine calls)."""

    def __init__(self, engine: PrefillEngine):
        self.engine = engine

    def identity(self) -> dict:
        return self.engine.identity()

    def segment(self, files, segment_tokens, whole):
        return self.engine.segment(files, segment_tokens, whole)

    def encode_all(self, segments: list[TextSegment], namespace: str, codec: str,
                   anchored: bool = False, side_tensors: bool = True):
        return (self.engine.encode(s, namespace, codec, anchored, side_tensors)
                for s in segments)

    def compress_all(self, packs: list[tuple[int, bytes]], method: str, budget: float,
                     codec: str, cancelled=None):
        """As PrefillPool's: (index, EncodedSegment | Exception) per context, in order."""
        for index, data in packs:
            if cancelled is not None and cancelled.is_set():
                return
            try:
                yield index, self.engine.compress(index, data, method, budget, codec)
            except Exception as err:  # noqa: BLE001 - reported per context
                yield index, err


def start_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join a cluster, or start Ray in-process with the dashboard off (embedded default)."""
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 runtime_env=env, log_to_driver=False)
