"""The manifest and container bookkeeping, torch-free (STYLE.md rule 2)."""
import json
import subprocess
import sys

import pytest

from kvedge.common.pack.container import (HEADER_SIZE, assemble, pack_id, read_header,
                                          read_manifest)
from kvedge.common.pack.errors import PackCorrupt, PackVersionError
from kvedge.common.pack.manifest import (FORMAT_VERSION, Manifest, TensorEntry, from_runs,
                                         kv_name, to_runs)

FP, TOK = "ab" * 32, "cd" * 32


def make_manifest(kept=None, side=None, **overrides) -> Manifest:
    n_layers, n_heads, n = 2, 2, 10
    positions = list(range(5, 5 + n))
    kept = kept or [[positions] * n_heads for _ in range(n_layers)]
    names = [kv_name(kind, l, h) for l in range(n_layers) for kind in "kv" for h in range(n_heads)]
    side = side or {}
    if "block_summaries" in side:
        names += [f"summary.{l}" for l in range(n_layers)]
    entries = {name: TensorEntry("fp16", {"shape": [1, 8], "dtype": "float16"}, ("data",),
                                 "0" * 64, (("F16", (1, 8)),)) for name in names}
    fields = dict(model_fingerprint=FP, tokenizer_id=TOK, namespace="ns", n_layers=n_layers,
                  n_kv_heads=n_heads, head_dim=8, token_ids=list(range(100, 100 + n)),
                  positions=positions, segments=[(0, 4), (4, n)], kept=kept, tensors=entries,
                  side=side)
    fields.update(overrides)
    return Manifest(**fields)


@pytest.mark.parametrize("xs", [[], [3], [3, 4, 5, 9], [0, 2, 4], list(range(100)) + [200]])
def test_runs_roundtrip(xs):
    assert from_runs(to_runs(xs), len(xs), "x") == xs


def test_runs_are_compact_for_dense_heads():
    assert to_runs(list(range(7, 4007))) == [[7, 4000]]


def test_runs_refuse_more_values_than_the_limit():
    with pytest.raises(PackCorrupt, match="more positions"):
        from_runs([[0, 10 ** 12]], 10, "kept")


def test_json_roundtrip_is_canonical():
    ragged = [[list(range(5, 15)), [5, 7, 8, 14]], [[6], []]]
    m = make_manifest(kept=ragged, side={"block_summaries": {"block_size": 4}})
    raw = m.to_json()
    back = Manifest.from_json(raw)
    assert back == m and back.to_json() == raw
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert back.kept[1][1] == [] and back.expected_shape("k.0.1") == (4, 8)
    assert back.expected_shape("summary.1") == (2, 3, 8)


@pytest.mark.parametrize("change, message", [
    (dict(model_fingerprint="XYZ"), "hex"),
    (dict(namespace=""), "namespace"),
    (dict(positions=[5, 6, 7, 8, 9, 10, 11, 12, 14, 13]), "strictly increasing"),
    (dict(positions=list(range(9))), "positions"),
    (dict(segments=[(0, 4), (5, 10)]), "segments"),
    (dict(segments=[(0, 4)]), "cover"),
    (dict(kept=[[[5, 6]], [[5], [6]]]), "heads"),
    (dict(kept=[[[5, 99], [5]], [[5], [6]]]), "not in the context"),
    (dict(kept=[[[6, 5], [5]], [[5], [6]]]), "strictly increasing"),
    (dict(tensors={}), "tensor list"),
    (dict(side={"nonsense": {}}), "unknown"),
    (dict(head_dim=0), "head_dim"),
    (dict(anchor=[1, -2]), "anchor"),
    (dict(anchor="<|im_start|>"), "anchor"),
])
def test_inconsistent_manifests_are_rejected(change, message):
    with pytest.raises(PackCorrupt, match=message):
        make_manifest(**change)


def test_anchor_is_written_only_when_set_and_absent_reads_as_alone():
    """Decision 9: a pack says how it was prefilled. One prefilled alone has the bytes it had
    before the field existed, so every older pack reads as prefilled alone."""
    anchored = make_manifest(anchor=[1, 2, 3])
    back = Manifest.from_json(anchored.to_json())
    assert back == anchored and back.anchor == [1, 2, 3] and back.version == FORMAT_VERSION
    alone = make_manifest()
    assert "anchor" not in alone.to_dict() and Manifest.from_json(alone.to_json()).anchor == []
    doc = anchored.to_dict()
    doc["anchor"] = {"ids": [1]}
    with pytest.raises(PackCorrupt, match="anchor"):
        Manifest.from_dict(doc)


def test_unknown_version_in_manifest():
    doc = make_manifest().to_dict()
    doc["format_version"] = 99
    with pytest.raises(PackVersionError, match="99"):
        Manifest.from_dict(doc)


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"\xff\xfe", b'{"format_version": 1}',
                                 b"1" * 5000, b"[" * 100000])
def test_garbage_json_is_pack_corrupt(raw):
    with pytest.raises(PackCorrupt):
        Manifest.from_json(raw)


def test_header_roundtrip_and_named_failures():
    manifest = make_manifest().to_json()
    data = assemble(manifest, b"payload", FORMAT_VERSION)
    version, m_len, p_len, _, _ = read_header(data)
    assert (version, p_len) == (FORMAT_VERSION, 7) and m_len < len(manifest)  # compressed
    assert read_manifest(data) == make_manifest()
    assert pack_id(data) == pack_id(bytes(data)) and len(pack_id(data)) == 64
    with pytest.raises(PackCorrupt, match="magic"):
        read_header(b"GARBAGE!" + data[8:])
    with pytest.raises(PackVersionError):
        read_header(data[:8] + (7).to_bytes(4, "little") + data[12:])
    flipped = bytearray(data)
    flipped[HEADER_SIZE + 3] ^= 1
    with pytest.raises(PackCorrupt, match="manifest checksum"):
        read_manifest(bytes(flipped))
    with pytest.raises(PackCorrupt, match="truncated"):
        read_manifest(data[:HEADER_SIZE + 10])


def test_bookkeeping_modules_do_not_import_torch():
    code = ("import sys, kvedge.common.pack.manifest, kvedge.common.pack.container, "
            "kvedge.common.pack.errors; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
