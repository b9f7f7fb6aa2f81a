"""The backward's inverted index: which query positions kept each key block, on the device.

`invert_block_idx` turns block_idx [B, Hkv, T, S] into one CSR list per (b, kv head) and key
block: the positions t whose slots kept the block, ascending. The dk/dv kernel sums over a
block's list in list order, so the order is part of the result: it is fixed (tokens
ascending; with unique=False a repeat right after its first copy), whatever the launch
order. A deterministic counting sort in four steps, with no host sync and no torch op:

1. `_inv_sort_kernel`, one program per tile of TT consecutive tokens (TT * S slots, about
   `invert_tile_slots`): each slot gets the bucket of its kept block, NB when dropped (and,
   unique, when it repeats a block its token already kept), and the tile's slots are sorted
   in registers by (bucket, token). The sorted keys are stored for step 4, and the length of
   each bucket's run in HIST[bh, tile, bucket] (the program zeroes its own HIST row first).
2. `_inv_scan_kernel`: per (b, kv head) and bucket, the exclusive prefix sum of HIST over
   the tiles (in place: each tile's first place within the bucket) and the bucket's total.
3. `_row_ptr`, run by the last scan program of each (b, kv head) to finish (no launch of
   its own): ROW_PTR = exclusive prefix sum of the
   totals of buckets 0 .. NB - 1, so the dropped slots (bucket NB) come after every list.
   With SPLIT it also cuts each list into segments of at most SEG_LEN entries for the dk/dv
   kernel's load balance (see `backward.py`): SEG_START and PART_START, prefix sums of the
   segment counts max(1, cdiv(count, SEG_LEN)) and of those of split lists, and SEG_BLOCK,
   the block of every segment id (NB past the last).
4. `_inv_fill_kernel`, per tile again: a sorted slot's place is ROW_PTR[bucket] + its
   tile's first place in the bucket + its rank in the tile's run; COL[place] = its token.

Memory: the sorted keys (T * S rounded up per tile) and HIST, cdiv(T, TT) * (NB + 1) int32
per (b, kv head): 4.2 MB in all at the seed shape (Hkv = 4, block_size 64, S 16) at
T = 32768, growing as T^2 / (TT * block_size).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _runtime
from . import _checks
from .tiles import _kept, _max_op
from .tuning import resolve


@triton.jit
def _inv_sort_kernel(
    IDX, KEYS, HIST, DONE, T, NB,
    S: tl.constexpr, BS: tl.constexpr, TT: tl.constexpr, L_PAD: tl.constexpr,
    ZB: tl.constexpr, UNIQUE: tl.constexpr, KEY64: tl.constexpr,
):  # fmt: skip
    """Step 1 for one tile: KEYS[bh, tile, :] = the tile's slots sorted by key bucket * TT +
    token in tile (bucket NB: dropped; NB + 1: padding lanes past the tile or past T), and
    HIST[bh, tile, bucket] = the bucket's slot count in the tile, for buckets 0 .. NB.
    The first tile's program also sets DONE[bh] = -1 (the scan kernel's count)."""
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    n_tiles = tl.num_programs(0)
    if pid_t == 0:
        tl.store(DONE + i_bh, -1)
    p_hist = HIST + (i_bh.to(tl.int64) * n_tiles + pid_t) * (NB + 1)
    b0 = 0
    while b0 <= NB:  # a `while`: the interpreter cannot take `range` over an argument
        i_b = b0 + tl.arange(0, ZB)
        tl.store(p_hist + i_b, tl.zeros([ZB], tl.int32), mask=i_b <= NB)
        b0 += ZB
    # The counts below are stored by other threads than the zeros of their bucket.
    tl.debug_barrier()
    i_e = tl.arange(0, L_PAD)
    i_tok = i_e // S
    i_t = pid_t * TT + i_tok
    ok = (i_e < TT * S) & (i_t < T)
    b_j = tl.load(IDX + i_bh.to(tl.int64) * T * S + pid_t * TT * S + i_e, mask=ok, other=-1)
    b_bkt = tl.where(ok, tl.where(_kept(b_j, i_t, T, NB, BS), b_j, NB), NB + 1).to(tl.int32)
    if KEY64:
        b_key = tl.sort(b_bkt.to(tl.int64) * TT + i_tok)
    else:
        b_key = tl.sort(b_bkt * TT + i_tok)
    if UNIQUE:
        # Equal keys are one token naming one block twice: all but the first are dropped.
        b_prev = tl.gather(b_key, tl.maximum(i_e - 1, 0), 0)
        rep = (i_e > 0) & (b_key == b_prev) & (b_key // TT < NB)
        b_key = tl.sort(tl.where(rep, (b_key * 0 + NB) * TT + b_key % TT, b_key))
    b_bkt = (b_key // TT).to(tl.int32)
    nxt = tl.gather(b_bkt, tl.minimum(i_e + 1, L_PAD - 1), 0)
    last = ((i_e == L_PAD - 1) | (b_bkt != nxt)) & (b_bkt <= NB)
    first = (i_e == 0) | (b_bkt != tl.gather(b_bkt, tl.maximum(i_e - 1, 0), 0))
    start = tl.associative_scan(tl.where(first, i_e, 0), 0, _max_op)
    tl.store(p_hist + b_bkt, i_e - start + 1, mask=last)
    tl.store(KEYS + (i_bh.to(tl.int64) * n_tiles + pid_t) * L_PAD + i_e, b_key)


@triton.jit
def _inv_scan_kernel(
    HIST, TOTAL, DONE, ROW_PTR, SEG_BLOCK, SEG_START, PART_START, NB, N_TILES, NSEG, SEG_LEN,
    JB: tl.constexpr, TB: tl.constexpr, PB: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Step 2 for buckets pid * JB .. + JB - 1 of one (b, kv head): HIST[bh, tile, bucket]
    becomes the bucket's count in the tiles before it; TOTAL[bh, bucket] its count in all.
    The last of the (b, kv head)'s programs to finish, counted on DONE[bh] (from -1, as
    the sort kernel leaves it), also runs step 3 (`_row_ptr`) on the finished TOTAL row, so
    that step 3 needs no launch of its own: every program's TOTAL stores come before its
    count (a barrier, then a release), and the last one's acquire sees them all."""
    i_bh = tl.program_id(1)
    i_b = tl.program_id(0) * JB + tl.arange(0, JB)
    p_hist = HIST + i_bh.to(tl.int64) * N_TILES * (NB + 1) + i_b[None, :]
    carry = tl.zeros([JB], tl.int32)
    t0 = 0
    while t0 < N_TILES:
        i_c = t0 + tl.arange(0, TB)
        mask = (i_c < N_TILES)[:, None] & (i_b <= NB)[None, :]
        p = p_hist + i_c[:, None].to(tl.int64) * (NB + 1)
        b_n = tl.load(p, mask=mask, other=0)
        tl.store(p, carry[None, :] + tl.cumsum(b_n, 0) - b_n, mask=mask)
        carry += tl.sum(b_n, 0)
        t0 += TB
    tl.store(TOTAL + i_bh.to(tl.int64) * (NB + 1) + i_b, carry, mask=i_b <= NB)
    tl.debug_barrier()  # every lane's TOTAL stores before the release below
    if tl.atomic_add(DONE + i_bh, 1, sem="acq_rel") == tl.num_programs(0) - 2:
        _row_ptr(
            TOTAL, ROW_PTR, SEG_BLOCK, SEG_START, PART_START, i_bh, NB, NSEG, SEG_LEN, PB, SPLIT
        )  # fmt: skip


@triton.jit
def _row_ptr(
    TOTAL, ROW_PTR, SEG_BLOCK, SEG_START, PART_START, i_bh, NB, NSEG, SEG_LEN,
    PB: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Step 3 for (b, kv head) i_bh: ROW_PTR, and with SPLIT the segments (module doc).
    TOTAL is read past L1: other programs of the scan kernel wrote it."""
    o_row = i_bh.to(tl.int64) * (NB + 1)
    p_seg = SEG_BLOCK + i_bh.to(tl.int64) * NSEG
    entries = tl.full([], 0, tl.int32)
    segs = tl.full([], 0, tl.int32)
    parts = tl.full([], 0, tl.int32)
    j0 = 0
    while j0 <= NB:
        i_j = j0 + tl.arange(0, PB)
        b_n = tl.load(TOTAL + o_row + i_j, mask=i_j < NB, other=0, cache_modifier=".cg")
        tl.store(ROW_PTR + o_row + i_j, entries + tl.cumsum(b_n, 0) - b_n, mask=i_j <= NB)
        entries += tl.sum(b_n, 0)
        if SPLIT:
            # Every block gets a segment, so that blocks nobody chose still get their zeros.
            b_seg = tl.where(i_j < NB, tl.maximum(tl.cdiv(b_n, SEG_LEN), 1), 0)
            b_first = segs + tl.cumsum(b_seg, 0) - b_seg
            tl.store(SEG_START + o_row + i_j, b_first, mask=i_j <= NB)
            b_part = tl.where(b_seg > 1, b_seg, 0)
            tl.store(
                PART_START + o_row + i_j, parts + tl.cumsum(b_part, 0) - b_part, mask=i_j <= NB
            )
            r = 0
            while r < tl.max(b_seg, 0):
                tl.store(p_seg + b_first + r, i_j, mask=r < b_seg)
                r += 1
            segs += tl.sum(b_seg, 0)
            parts += tl.sum(b_part, 0)
        j0 += PB
    if SPLIT:
        s0 = segs
        while s0 < NSEG:
            i_s = s0 + tl.arange(0, PB)
            tl.store(p_seg + i_s, tl.full([PB], 0, tl.int32) + NB, mask=i_s < NSEG)
            s0 += PB


@triton.jit
def _inv_fill_kernel(
    KEYS, HIST, ROW_PTR, COL, T, NB,
    S: tl.constexpr, TT: tl.constexpr, L_PAD: tl.constexpr,
):  # fmt: skip
    """Step 4 for one tile: COL[bh, place] = token of each of the tile's sorted slots."""
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    n_tiles = tl.num_programs(0)
    i_e = tl.arange(0, L_PAD)
    b_key = tl.load(KEYS + (i_bh.to(tl.int64) * n_tiles + pid_t) * L_PAD + i_e)
    b_bkt = (b_key // TT).to(tl.int32)
    i_t = pid_t * TT + (b_key % TT).to(tl.int32)
    first = (i_e == 0) | (b_bkt != tl.gather(b_bkt, tl.maximum(i_e - 1, 0), 0))
    start = tl.associative_scan(tl.where(first, i_e, 0), 0, _max_op)
    real = b_bkt <= NB
    b_base = tl.load(ROW_PTR + i_bh.to(tl.int64) * (NB + 1) + b_bkt, mask=real, other=0)
    p_hist = HIST + (i_bh.to(tl.int64) * n_tiles + pid_t) * (NB + 1) + b_bkt
    place = b_base + tl.load(p_hist, mask=real, other=0) + i_e - start
    tl.store(COL + i_bh.to(tl.int64) * T * S + place, i_t, mask=real)


class _InversePlan(NamedTuple):
    """The buffers and launches of `inverted_lists`, from sizes and tuning alone."""

    keys_shape: tuple
    keys_dtype: torch.dtype
    hist_shape: tuple
    row_shape: tuple  # [BH, NB + 1]
    seg_shape: tuple
    col_shape: tuple
    n_part: int
    tile_grid: tuple  # the sort's and the fill's
    sort_args: tuple  # scalar arguments
    sort_options: dict  # constexprs and launch options
    scan_grid: tuple
    scan_args: tuple
    scan_options: dict
    fill_args: tuple
    fill_options: dict


def segment_sizes(T, S, NB, seg_len):
    """(NSEG, n_part) of `inverted_lists` with segments of seg_len entries: NB + T * S //
    seg_len bounds the segments (every block's first one, plus one per seg_len entries of
    the T * S), and a split list (count > seg_len) needs cdiv(count, seg_len) < 2 * count /
    seg_len partial slots, so max(1, 2 * T * S // seg_len) hold them all."""
    return NB + T * S // seg_len, max(1, 2 * T * S // seg_len)


def _inverse_plan(shape, block_size, unique, seg_len, tuning):
    t, direct = tuning.backward, tuning.direct_launch
    B, Hkv, T, S = shape
    NB = _runtime.cdiv(T, block_size)
    BH = B * Hkv
    tt = max(1, min(t.invert_tile_slots // S, T))  # no wider than the row
    n_tiles = _runtime.cdiv(T, tt)
    l_pad = _runtime.next_pow2(tt * S)
    key64 = (NB + 2) * tt > 2**31 - 1
    n_seg, n_part = (0, 0) if seg_len is None else segment_sizes(T, S, NB, seg_len)
    jb = t.invert_scan_buckets
    return _InversePlan(
        (BH, n_tiles * l_pad), torch.int64 if key64 else torch.int32, (BH, n_tiles, NB + 1),
        (BH, NB + 1), (BH, n_seg), (BH, T * S),
        n_part,
        (n_tiles, BH),
        (T, NB),
        dict(S=S, BS=block_size, TT=tt, L_PAD=l_pad, ZB=t.invert_prefix_block, UNIQUE=unique,
             KEY64=key64, direct=direct, num_warps=t.invert_warps),
        (_runtime.cdiv(NB + 1, jb), BH),
        (NB, n_tiles, n_seg, seg_len or 1),
        dict(JB=jb, TB=t.invert_scan_tiles, PB=t.invert_prefix_block, SPLIT=seg_len is not None,
             direct=direct, num_warps=4),
        (T, NB),
        dict(S=S, TT=tt, L_PAD=l_pad, direct=direct, num_warps=t.invert_warps),
    )  # fmt: skip


def inverted_lists(
    block_idx, block_size, unique=True, seg_len=None, tuning=None, call=None, scratch=None
):
    """(row_ptr, col, segments) of block_idx's inverse (module doc); segments is None
    unless seg_len is given, else (seg_block, seg_start, part_start, n_part) as
    backward.py's dk/dv kernels read them:
    seg_block int32 [BH, NSEG] (NSEG = NB + T * S // seg_len, which bounds the segments),
    seg_start and part_start int32 [BH, NB + 1], and n_part = max(1, 2 * T * S // seg_len)
    partial slots per (b, kv head) (`segment_sizes`). block_idx: checked by the caller;
    call: the calling wrapper's `_runtime.Call`, or None (launched on their own); scratch:
    its `_runtime.Scratch`, which every buffer comes from, or None (their own
    allocations)."""
    tuning = resolve(tuning)
    dev = block_idx.device
    if call is None:
        call = _runtime.Call(None, dev)
    p = _runtime.per_key(
        call.key, dev, _inverse_plan, tuple(block_idx.shape), block_size, unique, seg_len, tuning
    )  # fmt: skip
    new = (scratch or _runtime.Scratch(dev)).empty
    keys = new(p.keys_shape, p.keys_dtype)
    hist = new(p.hist_shape, torch.int32)
    total = new(p.row_shape, torch.int32)
    row_ptr = new(p.row_shape, torch.int32)
    done = new(p.row_shape[:1], torch.int32)  # the scan's count
    call.launch(
        _inv_sort_kernel, p.tile_grid, (block_idx, keys, hist, done, *p.sort_args),
        p.sort_options,
    )  # fmt: skip
    segments = None
    if seg_len is None:
        seg_block = seg_start = part_start = row_ptr  # not written (SPLIT off)
    else:
        seg_block = new(p.seg_shape, torch.int32)
        seg_start = new(p.row_shape, torch.int32)
        part_start = new(p.row_shape, torch.int32)
        segments = (seg_block, seg_start, part_start, p.n_part)
    call.launch(
        _inv_scan_kernel, p.scan_grid,
        (hist, total, done, row_ptr, seg_block, seg_start, part_start, *p.scan_args),
        p.scan_options,
    )  # fmt: skip
    col = new(p.col_shape, torch.int32)
    call.launch(
        _inv_fill_kernel, p.tile_grid, (keys, hist, row_ptr, col, *p.fill_args), p.fill_options
    )  # fmt: skip
    return row_ptr, col, segments


def invert_block_idx(block_idx, block_size, unique=True, tuning=None):
    """CSR inverse of block_idx: which query positions kept each key block.

    Args:
        block_idx: [B, Hkv, T, S] int32/int64, contiguous.
        block_size: keys per block.
        unique: a block repeated in one token's slots is listed once for that token, as the
            selection counts it once. With unique=False a repeat stays in the list, right
            after its first copy (the same position twice in a row): the backward's dk/dv
            kernel skips such entries.
        tuning: an `NsaTuning` (None: the default); its backward.invert_* settings apply.
    Returns:
        row_ptr: int32 [B * Hkv, NB + 1]; the queries of block j of (b, h) are
            col[b * Hkv + h, row_ptr[., j] : row_ptr[., j + 1]].
        col: int32 [B * Hkv, T * S] query positions, ascending within each block; entries
            past row_ptr[., NB] are the dropped slots' positions (with unique, the repeats'
            too), ascending.
    Three kernel launches (module doc), no host sync; the result does not depend on the
    launch order.
    """
    _checks.check_block_idx_arg(block_idx, block_size)
    row_ptr, col, _ = inverted_lists(block_idx, block_size, unique=unique, tuning=tuning)
    return row_ptr, col
