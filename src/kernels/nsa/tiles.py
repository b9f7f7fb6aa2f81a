"""Tile helpers shared by the NSA forward, its block-major phase and the backward.

A token tile is BLOCK_T consecutive query positions of one (b, kv head) with their G query
heads stacked into BLOCK_T * BLOCK_G rows (`tile_config`, `_tile_rows`). The tile-list
kernel (`tile_block_lists`) writes, per tile, the sorted distinct kept blocks of its
BLOCK_T * S slots; the forward and the dq kernel loop over them, and the block-major phase
reads their counts (and a per-window histogram) to pick and place its tiles.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _runtime
from .tuning import resolve

LOG2E = 1.4426950408889634
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


def use_for_loop():
    """Whether loops over a loaded trip count are `for` loops (compiled: pipelined) or
    `while` loops (the interpreter cannot run `range` over a loaded bound with numpy 2)."""
    return not _runtime.interpreter_active()


@triton.jit
def _tile_rows(pid_t, T, G, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr):
    """Row r of a token tile is head r % BLOCK_G of token pid_t * BLOCK_T + r // BLOCK_G."""
    i_r = tl.arange(0, BLOCK_T * BLOCK_G)
    i_t = pid_t * BLOCK_T + i_r // BLOCK_G
    i_g = i_r % BLOCK_G
    row_ok = (i_t < T) & (i_g < G)
    return i_t, i_g, row_ok


@triton.jit
def _kept(j, t, T, NB, BS: tl.constexpr):
    """The slot rule: block j is used by query t when 0 <= j < NB and j * BS <= t. Tested in
    the index dtype (int64 ids beyond int32 must not wrap into range)."""
    return (t < T) & (j >= 0) & (j < NB) & (j * BS <= t)


@triton.jit
def _tile_slots(p_idx, i_t, T, NB, S: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr):
    """[rows, S_PAD] kept block ids of each row's token (-1 where the slot is dropped)."""
    i_s = tl.arange(0, S_PAD)
    mask = (i_t < T)[:, None] & (i_s < S)[None, :]
    b_j = tl.load(p_idx + i_t.to(tl.int64)[:, None] * S + i_s[None, :], mask=mask, other=-1)
    keep = _kept(b_j, i_t[:, None], T, NB, BS)
    return tl.where(keep, b_j, -1).to(tl.int32)


@triton.jit
def _max_op(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_op(a, b):
    return tl.minimum(a, b)


@triton.jit
def _run_bounds(first, last, i_e, L: tl.constexpr):
    """The lanes where each lane's run starts and ends, from the runs' first and last lanes
    ([L] bool)."""
    start = tl.associative_scan(tl.where(first, i_e, 0), 0, _max_op)
    end = tl.associative_scan(tl.where(last, i_e, L - 1), 0, _min_op, reverse=True)
    return start, end


@triton.jit
def _sorted_runs(b_x, i_e, L: tl.constexpr):
    """Runs of equal values in a sorted [L] vector: per lane, whether it is the first / last
    of its run, and the lanes where its run starts and ends."""
    first = (i_e == 0) | (b_x != tl.gather(b_x, tl.maximum(i_e - 1, 0), 0))
    last = (i_e == L - 1) | (b_x != tl.gather(b_x, tl.minimum(i_e + 1, L - 1), 0))
    start, end = _run_bounds(first, last, i_e, L)
    return first, last, start, end


@triton.jit
def _tile_list_kernel(
    IDX, LIST, COUNT, HIST, FLAG, T, NB, N_TILES, MIN_BLOCKS, NW, TPW,
    S: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr, L_PAD: tl.constexpr,
    USE_HIST: tl.constexpr, ZERO_FLAG: tl.constexpr,
):  # fmt: skip
    """LIST[bh, tile, :count] = sorted distinct kept blocks of the tile's BLOCK_T * S slots;
    COUNT[bh, tile] = count. Entries past count are left unwritten (never read).
    USE_HIST: when count > MIN_BLOCKS (a block-handled tile), also add to HIST[bh, w, j] the
    number of the tile's kept slots that chose block j (a row's repeat of a block is a slot
    too: the fill kernel gives it a place that it leaves empty; one int32 atomic per
    distinct block, not per slot: block 0 of the 'random' pattern is chosen by every
    token); w = tile // TPW, the tile's window of TPW tiles (HIST is [B * Hkv, NW, NB]).
    ZERO_FLAG: FLAG[bh, tile] = 0 (the forward's non-finite flags, set by later kernels)."""
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_e = tl.arange(0, L_PAD)
    i_t = pid_t * BLOCK_T + i_e // S
    ok = (i_e < BLOCK_T * S) & (i_t < T)
    p_idx = IDX + i_bh.to(tl.int64) * T * S + pid_t * BLOCK_T * S
    b_j = tl.load(p_idx + i_e, mask=ok, other=-1)
    # Dropped slots sort last as NB; after sorting, a block's first copy is the one that
    # differs from its left neighbour, and a prefix sum of those flags is its output slot.
    b_j = tl.sort(tl.where(ok & _kept(b_j, i_t, T, NB, BS), b_j, NB).to(tl.int32))
    first, last, start, _ = _sorted_runs(b_j, i_e, L_PAD)
    first = first & (b_j < NB)
    pos = tl.cumsum(first.to(tl.int32), 0) - 1
    o_tile = i_bh.to(tl.int64) * N_TILES + pid_t
    count = tl.sum(first.to(tl.int32), 0)
    tl.store(LIST + o_tile * BLOCK_T * S + pos, b_j, mask=first)
    tl.store(COUNT + o_tile, count)
    if ZERO_FLAG:
        tl.store(FLAG + o_tile, 0)
    if USE_HIST:
        if count > MIN_BLOCKS:
            # A run's last lane adds the run length (its lane - the run's first lane + 1).
            p_hist = HIST + (i_bh.to(tl.int64) * NW + pid_t // TPW) * NB + b_j
            tl.atomic_add(p_hist, i_e - start + 1, mask=last & (b_j < NB), sem="relaxed")


def window_tiles(n_tiles, n_windows):
    """Tiles per window when n_tiles tiles are cut into n_windows windows."""
    return _runtime.cdiv(n_tiles, n_windows)


class _TileListsPlan(NamedTuple):
    """The launch of `tile_block_lists`, from sizes and tuning alone."""

    lists_shape: tuple
    counts_shape: tuple
    grid: tuple
    args: tuple  # scalar arguments
    options: dict  # constexprs and launch options


def _tile_lists_plan(shape, block_size, block_t, NL, min_blocks, zero_flags, tuning):
    B, Hkv, T, S = shape
    n_tiles, NB = _runtime.cdiv(T, block_t), _runtime.cdiv(T, block_size)
    NW = 1 if NL is None else NL // NB
    return _TileListsPlan(
        (B * Hkv, n_tiles, block_t * S), (B * Hkv, n_tiles), (n_tiles, B * Hkv),
        (T, NB, n_tiles, min_blocks, NW, window_tiles(n_tiles, NW)),
        dict(
            S=S, BS=block_size, BLOCK_T=block_t, L_PAD=_runtime.next_pow2(block_t * S),
            USE_HIST=NL is not None, ZERO_FLAG=zero_flags, direct=tuning.direct_launch,
            num_warps=tuning.forward.tile_list_warps,
        ),
    )  # fmt: skip


def tile_block_lists(
    block_idx, block_size, block_t, hist=None, min_blocks=0, flags=None, tuning=None,
    call=None, scratch=None, n_lists=None,
):  # fmt: skip
    """Per tile of block_t consecutive tokens, the distinct kept blocks its tokens selected.

    Args:
        block_idx: [B, Hkv, T, S] int32/int64, contiguous.
        block_size: keys per block.
        block_t: tokens per tile.
        hist: optional int32 [B * Hkv, NW * NB]: for every tile with more than
            `min_blocks` distinct blocks (block-handled), hist[bh, w * NB + j] is increased
            by the number of its slots that kept block j (a row that lists j twice adds 2),
            w = the tile's window (`window_tiles`). The forward fills it with -1
            (`block_major.list_scratch`).
        min_blocks: see hist.
        flags: optional int32 [B * Hkv, n_tiles], zero-filled here.
        tuning: an `NsaTuning` (None: the default); its forward.tile_list_warps apply.
        call: the calling wrapper's `_runtime.Call`, or None (launched on its own).
        scratch: the calling wrapper's `_runtime.Scratch`, which lists and counts come
            from, or None (their own allocations). With a direct call's scratch
            (`Scratch.addresses`), hist, flags, lists and counts are device addresses (ints).
        n_lists: NW * NB, otherwise read off hist: needed where hist is an address.
    Returns:
        lists: int32 [B * Hkv, n_tiles, block_t * S]; row [bh, i] holds, ascending, the
            count[bh, i] distinct blocks kept by any token of tile i (entries after that are
            unspecified); n_tiles = ceil(T / block_t).
        counts: int32 [B * Hkv, n_tiles].
    One kernel launch, no host sync.
    """
    tuning = resolve(tuning)
    shape = tuple(block_idx.shape)
    NL = None if hist is None else n_lists if n_lists is not None else hist.shape[1]
    dev = block_idx.device
    if call is None:
        call = _runtime.Call(None, dev)
    p = _runtime.per_key(
        call.key, dev, _tile_lists_plan, shape, block_size, block_t, NL, min_blocks,
        flags is not None, tuning,
    )  # fmt: skip
    if scratch is None:
        scratch = _runtime.Scratch(dev)
    lists = scratch.empty(p.lists_shape, torch.int32)
    counts = scratch.empty(p.counts_shape, torch.int32)
    call.launch(
        _tile_list_kernel, p.grid,
        (block_idx, lists, counts, counts if hist is None else hist,
         counts if flags is None else flags, *p.args),
        p.options,
    )  # fmt: skip
    return lists, counts


@triton.jit
def _flag_nonfinite(FLAG, o_tile, b_x, rows):
    """FLAG[o_tile] = 1 when a row of b_x ([R, C] fp32) where `rows` ([R] bool) holds has an
    inf or NaN; o_tile is one tile for all rows (a scalar) or each row's own ([R], as the
    block-major partials give it). Tested on each row's sum (a reduction inside the row's
    threads, no barrier across the tile): non-finite when an element is, and also,
    harmlessly, when finite elements overflow fp32 (the tile is then redone, with the same
    result). Each flagged row stores 1 at its tile under its own mask; clean inputs store
    nothing."""
    b_row = tl.sum(b_x, axis=1)
    bad = ~(tl.abs(b_row) < float("inf")) & rows
    tl.store(FLAG + o_tile + tl.zeros(b_row.shape, tl.int32), tl.full(b_row.shape, 1, tl.int32),
             mask=bad)  # fmt: skip


def tile_config(G, dtype, rows):
    """(BLOCK_G, BLOCK_T, dot precision) for a forward/dq tile of about `rows` query rows."""
    block_g = _runtime.next_pow2(G)
    block_t = max(1, rows // block_g)
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return block_g, block_t, prec
