"""Triton forward of NSA selection attention.

Design: one program per (tile of BLOCK_T consecutive query positions, b, kv head). The
program stacks the G query heads of its BLOCK_T tokens into one [BLOCK_T * BLOCK_G, D] tile
(BLOCK_G = next_pow2(G), padding rows masked), so even G = 1..8 fills the 16 rows a tensor-core
tile needs with real queries instead of padding. BLOCK_T = max(1, TILE_ROWS // BLOCK_G) with
TILE_ROWS = 16 by default: G >= 16 gives one token per program.

The program walks the (token, slot) pairs of its tile. Each kept block j that no earlier pair
of the tile has already produced is loaded once ([block_size, D] of K and V) and multiplied by
the whole query tile; rows whose token did not select j, and keys after a row's position, are
masked to -inf. Neighbouring tokens often share blocks (always, for the 'recent' pattern), so
a shared block costs one K/V load and one dot for the whole tile; in the worst case (no
sharing) the work equals that of a per-token kernel. The softmax is the online (running max)
form in fp32 over the visited blocks, in base 2; o is written in the input dtype and
lse = log(sum exp(s)) in fp32, natural log, -inf (with o = 0) for rows with no visible key.

fp32 inputs use tl.dot with input_precision="ieee" so results match the fp32 reference to
about 1e-5 on the GPU as well as in the interpreter.
"""

import torch
import triton
import triton.language as tl

from . import _checks

LOG2E = 1.4426950408889634
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile_rows(pid_t, T, G, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr):
    """Row r of a token tile is head r % BLOCK_G of token pid_t * BLOCK_T + r // BLOCK_G."""
    i_r = tl.arange(0, BLOCK_T * BLOCK_G)
    i_t = pid_t * BLOCK_T + i_r // BLOCK_G
    i_g = i_r % BLOCK_G
    row_ok = (i_t < T) & (i_g < G)
    return i_t, i_g, row_ok


@triton.jit
def _tile_slots(p_idx, i_t, T, NB, S: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr):
    """[rows, S_PAD] kept block ids of each row's token (-1 where the slot is dropped),
    and the flat (token-in-tile, slot) order used to skip blocks already visited."""
    i_s = tl.arange(0, S_PAD)
    mask = (i_t < T)[:, None] & (i_s < S)[None, :]
    b_j = tl.load(p_idx + i_t.to(tl.int64)[:, None] * S + i_s[None, :], mask=mask, other=-1)
    # Tested in the index dtype (int64 ids beyond int32 must not wrap into range), then narrowed.
    keep = (b_j >= 0) & (b_j < NB) & (b_j * BS <= i_t[:, None])
    return tl.where(keep, b_j, -1).to(tl.int32), i_s


@triton.jit
def _next_block(p_idx, f, t0, T, NB, b_j, i_flat, S: tl.constexpr, BS: tl.constexpr):
    """Block of pair f = (token t0 + f // S, slot f % S) and whether the tile must visit it:
    kept for its token and not produced by an earlier pair (so each block is visited once)."""
    t = t0 + f // S
    j = tl.load(p_idx + t.to(tl.int64) * S + f % S, mask=t < T, other=-1)
    keep = (t < T) & (j >= 0) & (j < NB) & (j * BS <= t)
    j = tl.where(keep, j, -1).to(tl.int32)
    seen = tl.sum(((b_j == j) & (i_flat < f)).to(tl.int32)) > 0
    return j, keep & (~seen)


@triton.jit
def _sel_fwd_kernel(
    Q, K, V, IDX, O, LSE,
    T, NB, Hq, G, qk_scale,
    S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    pid_t = tl.program_id(0)
    i_bh = tl.program_id(1)  # b * Hkv + kv head
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
    b_j, i_s = _tile_slots(p_idx, i_t, T, NB, S, BS, S_PAD)
    i_flat = ((i_t - pid_t * BLOCK_T) * S)[:, None] + i_s[None, :]

    b_m = tl.full([BLOCK_T * BLOCK_G], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_T * BLOCK_G], tl.float32)
    b_acc = tl.zeros([BLOCK_T * BLOCK_G, D], tl.float32)
    for f in range(0, BLOCK_T * S):
        j, visit = _next_block(p_idx, f, pid_t * BLOCK_T, T, NB, b_j, i_flat, S, BS)
        if visit:
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
            b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)
            b_m = m_new
    has_key = b_l > 0
    b_o = b_acc / tl.where(has_key, b_l, 1.0)[:, None]
    b_lse = (b_m + tl.log2(tl.where(has_key, b_l, 1.0))) * LN2
    b_lse = tl.where(has_key, b_lse, float("-inf"))
    tl.store(O + o_row[:, None] + i_d[None, :], b_o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + o_row // D, b_lse, mask=row_ok)


# Tuning knobs, read at call time: query rows (tokens x padded group) per forward/dq program,
# and warps per program. More rows share more K/V loads when neighbouring tokens pick the
# same blocks ('recent'), but visit more blocks per program when they do not ('random').
TILE_ROWS = 16
NUM_WARPS = 4


def tile_config(G, dtype):
    """(BLOCK_G, BLOCK_T, dot precision) shared by the forward and the dq kernel."""
    block_g = triton.next_power_of_2(G)
    block_t = max(1, TILE_ROWS // block_g)
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return block_g, block_t, prec


def selection_forward_triton(q, k, v, block_idx, block_size, scale=None, return_lse=False):
    """NSA selection attention forward (Triton).

    Args:
        q: [B, Hq, T, D] bf16/fp16/fp32, contiguous; D in {32, 64, 128}.
        k, v: [B, Hkv, T, D], q's dtype; Hq % Hkv == 0 (GQA, group G = Hq // Hkv).
        block_idx: [B, Hkv, T, S] int32/int64; slot j is used by query t when
            0 <= j < ceil(T / block_size) and j * block_size <= t; valid entries of a row
            must be distinct (see `validate_block_idx`).
        block_size: 16, 32, 64 or 128.
        scale: softmax scale, default D ** -0.5.
        return_lse: also return lse.
    Returns:
        o [B, Hq, T, D] in q's dtype; with return_lse, (o, lse) where lse is fp32 [B, Hq, T],
        natural log, -inf for rows that see no key (their o row is 0).
    """
    dims = _checks.check_forward_args(q, k, v, block_idx, block_size, scale)
    o = _checks.new_empty(q.shape, q.dtype, q.device)
    lse = _checks.new_empty(q.shape[:3], torch.float32, q.device)
    block_g, block_t, prec = tile_config(dims.G, q.dtype)
    grid = (triton.cdiv(dims.T, block_t), dims.B * dims.Hkv)
    _sel_fwd_kernel[grid](
        q, k, v, block_idx, o, lse,
        dims.T, dims.NB, dims.Hq, dims.G, dims.scale * LOG2E,
        S=dims.S, D=dims.D, BS=block_size, S_PAD=triton.next_power_of_2(dims.S),
        BLOCK_T=block_t, BLOCK_G=block_g, PREC=prec, num_warps=NUM_WARPS,
    )  # fmt: skip
    return (o, lse) if return_lse else o
