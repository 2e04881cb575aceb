"""kvtc: round-trip error per budget, the calibrated transform's store and its named errors,
packs through encode_pack/open_pack and the realignment path, option checks."""
import pytest
import torch

from kvedge.common.pack.codecs import Role, codec_for_model, get_codec
from kvedge.common.pack.codecs.kvtc import (Kvtc, TransformStore, allocate, default_store,
                                            fit_head, fit_transform)
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.errors import (InvalidCodecOption, PackCorrupt, TransformMismatch,
                                       TransformMissing)
from kvedge.common.pack.format import encode_pack, open_pack

L, H, D = 2, 2, 16


def correlated(n: int, dim: int = D, rank: int = 4, seed: int = 0) -> torch.Tensor:
    """Rows near a low-rank subspace with an offset: what PCA is for."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(rank, dim, generator=g) * 3
    return torch.randn(n, rank, generator=g) @ mix + 0.1 * torch.randn(n, dim, generator=g) + 2


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def heads(n: int, seed: int) -> list[torch.Tensor]:
    """Per layer (H, n, D): each head its own correlation (same seeds, same distribution)."""
    return [torch.stack([correlated(n, seed=100 * layer + h) for h in range(H)])
            for layer in range(L)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "home"))
    return default_store()


@pytest.fixture
def transform(store):
    keys, values = heads(300, 0), [2 * k for k in heads(300, 0)]
    t = fit_transform(keys, values, model="test")
    store.save(t)
    return t


def context(n: int = 40) -> KVContext:
    g = torch.Generator().manual_seed(5)
    keys = [k[:, torch.randperm(300, generator=g)[:n]] for k in heads(300, 0)]
    values = [2 * k for k in keys]
    return KVContext.from_dense(keys, values, list(range(n)), model_fingerprint="ab",
                                tokenizer_id="cd", summaries=False)


def test_self_fitted_error_falls_with_the_budget():
    x = correlated(300)
    errors = [rel(Kvtc(bits=b).decode(*Kvtc(bits=b).encode(x, Role("key"))), x)
              for b in (0.25, 1, 3)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.02 and errors[0] < 0.7


def test_allocation_spends_the_budget_and_drops_the_flat_components():
    x = correlated(500)  # rank 4 + small noise: the noise components get nothing at low bits
    _, _, error, rate, _ = fit_head(x)
    choice = allocate(error, rate, bits=0.5)
    kept = choice.nonzero().flatten().tolist()
    assert kept and max(kept) < 8  # only the strong components, which sort first
    spent = rate.gather(-1, choice[:, None]).sum()
    assert 0.9 * 0.5 * D < spent <= 0.5 * D
    assert (allocate(error, rate, bits=4) > 0).sum() > len(kept)


def test_calibrated_transform_round_trips_within_bounds(transform):
    x = correlated(80, seed=1)  # layer 0 head 1's distribution
    for bits, bound in ((1, 0.1), (3, 0.02)):
        codec = Kvtc(bits=bits, transform=transform.digest)
        parts, params = codec.encode(x, Role("key", 0, L, head=1))
        assert params["slot"] == transform.slot("key", 0, 1)
        assert rel(get_codec("kvtc").decode(parts, params), x) < bound
        lean_parts, lean_params = Kvtc(bits=bits, transform=transform.digest,
                                       embed=False).encode(x, Role("key", 0, L, head=1))
        assert "basis" not in lean_parts and sum(p.numel() * p.element_size() for p in
                                                 lean_parts.values()) < \
            sum(p.numel() * p.element_size() for p in parts.values())
        assert rel(get_codec("kvtc").decode(lean_parts, lean_params), x) < bound


def test_pack_round_trip_dense_and_ragged(transform):
    from kvedge.common.pack.realign import realign_pack
    from kvedge.kernels.rope import apply_rope_at

    ctx = context()
    ragged = ctx.select([[p[torch.arange(0, p.numel(), 1 + h)] for h, p in enumerate(layer)]
                         for layer in ctx.kept_positions])
    for c in (ctx, ragged):
        pack = open_pack(encode_pack(c, Kvtc(bits=3, transform=transform.digest)))
        back = pack.context()
        for layer in range(L):
            for h in range(H):
                assert rel(back.keys[layer][h], c.keys[layer][h]) < 0.03
                assert rel(back.values[layer][h], c.values[layer][h]) < 0.03
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    realigned = realign_pack(pack, inv_freq)
    for layer in range(L):
        for h in range(H):
            pos = ragged.kept_positions[layer][h]  # realignment reads pieces: kvtc's are dense
            want = apply_rope_at(back.keys[layer][h].float(), pos, inv_freq)
            assert torch.allclose(realigned.keys[layer][h], want, atol=1e-4)


def test_missing_transform_is_named(transform, tmp_path, monkeypatch):
    data = encode_pack(context(), Kvtc(transform=transform.digest, embed=False))
    assert open_pack(data).context().n_tokens == 40
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "elsewhere"))  # an edge without the file
    with pytest.raises(TransformMissing, match="not in"):
        open_pack(data).context()
    # an embedded pack needs no file
    assert open_pack(encode_pack(context(), Kvtc(bits=1))).context().n_tokens == 40


def test_corrupted_transform_is_named(transform, store, tmp_path):
    path = store.path(transform.digest)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(TransformMismatch, match="do not hash"):
        TransformStore(store.root).load(transform.digest)  # a fresh process reads the file
    with pytest.raises(TransformMismatch, match="not a kvtc transform"):
        from kvedge.common.pack.codecs.kvtc import Transform
        Transform.from_bytes(b"garbage!" * 4, transform.digest)


def test_transform_for_another_model_shape_is_refused(transform):
    with pytest.raises(TransformMismatch, match="fits"):
        Kvtc(transform=transform.digest).encode(torch.randn(5, D), Role("key", 0, L + 1))


def test_embedded_slice_is_checksummed(transform):
    data = bytearray(encode_pack(context(), Kvtc(transform=transform.digest)))
    basis = bytes(open_pack(bytes(data)).container.parts["k.0.0/basis"].data)
    data[bytes(data).index(basis)] ^= 0xFF
    with pytest.raises(PackCorrupt, match="k.0.0"):
        open_pack(bytes(data)).tensor("k.0.0")


def test_codec_for_model_calibrates_once(tmp_path, monkeypatch):
    from kvedge.common.model.models import load_model
    from kvedge.common.pack.codecs.kvtc import fit
    from kvedge.common.model.runtime import Runtime

    monkeypatch.setattr(fit, "CALIBRATION_TEXT", fit.CALIBRATION_TEXT[:600])  # test speed
    rt = Runtime(load_model("tiny-llama"))
    store = TransformStore(tmp_path)
    codec = codec_for_model("kvtc:bits=1.5", rt, store)
    assert isinstance(codec, Kvtc) and codec.bits == 1.5 and len(codec.transform) == 64
    assert store.path(codec.transform).exists()
    assert store.for_model(rt.loaded.fingerprint) == codec.transform
    again = codec_for_model("kvtc+zstd", rt, store)
    assert again.inner.transform == codec.transform  # loaded, not fitted again
    given = get_codec("kvtc+zstd")
    assert codec_for_model(given, rt, store).inner.transform == codec.transform
    assert given.inner.transform == ""  # a bound copy: the caller's codec is left as it was
    assert codec_for_model("int4+zstd", rt, store) == "int4+zstd"  # not built: needs no model


def test_options_are_checked():
    assert get_codec("kvtc:bits=1.5,embed=false").bits == 1.5
    assert get_codec("kvtc:bits=1.5").embed is True
    assert get_codec("kvtc+zstd:allocate=head").inner.allocate == "head"
    for bad in ("kvtc:bits=0", "kvtc:bits=x", "kvtc:allocate=layer", "kvtc:transform=abc",
                "kvtc:sinks=-1", "kvtc:colour=red"):
        with pytest.raises(InvalidCodecOption):
            get_codec(bad)


def test_a_worker_encodes_kvtc_with_the_models_transform(tmp_path, monkeypatch):
    """What `kvctl upload --codec kvtc` runs: the worker binds the model's transform
    (calibrated on first use), the pack decodes from its bytes alone (embedded)."""
    from kvedge.cloud.ingest import TextSegment
    from kvedge.cloud.workers import PrefillEngine
    from kvedge.common.pack.codecs.kvtc import fit
    from kvedge.common.pack.format import read_pack

    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))
    monkeypatch.setattr(fit, "CALIBRATION_TEXT", fit.CALIBRATION_TEXT[:600])  # test speed
    engine = PrefillEngine("tiny-llama")
    ids = engine.loaded.tokenizer("The lighthouse keeper counted 42 boats.")["input_ids"] * 6
    encoded = engine.encode(TextSegment(0, "a.txt", "", ids), "default", "kvtc:bits=2")
    pack = open_pack(encoded.data)
    entry = pack.manifest.tensors["k.1.1"]
    assert entry.codec == "kvtc" and entry.params["transform"] == \
        default_store().for_model(engine.loaded.fingerprint)
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "edge"))  # the edge has no transform file
    ctx = read_pack(encoded.data, engine.loaded.fingerprint)
    assert ctx.n_tokens == len(ids) and ctx.keys[1][1].shape == (len(ids), 16)
