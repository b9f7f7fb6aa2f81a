"""NSA selection: the pure-PyTorch references and the block-index helpers (no Triton)."""

import pytest
import torch

from kernels.nsa import (
    make_block_idx_random,
    make_block_idx_recent,
    selection_forward_gather_reference,
    selection_forward_reference,
    validate_block_idx,
)
from kernels.nsa.reference import visibility_mask
from kernels.nsa.tuning import DEFAULT, with_fields

NAN, INF = float("nan"), float("inf")


def tuned(**fields):
    """DEFAULT with the named fields replaced (`tuning.with_fields`)."""
    return with_fields(DEFAULT, **fields)


def test_tuned_replaces_fields_by_group():
    t = tuned(tile_rows=16, chunk_rows=8, dq_rows=4)
    assert (t.forward.tile_rows, t.block_major.chunk_rows, t.backward.dq_rows) == (16, 8, 4)
    assert t.forward.num_warps == DEFAULT.forward.num_warps and DEFAULT.forward.tile_rows == 64
    with pytest.raises(ValueError, match="no_such"):
        tuned(no_such=1)
    with pytest.raises(ValueError, match="schedule"):
        tuned(schedule="nope")
    with pytest.raises(ValueError, match="overlap_tile_kernel"):
        tuned(overlap_tile_kernel="yes")


def rel_err(got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def qkv(B, Hq, Hkv, T, D, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype) for H in (Hq, Hkv, Hkv)]


def brute_force_o(q, k, v, block_idx, block_size, scale):
    """Per-query loop straight from the spec's definition (fp64), for tiny shapes."""
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    NB = -(-T // block_size)
    o = torch.zeros_like(q)
    for b in range(B):
        for hq in range(Hq):
            for t in range(T):
                keys = set()
                for j in block_idx[b, hq // G, t].tolist():
                    if 0 <= j < NB and j * block_size <= t:
                        keys |= {p for p in range(j * block_size, (j + 1) * block_size) if p <= t}
                if keys:
                    p = torch.tensor(sorted(keys))
                    w = torch.softmax(scale * k[b, hq // G, p] @ q[b, hq, t], dim=0)
                    o[b, hq, t] = w @ v[b, hq // G, p]
    return o


def odd_block_idx(B, Hkv, T, block_size, S, seed=0):
    """Random entries in [-2, NB + 1]: -1/-2, out of range, future and causal blocks; valid
    entries made distinct per row (later duplicates replaced by -1)."""
    NB = -(-T // block_size)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-2, NB + 2, (B, Hkv, T, S), generator=g)
    sorted_idx, _ = idx.sort(dim=-1)
    dup = torch.zeros_like(sorted_idx, dtype=torch.bool)
    dup[..., 1:] = sorted_idx[..., 1:] == sorted_idx[..., :-1]
    idx = torch.where(dup, torch.full_like(sorted_idx, -1), sorted_idx)
    idx[:, :, 3] = -1  # one row with no slot at all
    idx[:, :, T - 1] = NB + 5  # last row: only an out-of-range slot
    return idx.to(torch.int32)


def at(x, positions, value):
    """A copy of x ([B, H, T, D]) with every element of the key rows `positions` = value."""
    x = x.clone()
    x[:, :, positions] = value
    return x


def seen(idx, bs, T, positions, G):
    """[B, Hq, T] bool: the rows that see at least one key of `positions`."""
    mask = visibility_mask(idx, bs, T)[..., positions].any(-1)
    return mask.repeat_interleave(G, dim=1)


def with_repeats(idx, seed):
    """idx with repeats within rows: in about half the rows the last slot copies slot 0,
    in a quarter slot 1 does too (a block named three times)."""
    g = torch.Generator().manual_seed(seed)
    out = idx.clone()
    r = torch.rand(idx.shape[:3], generator=g)
    out[..., -1] = torch.where(r < 0.5, out[..., 0], out[..., -1])
    out[..., 1] = torch.where(r < 0.25, out[..., 0], out[..., 1])
    return out


def test_dense_reference_matches_definition():
    q, k, v = qkv(1, 4, 2, 23, 8)
    idx = odd_block_idx(1, 2, 23, 4, 3)
    ref = selection_forward_reference(q, k, v, idx, 4, scale=0.3)
    assert rel_err(ref, brute_force_o(q, k, v, idx, 4, 0.3)) < 1e-12


@pytest.mark.parametrize(
    "B,Hq,Hkv,T,bs,S,pattern",
    [(2, 4, 4, 37, 16, 3, "odd"), (1, 6, 2, 100, 16, 5, "random"), (1, 8, 1, 64, 16, 4, "recent")],
)
def test_gather_reference_matches_dense(B, Hq, Hkv, T, bs, S, pattern):
    q, k, v = qkv(B, Hq, Hkv, T, 16, seed=1)
    if pattern == "odd":
        idx = odd_block_idx(B, Hkv, T, bs, S)
    elif pattern == "random":
        idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=3)
    else:
        idx = make_block_idx_recent(B, Hkv, T, bs, S, "cpu")
    o, lse = selection_forward_reference(q, k, v, idx, bs, return_lse=True)
    og, lseg = selection_forward_gather_reference(q, k, v, idx, bs, return_lse=True, chunk=17)
    assert rel_err(og, o) < 1e-12
    assert torch.equal(torch.isinf(lse), torch.isinf(lseg))
    fin = torch.isfinite(lse)
    assert torch.allclose(lse[fin], lseg[fin], rtol=0, atol=1e-12)


@pytest.mark.parametrize("ref", [selection_forward_reference, selection_forward_gather_reference])
def test_reference_empty_rows_zero_and_no_nan(ref):
    q, k, v = [x.requires_grad_() for x in qkv(1, 4, 2, 40, 16, dtype=torch.float32)]
    idx = make_block_idx_recent(1, 2, 40, 16, 2, "cpu")  # t < 15 sees nothing
    o, lse = ref(q, k, v, idx, 16, return_lse=True)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert torch.all(o[:, :, :15] == 0) and torch.all(o[:, :, 15:].abs().sum(-1) > 0)
    assert torch.all(lse[:, :, :15] == float("-inf")) and torch.isfinite(lse[:, :, 15:]).all()
    o.square().sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.all(q.grad[:, :, :15] == 0)


def test_reference_returns_input_dtype():
    q, k, v = qkv(1, 2, 1, 20, 16, dtype=torch.float16)
    idx = make_block_idx_recent(1, 1, 20, 16, 2, "cpu")
    assert selection_forward_reference(q, k, v, idx, 16).dtype == torch.float16


def test_recent_pattern():
    bs, S, T = 16, 3, 70
    idx = make_block_idx_recent(2, 3, T, bs, S, "cpu")
    assert idx.shape == (2, 3, T, S) and idx.dtype == torch.int32 and idx.is_contiguous()
    assert torch.all(idx[:, :, : bs - 1] == -1)
    assert idx[0, 0, bs - 1].tolist() == [0, -1, -1]
    assert idx[1, 2, 4 * bs - 1].tolist() == [3, 2, 1]
    assert idx[0, 1, 4 * bs - 2].tolist() == [2, 1, 0]
    validate_block_idx(idx, bs)


@pytest.mark.parametrize("S", [1, 2, 3, 6])
def test_random_pattern(S):
    B, Hkv, T, bs = 2, 2, 150, 16
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=5)
    assert idx.shape == (B, Hkv, T, S) and idx.dtype == torch.int32
    validate_block_idx(idx, bs, shape=(B, Hkv, T, S))
    own = torch.arange(T) // bs
    assert torch.all(idx >= -1) and torch.all(idx <= own[:, None])
    n_valid = (idx >= 0).sum(-1)
    assert torch.equal(n_valid, torch.minimum(own + 1, torch.tensor(S)).expand_as(n_valid))
    forced = [torch.zeros_like(own), own, own - 1][:S]
    for f in forced:
        has = (idx == f[:, None]).any(-1) | (f < 0)
        assert has.all()
    assert torch.equal(idx, make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=5))
    if S > 3:
        assert not torch.equal(idx, make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=6))
        assert not torch.equal(idx[0, 0], idx[0, 1]) and not torch.equal(idx[0, 0], idx[1, 0])


def test_random_pattern_is_uniform_enough():
    # Query t = 159 (own block 9): the 3 random slots come from blocks 1..7 uniformly.
    idx = make_block_idx_random(1, 4000, 160, 16, 6, "cpu", seed=0)[0, :, -1, 3:]
    counts = torch.bincount(idx.flatten().long(), minlength=10).double()
    assert counts[[0, 8, 9]].sum() == 0
    assert (counts[1:8] / counts[1:8].mean() - 1).abs().max() < 0.1


def test_validate_block_idx_errors():
    idx = make_block_idx_recent(1, 2, 40, 16, 3, "cpu")
    validate_block_idx(idx.long(), 16)
    bad = idx.clone()
    bad[0, 1, 35, 2] = bad[0, 1, 35, 0]
    with pytest.raises(ValueError, match="repeated"):
        validate_block_idx(bad, 16)
    with pytest.raises(ValueError, match="block_idx"):
        validate_block_idx(idx.float(), 16)
    with pytest.raises(ValueError, match="block_idx"):
        validate_block_idx(idx[0], 16)
    with pytest.raises(ValueError, match="block_idx"):
        validate_block_idx(idx, 16, shape=(1, 2, 40, 4))
    # Repeated dropped entries (-1, future or out-of-range blocks) are allowed.
    ok = idx.clone()
    ok[0, 0, 5] = torch.tensor([2, 2, 9])
    validate_block_idx(ok, 16)


REFS = [selection_forward_reference, selection_forward_gather_reference]


def test_repeated_block_counts_once_in_both_references():
    """A block named by several slots of a row counts once: both references equal the
    per-query definition (a set of keys) on rows with repeats."""
    B, Hq, Hkv, T, bs, S = 1, 4, 2, 41, 8, 4
    q, k, v = qkv(B, Hq, Hkv, T, 8, seed=7)
    idx = with_repeats(odd_block_idx(B, Hkv, T, bs, S, seed=8), seed=9)
    t = torch.arange(T)
    kept0 = (idx[..., 0] >= 0) & (idx[..., 0] * bs <= t)
    assert (kept0 & (idx[..., -1] == idx[..., 0]) & (idx[..., 1] == idx[..., 0])).any()
    want = brute_force_o(q, k, v, idx, bs, 0.4)
    for ref in REFS:
        assert rel_err(ref(q, k, v, idx, bs, scale=0.4), want) < 1e-12


@pytest.mark.parametrize("ref", REFS, ids=["dense", "gather"])
@pytest.mark.parametrize("pattern", ["random", "odd"])
def test_references_ignore_masked_nonfinite(ref, pattern):
    """NaN or inf in k or v where a row cannot see it (blocks it did not select, keys after
    it in a selected block, the last key) leaves the row as on clean inputs; a row that sees
    a NaN is NaN, one that sees an inf value is not finite."""
    B, Hq, Hkv, T, bs, S = 1, 4, 2, 45, 8, 4
    q, k, v = qkv(B, Hq, Hkv, T, 8, seed=10)
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=4)
    if pattern == "odd":
        idx = odd_block_idx(B, Hkv, T, bs, S, seed=5)
    p1, p2 = [T - 1, 13, 30], [T - 3, 21]
    s1, s2 = seen(idx, bs, T, p1, 2), seen(idx, bs, T, p2, 2)
    clean = ~(s1 | s2)
    assert s1.any() and s2.any() and clean.any()
    o0, lse0 = ref(q, k, v, idx, bs, return_lse=True)
    for kx, vx, nan_rows, inf_rows in (
        (at(k, p1, NAN), at(v, p2, INF), s1, s2),
        (at(k, p2, INF), at(v, p1, -INF), None, s1),
        (k, at(at(v, p1, NAN), p2, INF), s1, s2),
    ):
        o, lse = ref(q, kx, vx, idx, bs, return_lse=True)
        assert torch.isfinite(o[clean]).all()
        assert rel_err(o[clean], o0[clean]) < 1e-12
        assert torch.equal(lse[clean], lse0[clean])
        if nan_rows is not None:
            assert torch.isnan(o[nan_rows]).all()
        assert not torch.isfinite(o[inf_rows]).any()


@pytest.mark.parametrize("ref", REFS, ids=["dense", "gather"])
def test_reference_grads_ignore_unseen_nonfinite(ref):
    """NaN and inf at keys no row sees (past every row's selection): o and every autograd
    gradient equal those on clean inputs, the poisoned keys' dk and dv are 0."""
    B, Hq, Hkv, T, bs, S = 1, 4, 2, 45, 8, 3
    q, k, v = qkv(B, Hq, Hkv, T, 8, seed=11)
    do = qkv(B, Hq, Hkv, T, 8, seed=12)[0]
    idx = odd_block_idx(B, Hkv, T, bs, S, seed=6)
    unseen = (~visibility_mask(idx, bs, T).any(-2)).all(0).all(0).nonzero().flatten()
    assert len(unseen) >= 2 and unseen.max() == T - 1
    pos = unseen.tolist()
    grads = []
    for kx, vx in ((k, v), (at(k, pos[::2], NAN), at(at(v, pos[1::2], INF), pos[::2], NAN))):
        x = [t.clone().requires_grad_() for t in (q, kx, vx)]
        o = ref(*x, idx, bs)
        grads.append((o, *torch.autograd.grad(o, x, do)))
    for got, want in zip(grads[1], grads[0], strict=True):
        assert torch.isfinite(got).all() and torch.equal(got, want)
    assert torch.all(grads[1][2][:, :, pos] == 0) and torch.all(grads[1][3][:, :, pos] == 0)
