"""NSA selection: Triton forward/backward/autograd vs the fp64 dense reference.

Without a GPU the kernels run under the Triton interpreter, so shapes stay small; they are
odd (T not a multiple of block_size, G = 1..16, padded head groups, partial S tiles) to reach
every mask. Outputs are allocated NaN-filled (see `poisoned`) so an unwritten element fails.
"""

import pytest
import torch
from test_nsa_reference import odd_block_idx, qkv, rel_err, tuned

from kernels import _runtime
from kernels.nsa import (
    _checks,
    inverse,
    invert_block_idx,
    make_block_idx_random,
    make_block_idx_recent,
    selection_attention,
    selection_backward_triton,
    selection_forward_reference,
    selection_forward_triton,
    tiles,
)

TOL = {torch.float32: 1e-5, torch.float16: 1e-2}


def _poison(shape, dtype, device):
    """NaN for floats, -7 for integers; a scratch allocation's bytes 0xFF (NaN in any float
    view, -1 in an integer one)."""
    if dtype == torch.uint8:
        return torch.full(shape, 255, dtype=dtype, device=device)
    return torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype,
                      device=device)  # fmt: skip


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every kernel output and temporary starts poisoned (`_poison`): elements a kernel
    fails to write, or reads before writing, show up."""
    monkeypatch.setattr(_checks, "new_empty", _poison)
    monkeypatch.setattr(_runtime, "new_buffer", _poison)


def make_idx(pattern, B, Hkv, T, bs, S):
    if pattern == "recent":
        return make_block_idx_recent(B, Hkv, T, bs, S, "cpu")
    if pattern == "random":
        return make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=1)
    return odd_block_idx(B, Hkv, T, bs, S, seed=2)


def reference(q, k, v, idx, bs, do, scale=None):
    """fp64 dense reference: o, lse and autograd gradients of <o, do>."""
    x = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o, lse = selection_forward_reference(*x, idx, bs, scale=scale, return_lse=True)
    grads = torch.autograd.grad(o, x, do.double())
    return o, lse, grads


def check_against_reference(q, k, v, idx, bs, do, scale=None, tuning=None):
    tol = TOL[q.dtype]
    o, lse = selection_forward_triton(q, k, v, idx, bs, scale=scale, return_lse=True, tuning=tuning)
    dq, dk, dv = selection_backward_triton(q, k, v, idx, bs, do, o, lse, scale=scale, tuning=tuning)
    ro, rlse, rgrads = reference(q, k, v, idx, bs, do, scale)
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert rel_err(o, ro) < tol
    empty = torch.isinf(rlse)
    assert torch.equal(torch.isinf(lse), empty) and torch.all(lse[empty] < 0)
    assert torch.allclose(lse[~empty].double(), rlse[~empty], rtol=0, atol=10 * tol)
    assert torch.all(o[empty] == 0)
    for got, ref in zip((dq, dk, dv), rgrads, strict=True):
        assert got.dtype == q.dtype and torch.isfinite(got).all()
        assert rel_err(got, ref) < tol
    assert torch.all(dq[empty] == 0)
    return o, lse, (dq, dk, dv)


CASES = [  # B, Hq, Hkv, T, D, bs, S, pattern
    (2, 2, 2, 37, 32, 16, 3, "odd"),  # G = 1
    (1, 8, 2, 70, 32, 16, 4, "random"),  # G = 4
    (1, 8, 2, 53, 32, 16, 3, "recent"),  # G = 4, first 15 rows empty
    (1, 16, 1, 45, 64, 16, 5, "odd"),  # G = 16
    (1, 6, 2, 41, 128, 32, 2, "random"),  # G = 3 (padded group), D = 128, bs = 32
    (3, 4, 2, 2, 32, 16, 2, "random"),  # T = 2 (with T = 1, dq = dk = 0 exactly)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"G{c[1] // c[2]}-T{c[3]}-{c[7]}")
def test_forward_backward_vs_reference(case, cpu_dtype):
    B, Hq, Hkv, T, D, bs, S, pattern = case
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=cpu_dtype, seed=T)
    do = qkv(B, Hq, Hkv, T, D, dtype=cpu_dtype, seed=T + 1)[0]
    check_against_reference(q, k, v, make_idx(pattern, B, Hkv, T, bs, S), bs, do)


@pytest.mark.parametrize(
    "case", [(1, 8, 2, 50, 32, 16, 4, "random"), (1, 16, 1, 45, 64, 16, 3, "odd")]
)
def test_long_lists_split_into_segments(case):
    """Segments of one chunk: every list of more than BLOCK_Q entries is split and reduced
    through the partial buffer; results stay exact and deterministic."""
    t = tuned(segment_chunks=1)
    B, Hq, Hkv, T, D, bs, S, pattern = case
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 5)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 6)[0]
    idx = make_idx(pattern, B, Hkv, T, bs, S)
    o, lse, grads = check_against_reference(q, k, v, idx, bs, do, tuning=t)
    again = selection_backward_triton(q, k, v, idx, bs, do, o, lse, tuning=t)
    for a, b in zip(grads, again, strict=True):
        assert torch.equal(a, b)


FORWARD_LAUNCHES = ["_tile_list_kernel", "_sel_fwd_kernel", "_sel_fwd_fix_kernel"]
BLOCK_MAJOR_LAUNCHES = ["_prefix_kernel", "_fill_kernel", "_partial_kernel", "_combine_kernel"]
BACKWARD_LAUNCHES = [
    "_tile_list_kernel", "_sel_bwd_dq_kernel", "_sel_bwd_dq_kernel", "_inv_sort_kernel",
    "_inv_scan_kernel", "_inv_fill_kernel", "_sel_bwd_dkdv_kernel",
]  # fmt: skip


@pytest.mark.parametrize(
    "T,chunks,block_phase,reduce",
    [(64, None, False, False), (65, None, True, False), (64, 1, False, True)],
)
def test_each_call_launches_only_what_can_do_work(monkeypatch, T, chunks, block_phase, reduce):
    """G=4, block 16, S=2 (block-path threshold 2 S = 4 blocks): the forward launches the
    block-major phase only where a tile can keep more than 4 blocks (NB = 5 at T=65, 4 at
    64), and the backward the segment reduce only where a list can be split (T * S entries
    over one segment of segment_chunks * 32; segment_chunks=1 makes it 32). Results are
    checked against the reference either way."""
    from kernels import _runtime

    names = []
    real = _runtime.launch

    def record(kernel, grid, *args, **kwargs):
        names.append(kernel.fn.__name__)
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(_runtime, "launch", record)
    t = tuned(segment_chunks=chunks) if chunks else None
    B, Hq, Hkv, D, bs, S = 1, 4, 1, 32, 16, 2
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 7)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=T + 8)[0]
    idx = make_idx("random", B, Hkv, T, bs, S)
    o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=t)
    forward_names, names[:] = list(names), []
    grads = selection_backward_triton(q, k, v, idx, bs, do, o, lse, tuning=t)
    want = (
        FORWARD_LAUNCHES[:2] + (BLOCK_MAJOR_LAUNCHES if block_phase else []) + FORWARD_LAUNCHES[2:]
    )
    assert forward_names == want
    assert names == BACKWARD_LAUNCHES + (["_sel_bwd_reduce_kernel"] if reduce else [])
    ro, _, rgrads = reference(q, k, v, idx, bs, do)
    assert rel_err(o, ro) < TOL[q.dtype]
    for got, ref in zip(grads, rgrads, strict=True):
        assert rel_err(got, ref) < TOL[q.dtype]


@pytest.mark.parametrize("rows,dq_rows,dkdv_rows", [(16, 32, 16), (16, None, 64), (64, 16, 32)])
def test_tile_sizes(rows, dq_rows, dkdv_rows):
    """Other forward/dq/dk-dv tile sizes stay exact."""
    t = tuned(tile_rows=rows, dq_rows=dq_rows, dkdv_rows=dkdv_rows)
    q, k, v = qkv(1, 8, 2, 53, 32, dtype=torch.float32, seed=16)
    do = qkv(1, 8, 2, 53, 32, dtype=torch.float32, seed=17)[0]
    check_against_reference(q, k, v, make_idx("odd", 1, 2, 53, 16, 4), 16, do, tuning=t)


@pytest.mark.parametrize("block_t", [1, 3, 8])
def test_tile_block_lists(block_t):
    """Per tile: the distinct kept blocks of its tokens, ascending, and their count
    (odd ids, -1/-2, out of range, future blocks, int64 beyond int32, a partial last tile)."""
    T, bs, S = 37, 8, 3
    idx = odd_block_idx(2, 2, T, bs, S, seed=21).long()
    idx[1, 0, 30] = torch.tensor([2**32 + 1, 1, -1])  # wraps to 1 in int32: must stay dropped
    lists, counts = tiles.tile_block_lists(idx, bs, block_t)
    n_tiles = -(-T // block_t)
    assert lists.shape == (4, n_tiles, block_t * S) and counts.shape == (4, n_tiles)
    NB = -(-T // bs)
    for bh in range(4):
        b, h = divmod(bh, 2)
        for i in range(n_tiles):
            want = {
                j
                for t in range(i * block_t, min(T, (i + 1) * block_t))
                for j in idx[b, h, t].tolist()
                if 0 <= j < NB and j * bs <= t
            }
            n = counts[bh, i].item()
            assert n == len(want) and lists[bh, i, :n].tolist() == sorted(want)


def inverse_want(idx, bs, unique):
    """The whole inverted index in plain Python: per (b, kv head) and block, the positions
    that kept it, ascending (with unique=False once per slot naming it), then the dropped
    slots' positions (and, unique, the repeats'), ascending."""
    B, Hkv, T, S = idx.shape
    NB = -(-T // bs)
    rows = []
    for b in range(B):
        for h in range(Hkv):
            lists, rest = [[] for _ in range(NB)], []
            for t in range(T):
                seen = set()
                for j in idx[b, h, t].tolist():
                    if 0 <= j < NB and j * bs <= t and not (unique and j in seen):
                        lists[j].append(t)
                        seen.add(j)
                    else:
                        rest.append(t)
            rows.append((lists, sorted(rest)))
    return rows


def segments_want(lists, seg_len, n_entries):
    """seg_block, seg_start, part_start of one row, from the lists' lengths."""
    n_seg = [max(1, -(-len(x) // seg_len)) for x in lists]
    seg_start, part_start, seg_block = [0], [0], []
    for j, n in enumerate(n_seg):
        seg_start.append(seg_start[-1] + n)
        part_start.append(part_start[-1] + (n if n > 1 else 0))
        seg_block += [j] * n
    n_total = len(lists) + n_entries // seg_len
    return seg_block + [len(lists)] * (n_total - len(seg_block)), seg_start, part_start


@pytest.mark.parametrize("unique", [True, False])
@pytest.mark.parametrize("slots", [16, 1024])
@pytest.mark.parametrize("buckets", [16, 1])
def test_inverted_lists_whole_layout(monkeypatch, unique, slots, buckets):
    """Every entry of row_ptr, col and the segments (lists split at 4 entries) against plain
    Python, with repeats, dropped and out-of-range slots, and T not a multiple of the
    inversion's tiles (16 slots: 5 tokens a tile) or of block_size. The row offsets come
    from the last of the scan's programs of each row (one program, or one a bucket); the
    buffers are poisoned first."""
    B, Hkv, T, bs, S = 2, 2, 45, 16, 3
    idx = odd_block_idx(B, Hkv, T, bs, S, seed=21)
    idx[0, 1, 10:40] = torch.tensor([0, 0, 1], dtype=idx.dtype)  # long list, repeats
    seg_len = 4
    t = tuned(invert_tile_slots=slots, invert_scan_buckets=buckets)
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):  # every scratch buffer starts as garbage
        x = real_empty(*args, **kwargs)
        return x.fill_(-7) if not x.is_floating_point() else x.fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    row_ptr, col, segs = inverse.inverted_lists(idx, bs, unique, seg_len=seg_len, tuning=t)
    seg_block, seg_start, part_start, n_part = segs
    assert n_part == max(1, 2 * T * S // seg_len)
    for bh, (lists, rest) in enumerate(inverse_want(idx, bs, unique)):
        ptr = [0]
        for x in lists:
            ptr.append(ptr[-1] + len(x))
        assert row_ptr[bh].tolist() == ptr
        assert col[bh].tolist() == [t for x in lists for t in x] + rest
        want = segments_want(lists, seg_len, T * S)
        assert (seg_block[bh].tolist(), seg_start[bh].tolist(), part_start[bh].tolist()) == want
    assert seg_start[1, -1] > seg_start[1, 1] + 1  # the long list was split
    again = inverse.inverted_lists(idx, bs, unique, seg_len=seg_len, tuning=t)
    for a, b in zip((row_ptr, col, *segs[:3]), (*again[:2], *again[2][:3]), strict=True):
        assert torch.equal(a, b)


def test_special_indices_int64_scale_and_recompute():
    """-1, -2, >= NB, future blocks, rows with no key, int64 indices, a custom scale; the
    backward without lse recomputes it; dk/dv are bitwise deterministic."""
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 50, 32, 16, 4
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=7)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=8)[0]
    idx = odd_block_idx(B, Hkv, T, bs, S, seed=4).long()
    idx[0, 0, 20] = torch.tensor([2, 3, -1, 2**32 + 1])  # future / out of range (wraps in int32)
    o, lse, grads = check_against_reference(q, k, v, idx, bs, do, scale=0.37)
    assert torch.isinf(lse[0, :2, [3, 20, T - 1]]).all()
    again = selection_backward_triton(q, k, v, idx, bs, do, o, scale=0.37)
    for a, b in zip(grads, again, strict=True):
        assert torch.equal(a, b)


def test_duplicate_blocks_in_one_tile_visited_once():
    """Tokens of one tile select the same blocks in different slots (G = 2: 8 tokens a tile):
    each block is visited once per tile."""
    # Tokens of one tile select the same blocks in different slots (G = 2: 8 tokens a tile).
    B, Hq, Hkv, T, D, bs = 1, 2, 1, 40, 32, 16
    rows = []
    for t in range(T):
        own = t // bs
        row = []
        for j in (own, own - 1 if t % 2 == 0 else 0, 0):
            row.append(j if j >= 0 and j not in row else -1)
        rows.append(row)
    idx = torch.tensor(rows, dtype=torch.int32)[None, None].contiguous()
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=9)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=10)[0]
    check_against_reference(q, k, v, idx, bs, do, tuning=tuned(tile_rows=16))


def test_tuning_reaches_every_entry_point(monkeypatch):
    """`tuning=` is honoured by the forward, the backward and selection_attention (seen in
    the temporaries they ask for: the block path's 5-D partials, the dk/dv partial buffer,
    whose length follows segment_chunks), and anything but an NsaTuning is refused."""
    shapes = []
    scratch_empty = _runtime.Scratch.empty

    def recording(self, shape, dtype, tensor=False):
        shapes.append(tuple(shape))
        return scratch_empty(self, shape, dtype, tensor)

    monkeypatch.setattr(_runtime.Scratch, "empty", recording)
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 40, 32, 16, 3
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=12)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=13)[0]
    idx = make_idx("random", B, Hkv, T, bs, S)
    ro, _, rgrads = reference(q, k, v, idx, bs, do)

    def run(**fields):
        shapes.clear()
        x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = selection_attention(*x, idx, bs, tuning=tuned(**fields))
        o.backward(do)
        assert rel_err(o, ro) < 1e-5
        for got, want in zip((t.grad for t in x), rgrads, strict=True):
            assert rel_err(got, want) < 1e-5
        partials = [sh for sh in shapes if len(sh) == 5 and sh[2] == S]
        dkdv_parts = [sh[1] for sh in shapes if len(sh) == 5 and sh[2] == 2]
        return partials, dkdv_parts

    assert run(schedule="blocks")[0] == [(B * Hkv, T, S, Hq // Hkv, D)]
    assert run(schedule="tile")[0] == []
    assert run(schedule="tile", segment_chunks=1)[1] != run(schedule="tile")[1]
    a = _args()
    for call in (
        lambda: selection_forward_triton(a["q"], a["k"], a["v"], a["block_idx"], 16, tuning=1),
        lambda: selection_backward_triton(**a, tuning={}),
        lambda: selection_attention(a["q"], a["k"], a["v"], a["block_idx"], 16, tuning="x"),
    ):
        with pytest.raises(TypeError, match="NsaTuning"):
            call()


def test_invert_block_idx():
    T, bs, S = 37, 16, 3
    idx = odd_block_idx(2, 2, T, bs, S, seed=11)
    row_ptr, col = invert_block_idx(idx, bs)
    NB = 3
    assert row_ptr.shape == (4, NB + 1) and col.shape == (4, T * S)
    for bh in range(4):
        b, h = divmod(bh, 2)
        for j in range(NB):
            got = col[bh, row_ptr[bh, j] : row_ptr[bh, j + 1]].tolist()
            want = [t for t in range(T) if j * bs <= t and j in idx[b, h, t].tolist()]
            assert got == want


def test_autograd_function_matches_reference():
    B, Hq, Hkv, T, D, bs, S = 1, 4, 1, 33, 32, 16, 3
    q, k, v = [x.requires_grad_() for x in qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=12)]
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=13)[0]
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu")
    o = selection_attention(q, k, v, idx, bs)
    o.backward(do)
    ro, _, rgrads = reference(q, k, v, idx, bs, do)
    assert rel_err(o, ro) < 1e-5
    for x, ref in zip((q, k, v), rgrads, strict=True):
        assert rel_err(x.grad, ref) < 1e-5


def test_autograd_backward_checks_only_do_and_takes_an_expanded_one(monkeypatch):
    """The autograd backward runs below the checks (its tensors are the checked forward's)
    and takes a non-contiguous do: the gradients equal the public backward's, bit for bit."""
    B, Hq, Hkv, T, D, bs, S = 1, 4, 2, 37, 32, 16, 3
    q, k, v = [x.requires_grad_() for x in qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=14)]
    idx = odd_block_idx(B, Hkv, T, bs, S, seed=15)
    do = torch.randn(B, Hq, T, 1, generator=torch.Generator().manual_seed(16)).expand(-1, -1, -1, D)
    o, lse = selection_forward_triton(q.detach(), k.detach(), v.detach(), idx, bs, return_lse=True)
    want = selection_backward_triton(
        q.detach(), k.detach(), v.detach(), idx, bs, do.contiguous(), o, lse
    )
    checks = []
    real = _checks.check_backward_args
    monkeypatch.setattr(_checks, "check_backward_args", lambda *a: checks.append(1) or real(*a))
    got = torch.autograd.grad(selection_attention(q, k, v, idx, bs), (q, k, v), do)
    assert checks == []
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def _args(dtype=torch.float32):
    q, k, v = qkv(1, 4, 2, 20, 32, dtype=dtype)
    idx = make_block_idx_recent(1, 2, 20, 16, 2, "cpu")
    return dict(q=q, k=k, v=v, block_idx=idx, block_size=16, do=q.clone(), o=q.clone())


BAD = [  # name, mutate(args), error, message fragment
    ("q 3-D", lambda a: a.update(q=a["q"][0]), ValueError, "q"),
    (
        "Hq % Hkv",
        lambda a: a.update(**{n: a[n][:, :1].repeat(1, 3, 1, 1) for n in "kv"}),
        ValueError,
        "multiple",
    ),  # fmt: skip
    ("v shape", lambda a: a.update(v=a["v"][:, :, :10]), ValueError, "v"),
    ("k T", lambda a: a.update(k=a["k"][:, :, :10].contiguous()), ValueError, "k"),
    ("idx shape", lambda a: a.update(block_idx=a["block_idx"][:, :1]), ValueError, "block_idx"),
    ("idx dtype", lambda a: a.update(block_idx=a["block_idx"].float()), TypeError, "block_idx"),
    ("q dtype", lambda a: a.update(q=a["q"].double()), TypeError, "q"),
    ("k dtype", lambda a: a.update(k=a["k"].half()), TypeError, "k"),
    ("D", lambda a: a.update(**{n: a[n][..., :16] for n in "qkv"}), ValueError, "head dim"),
    ("block_size 24", lambda a: a.update(block_size=24), ValueError, "block_size"),
    ("block_size 256", lambda a: a.update(block_size=256), ValueError, "block_size"),
    ("v strided", lambda a: a.update(v=a["v"].transpose(2, 3)), ValueError, "v"),
    (
        "q view",
        lambda a: a.update(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)),
        ValueError,
        "q",
    ),  # fmt: skip
    ("idx device", lambda a: a.update(block_idx=a["block_idx"].to("meta")), ValueError, "device"),
]
BAD_BWD = [
    ("do dtype", lambda a: a.update(do=a["do"].half()), TypeError, "do"),
    ("o shape", lambda a: a.update(o=a["o"][:, :2]), ValueError, "o"),
    (
        "lse dtype",
        lambda a: a.update(lse=torch.zeros(1, 4, 20, dtype=torch.float16)),
        TypeError,
        "lse",
    ),  # fmt: skip
    ("lse shape", lambda a: a.update(lse=torch.zeros(1, 4, 21)), ValueError, "lse"),
    ("do strided", lambda a: a.update(do=a["do"].transpose(2, 3)), ValueError, "do"),
]


@pytest.mark.parametrize("name,mutate,err,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_forward_and_backward(name, mutate, err, msg):
    a = _args()
    mutate(a)
    fwd = {n: a[n] for n in ("q", "k", "v", "block_idx", "block_size")}
    with pytest.raises(err, match=msg):
        selection_forward_triton(**fwd)
    with pytest.raises(err, match=msg):
        selection_backward_triton(**fwd, do=a["do"], o=a["o"])


@pytest.mark.parametrize("name,mutate,err,msg", BAD_BWD, ids=[b[0] for b in BAD_BWD])
def test_bad_inputs_backward_only(name, mutate, err, msg):
    a = _args()
    mutate(a)
    with pytest.raises(err, match=msg):
        selection_backward_triton(**a)


def test_cpu_tensors_need_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    a = _args()
    with pytest.raises(ValueError, match="CUDA"):
        selection_forward_triton(a["q"], a["k"], a["v"], a["block_idx"], 16)


def test_single_token():
    """T = 1: one visible key, so o = v, dv = sum over the group of do, dq = dk = 0."""
    q, k, v = qkv(2, 4, 2, 1, 32, dtype=torch.float32, seed=14)
    do = qkv(2, 4, 2, 1, 32, dtype=torch.float32, seed=15)[0]
    idx = make_block_idx_random(2, 2, 1, 16, 3, "cpu")
    o, lse = selection_forward_triton(q, k, v, idx, 16, return_lse=True)
    dq, dk, dv = selection_backward_triton(q, k, v, idx, 16, do, o)
    assert rel_err(o, v.repeat_interleave(2, dim=1)) < 1e-6
    ref_lse = (q * k.repeat_interleave(2, dim=1)).sum(-1) * 32**-0.5
    assert torch.allclose(lse, ref_lse, atol=1e-5)
    assert rel_err(dv, do.view(2, 2, 2, 1, 32).sum(2)) < 1e-6
    # Analytically zero; fp32 rounding of dP - delta leaves ~1e-7 * |do . v| per term.
    assert dq.abs().max() < 5e-6 and dk.abs().max() < 5e-6


def test_later_calls_take_their_temporaries_from_one_allocation(monkeypatch):
    """A key's first forward and backward allocate their temporaries one by one and record
    the layout; later calls carve them from one allocation each (`_runtime.Scratch`).
    Every allocation is poisoned (`_poison`); the block-major
    phase runs (schedule "blocks", so its lists, partials and row offsets are carved too)
    and the dk/dv lists are split. Both calls match the reference and each other bit for
    bit."""
    monkeypatch.setattr(_runtime, "_layouts", {})
    made = []

    def recording(shape, dtype, device):
        made.append(dtype)
        return _poison(shape, dtype, device)

    monkeypatch.setattr(_runtime, "new_buffer", recording)
    monkeypatch.setattr(_checks, "new_empty", recording)
    B, Hq, Hkv, T, D, bs, S = 1, 8, 2, 75, 32, 16, 3
    q, k, v = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=31)
    do = qkv(B, Hq, Hkv, T, D, dtype=torch.float32, seed=32)[0]
    idx = make_idx("odd", B, Hkv, T, bs, S)
    t = tuned(schedule="blocks", segment_chunks=1)
    first = check_against_reference(q, k, v, idx, bs, do, tuning=t)
    n_first, made[:] = len(made), []
    second = check_against_reference(q, k, v, idx, bs, do, tuning=t)
    # The forward's 7 buffers and the backward's 15 (delta, lse_lo, the dq kernel's 3, the
    # inversion's 10) in 2 allocations.
    assert len(made) == n_first - 20, (n_first, len(made))
    assert made.count(torch.uint8) == 2  # the forward's and the backward's
    for a, b in zip((*first[:2], *first[2]), (*second[:2], *second[2]), strict=True):
        assert torch.equal(a, b)
