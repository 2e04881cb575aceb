"""Milliseconds to read a cached pack whole: tensor by tensor against batched, side by side.

`python -m kvedge.bench.pack_read DIR [--packs 10] [--rounds 5] [--threads 2]`: the first
`packs` pack files under DIR (an edge's cache, `<state>/packs`, or any directory of packs),
each read from disk into its KVContext — what the edge's pack cache does on a miss
(`PackCache.load`), the "packs" phase of an ask (`AskResult.phases`):

- "tensor by tensor": every tensor checksummed and decoded alone (`Pack.tensor`), as
  `read_pack` did until 2026-11-26;
- "whole pack": `read_pack` (`Pack.context`: the quantized pieces of one layout dequantized
  together, `decode_tensors`);

and the whole-pack read's stages: the file read and opened (header and manifest), the
tensors' checksums, their entropy decoding into pieces, the dequantization. Rounds alternate
the two paths over the same files; the figures are medians over rounds of the time per pack.
Both paths' tensors are checked equal to the bit before anything is timed.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path


def pack_files(directory: Path, limit: int) -> list[Path]:
    """The first `limit` pack files under `directory` (sorted: a fixed choice per directory)."""
    from kvedge.common.pack.container import MAGIC

    files = []
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        with path.open("rb") as f:
            if f.read(len(MAGIC)) == MAGIC:
                files.append(path)
        if len(files) == limit:
            break
    if not files:
        raise SystemExit(f"no pack files under {directory}")
    return files


def tensor_by_tensor(path: Path):
    """The reference: `read_pack` as it was, each tensor checksummed and decoded alone."""
    from kvedge.common.pack.format import SIDE, build_context, open_pack
    from kvedge.common.pack.manifest import kv_name

    pack = open_pack(path)
    m = pack.manifest
    heads = {kind: [[pack.tensor(kv_name(kind, layer, head)) for head in range(m.n_kv_heads)]
                    for layer in range(m.n_layers)] for kind in ("k", "v")}
    side = {key: [pack.tensor(f"{prefix}.{layer}") for layer in range(m.n_layers)]
            for key, prefix in SIDE if key in m.side}
    pack.container.verify_payload()
    return build_context(m, heads["k"], heads["v"], side)


def whole_pack(path: Path):
    from kvedge.common.pack.format import read_pack

    return read_pack(path)


def tensors(ctx) -> list:
    """Every tensor a KVContext decoded from a pack holds."""
    sides = [t for side in (ctx.block_summaries, ctx.query_cache) if side for t in side]
    return [h for kv in (ctx.keys, ctx.values) for layer in kv for h in layer] + sides


def stages(path: Path) -> dict[str, float]:
    """Seconds of each stage of a whole-pack read of `path` (the last: the read's whole time
    less the others)."""
    from kvedge.common.pack.codecs import decode_tensors
    from kvedge.common.pack.format import open_pack, read_pack, stored_pieces

    t0 = time.perf_counter()
    pack = open_pack(path)
    names = pack.manifest.expected_tensors()
    t1 = time.perf_counter()
    for name in names:
        pack.container.tensor_parts(name)
    t2 = time.perf_counter()
    stored = [pack._decode(name, stored_pieces) for name in names]  # checksums again: less t2-t1
    t3 = time.perf_counter()
    decode_tensors(stored)
    t4 = time.perf_counter()
    read_pack(path)
    total = time.perf_counter() - t4
    split = {"read and open": t1 - t0, "checksums": t2 - t1,
             "entropy decoding into pieces": (t3 - t2) - (t2 - t1), "dequantization": t4 - t3}
    return {**split, "the rest (payload hash, KVContext built)": total - sum(split.values())}


def main(argv: list[str] | None = None) -> None:
    import argparse

    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--packs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    files = pack_files(args.directory, args.packs)
    for path in files:  # the same bits both ways (and every file in the page cache)
        ref, got = tensors(tensor_by_tensor(path)), tensors(whole_pack(path))
        assert len(ref) == len(got) and all(a.dtype == b.dtype and torch.equal(a, b)
                                            for a, b in zip(ref, got)), path
    paths = {"tensor by tensor": tensor_by_tensor, "whole pack": whole_pack}
    times: dict[str, list[float]] = {name: [] for name in paths}
    split: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, read in paths.items():
            start = time.perf_counter()
            for path in files:
                read(path)
            times[name].append((time.perf_counter() - start) / len(files))
        for stage, seconds in _summed(stages(path) for path in files).items():
            split.setdefault(stage, []).append(seconds / len(files))
    base = statistics.median(times["tensor by tensor"])
    print(f"{len(files)} packs under {args.directory}, {args.threads} threads, "
          f"medians of {args.rounds} rounds")
    print("| read | ms per pack | × tensor by tensor |\n|---|---|---|")
    for name in paths:
        ms = statistics.median(times[name])
        print(f"| {name} | {ms * 1e3:.1f} | {ms / base:.2f} |")
    print("| whole-pack stage | ms per pack |\n|---|---|")
    for stage, seconds in split.items():
        print(f"| {stage} | {statistics.median(seconds) * 1e3:.1f} |")


def _summed(dicts) -> dict[str, float]:
    out: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v
    return out


if __name__ == "__main__":
    main()
