"""Triton backward of NSA selection attention: dq by gather, dk/dv by an inverted index.

With P = exp(s - lse) recomputed from q, k and the forward's lse, and delta = rowsum(o * do):
dS = P * (do v^T - delta), dq = scale * dS k, dk = scale * dS^T q, dv = P^T do.

* dq kernel: the forward's tiling and block loop (a tile of BLOCK_T tokens x G heads per
  program, each kept block visited once per tile; `tuning.BackwardTuning` dq_rows, dq_warps,
  dq_stages and the forward's tile lists). It also computes delta for its rows from o and do and stores it
  (fp32 [B, Hq, T]) for the dk/dv kernel, so no separate pass over o and do is needed.
* dk/dv without float atomics: block_idx is inverted into a per-(b, kv head, key block) CSR
  list of the query positions that kept the block, tokens ascending (`inverse.py`: a
  deterministic counting sort in three launches, no host sync).
  A program owns dk/dv of one key block and loops over its list in chunks of BLOCK_Q tokens x
  G heads, gathering their q, do, lse, delta and lo rows. Load balance: a block chosen by many
  queries (block 0 of the 'random' pattern is chosen by all of them) would be one long serial
  program, so each list is cut into segments of segment_chunks * BLOCK_Q entries, one program
  per segment. A block with one segment (the common case) writes dk/dv directly; the segments
  of a longer list write fp32 partials that a small kernel then adds in segment order (not
  launched where T * S entries fit one segment, so that no list can be split). The grid
  is a static bound on the number of segments (NB + T * S / segment length; spare programs
  exit; the inversion's last kernels write the segments), so nothing syncs the host.
  Every sum runs in a fixed order, so dk/dv are bitwise deterministic (no float atomics),
  and each key row is written exactly once (blocks nobody chose get zeros).
  Memory: the lists (O(T * S)) and the inversion's per-tile counts (`inverse.py`), plus the
  partial buffer of at most 2 * T * S / segment length tiles of [2, block_size, D] fp32 per
  (b, kv head).

Precision at large logits (fp32 inputs; `renormalise`): an fp32 lse near 100 carries an absolute error of ~1e-5, and
exp(s - lse) carries it as a relative error shared by the whole row. The dq kernel, which
visits all of a row's keys, also sums its recomputed P' = exp2(s - lse) to r and
renormalises (dq = dq' / r); it stores lo = log2(r) per row (fp32 [B, Hq, T]), and the
dk/dv kernel uses exp2((s - lse) - lo), the same normalised P, as long as it recomputes the
same scores (the GPU's IEEE fp32 dot does: one FMA chain per element, whatever the tile
shape).

Masked keys take no part in another row's gradient, whatever their values (the spec's sums
run over visible keys only). Products run over whole blocks, where a key hidden from a row
has P = dS = 0, and 0 * NaN = NaN:
* dq kernel: keys after the tile's last token (and past T) are loaded as 0. A non-finite v
  at a key hidden from a row makes the row's dS = 0 * (NaN - delta) there, and a
  non-finite k anywhere in the block makes dS k (a sum over the block's keys) NaN on every
  row. When the plain pass leaves a non-finite dq on a row of the tile, a second launch
  redoes that tile with dS selected on the visible keys and k's non-finite entries as 0
  (SAFE); clean inputs pay one check per tile and the second launch's early exits.
* dk/dv kernel: dk = dS^T q and dv = P^T do sum over query rows; P is selected on the
  visible keys, and a non-finite delta (a row that sees a non-finite key or value) enters
  as 0, so such a row cannot reach, through dS = 0 * (dp - delta), keys it cannot see.
The gradients of a row that sees a non-finite key or value, of the keys that row sees, and
of the non-finite key or value itself, are unspecified (typically NaN).

A block repeated in a row's slots counts once, as in the dense reference: the dq kernel
visits each block once per tile (a row selected it or not), and the dk/dv kernel skips a
list entry equal to the one before it (`invert_block_idx(unique=False)` leaves a repeat
right after its first copy; that costs one load per entry instead of a sort per token).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _runtime
from . import _checks
from .forward import checked_forward
from .inverse import inverted_lists, segment_sizes
from .tiles import (
    LOG2E,
    _tile_rows,
    _tile_slots,
    tile_block_lists,
    tile_config,
    use_for_loop,
)
from .tuning import resolve


@triton.jit
def _nonfinite_in(b_x, rows):
    """Whether b_x ([R, C] fp32) holds an inf or NaN in a row where `rows` ([R] bool) holds
    (NaN fails every comparison, so `abs < inf` is false for both)."""
    bad = (tl.abs(b_x) < float("inf")) == 0
    return tl.max((bad & rows[:, None]).to(tl.int32)) > 0


@triton.jit
def _finite_or_0(b_x):
    """b_x with every inf and NaN replaced by 0 (same dtype)."""
    return tl.where(tl.abs(b_x.to(tl.float32)) < float("inf"), b_x, tl.zeros_like(b_x))


@triton.jit
def _dq_block(
    K, V, p_kv, j, b_q, b_do, b_lse, b_delta, b_j, i_t, row_ok, b_dq, b_r, t_last, qk_scale,
    D: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr, SAFE: tl.constexpr,
    RENORM: tl.constexpr,
):  # fmt: skip
    """Key block j's share of the tile: returns (b_dq + dS' k, b_r + rowsum P'), where
    P' = exp2(s - lse) and dS' = P' (dp - delta) are not yet renormalised (see the kernel).
    t_last: the tile's last token (< T). SAFE: the masked-key pass (see the kernel).
    RENORM: accumulate r (otherwise b_r is returned unchanged)."""
    i_d = tl.arange(0, D)
    i_k = j * BS + tl.arange(0, BS)
    # Keys after the tile's last token, and past T, are seen by no row: read as 0.
    k_ok = (i_k <= t_last)[:, None]
    b_k = tl.load(K + p_kv + i_k[:, None] * D + i_d[None, :], mask=k_ok, other=0.0)
    b_v = tl.load(V + p_kv + i_k[:, None] * D + i_d[None, :], mask=k_ok, other=0.0)
    sel = (tl.sum((b_j == j).to(tl.int32), axis=1) > 0) & row_ok
    vis = sel[:, None] & (i_k[None, :] <= i_t[:, None])
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
    b_p = tl.exp2(tl.where(vis, b_s - b_lse[:, None], float("-inf")))
    if RENORM:
        b_r += tl.sum(b_p, axis=1)
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
    b_ds = b_p * (b_dp - b_delta[:, None])
    if SAFE:
        # dS selected on the visible keys (dp of a hidden key may be NaN, from v), and k's
        # non-finite entries as 0 in dS k, which sums over every key of the block for every
        # row (0 * NaN = NaN). A row that sees such a key has a non-finite P or dp there.
        b_ds = tl.where(vis, b_ds, 0.0)
        b_k = _finite_or_0(b_k)
    return tl.dot(b_ds.to(b_k.dtype), b_k, b_dq, input_precision=PREC), b_r


@triton.jit
def _dq_tile(
    K, V, LIST, COUNT, pid_t, i_bh, p_kv, b_q, b_do, b_lse, b_delta, b_j, i_t,
    row_ok, t_last, qk_scale, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, SAFE: tl.constexpr, RENORM: tl.constexpr,
):  # fmt: skip
    """The tile's loop over the COUNT blocks of its LIST: returns (dq' unscaled, rowsum P')."""
    b_dq = tl.zeros([BLOCK_R, D], tl.float32)
    b_r = tl.zeros([BLOCK_R], tl.float32)
    o_tile = i_bh.to(tl.int64) * tl.num_programs(0) + pid_t
    p_list = LIST + o_tile * BLOCK_T * S
    n = tl.load(COUNT + o_tile)
    if FOR_LOOP:
        for i in range(0, n):
            j = tl.load(p_list + i)
            b_dq, b_r = _dq_block(
                K, V, p_kv, j, b_q, b_do, b_lse, b_delta, b_j, i_t, row_ok, b_dq, b_r,
                t_last, qk_scale, D, BS, PREC, SAFE, RENORM,
            )  # fmt: skip
    else:
        i = 0
        while i < n:
            j = tl.load(p_list + i)
            b_dq, b_r = _dq_block(
                K, V, p_kv, j, b_q, b_do, b_lse, b_delta, b_j, i_t, row_ok, b_dq, b_r,
                t_last, qk_scale, D, BS, PREC, SAFE, RENORM,
            )  # fmt: skip
            i += 1
    return b_dq, b_r


@triton.jit
def _sel_bwd_dq_tile(
    Q, K, V, IDX, LIST, COUNT, O, DO, LSE, DELTA, LSE_LO, DQ, FLAG, pid_t, i_bh, o_tile,
    T, NB, Hq, G, qk_scale, scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, SAFE: tl.constexpr, RENORM: tl.constexpr,
):  # fmt: skip
    Hkv = Hq // G
    i_b = i_bh // Hkv
    i_h = i_bh % Hkv
    i_t, i_g, row_ok = _tile_rows(pid_t, T, G, BLOCK_T, BLOCK_G)
    i_d = tl.arange(0, D)
    o_row = ((i_b * Hq + i_h * G + i_g).to(tl.int64) * T + i_t) * D
    p_idx = IDX + i_bh.to(tl.int64) * T * S
    p_kv = i_bh.to(tl.int64) * T * D
    p_rows = o_row[:, None] + i_d[None, :]
    b_q = tl.load(Q + p_rows, mask=row_ok[:, None], other=0.0)
    b_do = tl.load(DO + p_rows, mask=row_ok[:, None], other=0.0)
    b_o = tl.load(O + p_rows, mask=row_ok[:, None], other=0.0)
    b_delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), axis=1)
    tl.store(DELTA + o_row // D, b_delta, mask=row_ok)
    # lse in base 2; rows without keys (-inf) are never visible, a finite stand-in avoids inf.
    b_lse = tl.load(LSE + o_row // D, mask=row_ok, other=0.0) * 1.4426950408889634
    b_lse = tl.where(b_lse == float("-inf"), 0.0, b_lse)
    b_j = _tile_slots(p_idx, i_t, T, NB, S, BS, S_PAD)
    t_last = tl.minimum(pid_t * BLOCK_T + BLOCK_T - 1, T - 1)
    b_dq, b_r = _dq_tile(
        K, V, LIST, COUNT, pid_t, i_bh, p_kv, b_q, b_do, b_lse, b_delta, b_j, i_t,
        row_ok, t_last, qk_scale, S, D, BS, BLOCK_T, BLOCK_T * BLOCK_G, PREC,
        FOR_LOOP, SAFE, RENORM,
    )  # fmt: skip
    if not SAFE:
        tl.store(FLAG + o_tile, _nonfinite_in(b_dq, row_ok).to(tl.int32))
    # Renormalise (RENORM): P' = exp2(s - lse) sums to r = 2^-e instead of 1 when the
    # forward's lse is off by e (an fp32 lse near 100 carries an error of ~1e-5, and |s| that
    # large is where it shows). dS is linear in P, so dq = dq' / r; lo = log2(r) lets the
    # dk/dv kernel use exp2((s - lse) - lo), the same normalised P, without folding lo into
    # lse (that sum would round back to lse's precision).
    if RENORM:
        has_key = b_r > 0
        b_r = tl.where(has_key, b_r, 1.0)
        tl.store(LSE_LO + o_row // D, tl.log2(b_r), mask=row_ok)
        b_dq = b_dq * (scale / b_r)[:, None]
    else:
        b_dq = b_dq * scale
    tl.store(DQ + p_rows, b_dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _sel_bwd_dq_kernel(
    Q, K, V, IDX, LIST, COUNT, O, DO, LSE, DELTA, LSE_LO, DQ, FLAG,
    T, NB, Hq, G, qk_scale, scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, SAFE: tl.constexpr, RENORM: tl.constexpr,
):  # fmt: skip
    """dq, delta and (RENORM) lo of one token tile.

    Masked keys: dS = P (dp - delta) and dS k run over whole blocks, where a key hidden from
    a row (another token's selection, or the row's future) has P = dS = 0, and a non-finite
    k or v there would make that row NaN (0 * NaN). The plain launch (SAFE=False) has no
    guard and sets FLAG[tile] when it leaves a non-finite dq on a row; the SAFE launch
    redoes only the flagged tiles, with the guards. Two launches rather than a second loop
    in one kernel: the guarded loop's registers would count against every plain tile.
    """
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    o_tile = i_bh.to(tl.int64) * tl.num_programs(0) + pid_t
    todo = True
    if SAFE:
        todo = tl.load(FLAG + o_tile) != 0
    if todo:
        _sel_bwd_dq_tile(
            Q, K, V, IDX, LIST, COUNT, O, DO, LSE, DELTA, LSE_LO, DQ, FLAG, pid_t, i_bh, o_tile,
            T, NB, Hq, G, qk_scale, scale, S, D, BS, S_PAD, BLOCK_T, BLOCK_G, PREC, FOR_LOOP,
            SAFE, RENORM,
        )  # fmt: skip


@triton.jit
def _dkdv_chunk(
    Q, DO, LSE, DELTA, LSE_LO, p_col, c, first, end, o_head, b_k, b_v, i_k, b_dk, b_dv,
    qk_scale, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, G,
    PREC: tl.constexpr, RENORM: tl.constexpr,
):  # fmt: skip
    """dk/dv contributions of list entries c .. c + BLOCK_Q - 1 (x G heads) to one key block
    whose list starts at entry `first`. An entry equal to the one before it in the list is a
    block repeated in that token's slots, and is skipped: it counts once."""
    # Row r of a chunk: head r % BLOCK_G of the (r // BLOCK_G)-th listed query position.
    i_r = tl.arange(0, BLOCK_Q * BLOCK_G)
    i_g = i_r % BLOCK_G
    i_d = tl.arange(0, D)
    i_e = c + i_r // BLOCK_G
    row_ok = (i_e < end) & (i_g < G)
    i_t = tl.load(p_col + i_e, mask=row_ok, other=0)
    i_prev = tl.load(p_col + i_e - 1, mask=row_ok & (i_e > first), other=-1)
    row_ok = row_ok & (i_t != i_prev)
    o_row = o_head + i_t
    p_rows = o_row[:, None] * D + i_d[None, :]
    b_q = tl.load(Q + p_rows, mask=row_ok[:, None], other=0.0)
    b_do = tl.load(DO + p_rows, mask=row_ok[:, None], other=0.0)
    # lse in base 2 exactly as the dq kernel computed it, then (RENORM) its renormalisation.
    b_lse = tl.load(LSE + o_row, mask=row_ok, other=0.0) * 1.4426950408889634
    # A row that sees a non-finite key or value may have a non-finite delta (its o), which
    # would reach the keys it cannot see through dS = 0 * (dp - delta); as 0 it reaches none
    # (the gradients of that row and of the keys it sees are unspecified anyway).
    b_delta = _finite_or_0(tl.load(DELTA + o_row, mask=row_ok, other=0.0))
    vis = row_ok[:, None] & (i_k[None, :] <= i_t[:, None])
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
    b_x = b_s - b_lse[:, None]
    if RENORM:  # subtracted after lse, not folded into it (the sum would round to lse's ulp)
        b_x -= tl.load(LSE_LO + o_row, mask=row_ok, other=0.0)[:, None]
    b_p = tl.exp2(tl.where(vis, b_x, float("-inf")))
    b_dv += tl.dot(tl.trans(b_p.to(b_do.dtype)), b_do, input_precision=PREC)
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
    # dp of a non-finite v reaches, through dS, only dk of that key itself.
    b_ds = b_p * (b_dp - b_delta[:, None])
    b_dk += tl.dot(tl.trans(b_ds.to(b_q.dtype)), b_q, input_precision=PREC)
    return b_dk, b_dv


@triton.jit
def _sel_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, LSE_LO, ROW_PTR, COL, SEG_BLOCK, SEG_START, PART_START, PART, DK, DV,
    T, NB, NSEG, NPART, SEG_LEN, Hq, G, qk_scale, scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr, FOR_LOOP: tl.constexpr,
    RENORM: tl.constexpr,
):  # fmt: skip
    i_seg = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_blk = tl.load(SEG_BLOCK + i_bh.to(tl.int64) * NSEG + i_seg)
    if i_blk < NB:  # the grid is a static upper bound on the number of segments
        Hkv = Hq // G
        i_b = i_bh // Hkv
        i_h = i_bh % Hkv
        i_d = tl.arange(0, D)
        i_k = i_blk * BS + tl.arange(0, BS)
        k_ok = (i_k < T)[:, None]
        p_kv = i_bh.to(tl.int64) * T * D + i_k[:, None] * D + i_d[None, :]
        b_k = tl.load(K + p_kv, mask=k_ok, other=0.0)
        b_v = tl.load(V + p_kv, mask=k_ok, other=0.0)
        o_blk = i_bh.to(tl.int64) * (NB + 1) + i_blk
        seg0 = tl.load(SEG_START + o_blk)
        n_seg = tl.load(SEG_START + o_blk + 1) - seg0
        # This program's share of the block's query list: SEG_LEN entries from `start`.
        first = tl.load(ROW_PTR + o_blk)
        start = first + (i_seg - seg0) * SEG_LEN
        end = tl.minimum(start + SEG_LEN, tl.load(ROW_PTR + o_blk + 1))
        p_col = COL + i_bh.to(tl.int64) * T * S
        o_head = (i_b * Hq + i_h * G + tl.arange(0, BLOCK_Q * BLOCK_G) % BLOCK_G).to(tl.int64) * T

        b_dk = tl.zeros([BS, D], tl.float32)
        b_dv = tl.zeros([BS, D], tl.float32)
        if FOR_LOOP:
            for c in range(start, end, BLOCK_Q):
                b_dk, b_dv = _dkdv_chunk(
                    Q, DO, LSE, DELTA, LSE_LO, p_col, c, first, end, o_head, b_k, b_v, i_k,
                    b_dk, b_dv, qk_scale, D, BLOCK_Q, BLOCK_G, G, PREC, RENORM,
                )  # fmt: skip
        else:
            c = start
            while c < end:
                b_dk, b_dv = _dkdv_chunk(
                    Q, DO, LSE, DELTA, LSE_LO, p_col, c, first, end, o_head, b_k, b_v, i_k,
                    b_dk, b_dv, qk_scale, D, BLOCK_Q, BLOCK_G, G, PREC, RENORM,
                )  # fmt: skip
                c += BLOCK_Q
        if n_seg == 1:
            tl.store(DK + p_kv, (b_dk * scale).to(DK.dtype.element_ty), mask=k_ok)
            tl.store(DV + p_kv, b_dv.to(DV.dtype.element_ty), mask=k_ok)
        else:  # a long list: fp32 partial sums, added in segment order by _sel_bwd_reduce_kernel
            slot = tl.load(PART_START + o_blk) + i_seg - seg0
            o_tile = tl.arange(0, BS)[:, None] * D + i_d[None, :]
            p_part = PART + (i_bh.to(tl.int64) * NPART + slot) * 2 * BS * D + o_tile
            tl.store(p_part, b_dk)
            tl.store(p_part + BS * D, b_dv)


@triton.jit
def _sel_bwd_reduce_kernel(
    SEG_START, PART_START, PART, DK, DV, T, NB, NPART, scale,
    D: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    """dk/dv of blocks whose list was split: sum the segments' partials in a fixed order."""
    i_blk = tl.program_id(0)
    i_bh = tl.program_id(1)
    o_blk = i_bh.to(tl.int64) * (NB + 1) + i_blk
    n_seg = tl.load(SEG_START + o_blk + 1) - tl.load(SEG_START + o_blk)
    if n_seg > 1:
        i_d = tl.arange(0, D)
        i_k = i_blk * BS + tl.arange(0, BS)
        k_ok = (i_k < T)[:, None]
        p_kv = i_bh.to(tl.int64) * T * D + i_k[:, None] * D + i_d[None, :]
        slot = tl.load(PART_START + o_blk)
        o_tile = tl.arange(0, BS)[:, None] * D + i_d[None, :]
        b_dk = tl.zeros([BS, D], tl.float32)
        b_dv = tl.zeros([BS, D], tl.float32)
        r = 0
        while r < n_seg:
            p_part = PART + (i_bh.to(tl.int64) * NPART + slot + r) * 2 * BS * D + o_tile
            b_dk += tl.load(p_part)
            b_dv += tl.load(p_part + BS * D)
            r += 1
        tl.store(DK + p_kv, (b_dk * scale).to(DK.dtype.element_ty), mask=k_ok)
        tl.store(DV + p_kv, b_dv.to(DV.dtype.element_ty), mask=k_ok)


def renormalise(dtype):
    """Whether the backward renormalises the recomputed P (dq kernel: r and lo; dk/dv: lo):
    for fp32 inputs, whose gradients are held to ~1e-5 and where lse's own rounding shows at
    large logits. 16-bit inputs round P to 8 or 11 bits in the products, far coarser than
    lse's error, and skip it."""
    return dtype == torch.float32


class _BackwardPlan(NamedTuple):
    """What one backward call launches, from its sizes, dtype and tuning alone
    (`_backward_plan`; computed once per launch key)."""

    renorm: bool  # `renormalise`
    block_t: int  # the dq kernel's tile
    redo_shape: tuple
    dq_grid: tuple
    dq_args: tuple  # the dq kernel's scalar arguments
    dq_options: tuple  # its constexprs and launch options: (plain launch, SAFE launch)
    seg_len: int
    dkdv_grid: tuple
    dkdv_args: tuple  # the dk/dv kernel's scalar arguments
    dkdv_options: dict
    reduce: bool  # whether a list can be split (the reduce kernel runs)
    reduce_grid: tuple
    reduce_args: tuple
    reduce_options: dict


def _backward_plan(dims, dtype, qk_scale, tuning):
    bt = tuning.backward
    renorm = renormalise(dtype)
    rows = tuning.forward.tile_rows if bt.dq_rows is None else bt.dq_rows
    block_g, block_t, prec = tile_config(dims.G, dtype, rows)
    grid = (_runtime.cdiv(dims.T, block_t), dims.B * dims.Hkv)
    for_loop = use_for_loop()
    dq = dict(
        S=dims.S, D=dims.D, BS=dims.block_size, S_PAD=_runtime.next_pow2(dims.S),
        BLOCK_T=block_t, BLOCK_G=block_g, PREC=prec, FOR_LOOP=for_loop, RENORM=renorm,
        direct=tuning.direct_launch, num_warps=bt.dq_warps, num_stages=bt.dq_stages,
    )  # fmt: skip
    block_g, _, prec = tile_config(dims.G, dtype, 1)
    block_q = max(1, bt.dkdv_rows // block_g)
    seg_len = block_q * bt.segment_chunks
    n_seg, n_part = segment_sizes(dims.T, dims.S, dims.NB, seg_len)
    BH = dims.B * dims.Hkv
    return _BackwardPlan(
        renorm, block_t, (grid[0] * grid[1],), grid,
        (dims.T, dims.NB, dims.Hq, dims.G, qk_scale, dims.scale),
        (dict(dq, SAFE=False), dict(dq, SAFE=True)),
        seg_len, (n_seg, BH),
        (dims.T, dims.NB, n_seg, n_part, seg_len, dims.Hq, dims.G, qk_scale, dims.scale),
        dict(
            S=dims.S, D=dims.D, BS=dims.block_size, BLOCK_Q=block_q, BLOCK_G=block_g,
            PREC=prec, FOR_LOOP=for_loop, RENORM=renorm, direct=tuning.direct_launch,
            num_warps=bt.dkdv_warps, num_stages=bt.dkdv_stages,
        ),
        # A list has at most T * S entries (every slot of every token naming its block);
        # where that fits one segment no list is split and the reduce would find nothing
        # to add.
        dims.T * dims.S > seg_len, (dims.NB, BH), (dims.T, dims.NB, n_part, dims.scale),
        dict(D=dims.D, BS=dims.block_size, direct=tuning.direct_launch, num_warps=4),
    )  # fmt: skip


def _dq_and_delta(
    q, k, v, block_idx, block_size, do, o, lse, dq, dims, p, tuning, call, scratch
):  # fmt: skip
    """Run the dq kernel into `dq`; returns (delta, lse_lo), fp32 [B, Hq, T]: delta =
    rowsum(o * do) and the base-2 correction of lse (None unless `renormalise`), from the
    call's `scratch` (device addresses in a direct call), as are the kernel's tile lists and
    redo flags; p: the call's `_BackwardPlan`, call its `_runtime.Call`."""
    delta = scratch.empty(q.shape[:3], torch.float32)
    lse_lo = scratch.empty(q.shape[:3], torch.float32) if p.renorm else None
    lists, counts = tile_block_lists(
        block_idx, block_size, p.block_t, tuning=tuning, call=call, scratch=scratch
    )  # fmt: skip
    # One int32 per tile, written by the plain launch for every tile, read by the SAFE one.
    redo = scratch.empty(p.redo_shape, torch.int32)
    args = (
        q, k, v, block_idx, lists, counts, o, do, lse, delta,
        delta if lse_lo is None else lse_lo, dq, redo, *p.dq_args,
    )  # fmt: skip
    for options in p.dq_options:  # plain, then SAFE
        call.launch(_sel_bwd_dq_kernel, p.dq_grid, args, options)
    return delta, lse_lo


def _dk_dv(
    q, k, v, block_idx, block_size, do, lse, delta, lse_lo, dk, dv, dims, p, tuning, call,
    scratch,
):  # fmt: skip
    """Run the dk/dv kernels over the inverted index (its buffers and the kernel's partial
    sums from the call's `scratch`, device addresses in a direct call) into dk and dv."""
    row_ptr, col, segments = inverted_lists(
        block_idx, block_size, unique=False, seg_len=p.seg_len, tuning=tuning, call=call,
        scratch=scratch,
    )  # fmt: skip
    seg_block, seg_start, part_start, n_part = segments
    BH = dims.B * dims.Hkv
    part = scratch.empty((BH, n_part, 2, block_size, dims.D), torch.float32)
    call.launch(
        _sel_bwd_dkdv_kernel, p.dkdv_grid,
        (q, k, v, do, lse, delta, delta if lse_lo is None else lse_lo, row_ptr, col, seg_block,
         seg_start, part_start, part, dk, dv,
         *p.dkdv_args),
        p.dkdv_options,
    )  # fmt: skip
    if p.reduce:
        call.launch(
            _sel_bwd_reduce_kernel, p.reduce_grid,
            (seg_start, part_start, part, dk, dv) + p.reduce_args, p.reduce_options,
        )  # fmt: skip


def selection_backward_triton(
    q, k, v, block_idx, block_size, do, o, lse=None, scale=None, *, tuning=None
):
    """NSA selection attention backward (Triton).

    Args:
        q, k, v, block_idx, block_size, scale: as for `selection_forward_triton`.
        do: [B, Hq, T, D] gradient of o, q's dtype, contiguous.
        o: [B, Hq, T, D] the forward output.
        lse: optional fp32 [B, Hq, T] from the forward (`return_lse=True`); recomputed by a
            forward pass when None.
        tuning: launch settings, an `NsaTuning` (None: `tuning.DEFAULT`).
    Returns:
        (dq, dk, dv) shaped like q, k, v, in q's dtype. Rows with no visible key contribute 0.
        A block repeated within a row counts once. An inf or NaN in k or v reaches only the
        gradients of the rows that see it and of the keys those rows see (see the module
        doc); those are unspecified, as is the gradient of the non-finite element itself.
    """
    tuning = resolve(tuning)
    dims = _checks.check_backward_args(q, k, v, block_idx, block_size, do, o, lse, scale)
    if lse is None:  # the forward's checks are a subset of the ones just made
        _, lse = checked_forward(q, k, v, block_idx, block_size, dims, tuning)
    return checked_backward(q, k, v, block_idx, block_size, do, o, lse, dims, tuning)


def checked_backward(q, k, v, block_idx, block_size, do, o, lse, dims, tuning):
    """(dq, dk, dv) of `selection_backward_triton` for inputs already checked, lse given:
    dims their `_checks.Dims`, tuning a resolved `NsaTuning` (the autograd backward, whose
    tensors the forward checked)."""
    qk_scale = dims.scale * LOG2E
    # Every launch below is determined by this key (`_runtime.launch`; as the forward's).
    key = _runtime.launch_key(
        __name__, dims, q.dtype, block_idx.dtype, tuning,
        _runtime.aligned(q, k, v, block_idx, do, o, lse),
    )  # fmt: skip
    call = _runtime.Call(key, q.device, tuning.replay_calls)
    # Every temporary of the call (delta and lse_lo, the dq kernel's tile lists and redo
    # flags, the inversion and the dk/dv partial sums) is a view of one allocation, or its
    # device address in a direct call: one allocation per call, not one per buffer. The dq
    # phase's few lists stay allocated through the dk/dv phase, which adds T * S int32 per
    # (b, kv head) to the call's peak. The allocations are made in one order on every path
    # (dq, the scratch, dk, dv), so a replayed call places its buffers as a launched one.
    dq = _checks.new_empty(q.shape, q.dtype, q.device)
    scratch = _runtime.Scratch(q.device, key, call.direct)
    scratch.allocate()
    dk = _checks.new_empty(k.shape, k.dtype, k.device)
    dv = _checks.new_empty(v.shape, v.dtype, v.device)
    bound = (q, k, v, block_idx, do, o, lse, dq, dk, dv)
    if call.replay(bound, scratch):  # an earlier direct call's launches, on these tensors
        return dq, dk, dv
    p = _runtime.per_key(key, None, _backward_plan, dims, q.dtype, qk_scale, tuning)
    delta, lse_lo = _dq_and_delta(
        q, k, v, block_idx, block_size, do, o, lse, dq, dims, p, tuning, call, scratch
    )
    _dk_dv(
        q, k, v, block_idx, block_size, do, lse, delta, lse_lo, dk, dv, dims, p, tuning, call,
        scratch,
    )  # fmt: skip
    scratch.close()
    call.close(bound, scratch)
    return dq, dk, dv
