"""Block-major phase of the NSA selection forward: key blocks outside, queries inside.

`selection_forward_triton` hands this phase the token tiles whose tokens do not share their
blocks ("block-handled" tiles, see forward.py). For them every (token, slot) pair would
otherwise stream its own K/V block; here each block is loaded once per chunk of the queries
that chose it. Steps (all on the device, no host sync, so the call stays capturable in a
CUDA graph):

1. Count (in tiles.py's tile-list kernel): HIST[bh, w, j] = slots of block-handled
   tiles of window w (`list_window` consecutive tokens) that kept block j (a row that lists
   j twice counts twice: see step 3), one int32 atomic per distinct block of a tile. Each
   (window, block) pair has its own list, and the lists
   run window by window: the programs, which walk the lists in order, all work on one window
   at a time, so the window's q rows (each read by the S blocks its token chose) are read
   from DRAM about once and then hit in L2.
2. `_prefix_kernel`: ROW_PTR[bh] = exclusive prefix sum of HIST[bh] rounded up to whole
   chunks of CHUNK entries (NL + 1 entries for NL = NW * NB lists, one program per (b, kv
   head) looping over them), so that every list starts a chunk; the places between a list's
   end and the next chunk boundary keep the COL = -1 they were allocated with (padding).
3. `_fill_kernel` (a counting sort, no torch.sort): per block-handled tile, its kept slots
   are sorted by (block, slot) in registers; each run of one block claims its places at the
   head of the list of (its window, block) with one atomic that counts HIST[bh, w, j] down,
   and writes there the flat slot index t * S + s (COL); an atomic max gives each chunk of
   places its code (CODE: the block, with a flag for a token inside the block: only such
   chunks need the causal mask). A slot naming a block that an earlier slot of its row
   named (in (block, slot) order it follows that slot) keeps its place but writes
   -2 - slot there: no partial, and the partial kernel sets its PART_L -inf, so a repeated
   block counts once. The order of tiles inside a list depends on the
   atomics' order: it is nondeterministic. The tile's dropped slots get PART_L = -inf (no
   partial will be written for them), so that the combine needs nothing but PART_L to tell
   them.
4. `_partial_kernel`: the lists of one (b, kv head) are cut into chunks of CHUNK entries
   (CHUNK * BLOCK_G query rows: the G heads of each entry's token). A chunk lies inside one
   block's list, so its block's K_j and V_j are loaded once, multiplied with the chunk's
   gathered q rows, and each real row gets the softmax of that block alone: o_part =
   (p @ v) / l and lse_part = m + log2(l) (base 2), stored at PART_O[bh, t, s, g, :] /
   PART_L[bh, t, s, g]. Every kept block has a visible key (j * bs <= t), so lse_part is
   finite. Programs are persistent (`partial_waves`) and walk their chunks in a loop that
   Triton software-pipelines (`partial_stages`): the loop body has no inner loop (its one
   branch, the causal mask, holds no load), so the next chunks' list entries, gathered q
   rows and K/V blocks are copied to shared memory while this chunk computes. A block
   chosen by every token (block 0 of the 'random' pattern) simply fills many chunks, so the
   load is balanced by construction; the padding costs at most one partly empty chunk per
   list.
5. `_combine_kernel`, per block-handled tile: for each row, the partials of its kept slots
   (those with a finite lse_part: a dropped slot's -inf from step 3 keeps its unwritten
   partial from being read), in slot order: with M = max lse_s and w_s = exp2(lse_s - M),
   o = sum_s w_s o_part_s / sum_s w_s and lse = (M + log2 sum_s w_s) ln 2. Every slot's lse
   is read first, so M and the weights are known before the partials are read, all at once
   (no running max, no rescaling). Rows with no kept slot get o = 0 and lse = -inf, as on the
   token-tile path.

Masked keys: a partial covers one block its token selected, so the only keys it hides are
those after the token, in a chunk that takes the causal mask: there p = 0 multiplies their
values (and copies of key T - 1 past T), and a non-finite value makes the partial
non-finite. Such a chunk sets the forward's FLAG of each tile with a row whose partial
ended non-finite, and forward.py's fix-up kernel redoes the tile on the token-tile path
over visible keys only. A non-finite partial of any other chunk comes from a key its row
sees, and the combined row is non-finite as it should be.

Determinism: a row's partial depends only on its own q row and its block (the tensor-core
dot gives each output row the same result wherever the row sits in the tile), and it is
written to the row's own (t, s) place; the combine reads the slots in slot order. So o and
lse are bitwise reproducible although the lists' order is not.

Memory: the partials take B * Hkv * T * S * G * D elements in q's dtype (bf16/fp16: each
of the <= S partials is rounded like the output itself; fp32 stays fp32) plus
B * Hkv * T * S * G fp32 lse values, O(T); the lists take B * Hkv * (T * S + NL * CHUNK)
int32 and their chunk codes 1 / CHUNK of that.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .. import _runtime
from .tiles import (
    LN2,
    _flag_nonfinite,
    _kept,
    _run_bounds,
    _tile_rows,
    window_tiles,
)
from .tuning import resolve


@triton.jit
def _prefix_kernel(HIST, ROW_PTR, NL, CHUNK: tl.constexpr, PB: tl.constexpr):
    """ROW_PTR[bh, l] = CHUNK * sum of cdiv(1 + HIST[bh, :l], CHUNK) for l = 0 .. NL (HIST
    counts from -1, see `list_scratch`)."""
    i_bh = tl.program_id(0)
    p_hist = HIST + i_bh.to(tl.int64) * NL
    p_row = ROW_PTR + i_bh.to(tl.int64) * (NL + 1)
    carry = tl.full([], 0, tl.int32)
    i0 = 0
    while i0 <= NL:  # a `while`: the interpreter cannot take `range` over an argument
        i_l = i0 + tl.arange(0, PB)
        b_len = tl.cdiv(tl.load(p_hist + i_l, mask=i_l < NL, other=-1) + 1, CHUNK) * CHUNK
        tl.store(p_row + i_l, carry + tl.cumsum(b_len, 0) - b_len, mask=i_l <= NL)
        carry += tl.sum(b_len, 0)
        i0 += PB


@triton.jit
def _fill_kernel(
    IDX, COUNT, HIST, ROW_PTR, COL, CODE, PART_L, T, NB, NW, TPW, L, NC, MIN_BLOCKS, G,
    S: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr, L_PAD: tl.constexpr,
    CHUNK: tl.constexpr, KEY64: tl.constexpr, BLOCK_G: tl.constexpr, WAIT: tl.constexpr,
):  # fmt: skip
    """Place the kept slots of one block-handled tile in their blocks' lists, and mark its
    dropped slots' PART_L -inf (step 3). A slot that repeats its row's block (an earlier
    slot of the same token kept it) is placed as -2 - slot, which the partial kernel reads
    as "mark this slot's PART_L -inf": the block counts once per row. WAIT: launched as a
    programmatic dependent (`chain_pdl`): first wait for the prefix kernel's writes."""
    if WAIT:
        tl.extra.cuda.gdc_wait()
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    if tl.load(COUNT + i_bh.to(tl.int64) * tl.num_programs(0) + pid_t) > MIN_BLOCKS:
        i_e = tl.arange(0, L_PAD)
        i_t = pid_t * BLOCK_T + i_e // S
        ok = (i_e < BLOCK_T * S) & (i_t < T)
        e0 = pid_t * BLOCK_T * S  # flat slot index of the tile's first slot
        b_j = tl.load(IDX + i_bh.to(tl.int64) * T * S + e0 + i_e, mask=ok, other=-1)
        kept = ok & _kept(b_j, i_t, T, NB, BS)
        i_g = tl.arange(0, BLOCK_G)
        p_l = PART_L + (i_bh.to(tl.int64) * T * S + e0 + i_e)[:, None] * G + i_g[None, :]
        b_inf = tl.full([L_PAD, BLOCK_G], float("-inf"), tl.float32)
        tl.store(p_l, b_inf, mask=(ok & ~kept)[:, None] & (i_g < G)[None, :])
        b_j = tl.where(kept, b_j, NB).to(tl.int32)
        # Sort by (block, slot); dropped slots (block NB) sort last. The keys are 32-bit
        # unless (NB + 1) * L_PAD needs more (half the lane shuffles of 64-bit keys).
        if KEY64:
            b_key = tl.sort(b_j.to(tl.int64) * L_PAD + i_e)
        else:
            b_key = tl.sort(b_j * L_PAD + i_e)
        b_j = (b_key // L_PAD).to(tl.int32)
        i_slot = (b_key % L_PAD).to(tl.int32) + e0
        # Runs of one block, and a row's repeats of it: sorted by (block, slot), a row's
        # repeats follow its first slot naming the block, so one gather of each lane's left
        # neighbour's (block, token) tells both where a run starts and whether a lane
        # repeats the one before it.
        b_jt = b_j.to(b_key.dtype) * BLOCK_T + (i_slot - e0) // S
        b_prev = tl.gather(b_jt, tl.maximum(i_e - 1, 0), 0)
        first = (i_e == 0) | (b_prev // BLOCK_T != b_j)
        last = (i_e == L_PAD - 1) | (b_j != tl.gather(b_j, tl.minimum(i_e + 1, L_PAD - 1), 0))
        start, end = _run_bounds(first, last, i_e, L_PAD)
        valid = b_j < NB
        # 1 + HIST[bh, w, j] counts the list's unclaimed entries down: the run's last lane
        # takes the run's length off it and the run fills the places [top - length, top).
        i_list = (pid_t // TPW) * NB + b_j
        p_hist = HIST + i_bh.to(tl.int64) * NW * NB + i_list
        b_top = tl.atomic_add(p_hist, start - i_e - 1, mask=last & valid, sem="relaxed")
        b_top = tl.gather(b_top, end, 0) + 1
        b_ptr = tl.load(ROW_PTR + i_bh.to(tl.int64) * (NW * NB + 1) + i_list, mask=valid, other=0)
        place = b_ptr + b_top - (end - i_e) - 1
        # A repeat keeps its place (the tile-list kernel's HIST counted it) and writes
        # -2 - slot there: no partial, and the partial kernel, which has a few rows a
        # chunk where this kernel has the tile's every slot, marks its PART_L -inf, as a
        # dropped slot's.
        rep = (i_e > 0) & (b_prev == b_jt) & valid
        p_col = COL + i_bh.to(tl.int64) * L + place
        tl.store(p_col, tl.where(rep, -2 - i_slot, i_slot), mask=valid)
        # The chunk's code: its block, and whether any of its tokens lies inside the block
        # (only then does the causal mask matter). All entries of a chunk share the block,
        # so the max over them is 2 j + 1 as soon as one entry needs the mask. A repeat
        # names the block only (a chunk of repeats alone still has one).
        b_code = 2 * b_j + ((i_slot // S < (b_j + 1) * BS) & ~rep)
        p_code = CODE + i_bh.to(tl.int64) * NC + place // CHUNK
        tl.atomic_max(p_code, b_code, mask=valid, sem="relaxed")


@triton.jit
def _chunk_entries(
    COL, CODE, c, o_list, o_code, n_chunks, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr
):
    """The list places of chunk c's rows (flat slot t * S + s; -1 on padding, -2 - slot for
    a repeat) and the chunk's code (2 j + 1 when a row needs the causal mask, else 2 j).
    Row r of a chunk is head r % BLOCK_G of the chunk's entry r // BLOCK_G. A chunk past the lists (c >=
    n_chunks, read ahead by the last iteration) comes back as padding."""
    i_r = tl.arange(0, CHUNK * BLOCK_G)
    live = c < n_chunks
    i_slot = tl.load(COL + o_list + c * CHUNK + i_r // BLOCK_G, mask=live, other=-1)
    b_code = tl.load(CODE + o_code + c, mask=live, other=0)
    return i_slot, b_code


@triton.jit
def _partial_chunk(
    Q, K, V, PART_O, PART_L, FLAG, i_slot, b_code, T, G, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, PREC: tl.constexpr,
    SCALE_POS: tl.constexpr, OFF64: tl.constexpr, EVEN_G: tl.constexpr, FAST: tl.constexpr,
    EVICT: tl.constexpr,
):  # fmt: skip
    """Partial softmax of every real row of one chunk over the chunk's block (step 4).
    Q, K, V, PART_O, PART_L, FLAG point at the program's (b, kv head): the group's first
    query head, its K/V head, its partials and its tiles' non-finite flags (tiles of
    BLOCK_T tokens). i_slot, b_code: from `_chunk_entries`.
    SCALE_POS: qk_scale > 0, so that the row max can be taken before scaling. OFF64: the
    per-row offsets need 64 bits (T * S * BLOCK_G * D past `partial_off32_max`). EVEN_G:
    G == BLOCK_G."""
    i_r = tl.arange(0, CHUNK * BLOCK_G)
    i_g = i_r % BLOCK_G
    i_d = tl.arange(0, D)
    ok = (i_slot >= 0) & (i_g < G)
    # A row's repeat of its block (place -2 - slot, see the fill kernel) takes no part:
    # its slot's lse is -inf, as a dropped slot's.
    rep = (i_slot < -1) & (i_g < G)
    if OFF64:
        o_rep = (-2 - i_slot).to(tl.int64) * G + i_g
    else:
        o_rep = (-2 - i_slot) * G + i_g
    tl.store(PART_L + o_rep, tl.full(o_rep.shape, float("-inf"), tl.float32), mask=rep)
    j = b_code // 2
    # Padding rows (slot -1) read token 0's q row, a valid address: their results are
    # never stored, so the q loads need a mask only for a padded group (G < BLOCK_G).
    i_t = tl.maximum(i_slot, 0) // S
    if OFF64:
        o_q = (i_g.to(tl.int64) * T + i_t) * D
    else:
        o_q = (i_g * T + i_t) * D
    if EVEN_G:
        b_q = tl.load(Q + o_q[:, None] + i_d[None, :])
    else:
        b_q = tl.load(Q + o_q[:, None] + i_d[None, :], mask=(i_g < G)[:, None], other=0.0)
    # Keys past T (the tail of the last block) read key T - 1 instead of being masked: a
    # token that chose the last block lies inside it, so its chunk takes the causal mask,
    # which drops every key past the token (i_k, not the clamped address).
    i_k = j * BS + tl.arange(0, BS)
    o_kv = tl.minimum(i_k, T - 1) * D
    b_k = tl.load(K + o_kv[:, None] + i_d[None, :])
    b_v = tl.load(V + o_kv[:, None] + i_d[None, :])
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
    if not SCALE_POS:
        b_s = b_s * qk_scale
    if b_code % 2 == 1:
        b_s = tl.where(i_k[None, :] <= i_t[:, None], b_s, float("-inf"))
    # Row statistics in the layout of the scores: finite on real rows (key j * BS <= t),
    # l >= 1 there. A padding row may get m = -inf and NaN in p and o: a product's rows are
    # independent, and padding rows are never stored, so m is not masked (that would move
    # the row vectors between layouts, through shared memory). l is: its trip through
    # shared memory keeps ptxas from interleaving the two products' epilogues, which would
    # hold both in registers at once and leave room for one program fewer per SM.
    if SCALE_POS:
        # A positive scale commutes with the max: one multiply-add per score, not two ops.
        b_m = tl.max(b_s, axis=1) * qk_scale
        b_p = tl.exp2(b_s * qk_scale - b_m[:, None])
    else:
        b_m = tl.max(b_s, axis=1)
        b_p = tl.exp2(b_s - b_m[:, None])
    b_l = tl.where(ok, tl.sum(b_p, axis=1), 1.0)
    # FAST: the row's reciprocal and log2 by the special-function unit's approximations
    # (relative error near 2**-22 for l in [1, BS]) instead of the exact sequences (about
    # 20 instructions a row each); the interpreter has no libdevice, so it takes the latter.
    if FAST:
        b_rl = libdevice.fast_dividef(1.0, b_l)
        b_lg = libdevice.fast_log2f(b_l)
    else:
        b_rl = 1.0 / b_l
        b_lg = tl.log2(b_l)
    b_o = tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC) * b_rl[:, None]
    if b_code % 2 == 1:
        # The only chunks that hide keys from a row (see the module doc): flag the tiles
        # whose rows may have taken a hidden non-finite value, for the fix-up kernel.
        _flag_nonfinite(FLAG, i_t // BLOCK_T, b_o, ok)
    if OFF64:
        o_part = i_slot.to(tl.int64) * G + i_g
    else:
        o_part = i_slot * G + i_g
    p_o = PART_O + o_part[:, None] * D + i_d[None, :]
    tl.store(p_o, b_o.to(PART_O.dtype.element_ty), mask=ok[:, None], eviction_policy=EVICT)
    tl.store(PART_L + o_part, b_m + b_lg, mask=ok)


@triton.jit
def _partial_step(
    Q, K, V, COL, CODE, PART_O, PART_L, FLAG, c, n_prog, i_slot, b_code, o_list, o_code,
    n_chunks, T, G, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, PREC: tl.constexpr,
    SCALE_POS: tl.constexpr, OFF64: tl.constexpr, EVEN_G: tl.constexpr, FAST: tl.constexpr,
    EVICT: tl.constexpr,
):  # fmt: skip
    """Chunk c of `_partial_kernel`'s loop; returns the places and code the next step takes.
    i_slot and b_code are chunk c's, read by the step before, and chunk c + n_prog's are
    read here before chunk c computes, so that the next chunk's gathers need not wait for
    them."""
    i_next, code_next = _chunk_entries(
        COL, CODE, c + n_prog, o_list, o_code, n_chunks, CHUNK, BLOCK_G
    )
    _partial_chunk(
        Q, K, V, PART_O, PART_L, FLAG, i_slot, b_code, T, G, qk_scale, S, D, BS, CHUNK,
        BLOCK_G, BLOCK_T, PREC, SCALE_POS, OFF64, EVEN_G, FAST, EVICT,
    )  # fmt: skip
    return i_next, code_next


@triton.jit
def _partial_kernel(
    Q, K, V, ROW_PTR, COL, CODE, PART_O, PART_L, FLAG, T, NL, Hq, G, L, NC, N_TILES, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr, PREC: tl.constexpr,
    SCALE_POS: tl.constexpr, STAGES: tl.constexpr, PIPELINED: tl.constexpr,
    OFF64: tl.constexpr, EVEN_G: tl.constexpr, FAST: tl.constexpr, EVICT: tl.constexpr,
    WAIT: tl.constexpr,
):  # fmt: skip
    """Chunks pid, pid + num_programs, ... of the lists of one (b, kv head) (step 4).
    PIPELINED: a `tl.range` loop that Triton software-pipelines over STAGES; otherwise
    (the interpreter, which cannot run `tl.range` over a loaded bound) a `while` loop over
    the same chunks. Each iteration reads the next chunk's list places and code before it
    computes its own, so the next chunk's gathers need not wait for them. WAIT: launched
    as a programmatic dependent (`chain_pdl`): first wait for the fill kernel's writes."""
    if WAIT:
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    i_bh = tl.program_id(1)
    n_prog = tl.num_programs(0)
    Hkv = Hq // G
    o_head = (i_bh // Hkv) * Hq + (i_bh % Hkv) * G  # first query head of the group
    # The program's bases (64-bit scalars); per-row offsets from them fit 32 bits unless OFF64.
    Q += o_head.to(tl.int64) * T * D
    K += i_bh.to(tl.int64) * T * D
    V += i_bh.to(tl.int64) * T * D
    PART_O += i_bh.to(tl.int64) * T * S * G * D
    PART_L += i_bh.to(tl.int64) * T * S * G
    FLAG += i_bh.to(tl.int64) * N_TILES
    o_list = i_bh.to(tl.int64) * L
    o_code = i_bh.to(tl.int64) * NC
    n_chunks = tl.load(ROW_PTR + i_bh.to(tl.int64) * (NL + 1) + NL) // CHUNK
    i_slot, b_code = _chunk_entries(COL, CODE, pid, o_list, o_code, n_chunks, CHUNK, BLOCK_G)
    if PIPELINED:
        for c in tl.range(pid, n_chunks, n_prog, num_stages=STAGES):
            i_slot, b_code = _partial_step(
                Q, K, V, COL, CODE, PART_O, PART_L, FLAG, c, n_prog, i_slot, b_code, o_list,
                o_code, n_chunks, T, G, qk_scale, S, D, BS, CHUNK, BLOCK_G, BLOCK_T, PREC,
                SCALE_POS, OFF64, EVEN_G, FAST, EVICT,
            )  # fmt: skip
    else:
        c = pid
        while c < n_chunks:
            i_slot, b_code = _partial_step(
                Q, K, V, COL, CODE, PART_O, PART_L, FLAG, c, n_prog, i_slot, b_code, o_list,
                o_code, n_chunks, T, G, qk_scale, S, D, BS, CHUNK, BLOCK_G, BLOCK_T, PREC,
                SCALE_POS, OFF64, EVEN_G, FAST, EVICT,
            )  # fmt: skip
            c += n_prog


@triton.jit
def _combine_tile(
    PART_O, PART_L, O, LSE, pid_t, i_bh, T, Hq, G,
    S: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """o and lse of the rows of one block-handled tile from their slots' partials (step 5),
    slot by slot in a fixed order. A slot is kept when its lse is not -inf (the fill kernel
    wrote -inf for the dropped ones; a NaN, an lse nobody wrote in a poisoned test buffer,
    counts as kept and shows). Every slot's lse first (small loads, all issued at once), so
    the max and the weights are known before any partial is read, and the sum over slots
    needs no rescaling."""
    Hkv = Hq // G
    i_t, i_g, row_ok = _tile_rows(pid_t, T, G, BLOCK_T, BLOCK_G)
    i_d = tl.arange(0, D)
    o_row = (((i_bh // Hkv) * Hq + (i_bh % Hkv) * G + i_g).to(tl.int64) * T + i_t) * D
    o_slot0 = i_bh.to(tl.int64) * T * S + i_t * S  # flat slot index of each row's slot 0
    b_kept = ()
    b_lse = ()
    b_m = tl.full([BLOCK_T * BLOCK_G], float("-inf"), tl.float32)
    for s in tl.static_range(S):
        # Only kept slots were given a partial: the others are never read.
        b_ls = tl.load(PART_L + (o_slot0 + s) * G + i_g, mask=row_ok, other=float("-inf"))
        b_kept = b_kept + (b_ls != float("-inf"),)
        b_lse = b_lse + (b_ls,)
        b_m = tl.maximum(b_m, b_ls)
    m_safe = tl.where(b_m == float("-inf"), 0.0, b_m)  # rows with no kept slot
    b_l = tl.zeros([BLOCK_T * BLOCK_G], tl.float32)
    b_acc = tl.zeros([BLOCK_T * BLOCK_G, D], tl.float32)
    for s in tl.static_range(S):
        b_w = tl.exp2(b_lse[s] - m_safe)  # 0 for dropped slots
        p_o = PART_O + ((o_slot0 + s) * G + i_g)[:, None] * D + i_d[None, :]
        b_o = tl.load(p_o, mask=b_kept[s][:, None], other=0.0).to(tl.float32)
        b_l += b_w
        b_acc += b_w[:, None] * b_o
    # No kept slot: l = 0 (a NaN l, from a partial that saw a NaN key, stays NaN).
    no_key = b_l == 0
    b_l = tl.where(no_key, 1.0, b_l)
    b_lse = tl.where(no_key, float("-inf"), (m_safe + tl.log2(b_l)) * LN2)
    b_o = b_acc / b_l[:, None]
    tl.store(O + o_row[:, None] + i_d[None, :], b_o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + o_row // D, b_lse, mask=row_ok)


@triton.jit
def _combine_kernel(
    COUNT, PART_O, PART_L, O, LSE, T, Hq, G, MIN_BLOCKS, N_TILES,
    S: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr,
    WALK: tl.constexpr, WAIT: tl.constexpr,
):  # fmt: skip
    """Tiles pid, pid + num_programs, ... of one (b, kv head): the block-handled ones are
    combined, the others skipped (persistent programs: on the 'recent' pattern no tile is
    block-handled, and a few programs reading the counts cost less than one per tile).
    The next tile's count is read before this tile is combined, so the branch on it does
    not wait for memory. WALK: a power of two >= the tiles of one program, or 0: no
    pre-check. WAIT: launched as a programmatic dependent (`chain_pdl`): first wait for
    the partial kernel's writes."""
    if WAIT:
        tl.extra.cuda.gdc_wait()
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    n_prog = tl.num_programs(0)
    p_count = COUNT + i_bh.to(tl.int64) * N_TILES
    # All of the program's counts first, in one vector load (WALK >= its tiles): on the
    # 'recent' pattern none exceeds MIN_BLOCKS, and the walk below never starts.
    todo = True
    if WALK > 0:
        i_w = pid_t + tl.arange(0, WALK) * n_prog
        todo = tl.max(tl.load(p_count + i_w, mask=i_w < N_TILES, other=0), axis=0) > MIN_BLOCKS
    if todo:
        n = tl.load(p_count + pid_t, mask=pid_t < N_TILES, other=0)
        while pid_t < N_TILES:
            nxt = pid_t + n_prog
            n_next = tl.load(p_count + nxt, mask=nxt < N_TILES, other=0)
            if n > MIN_BLOCKS:
                _combine_tile(
                    PART_O, PART_L, O, LSE, pid_t, i_bh, T, Hq, G, S, D, BLOCK_T, BLOCK_G
                )  # fmt: skip
            n = n_next
            pid_t = nxt


_SMS = {}  # CUDA device index -> its streaming multiprocessors (`_multiprocessors`)


def _multiprocessors(device):
    """Streaming multiprocessors of a CUDA device (a host-side query, made once per
    device); 1 elsewhere."""
    if device.type != "cuda":
        return 1
    n = _SMS.get(device.index)
    if n is None:
        n = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def list_windows(T, block_t, tuning=None):
    """Windows of the block lists for T tokens in tiles of block_t: `list_window` tokens
    (rounded to whole tiles) each, or one window."""
    window = resolve(tuning).block_major.list_window
    if window is None:
        return 1
    n_tiles = _runtime.cdiv(T, block_t)
    return _runtime.cdiv(n_tiles, max(1, window // block_t))


def chunk_entries(G, element_size, tuning=None):
    """List entries per chunk: `chunk_rows` rows over the padded group for 16-bit inputs;
    fp32 (IEEE dots without tensor cores) takes half."""
    block_g = _runtime.next_pow2(G)
    return max(1, resolve(tuning).block_major.chunk_rows * 2 // element_size // block_g)


def list_sizes(dims, block_t, element_size, tuning):
    """(BH, NL, L, NC) of `list_scratch`."""
    BH = dims.B * dims.Hkv
    NL = list_windows(dims.T, block_t, tuning) * dims.NB
    chunk = chunk_entries(dims.G, element_size, tuning)
    L = dims.T * dims.S + NL * chunk
    return BH, NL, L, _runtime.cdiv(L, chunk)


def list_scratch(
    dims, block_t, element_size, device, tuning=None, key=None, scratch=None, call=None
):  # fmt: skip
    """hist, col and code of one forward call for its checked `dims`: views of one int32
    buffer filled with -1, so that the three cost one fill. -1 is padding in col and "no
    block yet" in code, and hist counts from -1 (the tile-list kernel adds each list's
    entries to it, the fill kernel counts them down again). Shapes: [BH, NL],
    [BH, T * S + NL * chunk] and [BH, cdiv(T * S + NL * chunk, chunk)] for BH = B * Hkv,
    NL = windows * NB lists and chunk = `chunk_entries`. key: the forward's launch key
    (`_runtime.per_key`), or None; scratch: the forward's `_runtime.Scratch`, which the
    buffer comes from, or None (its own allocation); a Scratch with addresses gives the
    three as device addresses (ints), filled by one driver memset on the stream of `call`
    (the forward's `_runtime.Call`, needed then)."""
    BH, NL, L, NC = _runtime.per_key(key, device, list_sizes, dims, block_t, element_size, tuning)
    scratch = scratch or _runtime.Scratch(device)
    n = BH * (NL + L + NC)
    if scratch.addresses:  # a direct call: the kernels take addresses
        at, w = scratch.empty((n,), torch.int32), torch.int32.itemsize
        call.fill_int32(at, -1, n)
        return at, at + w * BH * NL, at + w * BH * (NL + L)
    buf = scratch.empty((n,), torch.int32)
    buf.fill_(-1)
    at = buf.storage_offset()
    return (
        buf.as_strided((BH, NL), (NL, 1), at),
        buf.as_strided((BH, L), (L, 1), at + BH * NL),
        buf.as_strided((BH, NC), (NC, 1), at + BH * (NL + L)),
    )


class _ListsPlan(NamedTuple):
    """The launches of `block_lists`, from sizes and tuning alone (`_lists_plan`)."""

    row_ptr_shape: tuple
    col_shape: tuple
    code_shape: tuple
    prefix_grid: tuple
    prefix_args: tuple  # scalar arguments
    prefix_options: dict  # constexprs and launch options
    fill_grid: tuple
    fill_args: tuple
    fill_options: dict


def _lists_plan(shape, block_size, block_t, chunk, NL, n_tiles, G, min_blocks, tuning, pdl):
    t = tuning.block_major
    B, Hkv, T, S = shape
    BH = B * Hkv
    NB = _runtime.cdiv(T, block_size)
    NW = NL // NB
    L = T * S + NL * chunk
    NC = _runtime.cdiv(L, chunk)
    l_pad = _runtime.next_pow2(block_t * S)
    return _ListsPlan(
        (BH, NL + 1), (BH, L), (BH, NC),
        (BH,), (NL,),
        dict(CHUNK=chunk, PB=t.prefix_block, direct=tuning.direct_launch, num_warps=4),
        (n_tiles, BH), (T, NB, NW, window_tiles(n_tiles, NW), L, NC, min_blocks, G),
        dict(
            S=S, BS=block_size, BLOCK_T=block_t, L_PAD=l_pad, CHUNK=chunk,
            KEY64=(NB + 1) * l_pad > t.fill_key32_max, BLOCK_G=_runtime.next_pow2(G),
            WAIT=pdl, launch_pdl=pdl, direct=tuning.direct_launch, num_warps=t.fill_warps,
        ),
    )  # fmt: skip


def block_lists(
    block_idx, counts, hist, min_blocks, block_size, block_t, chunk, part_l, tuning=None,
    col=None, code=None, call=None, pdl=False, scratch=None, sizes=None,
):  # fmt: skip
    """Per (b, kv head, window, key block), the kept slots of the window's block-handled
    tiles that chose the block.

    Args:
        block_idx: [B, Hkv, T, S] int32/int64, contiguous.
        counts: int32 [B * Hkv, n_tiles] distinct kept blocks per tile of block_t tokens
            (`tiles.tile_block_lists`); tiles with counts > min_blocks are block-handled.
        hist: int32 [B * Hkv, NW * NB] from `tile_block_lists(..., hist, min_blocks)` on
            a hist filled with -1: entries per (window, block) less one, NW windows of
            `tiles.window_tiles(n_tiles, NW)` tiles. Consumed: counted down to -1.
        block_size, block_t: keys per block, tokens per tile; chunk: entries per chunk.
        part_l: fp32 [B * Hkv, T, S, G], the partials' lse: its dropped slots of
            block-handled tiles are set to -inf here (the kept ones and the repeats, placed
            as -2 - slot in col, are the partial kernel's).
        tuning: an `NsaTuning` (None: the default); its block_major settings apply.
        col, code: buffers for the results, filled with -1 (`list_scratch`); None:
            allocated here.
        call: the calling wrapper's `_runtime.Call`, or None (launched on their own).
        pdl: launch the fill kernel as a programmatic dependent of the prefix kernel
            (`chain_pdl`; only where `_runtime.pdl_supported`).
        scratch: the calling wrapper's `_runtime.Scratch`, which row_ptr comes from, or
            None (its own allocation).
        sizes: (NW * NB, n_tiles, G), which are otherwise read off hist, counts and part_l:
            needed where those are device addresses (a direct call's scratch).
    Returns:
        row_ptr: int32 [B * Hkv, NL + 1] (NL = NW * NB lists, list w * NB + j for block j
            in window w), multiples of chunk; list l's places of row bh are
            col[bh, row_ptr[bh, l] : row_ptr[bh, l + 1]]: its entries, in an unspecified
            order, then -1 up to the chunk boundary (fewer than chunk of them).
        col: int32 [B * Hkv, T * S + NL * chunk] flat slot indices t * S + s, or
            -2 - (t * S + s) for a slot repeating its row's block (past row_ptr[bh, NL]:
            unwritten).
        code: int32 [B * Hkv, cdiv(L, chunk)] per chunk of places (col[bh, c * chunk :
            (c + 1) * chunk]): 2 * block + 1 when one of its entries' tokens lies inside
            its block (the causal mask matters), else 2 * block; -1 past the lists.
    Two kernel launches (and the fills of col and code when not given), no host sync.
    """
    tuning = resolve(tuning)
    dev = block_idx.device
    if call is None:
        call = _runtime.Call(None, dev)
    if sizes is None:
        sizes = hist.shape[1], counts.shape[1], part_l.shape[3]
    p = _runtime.per_key(
        call.key, dev, _lists_plan, tuple(block_idx.shape), block_size, block_t, chunk, *sizes,
        min_blocks, tuning, pdl,
    )  # fmt: skip
    row_ptr = (scratch or _runtime.Scratch(dev)).empty(p.row_ptr_shape, torch.int32)
    if col is None:
        col = torch.full(p.col_shape, -1, dtype=torch.int32, device=dev)  # -1: padding
    if code is None:
        code = torch.full(p.code_shape, -1, dtype=torch.int32, device=dev)
    call.launch(_prefix_kernel, p.prefix_grid, (hist, row_ptr, *p.prefix_args), p.prefix_options)
    call.launch(
        _fill_kernel, p.fill_grid,
        (block_idx, counts, hist, row_ptr, col, code, part_l, *p.fill_args), p.fill_options,
    )  # fmt: skip
    return row_ptr, col, code


class _BlockPlan(NamedTuple):
    """The block-major phase's own buffers and launches, from sizes, tuning and device
    alone (`_block_plan`)."""

    chunk: int
    n_lists: int  # NW * NB
    pdl: bool
    part_o_shape: tuple
    partial_grid: tuple
    partial_args: tuple  # scalar arguments
    partial_options: dict  # constexprs and launch options
    combine_grid: tuple
    combine_args: tuple
    combine_options: dict


def _block_plan(dims, dtype, block_t, n_tiles, min_blocks, qk_scale, tuning, interpreted, device):
    t = tuning.block_major
    BH = dims.B * dims.Hkv
    block_g = _runtime.next_pow2(dims.G)
    prec = "ieee" if dtype == torch.float32 else "tf32"
    _, n_lists, L, NC = list_sizes(dims, block_t, dtype.itemsize, tuning)
    chunk = chunk_entries(dims.G, dtype.itemsize, tuning)
    # The chain fill -> partial -> combine as programmatic dependents (`chain_pdl`).
    pdl = t.chain_pdl and not interpreted and _runtime.pdl_supported(device)
    n_chunks = _runtime.cdiv(dims.T * dims.S, chunk) + n_lists  # the most any row can have
    if t.partial_waves is not None:
        n_chunks = min(n_chunks, _runtime.cdiv(t.partial_waves * _multiprocessors(device), BH))
    n_comb = n_tiles
    if t.combine_waves is not None:
        n_comb = min(n_tiles, _runtime.cdiv(t.combine_waves * _multiprocessors(device), BH))
    walk = _runtime.next_pow2(_runtime.cdiv(n_tiles, n_comb))
    return _BlockPlan(
        chunk, n_lists, pdl, (BH, dims.T, dims.S, dims.G, dims.D),
        (n_chunks, BH),
        (dims.T, n_lists, dims.Hq, dims.G, L, NC, n_tiles, qk_scale),
        dict(
            S=dims.S, D=dims.D, BS=dims.block_size, CHUNK=chunk, BLOCK_G=block_g,
            BLOCK_T=block_t, PREC=prec, SCALE_POS=qk_scale > 0, STAGES=t.partial_stages,
            PIPELINED=not interpreted,
            OFF64=dims.T * dims.S * block_g * dims.D > t.partial_off32_max,
            EVEN_G=dims.G == block_g, FAST=t.partial_fast_math and not interpreted,
            EVICT=t.partial_store_evict, WAIT=pdl, launch_pdl=pdl,
            direct=tuning.direct_launch, num_warps=t.partial_warps,
        ),
        (n_comb, BH),
        (dims.T, dims.Hq, dims.G, min_blocks, n_tiles),
        dict(
            S=dims.S, D=dims.D, BLOCK_T=block_t, BLOCK_G=block_g,
            WALK=walk if walk <= t.combine_precheck_tiles else 0, WAIT=pdl, launch_pdl=pdl,
            direct=tuning.direct_launch, num_warps=t.combine_warps,
        ),
    )  # fmt: skip


def block_major_forward(
    q, k, v, block_idx, counts, hist, col, code, min_blocks, o, lse, flags, dims, block_t,
    qk_scale, tuning, call=None, interpreted=None, scratch=None,
):  # fmt: skip
    """Write o and lse of the block-handled tiles (called by `selection_forward_triton`).

    Args:
        q, k, v, block_idx: the forward's checked inputs; dims their `_checks.Dims`.
        counts, hist, min_blocks, col, code: as for `block_lists` (hist, col and code from
            `list_scratch`); with a direct call's scratch, counts, hist, col, code and
            flags are device addresses (ints), and so are the partials made here.
        o: [B, Hq, T, D], lse: fp32 [B, Hq, T], the forward's outputs: rows of block-handled
            tiles are written here, the others left alone.
        flags: int32 [B * Hkv, n_tiles], zero-filled: set to 1 for each block-handled tile
            with a row whose partial over a block that takes the causal mask ended
            non-finite (a hidden key's value may have reached it).
        block_t: tokens per tile (the forward's); qk_scale: softmax scale * log2(e).
        tuning: the forward's `NsaTuning`; its block_major settings apply.
        call: the forward's `_runtime.Call`, or None (launched on their own).
        interpreted: whether Triton's interpreter runs the kernels (None: read it here).
        scratch: the forward's `_runtime.Scratch`, which the partials and `block_lists`'s
            row offsets come from, or None (their own allocations).
    """
    if interpreted is None:
        interpreted = _runtime.interpreter_active()
    dev = q.device
    if call is None:
        call = _runtime.Call(None, dev)
    n_tiles = _runtime.cdiv(dims.T, block_t)
    p = _runtime.per_key(
        call.key, dev, _block_plan, dims, q.dtype, block_t, n_tiles, min_blocks, qk_scale,
        tuning, interpreted, dev,
    )  # fmt: skip
    if scratch is None:
        scratch = _runtime.Scratch(dev)
    part_o = scratch.empty(p.part_o_shape, q.dtype)
    part_l = scratch.empty(p.part_o_shape[:4], torch.float32)
    row_ptr, col, code = block_lists(
        block_idx, counts, hist, min_blocks, dims.block_size, block_t, p.chunk, part_l, tuning,
        col=col, code=code, call=call, pdl=p.pdl, scratch=scratch,
        sizes=(p.n_lists, n_tiles, dims.G),
    )  # fmt: skip
    call.launch(
        _partial_kernel, p.partial_grid,
        (q, k, v, row_ptr, col, code, part_o, part_l, flags, *p.partial_args), p.partial_options,
    )  # fmt: skip
    call.launch(
        _combine_kernel, p.combine_grid, (counts, part_o, part_l, o, lse, *p.combine_args),
        p.combine_options,
    )  # fmt: skip
