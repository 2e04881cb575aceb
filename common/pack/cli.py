"""`kvctl pack inspect|verify`: look inside a pack, or check every byte of it."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from kvedge.common.pack.errors import ModelMismatch, PackError

_KINDS = {"k": "keys", "v": "values", "summary": "block summaries", "qcache": "query cache"}


@click.group("pack")
def pack():
    """Inspect and verify KV packs."""


def _fail(err: Exception):
    click.echo(f"{type(err).__name__}: {err}", err=True)
    raise SystemExit(1)


@pack.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def inspect(path: Path):
    """Summarize a pack's manifest and sizes (checks header and manifest, not tensors)."""
    from kvedge.common.pack.container import HEADER_SIZE, open_container, pack_id, read_header

    data = path.read_bytes()
    try:
        c = open_container(data)
    except PackError as err:
        _fail(err)
    m = c.manifest
    kept = [len(h) for layer in m.kept for h in layer]
    codecs = Counter(e.codec for name, e in m.tensors.items() if name[0] in "kv")
    click.echo(f"pack        {pack_id(data)}  ({len(data):,} bytes, format v{m.version})")
    click.echo(f"model       {m.model_fingerprint}")
    click.echo(f"tokenizer   {m.tokenizer_id}")
    click.echo(f"namespace   {m.namespace}")
    click.echo(f"tokens      {m.n_tokens} (positions {m.positions[0]}..{m.positions[-1]}, "
               f"{len(m.segments)} segment{'s' * (len(m.segments) != 1)})")
    click.echo(f"kv heads    {m.n_layers} layers × {m.n_kv_heads} heads × {m.head_dim} dims; "
               f"kept per head {min(kept)}..{max(kept)} "
               f"({100 * sum(kept) / (len(kept) * m.n_tokens):.1f}% of tokens)")
    click.echo("codec       " + ", ".join(f"{name} ×{n}" for name, n in codecs.items()))
    for side, spec in m.side.items():
        click.echo(f"side        {side} {spec}")
    stored, as_json = read_header(data)[1], len(m.to_json())
    click.echo(f"bytes       header {HEADER_SIZE:,}, manifest {stored:,}"
               + (f" ({as_json:,} as JSON)" if stored != as_json else ""))
    for kind, parts in _bytes_by_kind(c).items():
        detail = ", ".join(f"{part} {n:,}" for part, n in sorted(parts.items()))
        click.echo(f"  {_KINDS.get(kind, kind):<15} {sum(parts.values()):>12,}  ({detail})")


def _bytes_by_kind(c) -> dict[str, Counter]:
    """Payload bytes per tensor kind, split by part name."""
    sizes: dict[str, Counter] = {}
    for key, part in c.parts.items():
        tensor, _, name = key.partition("/")
        sizes.setdefault(tensor.split(".")[0], Counter())[name] += len(part.data)
    return sizes


@pack.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model-fingerprint", help="fail unless the pack belongs to this model (hex)")
def verify(path: Path, model_fingerprint: str | None):
    """Check every checksum, decode every tensor; exit 1 naming the error otherwise."""
    from kvedge.common.pack.format import open_pack

    try:
        p = open_pack(path, model_fingerprint)
        ctx = p.context()
    except (PackError, ModelMismatch) as err:
        _fail(err)
    click.echo(f"ok {p.id} ({ctx.n_tokens} tokens, {ctx.n_layers}×{ctx.n_kv_heads} heads)")
