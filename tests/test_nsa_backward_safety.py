"""NSA backward: masked keys stay masked, a repeated block counts once, large logits.

Every check compares against the fp64 dense reference's autograd gradient. Kernel outputs
start NaN-filled (unwritten elements show). Shapes are tiny and odd (T not a multiple of
block_size, a partial last tile) so the interpreter runs each test in seconds.
"""

import math

import numpy as np
import pytest
import torch
from test_nsa_kernels import poisoned  # noqa: F401  (autouse: outputs start NaN)
from test_nsa_reference import odd_block_idx, qkv, rel_err, tuned

from kernels.nsa import (
    invert_block_idx,
    make_block_idx_random,
    selection_backward_triton,
    selection_forward_reference,
    selection_forward_triton,
)
from kernels.nsa.reference import visibility_mask

B, HQ, HKV, T, D, BS, S = 1, 4, 2, 37, 32, 16, 3  # G = 2: tiles of 32 tokens, NB = 3
TOL = {torch.float32: 1e-5, torch.float16: 1e-2}


def reference(q, k, v, idx, bs, do):
    """fp64 dense reference on (clean) inputs: o, lse and the autograd gradients of <o, do>."""
    x = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o, lse = selection_forward_reference(*x, idx, bs, return_lse=True)
    return o, lse, torch.autograd.grad(o, x, do.double())


def inputs(pattern, seed, dtype=torch.float32, device="cpu"):
    q, k, v = [x.to(device) for x in qkv(B, HQ, HKV, T, D, dtype=dtype, seed=seed)]
    do = qkv(B, HQ, HKV, T, D, dtype=dtype, seed=seed + 1)[0].to(device)
    if pattern == "random":
        idx = make_block_idx_random(B, HKV, T, BS, S, "cpu", seed=seed)
    else:
        idx = odd_block_idx(B, HKV, T, BS, S, seed=seed)
    return q, k, v, do, idx.to(device)


def masking_idx():
    """[1, 2, T, S] selections built around the poisoned keys of POISON_AT.

    kv head 0: tokens 0..14 keep block 0 (key 15 in their future), tokens 16..31 of the same
    tile keep block 1 only, so no row sees key 15; tokens 32, 33 keep blocks 2 and 1 (keys
    34, 36 in their future), 34 and 35 keep block 2 only (they see key 34), 36 keeps block 1
    (no row sees key 36, in the partial last block). kv head 1: tokens 0..4 keep block 0 (key
    5 in their future), 5..15 keep nothing, 16..31 block 1, except token 20, which keeps
    blocks 1 and 0 and so sees key 5: its NaN statistics must not reach keys 21..31 of block
    1, which it cannot see and tokens 21..31 do. Tokens 32..36 keep blocks 2 and 1, except
    33, which keeps block 0 only (a block in the tile's past that its other rows skip)."""
    h0 = [[0, -1, -1]] * 15 + [[-1, -1, -1]] + [[1, -1, -1]] * 16
    h0 += [[2, 1, -1]] * 2 + [[2, -1, -1]] * 2 + [[1, -1, -1]]
    h1 = [[0, -1, -1]] * 5 + [[-1, -1, -1]] * 11 + [[1, -1, -1]] * 16 + [[2, 1, -1]] * 5
    h1[20], h1[33] = [1, 0, -1], [0, -1, -1]
    return torch.tensor([h0, h1], dtype=torch.int32)[None].contiguous()


POISON_AT = {0: (15, 34, 36), 1: (5,)}  # kv head: poisoned key positions


def poison_masks(idx, bs, G):
    """(bad_rows [B, Hq, T], bad_keys [B, Hkv, T]) for the keys of POISON_AT: rows that see
    a poisoned key, and keys that are poisoned or seen by such a row. The gradient of
    everything else must equal the clean gradient."""
    mask = visibility_mask(idx, bs, idx.shape[2])  # [B, Hkv, T (query), T (key)]
    at = torch.zeros(idx.shape[1:3], dtype=torch.bool)
    for h, keys in POISON_AT.items():
        at[h, list(keys)] = True
    rows = (mask & at[None, :, None, :]).any(-1)
    keys = at[None] | (mask & rows[..., None]).any(-2)
    return rows.repeat_interleave(G, dim=1), keys


def poison(x, value):
    """x with `value` in one element of each poisoned key (POISON_AT)."""
    x = x.clone()
    for h, keys in POISON_AT.items():
        for n, p in enumerate(keys):
            x[:, h, p, (3 * n + 1) % x.shape[-1]] = value
    return x


def assert_clean_parts_match(got, ref, bad_rows, bad_keys, tol):
    dq, dk, dv = got
    rdq, rdk, rdv = ref
    for name, g, r, ok in (
        ("dq", dq, rdq, ~bad_rows),
        ("dk", dk, rdk, ~bad_keys),
        ("dv", dv, rdv, ~bad_keys),
    ):
        assert ok.sum() > 10, name  # the test compares something
        assert torch.isfinite(g[ok]).all(), name
        assert rel_err(g[ok], r[ok]) < tol, name


@pytest.mark.parametrize(
    "name,value",
    [("k", math.nan), ("k", math.inf), ("k", -math.inf), ("v", math.nan), ("v", math.inf)],
)
def test_masked_keys_do_not_reach_other_gradients(name, value):
    """NaN/inf at keys outside a row's selection, or in a selected block but in the row's
    future (`masking_idx`): dq of every row that cannot see one, and dk/dv of every key that
    no such row sees, equal the gradient on clean inputs. The rows that see a poisoned key
    get NaN o and lse (the worst statistics a forward can hand over)."""
    q, k, v, do, _ = inputs("odd", seed=3)
    idx = masking_idx()
    ro, rlse, rgrads = reference(q, k, v, idx, BS, do)
    bad_rows, bad_keys = poison_masks(idx, BS, HQ // HKV)
    assert bad_rows.any() and bad_rows.float().mean() < 0.1
    o, lse = ro.float(), rlse.float()
    o[bad_rows] = math.nan
    lse[bad_rows] = math.nan
    k, v = (poison(k, value), v) if name == "k" else (k, poison(v, value))
    got = selection_backward_triton(q, k, v, idx, BS, do, o, lse)
    assert_clean_parts_match(got, rgrads, bad_rows, bad_keys, 1e-5)


@pytest.mark.parametrize(
    "dtype,dq_rows", [(torch.float16, None), (torch.float32, 2)], ids=["fp16", "fp32-one-token"]
)
def test_masked_keys_fp16_and_one_token_tiles(dtype, dq_rows):
    """The same in fp16, and with dq tiles of one token (2 rows = G): there no key is seen
    by some rows of a tile only, and keys after the token are read as 0."""
    t = tuned(dq_rows=dq_rows)
    q, k, v, do, _ = inputs("odd", seed=4, dtype=dtype)
    idx = masking_idx()
    ro, rlse, rgrads = reference(q, k, v, idx, BS, do)
    bad_rows, bad_keys = poison_masks(idx, BS, HQ // HKV)
    o, lse = ro.to(dtype), rlse.float()
    o[bad_rows] = math.nan
    lse[bad_rows] = math.nan
    k, v = poison(k, math.nan), poison(v, -math.inf)
    got = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t)
    assert_clean_parts_match(got, rgrads, bad_rows, bad_keys, TOL[dtype])


def test_masked_keys_end_to_end_and_split_lists():
    """The same through the Triton forward's own o and lse, with every block's query list
    split into segments (the partial-sum path of dk/dv)."""
    t = tuned(segment_chunks=1, dkdv_rows=16)
    q, k, v, do, _ = inputs("odd", seed=5)
    idx = masking_idx()
    _, _, rgrads = reference(q, k, v, idx, BS, do)
    bad_rows, bad_keys = poison_masks(idx, BS, HQ // HKV)
    k, v = poison(k, math.nan), poison(v, math.inf)
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t)
    got = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t)
    assert_clean_parts_match(got, rgrads, bad_rows, bad_keys, 1e-5)


def with_repeats(idx):
    """Repeat a row's blocks in its other slots: kept blocks (every third row repeats its
    first slot in the last one), dropped and out-of-range ids too."""
    idx = idx.clone()
    idx[:, :, ::3, -1] = idx[:, :, ::3, 0]
    idx[:, :, 1::3, 1] = idx[:, :, 1::3, 0]
    idx[:, :, 7] = torch.tensor([-1, -1, 1], dtype=idx.dtype)
    idx[:, :, 30] = torch.tensor([1, 1, 1], dtype=idx.dtype)
    idx[:, :, 31] = torch.tensor([9, 9, 0], dtype=idx.dtype)
    return idx


def test_invert_block_idx_lists_a_repeated_block_once():
    idx = with_repeats(make_block_idx_random(B, HKV, T, BS, S, "cpu", seed=2))
    row_ptr, col = invert_block_idx(idx, BS)
    for h in range(HKV):
        for j in range(3):
            got = col[h, row_ptr[h, j] : row_ptr[h, j + 1]].tolist()
            assert got == [t for t in range(T) if j * BS <= t and j in idx[0, h, t].tolist()]


def test_invert_block_idx_not_unique_keeps_a_repeat_beside_its_first_copy():
    """unique=False (the backward's call): each (token, block) pair appears as many times as
    the token's slots name the block, the copies side by side, tokens ascending."""
    idx = with_repeats(make_block_idx_random(B, HKV, T, BS, S, "cpu", seed=2))
    row_ptr, col = invert_block_idx(idx, BS, unique=False)
    repeats = 0
    for h in range(HKV):
        for j in range(3):
            got = col[h, row_ptr[h, j] : row_ptr[h, j + 1]].tolist()
            want = [
                t for t in range(T) if j * BS <= t for _ in range(idx[0, h, t].tolist().count(j))
            ]
            assert got == want
            repeats += len(want) - len(set(want))
    assert repeats > 0  # the inputs hold repeats of blocks 0..2


@pytest.mark.parametrize("pattern,schedule", [("random", "blocks"), ("odd", "tile")])
def test_repeated_block_counted_once(pattern, schedule):
    """dq, dk, dv with repeats in block_idx equal the gradient of the dense reference, which
    counts a repeated block once: from the reference's o and lse, and end to end through
    either forward path (which count it once too)."""
    t = tuned(schedule=schedule)
    q, k, v, do, idx = inputs(pattern, seed=7)
    idx = with_repeats(idx)
    ro, rlse, rgrads = reference(q, k, v, idx, BS, do)
    from_ref = selection_backward_triton(q, k, v, idx, BS, do, ro.float(), rlse.float())
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t)
    end_to_end = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t)
    for got in (from_ref, end_to_end):
        for g, r in zip(got, rgrads, strict=True):
            assert torch.isfinite(g).all() and rel_err(g, r) < 1e-5


@pytest.fixture
def ordered_dots(monkeypatch):
    """The interpreter's fp32 dot accumulates over k in a fixed order, as the GPU's IEEE fp32
    dot does (one FMA chain per output), instead of through numpy's BLAS, whose fp32 result
    for a row depends on the matrix's shape. The backward recomputes the forward's scores in
    kernels of other tile shapes; on the GPU they are bitwise the same, and only with the
    same scores can any recomputing backward meet fp32 accuracy at large logits."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    blas_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.astype(np.float32)
        for i in range(a.data.shape[-1]):
            acc = acc + a.data[..., :, i : i + 1] * b.data[..., i : i + 1, :]
        return interpreter.TensorHandle(acc.astype(d.data.dtype), d.dtype.scalar)

    monkeypatch.setattr(builder, "create_dot", create_dot)


@pytest.mark.parametrize("seed", [3, 11])
def test_large_logits_fp32(seed, ordered_dots):
    """q and k scaled by 10 (logits of ~100). A probability exp(s - lse) recomputed from an
    fp32 lse near 100 is off by lse's rounding (~1e-5 relative), shared by a whole row; the
    backward renormalises each row, so dv meets the fp32 bound against the fp64 gradient,
    given the forward's lse or the correctly rounded one. dq and dk at such logits carry
    fp32's own error (the fp32 torch reference's is as large, above 1e-5 for some seeds), so
    they are held to that reference's error; they also need an o consistent with the scores
    the kernels recompute (delta = o . do), as the Triton forward's o is."""
    tile = tuned(schedule="tile")
    q, k, v, do, idx = inputs("random", seed=seed)
    q, k = q * 10, k * 10
    ro, rlse, rgrads = reference(q, k, v, idx, BS, do)
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    fp32_ref = torch.autograd.grad(selection_forward_reference(*x, idx, BS), x, do)
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=tile)
    dq, dk, dv = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=tile)
    assert rel_err(dv, rgrads[2]) < 1e-5
    for g, r, r32 in zip((dq, dk), rgrads[:2], fp32_ref[:2], strict=True):
        assert rel_err(g, r) < max(1e-5, 1.25 * rel_err(r32, r))
    dv = selection_backward_triton(q, k, v, idx, BS, do, ro.float(), rlse.float(), tuning=tile)[2]
    assert rel_err(dv, rgrads[2]) < 1e-5


# --- GPU checks (bf16 is wrong under the interpreter) -------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masked_keys_gpu(dtype):
    """On the GPU, in bf16/fp16: the NaN/inf masking of both kernels (compiled code paths),
    given NaN statistics for the rows that see a poisoned key, and end to end."""
    q, k, v, do, _ = inputs("odd", seed=3, dtype=dtype, device="cuda")
    idx = masking_idx().cuda()
    x = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ro, rlse = selection_forward_reference(*x, idx, BS, return_lse=True)
    rgrads = torch.autograd.grad(ro, x, do.float())
    bad_rows, bad_keys = [m.cuda() for m in poison_masks(idx.cpu(), BS, HQ // HKV)]
    for name, value in (("k", math.nan), ("v", math.inf)):
        o, lse = ro.detach().to(dtype), rlse.detach().clone()
        o[bad_rows] = math.nan
        lse[bad_rows] = math.nan
        kk, vv = (poison(k, value), v) if name == "k" else (k, poison(v, value))
        got = selection_backward_triton(q, kk, vv, idx, BS, do, o, lse)
        assert_clean_parts_match(got, rgrads, bad_rows, bad_keys, 1e-2)
    # End to end through the forward's own o and lse, both poisons at once.
    kk, vv = poison(k, math.nan), poison(v, math.inf)
    o, lse = selection_forward_triton(q, kk, vv, idx, BS, return_lse=True)
    got = selection_backward_triton(q, kk, vv, idx, BS, do, o, lse)
    assert_clean_parts_match(got, rgrads, bad_rows, bad_keys, 1e-2)


@pytest.mark.gpu
def test_large_logits_fp32_gpu():
    """fp32 (IEEE dots) at logits of ~100, a moderate shape, the compiled kernels as they are."""
    Bg, Hq, Hkv, Tg, Dg, bs, Sg = 1, 8, 2, 700, 64, 32, 6
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [
        torch.randn(Bg, H, Tg, Dg, generator=g, device="cuda") for H in (Hq, Hkv, Hkv, Hq)
    ]
    q, k = q * 10, k * 10
    idx = make_block_idx_random(Bg, Hkv, Tg, bs, Sg, "cuda")
    x = [t.double().requires_grad_() for t in (q, k, v)]
    rgrads = torch.autograd.grad(selection_forward_reference(*x, idx, bs), x, do.double())
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    fp32_ref = torch.autograd.grad(selection_forward_reference(*x, idx, bs), x, do)
    o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True)
    dq, dk, dv = selection_backward_triton(q, k, v, idx, bs, do, o, lse)
    assert rel_err(dv, rgrads[2]) < 1e-5
    for got, r, r32 in zip((dq, dk), rgrads[:2], fp32_ref[:2], strict=True):
        assert rel_err(got, r) < max(1e-5, 1.25 * rel_err(r32, r))
