"""Triton forward of NSA selection attention.

Design: one program per (tile of BLOCK_T consecutive query positions, b, kv head). The
program stacks the G query heads of its BLOCK_T tokens into one [BLOCK_T * BLOCK_G, D] tile
(BLOCK_G = next_pow2(G), padding rows masked), so even G = 1..8 fills the 16 rows a tensor-core
tile needs with real queries instead of padding. BLOCK_T = max(1, tile_rows // BLOCK_G).

Each kept block that any token of the tile selected is loaded once ([block_size, D] of K and
V) and multiplied by the whole query tile; rows whose token did not select it, and keys after
a row's position, are masked to -inf. A block listed twice in a token's row is one block
(the tile visits each block once, and a row either selected it or not). Neighbouring tokens
often share blocks (always, for the 'recent' pattern), so a shared block costs one K/V load
and one dot for the whole tile; in the worst case (no sharing) the work equals that of a
per-token kernel. The softmax is the online (running max) form in fp32 over the visited
blocks, in base 2; o is written in the input dtype and lse = log(sum exp(s)) in fp32, natural
log, -inf (with o = 0) for rows with no visible key.

How a tile finds its blocks: a small kernel first writes, per tile, the sorted distinct kept
blocks of its BLOCK_T * S slots and their count (`tile_block_lists`). The attention loop then
runs over real blocks only, with no branch, so Triton can software-pipeline its K/V loads
(`tuning.ForwardTuning.num_stages`) across iterations.

Two schedules (`ForwardTuning.schedule`), picked per tile on the device:
* token-major (the tile kernel above): right when a tile's tokens share their blocks. When
  they do not (the 'random' pattern: a tile of 16 tokens visits ~200 distinct blocks for
  16 * 16 useful (token, block) pairs), every token streams its own S blocks of K/V.
* block-major (`block_major.py`): loop over key blocks outside and the queries that chose
  each block inside, so a K/V block is loaded once per chunk of its queries; each
  (token, slot) gets a partial result, combined per token afterwards.
The tile-list kernel counts each tile's distinct kept blocks anyway; a tile is
*block-handled* when that count exceeds block_path_ratio * S, G <= block_path_max_g and the
path's temporaries fit block_path_max_bytes ("auto"), always ("blocks") or never ("tile").
The tile kernel returns at once for block-handled tiles and the block-major
kernels at once for the others, so the choice costs no host sync (calls stay capturable in a
CUDA graph); when no tile is block-handled the block-major phase costs its launches only,
and when no tile can be (a tile keeps at most min(NB, BLOCK_T * S) distinct blocks: short
sequences), the host launches none of it.
When both paths may run, the tile kernel runs on a second stream beside the block-major
kernels (`overlap_tile_kernel`): they write disjoint rows, and the call joins the streams
before it returns.

fp32 inputs use tl.dot with input_precision="ieee" so results match the fp32 reference to
about 1e-5 on the GPU as well as in the interpreter.

Masked keys take no part in a row's result, whatever their values. Masking the scores to
-inf covers k; but p @ v sums p * v over all keys of the block, and a key hidden from a row
has p = 0 there, with 0 * NaN = NaN. Such keys (in a block that some of the tile's tokens
did not select, or after a row's token in a block of the causal diagonal, on either path)
can only make a row's sum non-finite. So both paths run their plain products and flag
(FLAG, one int32 per tile) the tiles where a hidden value may have reached a row: the
token-tile kernel a tile with a real row that ends non-finite, the block-major phase a tile
with a row whose partial over its causal block does (`block_major`: the only partials that
hide keys). A fix-up kernel, launched after both, redoes the flagged tiles on the
token-tile path with each row's p @ v over its visible keys (`_visible_pv`: non-finite
values enter the dot as 0, and a row that sees one gets NaN). Clean inputs pay one check
per token tile and per causal chunk, and the fix-up kernel's flag loads; the SAFE code
sits in a kernel of its own, so it costs the fast kernels no registers. A non-finite key or value that a row sees makes the row non-finite
(NaN when it is a NaN).
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _runtime
from . import _checks, block_major
from .tiles import (
    LN2,
    LOG2E,
    _tile_rows,
    _tile_slots,
    tile_block_lists,
    tile_config,
    use_for_loop,
)
from .tuning import resolve

_SIDE_STREAMS = {}  # the second stream of `side_stream`, per CUDA device


def forward_stages(block_t, tuning=None):
    """Software-pipeline stages of the forward for a tile of `block_t` tokens."""
    num_stages = resolve(tuning).forward.num_stages
    if num_stages is not None:
        return num_stages
    return 1 if block_t > 1 else 3


@triton.jit
def _visible_pv(b_p, b_v, vis, PREC: tl.constexpr):
    """p @ v ([R, K] x [K, D]) with each row's sum over its visible keys (vis [R, K]) only.

    A dot adds p * v over every key, and a key hidden from a row (p = 0 there) with a
    non-finite value would make the row NaN (0 * NaN, 0 * inf). Here non-finite values
    enter the dot as 0, and a row that sees a key with one gets NaN in its whole row.
    """
    b_fin = tl.abs(b_v.to(tl.float32)) < float("inf")
    key_bad = tl.min(b_fin.to(tl.int32), axis=1) == 0
    row_bad = tl.max((vis & key_bad[None, :]).to(tl.int32), axis=1) > 0
    b_pv = tl.dot(b_p, tl.where(b_fin, b_v, tl.zeros_like(b_v)), input_precision=PREC)
    return tl.where(row_bad[:, None], float("nan"), b_pv)


@triton.jit
def _attend_block(
    K, V, p_kv, j, b_q, b_j, i_t, row_ok, b_m, b_l, b_acc, T, qk_scale,
    D: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr, SAFE: tl.constexpr,
):  # fmt: skip
    """One online-softmax step of the tile over key block j; returns the new (m, l, acc).
    SAFE: p @ v over each row's visible keys only (`_visible_pv`), whatever the values of
    the others."""
    i_d = tl.arange(0, D)
    i_k = j * BS + tl.arange(0, BS)
    k_ok = (i_k < T)[:, None]
    b_k = tl.load(K + p_kv + i_k[:, None] * D + i_d[None, :], mask=k_ok, other=0.0)
    b_v = tl.load(V + p_kv + i_k[:, None] * D + i_d[None, :], mask=k_ok, other=0.0)
    # Rows whose token selected j (row_ok folds in padding rows), keys up to t.
    sel = (tl.sum((b_j == j).to(tl.int32), axis=1) > 0) & row_ok
    vis = sel[:, None] & (i_k[None, :] <= i_t[:, None])
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale
    b_s = tl.where(vis, b_s, float("-inf"))
    m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows still empty
    alpha = tl.exp2(b_m - m_safe)
    b_p = tl.exp2(b_s - m_safe[:, None])
    b_l = b_l * alpha + tl.sum(b_p, axis=1)
    if SAFE:
        b_pv = _visible_pv(b_p.to(b_v.dtype), b_v, vis, PREC)
    else:
        b_pv = tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)
    b_acc = b_acc * alpha[:, None] + b_pv
    return m_new, b_l, b_acc


@triton.jit
def _tile_blocks(
    K, V, LIST, COUNT, p_kv, o_tile, b_q, b_j, i_t, row_ok, T, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_G: tl.constexpr, PREC: tl.constexpr, FOR_LOOP: tl.constexpr, SAFE: tl.constexpr,
):  # fmt: skip
    """The online softmax of the tile over the COUNT blocks of its LIST; returns
    (m, l, acc). SAFE: `_attend_block`'s."""
    b_m = tl.full([BLOCK_T * BLOCK_G], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_T * BLOCK_G], tl.float32)
    b_acc = tl.zeros([BLOCK_T * BLOCK_G, D], tl.float32)
    p_list = LIST + o_tile * BLOCK_T * S
    n = tl.load(COUNT + o_tile)
    if FOR_LOOP:
        for i in range(0, n):
            j = tl.load(p_list + i)
            b_m, b_l, b_acc = _attend_block(
                K, V, p_kv, j, b_q, b_j, i_t, row_ok, b_m, b_l, b_acc, T, qk_scale,
                D, BS, PREC, SAFE,
            )  # fmt: skip
    else:
        i = 0
        while i < n:
            j = tl.load(p_list + i)
            b_m, b_l, b_acc = _attend_block(
                K, V, p_kv, j, b_q, b_j, i_t, row_ok, b_m, b_l, b_acc, T, qk_scale,
                D, BS, PREC, SAFE,
            )  # fmt: skip
            i += 1
    return b_m, b_l, b_acc


@triton.jit
def _sel_fwd_tile(
    Q, K, V, IDX, LIST, COUNT, O, LSE, FLAG, pid_t, i_bh, o_tile, T, NB, Hq, G, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, SAFE: tl.constexpr,
):  # fmt: skip
    """o and lse of one token tile; unless SAFE, FLAG[o_tile] = 1 (and lse NaN) when a real
    row ended non-finite. SAFE: each row's p @ v over its visible keys only
    (`_attend_block`)."""
    Hkv = Hq // G
    i_b = i_bh // Hkv
    i_h = i_bh % Hkv
    i_t, i_g, row_ok = _tile_rows(pid_t, T, G, BLOCK_T, BLOCK_G)
    i_d = tl.arange(0, D)
    # Row offsets into [B, Hq, T, *] and [B, Hkv, T, *] (int64: large B * H * T * D).
    o_row = ((i_b * Hq + i_h * G + i_g).to(tl.int64) * T + i_t) * D
    p_idx = IDX + i_bh.to(tl.int64) * T * S
    p_kv = i_bh.to(tl.int64) * T * D
    b_q = tl.load(Q + o_row[:, None] + i_d[None, :], mask=row_ok[:, None], other=0.0)
    b_j = _tile_slots(p_idx, i_t, T, NB, S, BS, S_PAD)
    b_m, b_l, b_acc = _tile_blocks(
        K, V, LIST, COUNT, p_kv, o_tile, b_q, b_j, i_t, row_ok, T, qk_scale,
        S, D, BS, BLOCK_T, BLOCK_G, PREC, FOR_LOOP, SAFE,
    )  # fmt: skip
    # No visible key: l = 0 (a NaN l, from a visible NaN key, stays NaN in o and lse).
    no_key = b_l == 0
    b_o = b_acc / tl.where(no_key, 1.0, b_l)[:, None]
    b_lse = (b_m + tl.log2(tl.where(no_key, 1.0, b_l))) * LN2
    b_lse = tl.where(no_key, float("-inf"), b_lse)
    if not SAFE:
        # A row that ended non-finite (its sum is) gets lse NaN for now and flags its tile,
        # which the fix-up kernel then redoes, o and lse both. The flag is read off the lse
        # being stored: that vector changes layout for its store anyway, and a flag vector
        # of its own would take a second trip through shared memory. An lse that is NaN by
        # itself (a visible NaN) comes with a NaN o, so it flags the same tiles.
        b_row = tl.sum(b_o, axis=1)
        b_lse = tl.where(tl.abs(b_row) < float("inf"), b_lse, float("nan"))
    tl.store(O + o_row[:, None] + i_d[None, :], b_o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + o_row // D, b_lse, mask=row_ok)
    if not SAFE:
        p_flag = FLAG + o_tile + tl.zeros(b_lse.shape, tl.int32)
        tl.store(p_flag, tl.full(b_lse.shape, 1, tl.int32), mask=(b_lse != b_lse) & row_ok)


@triton.jit
def _sel_fwd_kernel(
    Q, K, V, IDX, LIST, COUNT, O, LSE, FLAG,
    T, NB, Hq, G, qk_scale, MIN_BLOCKS,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, SKIP_BLOCK_TILES: tl.constexpr, TRIGGER: tl.constexpr,
):  # fmt: skip
    """One token tile (see the module doc). SKIP_BLOCK_TILES: return at once when the tile's
    distinct block count COUNT exceeds MIN_BLOCKS (the block-major path owns its rows).
    FLAG[bh, tile] (zero-filled) is set to 1 when a real row ended non-finite. TRIGGER: let
    a programmatic dependent (the fix-up kernel, `fix_pdl`) launch from this program's
    start: it waits for this kernel's writes before it reads any."""
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)  # b * Hkv + kv head
    o_tile = i_bh.to(tl.int64) * tl.num_programs(0) + pid_t
    todo = True
    if SKIP_BLOCK_TILES:
        todo = tl.load(COUNT + o_tile) <= MIN_BLOCKS
    if todo:
        _sel_fwd_tile(
            Q, K, V, IDX, LIST, COUNT, O, LSE, FLAG, pid_t, i_bh, o_tile, T, NB, Hq, G,
            qk_scale, S, D, BS, S_PAD, BLOCK_T, BLOCK_G, PREC, FOR_LOOP, False,
        )  # fmt: skip


@triton.jit
def _sel_fwd_fix_kernel(
    Q, K, V, IDX, LIST, COUNT, O, LSE, FLAG,
    T, NB, Hq, G, qk_scale, N_TILES,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
    FOR_LOOP: tl.constexpr, FIX: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Tiles pid * FIX .. pid * FIX + FIX - 1 of one (b, kv head): each flagged one (FLAG,
    from either path) is redone on the token-tile path with SAFE products. One vector load
    of the flags when none is set (clean inputs). PDL: launched as a programmatic dependent
    (`fix_pdl`), so first wait until the kernels before it have finished and their writes
    (flags, o, lse) are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    i_bh = tl.program_id(1)
    p_flag = FLAG + i_bh.to(tl.int64) * N_TILES
    i_f = pid * FIX + tl.arange(0, FIX)
    if tl.max(tl.load(p_flag + i_f, mask=i_f < N_TILES, other=0)) > 0:
        i = 0
        while i < FIX:
            pid_t = pid * FIX + i
            if tl.load(p_flag + pid_t, mask=pid_t < N_TILES, other=0) != 0:
                _sel_fwd_tile(
                    Q, K, V, IDX, LIST, COUNT, O, LSE, FLAG, pid_t, i_bh,
                    i_bh.to(tl.int64) * N_TILES + pid_t, T, NB, Hq, G, qk_scale,
                    S, D, BS, S_PAD, BLOCK_T, BLOCK_G, PREC, FOR_LOOP, True,
                )  # fmt: skip
            i += 1


def block_path_bytes(dims, element_size):
    """Device memory the block-major path allocates for one call: partial o and lse per
    (token, slot, head) and two int32 list entries per (token, slot)."""
    entries = dims.B * dims.Hkv * dims.T * dims.S
    return entries * (dims.G * (dims.D * element_size + 4) + 8)


def block_path_min_blocks(S, G, nbytes=0, tuning=None, max_blocks=None):
    """The schedule rule as a threshold: a tile whose count of distinct kept blocks exceeds
    the returned value is block-handled (-1: every tile); None: no tile is (also under
    "auto" when the group G exceeds `block_path_max_g`, the path's `nbytes` of temporaries
    exceed `block_path_max_bytes`, or no tile can exceed the threshold: `max_blocks`, the
    most distinct blocks a tile can keep, min(NB, BLOCK_T * S), is at most it; with the
    default ratio of 2 that is every T <= 2 * S * block_size)."""
    t = resolve(tuning).forward
    if t.schedule == "blocks":
        return -1
    if t.schedule == "tile" or not t.block_path_ratio or G > t.block_path_max_g:
        return None
    if nbytes > t.block_path_max_bytes:
        return None
    threshold = int(t.block_path_ratio * S)
    if max_blocks is not None and max_blocks <= threshold:
        return None
    return threshold


def side_stream(device, tuning=None):
    """The second stream of `overlap_tile_kernel` for a CUDA device (one per device, made on
    first use), or None: setting off, or not a CUDA device (the interpreter runs in order)."""
    if not resolve(tuning).forward.overlap_tile_kernel or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


class _ForwardPlan(NamedTuple):
    """What one forward call launches, from its sizes, dtype, tuning and device alone
    (`_forward_plan`; computed once per launch key)."""

    block_t: int
    min_blocks: int | None  # `block_path_min_blocks`; None: no block-major phase
    n_lists: int | None  # the block-major phase's lists (`block_major.list_sizes`)
    qk_scale: float
    for_loop: bool
    side: object  # the token-tile kernel's stream (`side_stream`), or None
    grid: tuple
    flags_shape: tuple
    tile_scalars: tuple  # the token-tile kernel's scalar arguments
    tile_options: dict  # its constexprs and launch options
    fix_grid: tuple
    fix_scalars: tuple
    fix_options: dict


def _forward_plan(dims, dtype, tuning, device):
    ft = tuning.forward
    block_g, block_t, prec = tile_config(dims.G, dtype, ft.tile_rows)
    nbytes = block_path_bytes(dims, dtype.itemsize)
    # Where no tile can be block-handled (short sequences: few blocks in all), the
    # block-major phase is not launched at all: no scratch, fork or join.
    min_blocks = block_path_min_blocks(
        dims.S, dims.G, nbytes, tuning, max_blocks=min(dims.NB, block_t * dims.S)
    )
    side = side_stream(device, tuning) if min_blocks is not None else None
    grid = (_runtime.cdiv(dims.T, block_t), dims.B * dims.Hkv)
    qk_scale = dims.scale * LOG2E
    for_loop = use_for_loop()
    # The fix-up as a programmatic dependent (`fix_pdl`): compiled kernels on Hopper and later.
    pdl = ft.fix_pdl and for_loop and _runtime.pdl_supported(device)
    shared = dict(
        S=dims.S, D=dims.D, BS=dims.block_size, S_PAD=_runtime.next_pow2(dims.S),
        BLOCK_T=block_t, BLOCK_G=block_g, PREC=prec, FOR_LOOP=for_loop,
        direct=tuning.direct_launch, num_warps=ft.num_warps,
    )  # fmt: skip
    tile_scalars = (
        dims.T, dims.NB, dims.Hq, dims.G, qk_scale, min_blocks or 0,
    )  # fmt: skip
    tile_options = dict(
        shared, SKIP_BLOCK_TILES=min_blocks is not None, TRIGGER=pdl,
        num_stages=forward_stages(block_t, tuning),
    )  # fmt: skip
    n_lists = None
    if min_blocks is not None:
        n_lists = block_major.list_sizes(dims, block_t, dtype.itemsize, tuning)[1]
    return _ForwardPlan(
        block_t, min_blocks, n_lists, qk_scale, for_loop, side, grid, (grid[1], grid[0]),
        tile_scalars, tile_options,
        (_runtime.cdiv(grid[0], ft.fix_tiles), grid[1]),
        (*tile_scalars[:5], grid[0]),
        dict(shared, FIX=ft.fix_tiles, PDL=pdl, launch_pdl=pdl, num_stages=1),
    )  # fmt: skip


def selection_forward_triton(
    q, k, v, block_idx, block_size, scale=None, return_lse=False, *, tuning=None
):
    """NSA selection attention forward (Triton).

    Args:
        q: [B, Hq, T, D] bf16/fp16/fp32, contiguous; D in {32, 64, 128}.
        k, v: [B, Hkv, T, D], q's dtype; Hq % Hkv == 0 (GQA, group G = Hq // Hkv).
        block_idx: [B, Hkv, T, S] int32/int64; slot j is used by query t when
            0 <= j < ceil(T / block_size) and j * block_size <= t; a block named by
            several slots of a row counts once (`validate_block_idx` checks for repeats).
        block_size: 16, 32, 64 or 128.
        scale: softmax scale, default D ** -0.5.
        return_lse: also return lse.
        tuning: launch settings, an `NsaTuning` (None: `tuning.DEFAULT`).
    Returns:
        o [B, Hq, T, D] in q's dtype; with return_lse, (o, lse) where lse is fp32 [B, Hq, T],
        natural log, -inf for rows that see no key (their o row is 0). Keys a row does not
        see take no part in its row, NaN or inf included; a non-finite key or value it
        sees makes the row non-finite.
    Unless the schedule is "tile" (or "auto" with G > block_path_max_g or more than
    block_path_max_bytes of temporaries), the call also allocates the block-major path's
    partial results (B * Hkv * T * S * G * D elements, see `block_major`), whether or not
    a tile ends up using them: which tiles do is only known on the device.
    """
    tuning = resolve(tuning)
    dims = _checks.check_forward_args(q, k, v, block_idx, block_size, scale)
    o, lse = checked_forward(q, k, v, block_idx, block_size, dims, tuning)
    return (o, lse) if return_lse else o


def checked_forward(q, k, v, block_idx, block_size, dims, tuning):
    """(o, lse) of `selection_forward_triton` for inputs already checked: dims their
    `_checks.Dims`, tuning a resolved `NsaTuning` (the backward's lse=None call)."""
    # Every launch below is determined by this key (`_runtime.launch`): the sizes, dtypes,
    # tuning and device decide all integers, constexprs and the layout of the buffers
    # allocated here, and the inputs' alignment the rest. It names this module, so a copy of
    # the wrapper loaded under another name (a patched variant beside it) has keys, and so
    # launch tables, of its own.
    key = _runtime.launch_key(
        __name__, dims, q.dtype, block_idx.dtype, tuning, _runtime.aligned(q, k, v, block_idx)
    )
    dev = q.device
    call = _runtime.Call(key, dev, tuning.replay_calls)
    o = _checks.new_empty(q.shape, q.dtype, dev)
    lse = _checks.new_empty(q.shape[:3], torch.float32, dev)
    bound = (q, k, v, block_idx, o, lse)
    if call.replay(bound):  # an earlier direct call's launches, on these tensors
        return o, lse
    p = _runtime.per_key(key, dev, _forward_plan, dims, q.dtype, tuning, dev)
    # The call's temporaries (flags, tile lists, the block-major phase's lists and partials)
    # in one allocation; a direct call (`_runtime.Call.direct`) passes their addresses.
    scratch = _runtime.Scratch(dev, key, call.direct)
    hist = None
    if p.min_blocks is not None:
        hist, col, code = block_major.list_scratch(
            dims, p.block_t, q.element_size(), dev, tuning, key=key, scratch=scratch, call=call
        )  # fmt: skip
    flags = scratch.empty(p.flags_shape, torch.int32)
    lists, counts = tile_block_lists(
        block_idx, block_size, p.block_t, hist, p.min_blocks or 0, flags=flags, tuning=tuning,
        call=call, scratch=scratch, n_lists=p.n_lists,
    )  # fmt: skip
    side = p.side
    if side is not None:
        call.fork(side)  # after the tile lists and counts
    call.launch(
        _sel_fwd_kernel, p.grid, (q, k, v, block_idx, lists, counts, o, lse, flags, *p.tile_scalars),
        p.tile_options, stream=side,
    )  # fmt: skip
    if hist is not None:
        block_major.block_major_forward(
            q, k, v, block_idx, counts, hist, col, code, p.min_blocks, o, lse, flags, dims,
            p.block_t, p.qk_scale, tuning, call=call, interpreted=not p.for_loop,
            scratch=scratch,
        )  # fmt: skip
    scratch.close()
    if side is not None:
        # Join: everything after the call on its stream (and the caching allocator's reuse
        # of this call's temporaries, allocated on it) waits for the tile kernel.
        call.join(side)
    call.launch(
        _sel_fwd_fix_kernel, p.fix_grid,
        (q, k, v, block_idx, lists, counts, o, lse, flags, *p.fix_scalars), p.fix_options,
    )  # fmt: skip
    call.close(bound, scratch)
    return o, lse
