"""Fused KDA chain verify: conv + split + gate + delta-rule recurrence in one kernel.

One program per (sequence, value head, V tile of BLOCK_V rows), as in the recurrent
kernel. Each program computes the causal conv of the 2K q/k channels of its q/k head once,
with the per-step gate, beta and normalized q and k, then walks its value rows in sub-tiles
of SUB_V: the conv of the sub-tile's value channels, its fp32 state rows and the T delta
steps. The sub-tiles are independent (a state row only meets its own value channel), so
the loop is software-pipelined: the next sub-tile's state and inputs load while this one
computes. Every conv output is rounded to the input dtype exactly where the unfused conv
kernel stores it; the conv, gate and beta math comes from the `@triton.jit` helpers in
`step`, shared with the unfused kernels, so the ring bytes match those of the unfused
path exactly.

Ownership of the shared writes (each byte written once): the q/k conv windows and rawk
by the first V tile of the first value head of each q/k group; g and beta by the first
V tile of each value head; v windows, rawv, snapshots and o by every tile for its slice.

Tuning: the wrapper's `tuning=` (a `tuning.VerifyTuning`; None = `tuning.DEFAULT`). The one
compatibility override is the module attribute `KDA_VERIFY_BLOCK_V`: read at every call, an
int (a power of two) forces the value tile BLOCK_V over `tuning` (a ValueError naming it
otherwise), None leaves the tile to `tuning`. Scripts written against the original kernels
sweep the tile by setting it.
"""

import torch
import triton
import triton.language as tl

from . import tuning as _tuning
from .checks import (
    FLOAT_DTYPES,
    check_devices,
    check_heads,
    check_index,
    check_lower_bound,
    check_state_and_saves,
    check_tensor,
    save_args,
    tokens_view,
)
from .step import (
    _conv_out,
    _load_rows,
    _pool_line,
    _step_inputs,
    _store_ring_shared,
    _store_windows,
    _tile_ptrs,
    _tile_rows,
    _verify_steps,
)

# The one module-level override, kept for scripts that sweep the value tile by setting it
# (`fused_verify.KDA_VERIFY_BLOCK_V = bv`): read at every call; an int forces BLOCK_V (a
# power of two, in place of tuning.block_v), None leaves the tile to `tuning`.
KDA_VERIFY_BLOCK_V = None


@triton.jit
def _load_v_rows(p_x, s_m_n, conv_w, s_cw_c, s_cw_w, conv_b, p_cs, s_cs_c, s_cs_w, p_h0, s_h0_v,
                 c_v, o_sv, valid, T: tl.constexpr, W: tl.constexpr, K: tl.constexpr,
                 KC: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    """Loads of one group of value rows o_sv (channels c_v): the conv sequence (saved conv
    inputs, then the T new inputs), conv weights and bias, and the fp32 state rows (in the
    tile shape of `_tile_ptrs`)."""
    m_sv = valid & (o_sv >= 0)
    b_xv = _load_rows(p_x + c_v, s_m_n, T, None)
    b_wv = _load_rows(conv_w + c_v * s_cw_c, s_cw_w, W, None)
    if HAS_BIAS:
        b_bv = tl.load(conv_b + c_v).to(tl.float32)
    else:
        b_bv = tl.zeros(o_sv.shape, dtype=tl.float32)
    b_xv = _load_rows(p_cs + c_v * s_cs_c, s_cs_w, W - 1, m_sv) + b_xv
    b_S = tl.load(_tile_ptrs(p_h0, o_sv, s_h0_v, K, KC), mask=_tile_rows(m_sv, K, KC), other=0.0)
    return b_xv, b_wv, b_bv, b_S


@triton.jit
def _step_conv(b_xx, b_w, b_b, t: tl.constexpr, W: tl.constexpr, FLOOR: tl.constexpr):
    """fp32 conv output of step t (`_conv_out` with SiLU); with FLOOR (the floor probe,
    `tuning.VerifyTuning.floor_probe`) the step's raw input x_t instead."""
    if FLOOR:
        b_y = b_xx[t + W - 1].to(tl.float32)
    else:
        b_y = _conv_out(b_xx, b_w, b_b, t, W, True)
    return b_y


@triton.jit
def _floor_step_inputs(b_q, b_k, b_a, b_b, T: tl.constexpr, PROJECT: tl.constexpr):
    """`_step_inputs`' tuples for the floor probe: g, beta, q and k are the raw input rows
    (no gate, no norm) and the projected form's coefficients are q and k themselves with
    zero cross terms, so no key-side arithmetic is left."""
    b_g = ()
    b_beta = ()
    b_qn = ()
    b_kn = ()
    for t in tl.static_range(T):
        b_g = b_g + (b_a[t].to(tl.float32),)
        b_beta = b_beta + (b_b[t].to(tl.float32),)
        b_qn = b_qn + (b_q[t].to(tl.float32),)
        b_kn = b_kn + (b_k[t].to(tl.float32),)
    b_pj = ()
    if PROJECT:
        b_A = ()
        b_B = ()
        for t in tl.static_range(T):
            b_B = b_B + (0.0,)
            for _jj in tl.static_range(t):
                b_A = b_A + (0.0,)
                b_B = b_B + (0.0,)
        b_pj = (b_qn, b_kn, b_A, b_B)
    return b_g, b_beta, b_qn, b_kn, b_pj


@triton.jit
def _value_steps(b_xv, b_wv, b_bv, b_S, b_qs, b_ks, b_g, b_beta, b_pj, valid, p_win, s_win_c,
                 s_win_t, s_win_w, c_v, p_o, s_o_n, p_snap, s_snap_t, s_snap_v, p_rawv, s_rawv_r,
                 o_sv, T: tl.constexpr, W: tl.constexpr, K: tl.constexpr, KC: tl.constexpr,
                 SNAPSHOT: tl.constexpr, SNAP_CM: tl.constexpr,
                 RING: tl.constexpr, PROJECT: tl.constexpr, FLOOR: tl.constexpr):  # fmt: skip
    """One group of value rows: their conv outputs (rounded like the unfused kernel's) and
    windows, then the T delta steps with o and the saves."""
    b_v = ()
    for t in tl.static_range(T):
        b_v = b_v + (_step_conv(b_xv, b_wv, b_bv, t, W, FLOOR).to(p_o.dtype.element_ty),)
    m_sv = valid & (o_sv >= 0)
    _store_windows(p_win + c_v * s_win_c, s_win_t, s_win_w, b_xv, T, W, m_sv)
    _verify_steps(
        b_S, b_qs, b_ks, b_v, b_g, b_beta, b_pj, valid, p_o + o_sv, s_o_n, p_snap, s_snap_t,
        s_snap_v, p_rawv, s_rawv_r, o_sv, T, K, KC, SNAPSHOT, SNAP_CM, RING, PROJECT,
    )  # fmt: skip


@triton.jit
def _fused_verify_kernel(
    mixed,
    conv_w,
    conv_b,
    conv_state,
    conv_indices,
    window,
    inter_indices,
    a,
    b,
    A_log,
    dt_bias,
    h0,
    h0_indices,
    o,
    snap,
    rawk,
    rawv,
    ring_g,
    ring_beta,
    n_slots,
    n_conv_lines,
    n_lines,
    s_m_n,
    s_cw_c,
    s_cw_w,
    s_cs_l,
    s_cs_c,
    s_cs_w,
    s_win_l,
    s_win_t,
    s_win_c,
    s_win_w,
    s_a_n,
    s_b_n,
    s_o_n,
    s_o_h,
    s_h0_s,
    s_h0_h,
    s_h0_v,
    s_snap_l,
    s_snap_t,
    s_snap_h,
    s_snap_v,
    s_rawk_s,
    s_rawk_h,
    s_rawk_r,
    s_rawv_s,
    s_rawv_h,
    s_rawv_r,
    s_g_s,
    s_g_h,
    s_g_r,
    s_beta_s,
    s_beta_h,
    s_beta_r,
    scale,
    lower_bound,
    T: tl.constexpr,
    W: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SUB_V: tl.constexpr,
    STAGES: tl.constexpr,
    KC: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SAFE_GATE: tl.constexpr,
    NORM_ROW: tl.constexpr,
    STACK_SUMS: tl.constexpr,
    SNAPSHOT: tl.constexpr,
    SNAP_CM: tl.constexpr,
    RING: tl.constexpr,
    PROJECT: tl.constexpr,
    FLOOR: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, K)
    DT = mixed.dtype.element_ty

    # 1. The indices: they head the longest chain of loads (index -> state / conv line).
    # One outside its pool (negative or past the end; n_lines bounds both pools of the
    # intermediate line, windows and snapshots) makes the sequence padding: every pool
    # access below is masked by `valid`.
    i_slot = _pool_line(tl.load(h0_indices + i_n).to(tl.int64), n_slots)
    i_cline = _pool_line(tl.load(conv_indices + i_n).to(tl.int64), n_conv_lines)
    i_line = _pool_line(tl.load(inter_indices + i_n).to(tl.int64), n_lines)
    valid = (i_slot >= 0) & (i_cline >= 0) & (i_line >= 0)

    # 2. The q/k head's inputs for all T steps (new inputs, conv weights and bias, saved
    # conv inputs), a, b and the gate parameters, all loaded before anything is computed.
    c_q = i_h * K + o_k
    c_k = H * K + i_h * K + o_k
    p_x = mixed + i_n * T * s_m_n
    p_cs = conv_state + i_cline * s_cs_l
    m_k = valid & (o_k >= 0)
    b_xq = _load_rows(p_x + c_q, s_m_n, T, None)
    b_xk = _load_rows(p_x + c_k, s_m_n, T, None)
    b_wq = _load_rows(conv_w + c_q * s_cw_c, s_cw_w, W, None)
    b_wk = _load_rows(conv_w + c_k * s_cw_c, s_cw_w, W, None)
    if HAS_BIAS:
        b_bq = tl.load(conv_b + c_q).to(tl.float32)
        b_bk = tl.load(conv_b + c_k).to(tl.float32)
    else:
        b_bq = tl.zeros([K], dtype=tl.float32)
        b_bk = tl.zeros([K], dtype=tl.float32)
    i_tok = i_n * T
    b_a = _load_rows(a + i_tok * s_a_n + i_hv * K + o_k, s_a_n, T, None)
    b_b = _load_rows(b + i_tok * s_b_n + i_hv, s_b_n, T, None)
    b_A_log = tl.load(A_log + i_hv)
    b_dt_bias = tl.load(dt_bias + i_hv * K + o_k)
    b_xq = _load_rows(p_cs + c_q * s_cs_c, s_cs_w, W - 1, m_k) + b_xq
    b_xk = _load_rows(p_cs + c_k * s_cs_c, s_cs_w, W - 1, m_k) + b_xk

    # 3. The q/k conv outputs of all steps, rounded to the input dtype where the unfused
    # conv kernel stores them.
    b_q = ()
    b_k = ()
    for t in tl.static_range(T):
        b_q = b_q + (_step_conv(b_xq, b_wq, b_bq, t, W, FLOOR).to(DT),)
        b_k = b_k + (_step_conv(b_xk, b_wk, b_bk, t, W, FLOOR).to(DT),)

    # 4. The value rows. The first sub-tile's loads go out before anything is stored (a
    # store would keep them behind it: the pointers might alias), so its state rows arrive
    # while the q/k work runs; then the q/k windows, the per-step inputs and the shared ring
    # entries, and a loop that loads, computes and saves one sub-tile at a time.
    p_h0 = h0 + i_slot * s_h0_s + i_hv * s_h0_h
    p_snap = snap + i_line * s_snap_l + i_hv * s_snap_h
    p_win = window + i_line * s_win_l
    p_o = o + i_tok * s_o_n + i_hv * s_o_h
    p_rawv = rawv + i_slot * s_rawv_s + i_hv * s_rawv_h
    c_v0 = 2 * H * K + i_hv * V
    own_v = i_v == 0
    own_k = own_v & (i_hv % (HV // H) == 0)
    p_rawk = rawk + i_slot * s_rawk_s + i_h * s_rawk_h
    p_g = ring_g + i_slot * s_g_s + i_hv * s_g_h
    p_beta = ring_beta + i_slot * s_beta_s + i_hv * s_beta_h
    o_sv0 = i_v * BLOCK_V + tl.arange(0, SUB_V)
    b_xv0, b_wv0, b_bv0, b_S0 = _load_v_rows(
        p_x, s_m_n, conv_w, s_cw_c, s_cw_w, conv_b, p_cs, s_cs_c, s_cs_w, p_h0, s_h0_v,
        c_v0 + o_sv0, o_sv0, valid, T, W, K, KC, HAS_BIAS,
    )  # fmt: skip
    _store_windows(p_win + c_q * s_win_c, s_win_t, s_win_w, b_xq, T, W, m_k & own_k)
    _store_windows(p_win + c_k * s_win_c, s_win_t, s_win_w, b_xk, T, W, m_k & own_k)
    if FLOOR:
        b_g, b_beta, b_qs, b_ks, b_pj = _floor_step_inputs(b_q, b_k, b_a, b_b, T, PROJECT)
    else:
        b_g, b_beta, b_qs, b_ks, b_pj = _step_inputs(
            b_q, b_k, b_a, b_b, b_A_log, b_dt_bias, scale, lower_bound, T, SAFE_GATE, PROJECT,
            NORM_ROW, STACK_SUMS,
        )  # fmt: skip
    if RING:
        _store_ring_shared(
            p_rawk, s_rawk_r, p_g, s_g_r, p_beta, s_beta_r, b_k, b_g, b_beta, o_k,
            m_k & own_k, own_v & valid, T,
        )  # fmt: skip
    _value_steps(
        b_xv0, b_wv0, b_bv0, b_S0, b_qs, b_ks, b_g, b_beta, b_pj, valid, p_win, s_win_c,
        s_win_t, s_win_w, c_v0 + o_sv0, p_o, s_o_n, p_snap, s_snap_t, s_snap_v, p_rawv,
        s_rawv_r, o_sv0, T, W, K, KC, SNAPSHOT, SNAP_CM, RING, PROJECT, FLOOR,
    )  # fmt: skip
    for i_s in tl.range(1, BLOCK_V // SUB_V, num_stages=STAGES):
        o_sv = i_v * BLOCK_V + i_s * SUB_V + tl.arange(0, SUB_V)
        b_xv, b_wv, b_bv, b_S = _load_v_rows(
            p_x, s_m_n, conv_w, s_cw_c, s_cw_w, conv_b, p_cs, s_cs_c, s_cs_w, p_h0, s_h0_v,
            c_v0 + o_sv, o_sv, valid, T, W, K, KC, HAS_BIAS,
        )  # fmt: skip
        _value_steps(
            b_xv, b_wv, b_bv, b_S, b_qs, b_ks, b_g, b_beta, b_pj, valid, p_win, s_win_c, s_win_t,
            s_win_w, c_v0 + o_sv, p_o, s_o_n, p_snap, s_snap_t, s_snap_v, p_rawv, s_rawv_r,
            o_sv, T, W, K, KC, SNAPSHOT, SNAP_CM, RING, PROJECT, FLOOR,
        )  # fmt: skip


def fused_kda_conv_gating_verify(
    mixed_qkv,
    conv_weight,
    conv_bias,
    conv_state,
    conv_state_indices,
    intermediate_conv_window,
    intermediate_state_indices,
    a,
    b,
    A_log,
    dt_bias,
    ssm_states,
    cache_indices,
    intermediate_states_buffer=None,
    scale=None,
    T=None,
    num_q_heads=None,
    num_v_heads=None,
    head_k_dim=None,
    head_v_dim=None,
    lower_bound=None,
    cache_ring=False,
    replayssm_rawv=None,
    replayssm_rawk=None,
    replayssm_g=None,
    replayssm_beta=None,
    *,
    tuning=None,
):
    """One-kernel KDA chain verify of T draft tokens for each of B sequences.

    Args (H = num_q_heads, HV = num_v_heads, K = head_k_dim, V = head_v_dim, HV % H == 0,
    K and V powers of two, dim = 2*H*K + HV*V, W = conv width):
        mixed_qkv: [B*T, dim] fp16/bf16/fp32 (unit last stride), channels [q | k | v].
        conv_weight [dim, W], conv_bias [dim] or None: any float dtype, read as fp32.
        conv_state: [lines, dim, W-1], mixed_qkv's dtype, any strides; read only.
        conv_state_indices: [B] int32/int64, conv line of each sequence.
        intermediate_conv_window: [lines, >=T, dim, W-1], mixed_qkv's dtype, any strides;
            window after step t at [intermediate_state_indices[n], t], oldest first.
        intermediate_state_indices: [B] int32/int64, line of the windows and snapshots.
        a: [B*T, HV*K], b: [B*T, HV] (input dtype); A_log [HV], dt_bias [HV*K] fp32.
        ssm_states: [slots, HV, V, K] fp32, slot cache_indices[n]; read only.
        intermediate_states_buffer: [lines, >=T, HV, V, K] fp32 snapshots, or None with
            cache_ring=True and the ring buffers replayssm_rawk [slots, H, R, K],
            replayssm_rawv [slots, HV, R, V] (input dtype), replayssm_g [slots, HV, R, K],
            replayssm_beta [slots, HV, R] (fp32); R a power of two >= 2*T, step t at
            position t of slot cache_indices[n].
        scale: defaults to K**-0.5. lower_bound: None (standard gate) or < 0 (safe gate).
        tuning: a `tuning.VerifyTuning` (or a `tuning.KdaTuning`); None = tuning.DEFAULT.
            The module's KDA_VERIFY_BLOCK_V, when set, forces BLOCK_V over it. The tile
            comes from the tuning's tables, read at batch B * HV / 8 by default (the
            shape they were tuned at); every shape runs this one kernel (none is routed to
            the unfused pair).

    Padding: a sequence whose index is outside its pool (negative, or cache_indices >=
    ssm_states.shape[0], conv_state_indices >= conv_state.shape[0],
    intermediate_state_indices >= the lines of intermediate_conv_window or of
    intermediate_states_buffer) is padding: its o rows are zeros and nothing is read from
    or written to any pool for it. The bounds are a compare and a select per index in the
    kernel (no host read), so the call stays CUDA-graph capturable. Two sequences sharing
    intermediate_state_indices, or cache_indices in ring mode (lines the call writes), is
    undefined; `kernels.kda.validate_indices` checks ranges and duplicates on request.
    ssm_states and conv_state are never written.

    Returns:
        o: [B*T, HV, V] in mixed_qkv's dtype.
    """
    H, HV, K, V = num_q_heads, num_v_heads, head_k_dim, head_v_dim
    check_heads(H, HV, K, V)
    if not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    check_lower_bound(lower_bound)
    check_tensor("mixed_qkv", mixed_qkv, ndim=2, dtype=FLOAT_DTYPES, unit_last=True)
    N, dim = mixed_qkv.shape
    if dim != 2 * H * K + HV * V:
        raise ValueError(f"mixed_qkv has {dim} channels, want 2*H*K + HV*V = {2 * H * K + HV * V}")
    if N % T:
        raise ValueError(f"mixed_qkv has {N} tokens, not a multiple of T={T}")
    B = N // T
    dtype = mixed_qkv.dtype
    check_tensor("conv_weight", conv_weight, ndim=2, dtype=FLOAT_DTYPES)
    if conv_weight.shape[0] != dim or conv_weight.shape[1] < 2:
        raise ValueError(f"conv_weight must be [{dim}, W>=2], got {tuple(conv_weight.shape)}")
    W = conv_weight.shape[1]
    if conv_bias is not None:
        check_tensor("conv_bias", conv_bias, shape=(dim,), dtype=FLOAT_DTYPES)
    check_tensor("conv_state", conv_state, shape=(None, dim, W - 1), dtype=dtype)
    check_index("conv_state_indices", conv_state_indices, B)
    window = intermediate_conv_window
    check_tensor("intermediate_conv_window", window, ndim=4, dtype=dtype)
    if window.shape[1] < T or window.shape[2:] != (dim, W - 1):
        raise ValueError(
            f"intermediate_conv_window must be [lines, >={T}, {dim}, {W - 1}], got {tuple(window.shape)}"
        )
    check_index("intermediate_state_indices", intermediate_state_indices, B)
    a2 = tokens_view("a", a, N, HV * K)
    b2 = tokens_view("b", b, N, HV)
    check_tensor("A_log", A_log, shape=(HV,), dtype=torch.float32)
    check_tensor("dt_bias", dt_bias, shape=(HV * K,), dtype=torch.float32)
    ring = (replayssm_rawk, replayssm_rawv, replayssm_g, replayssm_beta)
    check_state_and_saves(
        ssm_states, "ssm_states", cache_indices, "cache_indices", intermediate_states_buffer,
        intermediate_state_indices, cache_ring, ring, B, T, H, HV, K, V, dtype, require_save=True,
    )  # fmt: skip
    check_devices(
        {
            "mixed_qkv": mixed_qkv,
            "conv_weight": conv_weight,
            "conv_bias": conv_bias,
            "conv_state": conv_state,
            "conv_state_indices": conv_state_indices,
            "intermediate_conv_window": window,
            "intermediate_state_indices": intermediate_state_indices,
            "a": a,
            "b": b,
            "A_log": A_log,
            "dt_bias": dt_bias,
            "ssm_states": ssm_states,
            "cache_indices": cache_indices,
            "intermediate_states_buffer": intermediate_states_buffer,
            **(
                {"replayssm_rawk": replayssm_rawk, "replayssm_rawv": replayssm_rawv}
                if cache_ring
                else {}
            ),
            **(
                {"replayssm_g": replayssm_g, "replayssm_beta": replayssm_beta} if cache_ring else {}
            ),
        }
    )
    scale = K**-0.5 if scale is None else float(scale)

    o = mixed_qkv.new_empty(N, HV, V)
    ptrs, strides = save_args(intermediate_states_buffer, ring, cache_ring, ssm_states, dtype)
    tn = _tuning.resolve(tuning, _tuning.VerifyTuning, "verify")
    ring_mode = bool(cache_ring)
    Bt = _tuning.table_batch(tn, B, HV)  # the batch the tables are read at
    BV, SUB, num_warps, stages = _tuning.pick_tile(
        tn, ring_mode, Bt, V, K, KDA_VERIFY_BLOCK_V, "KDA_VERIFY_BLOCK_V"
    )
    kc = _tuning.key_chunk(tn, ring_mode, Bt, K)
    project = _tuning.project_flag(tn, ring_mode, False, Bt)
    norm_row = _tuning.norm_row_flag(tn, ring_mode, Bt)
    stack_sums = _tuning.stack_sums_flag(tn, ring_mode, Bt)
    snap_cm = _tuning.snapshot_cache_modifier(tn)
    floor = tn.floor_probe
    if not isinstance(floor, bool):
        raise ValueError(f"floor_probe must be a bool, got {floor!r}")
    maxnreg = _tuning.maxnreg_kwargs(tn)
    n_lines = window.shape[0]
    if intermediate_states_buffer is not None:
        n_lines = min(n_lines, intermediate_states_buffer.shape[0])
    grid = (B, HV, V // BV)
    _fused_verify_kernel[grid](
        mixed_qkv, conv_weight, conv_bias if conv_bias is not None else conv_weight, conv_state,
        conv_state_indices, window, intermediate_state_indices, a2, b2, A_log, dt_bias,
        ssm_states, cache_indices, o, *ptrs,
        ssm_states.shape[0], conv_state.shape[0], n_lines,
        mixed_qkv.stride(0), *conv_weight.stride(), *conv_state.stride(), *window.stride(),
        a2.stride(0), b2.stride(0), o.stride(0), o.stride(1), *ssm_states.stride()[:3],
        *strides,
        scale,
        0.0 if lower_bound is None else float(lower_bound),
        T=T, W=W, H=H, HV=HV, K=K, V=V, BLOCK_V=BV, SUB_V=SUB, STAGES=stages,
        KC=kc,
        HAS_BIAS=conv_bias is not None,
        SAFE_GATE=lower_bound is not None,
        NORM_ROW=norm_row,
        STACK_SUMS=stack_sums,
        SNAPSHOT=intermediate_states_buffer is not None,
        SNAP_CM=snap_cm,
        RING=bool(cache_ring),
        PROJECT=project,
        FLOOR=floor,
        num_warps=num_warps,
        **maxnreg,
    )  # fmt: skip
    return o


# The module-level knobs that `tuning=` replaced: setting one raises instead of doing nothing.
_tuning.refuse_removed_knobs(
    __name__,
    {
        "KDA_VERIFY_SUB_V": "replace(DEFAULT.verify, sub_v=...)",
        "KDA_VERIFY_NUM_WARPS": "replace(DEFAULT.verify, num_warps=...)",
        "KDA_VERIFY_STAGES": "replace(DEFAULT.verify, stages=...)",
        "KDA_VERIFY_MAXNREG": "replace(DEFAULT.verify, maxnreg=...)",
        "KDA_VERIFY_PREFETCH": "(none: the double-buffered sub-tile loop was removed)",
        "KDA_VERIFY_PROJECT": "replace(DEFAULT.verify, project=...)",
        "KDA_VERIFY_STATE_FIRST": "(none: the state-first order was removed)",
        "KDA_VERIFY_FIRST_AHEAD": "(none: the first step always loads ahead)",
    },
)
