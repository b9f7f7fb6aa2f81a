"""NSA selection forward: masked keys take no part, and a repeated block counts once.

Every forward path (the token-tile kernel with one token or many per tile; the block-major
path; the 'auto' schedule mixing both) gets k and v with NaN or inf at a few key positions:
keys of blocks that some rows did not select, keys inside a selected block but after some
rows' tokens (the causal diagonal), and the last key (the tail of the last block lies past
T). Rows that see none of them must equal the fp64 dense
reference computed on the clean inputs; rows that see a NaN must be NaN. Outputs start
NaN-filled (`poisoned`), so an unwritten row cannot pass as a masked one.

Runs under the Triton interpreter on the CPU at tiny odd shapes (T not a multiple of the
block), fp32; `test_bf16_on_gpu` repeats the check in bf16 at a larger shape.
"""

import pytest
import torch
from test_nsa_forward_blocks import (
    check_forward,
    schedule,
    tile_counts,
)
from test_nsa_kernels import (
    make_idx,
    poisoned,  # noqa: F401  (autouse: outputs and partials start NaN)
    reference,
)
from test_nsa_reference import at, qkv, rel_err, seen, with_repeats

from kernels.nsa import (
    forward,
    make_block_idx_random,
    make_block_idx_recent,
    selection_forward_reference,
)
from kernels.nsa import selection_forward_triton as fwd

NAN, INF = float("nan"), float("inf")

# B, Hq, Hkv, T, D, bs, S, pattern, P1, P2: two sets of poisoned key positions.
CASES = {
    # G = 4; 'random' with S = 4: blocks 0, own, own - 1 forced, one drawn from the rest,
    # so keys 20 (block 1) and 39 (block 2) are seen by some tiles' rows and not others;
    # 74 and 76 lie in the last block (keys 77..79 past T), after most of its tokens.
    "G4-random": (1, 4, 1, 77, 32, 16, 4, "random", [76, 20], [74, 39]),
    # G = 1: a 64-token tile holds every token (three diagonal blocks); random rows.
    "G1-odd": (1, 2, 2, 37, 32, 16, 3, "odd", [36, 20], [34, 9]),
    # G = 16 with 16-row tiles: one token per tile (nothing but the load mask on the
    # tile path), and the block-major path at a group of 16.
    "G16-odd": (1, 16, 1, 40, 32, 16, 3, "odd", [39, 18], [37, 5]),
}

# (schedule, tile_rows): "auto" sets a threshold that sends tiles both ways, and cuts the
# fix-up kernel's flag reads into many short programs.
PATHS = {
    "tile": ("tile", 64),
    "tile-1tok": ("tile", 16),
    "blocks": ("blocks", 64),
    "auto": ("auto", 16),
}
RUNS = [
    ("G4-random", "tile"),
    ("G4-random", "blocks"),
    ("G4-random", "auto"),
    ("G1-odd", "tile"),
    ("G1-odd", "blocks"),
    ("G1-odd", "auto"),
    ("G16-odd", "tile-1tok"),
    ("G16-odd", "blocks"),
]


def use_path(name, idx, bs, S, G):
    """The tuning of one forward path (see PATHS); for "auto", check that both paths get
    tiles."""
    sched, rows = PATHS[name]
    if sched != "auto":
        return schedule(sched, tile_rows=rows)
    counts = tile_counts(idx, bs, G, rows=rows)
    thr = (counts.min().item() + counts.max().item()) // 2
    # fix-up programs of 8 tiles, one short
    t = schedule("auto", ratio=(thr + 0.5) / S, tile_rows=rows, fix_tiles=8)
    assert forward.block_path_min_blocks(S, G, tuning=t) == thr
    assert (counts > thr).any() and (counts <= thr).any()
    return t


def check_rows(o, lse, ro, rlse, clean, nan_rows=None, nonfinite_rows=None):
    """Rows in `clean` equal the clean reference (o by relative error over those rows,
    lse to 1e-4) and are finite; rows in nan_rows are NaN, in nonfinite_rows not finite."""
    assert clean.any() and (~clean).any()
    assert torch.isfinite(o[clean]).all() and not torch.isnan(lse[clean]).any()
    assert rel_err(o[clean], ro[clean]) < 1e-5
    empty = torch.isinf(rlse) & clean
    assert torch.equal(torch.isinf(lse) & clean, empty) and torch.all(o[empty] == 0)
    full = clean & ~empty
    assert torch.allclose(lse[full].double(), rlse[full], rtol=0, atol=1e-4)
    if nan_rows is not None:
        assert nan_rows.any() and torch.isnan(o[nan_rows]).all()
    if nonfinite_rows is not None:
        assert nonfinite_rows.any() and not torch.isfinite(o[nonfinite_rows]).any()


@pytest.mark.parametrize("case,path", RUNS, ids=[f"{c}-{p}" for c, p in RUNS])
def test_masked_keys_take_no_part(case, path):
    """NaN k with inf v, then -inf k with NaN v, at two disjoint sets of key positions."""
    B, Hq, Hkv, T, D, bs, S, pattern, p1, p2 = CASES[case]
    G = Hq // Hkv
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 50)
    idx = make_idx(pattern, B, Hkv, T, bs, S)
    t = use_path(path, idx, bs, S, G)
    ro, rlse = reference(q, k, v, idx, bs, torch.zeros_like(q))[:2]
    s1, s2 = seen(idx, bs, T, p1, G), seen(idx, bs, T, p2, G)
    # Both sets hide keys from rows of tiles that visit their block: the rows before them
    # in their own block, and rows of other tiles whose tokens chose it.
    assert (s1 | s2).any() and not (s1 | s2).all()

    o, lse = fwd(q, at(k, p1, NAN), at(v, p2, INF), idx, bs, return_lse=True, tuning=t)
    check_rows(o, lse, ro, rlse, ~(s1 | s2), nan_rows=s1, nonfinite_rows=s2)
    # A visible -inf key is unspecified (its score may be -inf or +inf): s2 rows are left.
    o, lse = fwd(q, at(k, p2, -INF), at(v, p1, NAN), idx, bs, return_lse=True, tuning=t)
    check_rows(o, lse, ro, rlse, ~(s1 | s2), nan_rows=s1)


def test_nan_at_the_last_token_reaches_only_its_row():
    """Every token selects its own block and the one before: a NaN value at the last
    token is seen by the last row only, on each path."""
    B, Hq, Hkv, T, D, bs, S = 1, 4, 1, 45, 32, 16, 2
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=55)
    own = torch.arange(T, dtype=torch.int32) // bs
    idx = torch.stack([own, own - 1], dim=-1).expand(B, Hkv, T, S).contiguous()
    ro = reference(q, k, v, idx, bs, torch.zeros_like(q))[0]
    for path in ("tile", "blocks"):
        t = use_path(path, idx, bs, S, Hq)
        o = fwd(q, k, at(v, [T - 1], NAN), idx, bs, tuning=t)
        assert torch.isnan(o[:, :, T - 1]).all()
        assert torch.isfinite(o[:, :, : T - 1]).all()
        assert rel_err(o[:, :, : T - 1], ro[:, :, : T - 1]) < 1e-5


@pytest.mark.parametrize("path", ["tile", "blocks", "auto"])
@pytest.mark.parametrize("pattern", ["random", "odd"])
def test_repeated_block_counts_once(path, pattern):
    """A block named by several slots of one row counts once, as in the dense reference
    (built from the set of selected blocks), on every path."""
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 53, 32, 16, 4
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=56)
    idx = with_repeats(make_idx(pattern, B, Hkv, T, bs, S), seed=1)
    t = torch.arange(T)[:, None]
    kept0 = (idx[..., 0] >= 0) & (idx[..., 0] * bs <= t[:, 0])
    assert (kept0 & (idx[..., -1] == idx[..., 0])).any()  # kept blocks are repeated
    check_forward(q, k, v, idx, bs, tuning=use_path(path, idx, bs, S, Hq // Hkv))


@pytest.mark.gpu
@pytest.mark.parametrize("sched", ["tile", "blocks", "auto"])
@pytest.mark.parametrize("pattern", ["recent", "random"])
def test_bf16_on_gpu(pattern, sched):
    """bf16 on a GPU (seed shape, G = 4, block 32, S 16; 'auto' with ratio 1 mixes both
    paths): NaN k and inf v, then inf k and NaN v, at keys in the middle of a block and at
    the last token, and repeats within rows. Clean rows match the fp32 reference on clean
    inputs; rows that see a NaN are NaN."""
    t = schedule(sched, ratio=1)
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 1000, 64, 32, 16
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = [
        torch.randn(B, H, T, D, generator=g, device="cuda", dtype=torch.bfloat16)
        for H in (Hq, Hkv, Hkv)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    idx = with_repeats(make(B, Hkv, T, bs, S, "cuda").cpu(), seed=2).cuda()
    ro, rlse = selection_forward_reference(q.float(), k.float(), v.float(), idx, bs, None, True)
    p1, p2 = [T - 1, 300, 517], [T - 5, 611]
    s1, s2 = (seen(idx, bs, T, p, Hq // Hkv) for p in (p1, p2))
    clean = ~(s1 | s2)
    for kx, vx, tainted in (
        (at(k, p1, NAN), at(v, p2, INF), s1 | s2),
        (at(k, p2, INF), at(v, p1, NAN), s1),
    ):
        o, lse = fwd(q, kx, vx, idx, bs, return_lse=True, tuning=t)
        assert torch.isfinite(o[clean]).all()
        assert rel_err(o[clean], ro[clean]) < 1e-2
        fin = clean & torch.isfinite(rlse)
        assert (lse[fin] - rlse[fin]).abs().max() < 2e-2
        assert torch.equal(torch.isinf(lse) & clean, torch.isinf(rlse) & clean)
        assert tainted.any() and not torch.isfinite(o[tainted]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1000, 4096])
def test_pdl_launch_modes_agree_on_gpu(T):
    """bf16 on a GPU, seed shape: the fix-up (`fix_pdl`) and the block-major chain
    (`chain_pdl`) as ordinary launches and as programmatic dependents, eagerly and replayed
    from a CUDA graph (outputs poisoned before each replay, so every row must be written
    again). At T=1000 the forward is three launches on one stream; at 4096 (ratio 1: both
    paths) the block-major phase runs beside the token-tile kernel.

    Clean inputs: the same bits in every mode. Hidden NaN and inf keys (so the fix-up has
    tiles to redo): rows that see them are non-finite, the others match the fp32 reference
    on clean inputs. Not bit for bit there: a block-handled tile is redone on the token-tile
    path when a partial over a chunk that takes the causal mask ends non-finite, and which
    chunk a list entry lands in follows the order of the fill kernel's atomics."""
    B, Hq, Hkv, D, bs, S = 1, 16, 4, 64, 64, 16
    g = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = [
        torch.randn(B, H, T, D, generator=g, device="cuda", dtype=torch.bfloat16)
        for H in (Hq, Hkv, Hkv)
    ]
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cuda", seed=3)
    ro, rlse = selection_forward_reference(q.float(), k.float(), v.float(), idx, bs, None, True)
    p1, p2 = [T - 1, T // 3 + 5], [T // 2 + 7]
    kx, vx = at(k, p1, NAN), at(v, p2, INF)
    tainted = seen(idx, bs, T, p1, Hq // Hkv) | seen(idx, bs, T, p2, Hq // Hkv)
    assert tainted.any() and not tainted.all()

    def eager_and_graph(t, k, v):
        o, lse = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            go, glse = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
        go.fill_(NAN)
        glse.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        return (o, lse), (go, glse)

    first = None
    for mode in ((False, False), (True, False), (True, True)):
        t = schedule("auto", ratio=1, fix_pdl=mode[0], chain_pdl=mode[1])
        for o, lse in eager_and_graph(t, k, v):
            first = first or (o, lse)
            assert torch.equal(o, first[0]) and torch.equal(lse, first[1]), mode
        for o, lse in eager_and_graph(t, kx, vx):
            assert not torch.isfinite(o[tainted]).any(), mode
            assert torch.isfinite(o[~tainted]).all(), mode
            assert rel_err(o[~tainted], ro[~tainted]) < 1e-2, mode
            fin = ~tainted & torch.isfinite(rlse)
            assert (lse[fin] - rlse[fin]).abs().max() < 2e-2, mode
            assert torch.equal(torch.isinf(lse) & ~tainted, torch.isinf(rlse) & ~tainted), mode
