"""NSA selection forward: the block-major path and the per-tile choice between the two
schedules (`ForwardTuning.schedule`), against the fp64 dense reference.

Runs under the Triton interpreter on the CPU at small, odd shapes. Every kernel output and
the partial buffers are allocated NaN-filled (`poisoned`), so an unwritten output element, or
a combine that reads a partial nobody wrote, shows up as NaN.
"""

import pytest
import torch
from test_nsa_kernels import (
    TOL,
    make_idx,
    poisoned,  # noqa: F401  (autouse: outputs and partials start NaN)
    reference,
)
from test_nsa_reference import odd_block_idx, qkv, rel_err, tuned, with_repeats

from kernels.nsa import (
    _checks,
    block_major,
    forward,
    make_block_idx_random,
    make_block_idx_recent,
    selection_backward_triton,
    selection_forward_reference,
    tiles,
)
from kernels.nsa import selection_forward_triton as fwd
from kernels.nsa.tuning import DEFAULT


def schedule(name, ratio=None, **fields):
    """A tuning with the given schedule (and block-path ratio, and other fields)."""
    if ratio is not None:
        fields["block_path_ratio"] = ratio
    return tuned(schedule=name, **fields)


def check_forward(q, k, v, idx, bs, scale=None, tuning=None):
    """o and lse against the fp64 dense reference; returns (o, lse)."""
    tol = TOL[q.dtype]
    o, lse = fwd(q, k, v, idx, bs, scale=scale, return_lse=True, tuning=tuning)
    ro, rlse = reference(q, k, v, idx, bs, torch.zeros_like(q), scale)[:2]
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ro) < tol
    empty = torch.isinf(rlse)
    assert torch.equal(torch.isinf(lse), empty) and torch.all(lse[empty] < 0)
    assert torch.allclose(lse[~empty].double(), rlse[~empty], rtol=0, atol=10 * tol)
    assert torch.all(o[empty] == 0)
    return o, lse


def tile_counts(idx, bs, G, rows=None):
    """Distinct kept blocks per tile of the forward's tiling (tiles of `rows` rows; None:
    the default)."""
    rows = DEFAULT.forward.tile_rows if rows is None else rows
    block_t = tiles.tile_config(G, torch.float32, rows)[1]
    return tiles.tile_block_lists(idx, bs, block_t)[1]


CASES = [  # B, Hq, Hkv, T, D, bs, S, pattern
    (2, 2, 2, 37, 32, 16, 3, "odd"),  # G = 1, -1/-2, >= NB, future ids, rows with no slot
    (1, 6, 2, 53, 32, 16, 4, "random"),  # G = 3 (padded group)
    (1, 8, 2, 45, 64, 32, 3, "recent"),  # G = 4, bs = 32: the first 31 rows see nothing
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"G{c[1] // c[2]}-T{c[3]}-{c[7]}")
def test_blocks_schedule_vs_reference(case, cpu_dtype):
    """Every tile block-handled: the whole output comes from partials and the combine."""
    B, Hq, Hkv, T, D, bs, S, pattern = case
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=cpu_dtype, seed=T + 30)
    check_forward(q, k, v, make_idx(pattern, B, Hkv, T, bs, S), bs, tuning=schedule("blocks"))


@pytest.mark.parametrize(
    "case", [(1, 4, 1, 61, 32, 16, 5, "random"), (2, 6, 2, 50, 32, 16, 4, "odd")]
)
def test_auto_schedule_mixes_paths(case):
    """A threshold between the tiles' block counts: some tiles take each path."""
    B, Hq, Hkv, T, D, bs, S, pattern = case
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 31)
    idx = make_idx(pattern, B, Hkv, T, bs, S)
    counts = tile_counts(idx, bs, Hq // Hkv, rows=16)
    thr = (counts.min().item() + counts.max().item()) // 2
    t = schedule("auto", ratio=(thr + 0.5) / S, tile_rows=16)
    assert forward.block_path_min_blocks(S, Hq // Hkv, tuning=t) == thr
    assert (counts > thr).any() and (counts <= thr).any()
    check_forward(q, k, v, idx, bs, tuning=t)


def test_each_path_writes_only_its_tiles(monkeypatch):
    """Without the block-major phase, exactly the rows of block-handled tiles stay NaN: the
    tile kernel skips them and writes every other row."""
    monkeypatch.setattr(block_major, "block_major_forward", lambda *args, **kwargs: None)
    B, Hq, Hkv, T, D, bs, S = 1, 4, 1, 45, 32, 16, 4
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=39)
    idx = make_idx("odd", B, Hkv, T, bs, S)
    counts = tile_counts(idx, bs, 4, rows=16)
    thr = (counts.min().item() + counts.max().item()) // 2
    t = schedule("auto", ratio=(thr + 0.5) / S, tile_rows=16)
    o, lse = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    handled = (counts[0] > thr).repeat_interleave(4)[:T]  # 4 tokens per tile
    assert handled.any() and (~handled).any()
    assert torch.equal(torch.isnan(lse[0]), handled[None].expand(Hq, T))
    assert torch.equal(torch.isnan(o[0]).all(-1), handled[None].expand(Hq, T))


@pytest.mark.parametrize("T", [64, 65])
def test_block_phase_is_launched_only_where_a_tile_can_use_it(monkeypatch, T):
    """'auto' at S=2, block 16 (threshold 2 S = 4 blocks; a tile of 16 tokens keeps at most
    min(NB, 32)): at T=64 (NB=4) no tile can exceed it, so neither the block-major phase
    nor its scratch is launched, and the result matches the reference; at T=65 (NB=5) both
    run. The threshold rule without a cap is unchanged."""
    calls = []
    real = block_major.block_major_forward
    monkeypatch.setattr(
        block_major, "block_major_forward", lambda *a, **kw: calls.append(T) or real(*a, **kw)
    )
    B, Hq, Hkv, D, bs, S = 1, 4, 1, 32, 16, 2
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=41)
    idx = make_idx("random", B, Hkv, T, bs, S)
    check_forward(q, k, v, idx, bs)
    assert calls == ([] if T == 64 else [T])
    nb = -(-T // bs)
    assert forward.block_path_min_blocks(S, 4, max_blocks=min(nb, 16 * S)) == (
        None if T == 64 else 2 * S
    )
    assert forward.block_path_min_blocks(S, 4) == 2 * S
    assert forward.block_path_min_blocks(S, 4, max_blocks=1, tuning=schedule("blocks")) == -1


def test_auto_without_block_tiles_equals_tile_schedule():
    """'recent' has at most S + 1 blocks per tile: with the default ratio no tile is
    block-handled and the result is bitwise the token-tile one; 'tile' still matches the
    reference; an unknown schedule is refused."""
    B, Hq, Hkv, T, D, bs, S = 1, 8, 2, 70, 32, 16, 3
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=32)
    idx = make_idx("recent", B, Hkv, T, bs, S)
    ft = DEFAULT.forward
    assert (tile_counts(idx, bs, 4) <= ft.block_path_ratio * S).all()
    got = fwd(q, k, v, idx, bs, return_lse=True)  # the default: "auto"
    want = check_forward(q, k, v, idx, bs, tuning=schedule("tile"))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert ft.schedule == "auto"
    assert forward.block_path_min_blocks(S, 4) == ft.block_path_ratio * S
    assert forward.block_path_min_blocks(S, ft.block_path_max_g + 1) is None  # large G
    big = ft.block_path_max_bytes + 1  # temporaries over the cap
    assert forward.block_path_min_blocks(S, 4, big) is None
    dims = _checks.check_forward_args(q, k, v, idx, bs, None)
    assert forward.block_path_bytes(dims, 4) == B * Hkv * T * S * (4 * (D * 4 + 4) + 8)
    assert forward.block_path_min_blocks(S, 4, tuning=schedule("auto", ratio=0)) is None
    assert forward.block_path_min_blocks(S, 4, tuning=schedule("blocks")) == -1
    with pytest.raises(ValueError, match="schedule"):
        schedule("nope")


@pytest.mark.parametrize("scale", [0.37, -0.6])
def test_special_indices_int64_and_scale(scale):
    """int64 ids (one that wraps to a valid block in int32 must stay dropped), -1/-2, >= NB,
    future blocks, rows with no key, a custom scale (a negative one too: the block path
    then cannot take the row max before scaling)."""
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 50, 32, 16, 4
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=33)
    idx = odd_block_idx(B, Hkv, T, bs, S, seed=4).long()
    idx[0, 0, 20] = torch.tensor([2, 3, -1, 2**32 + 1])
    o, lse = check_forward(q, k, v, idx, bs, scale=scale, tuning=schedule("blocks"))
    assert torch.isinf(lse[0, :2, [3, 20, T - 1]]).all()


@pytest.mark.parametrize(
    "chunk,windows,key64",
    [(1, 1, False), (3, 1, False), (8, 1, False), (3, 4, False), (3, 4, True)],
)
def test_block_lists_are_the_inverse_of_block_idx(chunk, windows, key64):
    """For each (b, kv head, window, block): exactly the kept slots of the window's
    block-handled tiles, as flat slot indices t * S + s, with their block and whether the
    token lies inside it, then -1 up to a multiple of `chunk` places; a slot repeating an
    earlier slot's block in its row has a place among the entries that holds -2 - slot (no
    partial: the block counts once); the histogram is consumed back to -1; the partials' lse
    is -inf at exactly the dropped slots of block-handled tiles (every head of a padded
    group of 3; the repeats' are the partial kernel's) and untouched elsewhere. key64: the
    fill kernel's 64-bit (block, slot) sort keys (for NB * slots per tile past 32 bits),
    forced."""
    t = tuned(fill_key32_max=0) if key64 else None
    T, bs, S, block_t = 45, 8, 3, 4
    idx = with_repeats(odd_block_idx(2, 2, T, bs, S, seed=34), seed=3).long()
    idx[1, 0, 30] = torch.tensor([2**32 + 1, 1, -1])
    NB, n_tiles = -(-T // bs), -(-T // block_t)
    tpw = tiles.window_tiles(n_tiles, windows)  # 3 tiles a window: 4 windows, one short
    counts = tiles.tile_block_lists(idx, bs, block_t)[1]
    thr = (counts.min().item() + counts.max().item()) // 2
    handled = counts > thr
    assert handled.any() and (~handled).any()
    hist = torch.full((4, windows * NB), -1, dtype=torch.int32)  # as list_scratch fills it
    assert torch.equal(tiles.tile_block_lists(idx, bs, block_t, hist, thr)[1], counts)
    part_l = torch.full((4, T, S, 3), float("nan"))
    row_ptr, col, code = block_major.block_lists(
        idx, counts, hist, thr, bs, block_t, chunk, part_l, t
    )  # fmt: skip
    assert (hist == -1).all()
    flat = idx.view(4, T, S)
    t = torch.arange(T)[None, :, None]
    earlier = torch.ones(S, S, dtype=torch.bool).tril(-1)  # [s, s']: s' < s
    repeat = ((flat[..., :, None] == flat[..., None, :]) & earlier).any(-1)
    kept = (flat >= 0) & (flat < NB) & (flat * bs <= t)
    assert (kept & repeat).any()
    dropped = ~kept & handled.repeat_interleave(block_t, 1)[:, :T, None]
    assert dropped.any() and (~dropped).any()
    assert torch.equal(part_l == float("-inf"), dropped[..., None].expand(-1, -1, -1, 3))
    assert torch.isnan(part_l[~dropped]).all()
    NL = windows * NB
    L = T * S + NL * chunk
    assert row_ptr.shape == (4, NL + 1) and col.shape == (4, L)
    assert code.shape == (4, -(-L // chunk))
    assert (row_ptr[:, 0] == 0).all() and (row_ptr % chunk == 0).all()
    want, reps = {}, {}
    for bh, t, s in torch.nonzero(kept).tolist():
        j = flat[bh, t, s].item()
        if handled[bh, t // block_t]:
            key = (bh, t // block_t // tpw * NB + j)
            (reps if repeat[bh, t, s] else want).setdefault(key, []).append(t * S + s)
    assert windows == 1 or len({key[1] // NB for key in want}) > 2  # several windows used
    assert reps
    for bh in range(4):
        for i_l in range(NL):
            lo, hi = row_ptr[bh, i_l].item(), row_ptr[bh, i_l + 1].item()
            entries, repeats = want.get((bh, i_l), []), reps.get((bh, i_l), [])
            n = len(entries) + len(repeats)
            assert hi - lo == -(-n // chunk) * chunk
            got = col[bh, lo : lo + n]
            assert sorted(got[got >= 0].tolist()) == entries
            assert sorted((-2 - got[got < 0]).tolist()) == repeats
            assert (col[bh, lo + n : hi] == -1).all()
            want_code = chunk_codes(col[bh, lo:hi], i_l % NB, S, bs, chunk)
            assert torch.equal(code[bh, lo // chunk : hi // chunk], want_code)
        assert (code[bh, row_ptr[bh, NL].item() // chunk :] == -1).all()


def chunk_codes(places, j, S, bs, chunk):
    """Codes of the chunks of one list's places (entries, then -1): 2 j + 1 where an entry's
    token lies inside block j, else 2 j."""
    inside = (places >= 0) & (places // S // bs == j)
    return 2 * j + inside.view(-1, chunk).any(1).int()


def test_block_path_is_deterministic(monkeypatch):
    """Two calls agree bitwise, and so does a call whose block lists are shuffled within each
    block (the order the fill kernel's atomics leave them in is not fixed on a GPU). Under
    the interpreter a shuffle moves rows within a chunk's product, and numpy's matmul does
    not give a row the same rounding at every position: there the shuffled call must agree
    to fp32 rounding (the GPU's tensor-core dot is row-position invariant: bitwise)."""
    t = schedule("blocks")
    B, Hq, Hkv, T, D, bs, S = 1, 8, 2, 53, 32, 16, 4
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=35)
    idx = make_idx("random", B, Hkv, T, bs, S)
    first = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    assert all(
        torch.equal(a, b)
        for a, b in zip(first, fwd(q, k, v, idx, bs, return_lse=True, tuning=t), strict=True)
    )

    real = block_major.block_lists
    gen = torch.Generator().manual_seed(0)

    def shuffled(*args, **kwargs):
        """Each block's places permuted, padding included: a chunk may start with it."""
        row_ptr, col, code = real(*args, **kwargs)
        chunk = args[6]
        for bh in range(row_ptr.shape[0]):
            for i_l in range(row_ptr.shape[1] - 1):
                lo, hi = row_ptr[bh, i_l].item(), row_ptr[bh, i_l + 1].item()
                col[bh, lo:hi] = col[bh, lo + torch.randperm(hi - lo, generator=gen)]
                j = i_l % -(-T // bs)
                code[bh, lo // chunk : hi // chunk] = chunk_codes(col[bh, lo:hi], j, S, bs, chunk)
        return row_ptr, col, code

    monkeypatch.setattr(block_major, "block_lists", shuffled)
    again = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    if q.is_cuda:
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    else:
        assert not torch.isnan(again[0]).any() and rel_err(again[0], first[0]) < 1e-6
        assert torch.allclose(again[1], first[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "rows,waves,window", [(16, None, None), (256, 1, 16), (16, 1, 8), (64, 2, 32)]
)
def test_partial_chunk_sizes(rows, waves, window):
    """fp32 chunks of 2 entries (one program per chunk), of 32 entries (most of a block's
    places padding, one persistent program per head) and of 8, with persistent programs
    walking many chunks each; list windows of 1, 2 and 4 tiles; the combine with one
    program per tile or persistent programs walking many tiles. Each program reads its next
    chunk's places ahead, past the last chunk at the end."""
    t = schedule(
        "blocks", chunk_rows=rows, list_window=window, combine_waves=waves, partial_waves=waves
    )
    B, Hq, Hkv, T, D, bs, S = 1, 8, 2, 47, 32, 16, 3
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=36)
    check_forward(q, k, v, make_idx("odd", B, Hkv, T, bs, S), bs, tuning=t)


def test_partial_kernel_64bit_offsets():
    """The partial kernel's 64-bit row offsets (taken past 2**31 elements), forced by a zero
    limit, at a padded group (G = 3: masked q rows) and T not a multiple of the block."""
    t = schedule("blocks", partial_off32_max=0)
    B, Hq, Hkv, T, D, bs, S, pattern = CASES[1]
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=44)
    check_forward(q, k, v, make_idx(pattern, B, Hkv, T, bs, S), bs, tuning=t)


def test_backward_with_lse_from_block_path():
    """The backward takes lse from a block-path forward; gradients match the reference."""
    t = schedule("blocks")
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 41, 32, 16, 3
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=37)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=38)[0]
    idx = make_idx("random", B, Hkv, T, bs, S)
    o, lse = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    grads = selection_backward_triton(q, k, v, idx, bs, do, o, lse, tuning=t)
    _, _, rgrads = reference(q, k, v, idx, bs, do)
    for got, ref in zip(grads, rgrads, strict=True):
        assert torch.isfinite(got).all() and rel_err(got, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("sched", ["blocks", "auto"])
@pytest.mark.parametrize("pattern", ["recent", "random"])
@pytest.mark.parametrize("G", [1, 4, 16])
def test_bf16_on_gpu(G, pattern, sched):
    """bf16 on a GPU against the fp32 dense reference ('auto' with ratio 1 mixes both paths
    for both patterns); two calls agree bitwise although the fill kernel's atomics race."""
    t = schedule(sched, ratio=1)
    B, Hq, T, D, bs, S = 1, 16, 1000, 64, 32, 16
    g = torch.Generator(device="cuda").manual_seed(G)
    q, k, v = [
        torch.randn(B, H, T, D, generator=g, device="cuda", dtype=torch.bfloat16)
        for H in (Hq, Hq // G, Hq // G)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    idx = make(B, Hq // G, T, bs, S, "cuda")
    o, lse = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    ro, rlse = selection_forward_reference(q.float(), k.float(), v.float(), idx, bs, None, True)
    assert rel_err(o, ro) < 1e-2
    empty = torch.isinf(rlse)
    assert torch.equal(torch.isinf(lse), empty)
    assert (lse[~empty] - rlse[~empty]).abs().max() < 2e-2
    again = fwd(q, k, v, idx, bs, return_lse=True, tuning=t)
    assert torch.equal(o, again[0]) and torch.equal(lse, again[1])


def seed_inputs_bf16(T, pattern, device):
    """bf16 q, k, v at the seed shape (B 1, Hq 16, Hkv 4, D 64) with T tokens and the
    pattern's block_idx (block 32, S 16), for the GPU tests; also the generator (seed 7)
    they were drawn from, for more inputs of the same stream."""
    B, Hq, Hkv, D, bs, S = 1, 16, 4, 64, 32, 16
    g = torch.Generator(device=device).manual_seed(7)
    q, k, v = [
        torch.randn(B, H, T, D, generator=g, device=device, dtype=torch.bfloat16)
        for H in (Hq, Hkv, Hkv)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    return g, q, k, v, make(B, Hkv, T, bs, S, device)


def test_seed_inputs_bf16_shapes():
    """The GPU tests' input helper, run on the CPU: shapes, dtype, seeded."""
    _, q, k, v, idx = seed_inputs_bf16(40, "random", "cpu")
    assert q.shape == (1, 16, 40, 64) and k.shape == v.shape == (1, 4, 40, 64)
    assert q.dtype == torch.bfloat16 and idx.shape == (1, 4, 40, 16)
    assert torch.equal(q, seed_inputs_bf16(40, "random", "cpu")[1])


def test_overlap_setting_is_checked_and_off_on_the_cpu():
    """overlap_tile_kernel: a non-bool is refused (naming the field) when the tuning is
    made; on the CPU (interpreter) there is no second stream whatever its value."""
    assert forward.side_stream(torch.device("cpu")) is None
    assert forward.side_stream(torch.device("cpu"), tuned(overlap_tile_kernel=True)) is None
    with pytest.raises(ValueError, match="overlap_tile_kernel"):
        tuned(overlap_tile_kernel="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["recent", "random"])
def test_overlap_on_gpu_bitwise_and_in_a_graph(pattern):
    """bf16, 'auto' with ratio 1 (both paths serve tiles): with the tile kernel on its own
    stream, o and lse are bitwise those of the one-stream call, also when the call is
    captured in a CUDA graph and replayed on fresh inputs (the graph's fork and join)."""
    on = schedule("auto", ratio=1)
    off = schedule("auto", ratio=1, overlap_tile_kernel=False)
    bs = 32
    g, q, k, v, idx = seed_inputs_bf16(2000, pattern, "cuda")
    ref = fwd(q, k, v, idx, bs, return_lse=True, tuning=off)
    assert forward.side_stream(q.device, on) is not None
    got = fwd(q, k, v, idx, bs, return_lse=True, tuning=on)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    ro = selection_forward_reference(q.float(), k.float(), v.float(), idx, bs)
    assert rel_err(got[0], ro) < 1e-2
    # Captured, then replayed on new q values: the graph recomputes, still bitwise.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fwd(q, k, v, idx, bs, return_lse=True, tuning=on)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd(q, k, v, idx, bs, return_lse=True, tuning=on)
    q.copy_(torch.randn(q.shape, generator=g, device="cuda", dtype=q.dtype))
    graph.replay()
    torch.cuda.synchronize()
    want = fwd(q, k, v, idx, bs, return_lse=True, tuning=off)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
