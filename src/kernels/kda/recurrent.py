"""KDA gated delta-rule recurrence over T tokens per sequence (the second unfused kernel).

One program per (sequence, value head, V tile of BLOCK_V rows). q and k of the value
head's q/k head, the gate and beta of all T steps are loaded and prepared once per program
(they are small and shared through L2); then the program walks its value rows in
sub-tiles of SUB_V, each an fp32 state tile [SUB_V, K] kept in registers across the T
steps. The sub-tiles are independent, so that loop is software-pipelined (the next
sub-tile's state loads while this one computes). After each step a sub-tile saves either
its snapshot or its slice of the ring (see `step._verify_steps`); the ring entries
shared by the head are written once, by the first V tile.
"""

import torch
import triton
import triton.language as tl

from . import tuning as _tuning
from .checks import (
    FLOAT_DTYPES,
    check_devices,
    check_heads,
    check_lower_bound,
    check_state_and_saves,
    check_tensor,
    save_args,
    tokens_view,
)
from .step import (
    _load_rows,
    _pool_line,
    _step_inputs,
    _store_ring_shared,
    _tile_ptrs,
    _tile_rows,
    _verify_steps,
)


@triton.jit
def _recurrent_verify_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    h0,
    h0_indices,
    o,
    snap_indices,
    snap,
    rawk,
    rawv,
    ring_g,
    ring_beta,
    n_slots,
    n_snap_lines,
    s_q_n,
    s_q_h,
    s_k_n,
    s_k_h,
    s_v_n,
    s_v_h,
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
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SUB_V: tl.constexpr,
    STAGES: tl.constexpr,
    SAFE_GATE: tl.constexpr,
    NORM_ROW: tl.constexpr,
    STACK_SUMS: tl.constexpr,
    SNAPSHOT: tl.constexpr,
    SNAP_CM: tl.constexpr,
    RING: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    KC: tl.constexpr,
    PROJECT: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, K)

    # Slot and line first (they head the longest chain: index -> state), then the per-token
    # rows of all T steps, which do not depend on them. A slot or line outside its pool
    # (negative or past the end) makes the sequence padding: every state, snapshot and
    # ring access is masked by `valid`.
    i_slot = _pool_line(tl.load(h0_indices + i_n).to(tl.int64), n_slots)
    valid = i_slot >= 0
    p_snap = snap
    if SNAPSHOT:
        i_line = _pool_line(tl.load(snap_indices + i_n).to(tl.int64), n_snap_lines)
        valid = valid & (i_line >= 0)
        p_snap = snap + i_line * s_snap_l + i_hv * s_snap_h
    i_tok = i_n * T
    b_q = _load_rows(q + i_tok * s_q_n + i_h * s_q_h + o_k, s_q_n, T, None)
    b_k = _load_rows(k + i_tok * s_k_n + i_h * s_k_h + o_k, s_k_n, T, None)
    b_a = _load_rows(a + i_tok * s_a_n + i_hv * K + o_k, s_a_n, T, None)
    b_b = _load_rows(b + i_tok * s_b_n + i_hv, s_b_n, T, None)
    b_A_log = tl.load(A_log + i_hv)
    b_dt_bias = tl.load(dt_bias + i_hv * K + o_k)

    # The value rows. One piece (SUB_V == BLOCK_V): its v rows and state rows (zeros for a
    # padded sequence, whose results are never stored) are loaded before the per-step gate,
    # beta and norms are computed, whose reductions would otherwise hold the loads back.
    # Several sub-tiles: those per-step inputs first, then one sub-tile at a time.
    p_h0 = h0 + i_slot * s_h0_s + i_hv * s_h0_h
    p_v = v + i_tok * s_v_n + i_hv * s_v_h
    p_o = o + i_tok * s_o_n + i_hv * s_o_h
    p_rawv = rawv + i_slot * s_rawv_s + i_hv * s_rawv_h
    if SUB_V == BLOCK_V:
        o_sv = i_v * BLOCK_V + tl.arange(0, SUB_V)
        p_S = _tile_ptrs(p_h0, o_sv, s_h0_v, K, KC)
        m_S = _tile_rows(valid & (o_sv >= 0), K, KC)
        b_v = _load_rows(p_v + o_sv, s_v_n, T, None)
        b_S = tl.load(p_S, mask=m_S, other=0.0)
        b_g, b_beta, b_qs, b_ks, b_pj = _step_inputs(
            b_q, b_k, b_a, b_b, b_A_log, b_dt_bias, scale, lower_bound, T, SAFE_GATE, PROJECT,
            NORM_ROW, STACK_SUMS,
        )  # fmt: skip
        b_S = _verify_steps(
            b_S, b_qs, b_ks, b_v, b_g, b_beta, b_pj, valid, p_o + o_sv, s_o_n, p_snap,
            s_snap_t, s_snap_v, p_rawv, s_rawv_r, o_sv, T, K, KC, SNAPSHOT, SNAP_CM, RING,
            PROJECT,
        )  # fmt: skip
        if STORE_FINAL:
            tl.store(p_S, b_S, mask=m_S)
    else:
        b_g, b_beta, b_qs, b_ks, b_pj = _step_inputs(
            b_q, b_k, b_a, b_b, b_A_log, b_dt_bias, scale, lower_bound, T, SAFE_GATE, PROJECT,
            NORM_ROW, STACK_SUMS,
        )  # fmt: skip
        for i_s in tl.range(0, BLOCK_V // SUB_V, num_stages=STAGES):
            o_sv = i_v * BLOCK_V + i_s * SUB_V + tl.arange(0, SUB_V)
            p_S = _tile_ptrs(p_h0, o_sv, s_h0_v, K, KC)
            m_S = _tile_rows(valid & (o_sv >= 0), K, KC)
            b_v = _load_rows(p_v + o_sv, s_v_n, T, None)
            b_S = tl.load(p_S, mask=m_S, other=0.0)
            b_S = _verify_steps(
                b_S, b_qs, b_ks, b_v, b_g, b_beta, b_pj, valid, p_o + o_sv, s_o_n, p_snap,
                s_snap_t, s_snap_v, p_rawv, s_rawv_r, o_sv, T, K, KC, SNAPSHOT, SNAP_CM, RING,
                PROJECT,
            )  # fmt: skip
            if STORE_FINAL:
                tl.store(p_S, b_S, mask=m_S)

    # The ring entries shared by the head, last: nothing above waits for them.
    if RING:
        own_v = i_v == 0
        own_k = own_v & (i_hv % (HV // H) == 0)
        _store_ring_shared(
            rawk + i_slot * s_rawk_s + i_h * s_rawk_h, s_rawk_r,
            ring_g + i_slot * s_g_s + i_hv * s_g_h, s_g_r,
            ring_beta + i_slot * s_beta_s + i_hv * s_beta_h, s_beta_r,
            b_k, b_g, b_beta, o_k, own_k & valid & (o_k >= 0), own_v & valid, T,
        )  # fmt: skip


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    dt_bias,
    softplus_beta=1.0,
    softplus_threshold=20.0,
    q=None,
    k=None,
    v=None,
    b=None,
    initial_state_source=None,
    initial_state_indices=None,
    scale=None,
    use_qk_l2norm_in_kernel=True,
    cu_seqlens=None,
    is_kda=True,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
    lower_bound=None,
    cache_ring=False,
    replayssm_rawv=None,
    replayssm_rawk=None,
    replayssm_g=None,
    replayssm_beta=None,
    *,
    tuning=None,
):
    """KDA gate + beta + gated delta rule over T tokens of B sequences (chain verify/decode).

    Shapes (N = B*T tokens; H q/k heads, HV value heads, HV % H == 0; K, V powers of two):
        q, k: [1, N, H, K] with cu_seqlens, else [B, T, H, K]; input dtype, unit last stride
        v: [..., HV, V] with the same token layout; a: N tokens of HV*K; b: N tokens of HV
        A_log [HV], dt_bias [HV*K]: fp32
        initial_state_source: [slots, HV, V, K] fp32, slot of sequence n =
            initial_state_indices[n] (int32/int64 [B])
        intermediate_states_buffer: [lines, >=T, HV, V, K] fp32 (snapshot after step t at
            [intermediate_state_indices[n], t], int32/int64 [B]), or None
        cache_ring: write the ring instead: replayssm_rawk [slots, H, R, K], replayssm_rawv
            [slots, HV, R, V] (input dtype), replayssm_g [slots, HV, R, K], replayssm_beta
            [slots, HV, R] (fp32), step t at position t of slot initial_state_indices[n];
            R a power of two >= 2*T.
        tuning: a `tuning.RecurrentTuning` (or a `tuning.KdaTuning`); None = tuning.DEFAULT.
    Returns:
        o: q.shape[:-2] + (HV, V), q's dtype.

    Padding: a sequence whose initial_state_indices entry is outside 0..slots-1 (negative,
    or >= initial_state_source.shape[0]), or whose intermediate_state_indices entry is
    outside 0..lines-1 of intermediate_states_buffer, is padding: its o rows are zeros and
    nothing is read from or written to any pool for it. The bounds are a compare and a
    select per index in the kernel (no host read), so the call stays CUDA-graph
    capturable. Two sequences sharing a line that is written (a ring slot, a snapshot
    line, a state written back) is undefined; `kernels.kda.validate_indices` checks
    ranges and duplicates on request.

    Math (kernels.kda.reference is the plain PyTorch version): g = -exp(A_log) softplus(a + dt_bias)
    or, with lower_bound < 0, lower_bound * sigmoid(exp(A_log) (a + dt_bias)); beta =
    sigmoid(b); q, k L2-normalized in-kernel; scale defaults to K**-0.5.
    disable_state_update=True (verify) leaves initial_state_source untouched and needs
    exactly one of snapshots / ring; False also writes the state after the last token back.

    Fixed choices, accepted for call compatibility (other values raise ValueError):
    softplus_beta=1.0, softplus_threshold=20.0, use_qk_l2norm_in_kernel=True, is_kda=True,
    retrieve_parent_token=None (chains only). cache_steps, if given, must be >= T.
    cu_seqlens, if given, must be arange(B+1)*T: its shape is always checked, its values
    only for CPU tensors (reading a GPU tensor would synchronize).
    """
    if softplus_beta != 1.0 or softplus_threshold != 20.0:
        raise ValueError("only softplus_beta=1.0 and softplus_threshold=20.0 are supported")
    if not use_qk_l2norm_in_kernel:
        raise ValueError("use_qk_l2norm_in_kernel must be True")
    if not is_kda:
        raise ValueError("is_kda must be True (per-channel KDA gate)")
    if retrieve_parent_token is not None:
        raise ValueError("retrieve_parent_token must be None: only chain verify is supported")
    check_lower_bound(lower_bound)
    check_tensor("q", q, ndim=4, dtype=FLOAT_DTYPES, unit_last=True)
    Bq, Tq, H, K = q.shape
    check_tensor("k", k, shape=(Bq, Tq, H, K), dtype=q.dtype, unit_last=True)
    check_tensor("v", v, ndim=4, dtype=q.dtype, unit_last=True)
    HV, V = v.shape[2:]
    check_tensor("v", v, shape=(Bq, Tq, HV, V))
    check_heads(H, HV, K, V)
    N = Bq * Tq
    if cu_seqlens is None:
        B, T = Bq, Tq
    else:
        check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtype=(torch.int32, torch.int64))
        B = cu_seqlens.numel() - 1
        if Bq != 1 or B < 1 or N % B:
            raise ValueError(
                f"cu_seqlens of {B + 1} entries does not split q of shape {tuple(q.shape)}"
            )
        T = N // B
        if cu_seqlens.device.type == "cpu":
            want = torch.arange(B + 1, dtype=cu_seqlens.dtype) * T
            if not torch.equal(cu_seqlens, want):
                raise ValueError(f"cu_seqlens must be arange(B+1)*T with T={T}")
    if cache_steps is not None and cache_steps < T:
        raise ValueError(f"cache_steps={cache_steps} is smaller than T={T}")
    q3, k3, v3 = q.reshape(N, H, K), k.reshape(N, H, K), v.reshape(N, HV, V)
    a2 = tokens_view("a", a, N, HV * K)
    b2 = tokens_view("b", b, N, HV)
    check_tensor("A_log", A_log, shape=(HV,), dtype=torch.float32)
    check_tensor("dt_bias", dt_bias, shape=(HV * K,), dtype=torch.float32)
    ring = (replayssm_rawk, replayssm_rawv, replayssm_g, replayssm_beta)
    check_state_and_saves(
        initial_state_source, "initial_state_source", initial_state_indices, "initial_state_indices",
        intermediate_states_buffer, intermediate_state_indices, cache_ring, ring,
        B, T, H, HV, K, V, q.dtype, require_save=disable_state_update,
    )  # fmt: skip
    check_devices(
        {
            "q": q,
            "k": k,
            "v": v,
            "a": a,
            "b": b,
            "A_log": A_log,
            "dt_bias": dt_bias,
            "initial_state_source": initial_state_source,
            "initial_state_indices": initial_state_indices,
            "intermediate_states_buffer": intermediate_states_buffer,
            "intermediate_state_indices": intermediate_state_indices,
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

    o = q.new_empty(*q.shape[:-2], HV, V)
    o3 = o.view(N, HV, V)
    ptrs, strides = save_args(
        intermediate_states_buffer, ring, cache_ring, initial_state_source, q.dtype
    )
    snap_idx = (
        intermediate_state_indices
        if intermediate_states_buffer is not None
        else initial_state_indices
    )
    tn = _tuning.resolve(tuning, _tuning.RecurrentTuning, "recurrent")
    ring_mode = bool(cache_ring)
    Bt = _tuning.table_batch(tn, B, HV)  # the batch the tables are read at
    BV, SUB, num_warps, stages = _tuning.pick_tile(tn, ring_mode, Bt, V, K)
    kc = _tuning.key_chunk(tn, ring_mode, Bt, K)
    needs_state = not disable_state_update and intermediate_states_buffer is None
    project = _tuning.project_flag(tn, ring_mode, needs_state, Bt)
    norm_row = _tuning.norm_row_flag(tn, ring_mode, Bt)
    stack_sums = _tuning.stack_sums_flag(tn, ring_mode, Bt)
    snap_cm = _tuning.snapshot_cache_modifier(tn)
    maxnreg = _tuning.maxnreg_kwargs(tn)
    grid = (B, HV, V // BV)
    _recurrent_verify_kernel[grid](
        q3, k3, v3, a2, b2, A_log, dt_bias, initial_state_source, initial_state_indices, o3, snap_idx,
        *ptrs,
        initial_state_source.shape[0],
        intermediate_states_buffer.shape[0] if intermediate_states_buffer is not None else 1,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        a2.stride(0), b2.stride(0), o3.stride(0), o3.stride(1),
        *initial_state_source.stride()[:3],
        *strides,
        scale,
        0.0 if lower_bound is None else float(lower_bound),
        T=T, H=H, HV=HV, K=K, V=V, BLOCK_V=BV, SUB_V=SUB, STAGES=stages,
        SAFE_GATE=lower_bound is not None,
        NORM_ROW=norm_row,
        STACK_SUMS=stack_sums,
        SNAPSHOT=intermediate_states_buffer is not None,
        SNAP_CM=snap_cm,
        RING=bool(cache_ring),
        STORE_FINAL=not disable_state_update,
        KC=kc,
        PROJECT=project,
        num_warps=num_warps,
        **maxnreg,
    )  # fmt: skip
    return o


# The module-level knobs that `tuning=` replaced: setting one raises instead of doing nothing.
_tuning.refuse_removed_knobs(
    __name__,
    {
        "RECURRENT_BLOCK_V": "replace(DEFAULT.recurrent, block_v=...)",
        "RECURRENT_SUB_V": "replace(DEFAULT.recurrent, sub_v=...)",
        "RECURRENT_NUM_WARPS": "replace(DEFAULT.recurrent, num_warps=...)",
        "RECURRENT_STAGES": "replace(DEFAULT.recurrent, stages=...)",
        "RECURRENT_MAXNREG": "replace(DEFAULT.recurrent, maxnreg=...)",
        "RECURRENT_PROJECT": "replace(DEFAULT.recurrent, project=...)",
    },
)
