"""Pieces shared by the KDA verify kernels: `@triton.jit` math helpers and host-side checks.

The ring written by the fused kernel must be byte-identical to the ring written by the
unfused pair (conv kernel, then recurrent kernel). Both therefore take every fp32 formula
that feeds a ring entry from the helpers here, so that the same instruction sequence
runs in both: the conv sum (explicit FMAs in tap order), bias, SiLU, the gate and beta.
"""

import os

import torch
import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------
# Triton helpers
# ---------------------------------------------------------------------------------------


@triton.jit
def _load_rows(p, stride, N: tl.constexpr, mask):
    """Tuple of N rows p[i * stride], i = 0..N-1 (masked lanes read 0; mask may be None).

    Every row is loaded before anything is computed or stored, so the loads of all steps
    are in flight together instead of forming one memory round trip per step (a store
    between two loads would keep the compiler from moving the second load up, as the
    pointers might alias)."""
    b_rows = ()
    for i in tl.static_range(N):
        if mask is None:
            b_row = tl.load(p + i * stride)
        else:
            b_row = tl.load(p + i * stride, mask=mask, other=0)
        b_rows = b_rows + (b_row,)
    return b_rows


@triton.jit
def _pool_line(i, n):
    """Line index i (int64) of a pool of n lines, with every index outside the pool made
    negative: i itself when i < n, else -1 (a negative i stays as it is). The kernels then
    test `line >= 0` as the validity of a sequence, so an index past the end of its pool
    makes the sequence padding, exactly like a negative one: one compare and one select
    per index, per program, no host read. The masks stay a sign test of the line: masks
    built from the unsigned compare `0 <= i < n` (one compare too) take more registers,
    and two of the widest tiles (255 registers) then spill (tools/dev/compile_kda_sm90.py)."""
    return tl.where(i < n, i, -1)


@triton.jit
def _conv_out(b_xx, b_w, b_bias, t: tl.constexpr, W: tl.constexpr, SILU: tl.constexpr):
    """fp32 conv output of step `t`: silu(bias + sum_j w[j] * xx[t + j]), not yet rounded.

    b_xx: the conv sequence as a tuple of rows, xx = [state columns 0..W-2, x_0 .. x_{T-1}]
    (state rows and new inputs loaded by `_load_rows` and concatenated); b_w: tuple of the
    W weight columns. The sum starts from the bias and adds the taps oldest first with
    explicit FMAs, so the result does not depend on how the compiler would contract a plain
    multiply-add.
    """
    b_y = b_bias
    for j in tl.static_range(W):
        b_y = tl.fma(b_w[j].to(tl.float32), b_xx[t + j].to(tl.float32), b_y)
    if SILU:
        b_y = b_y / (1.0 + tl.exp(-b_y))
    return b_y


@triton.jit
def _store_windows(p_win, s_win_t, s_win_w, b_xx, T: tl.constexpr, W: tl.constexpr, mask):
    """Window after each step t: the W-1 raw inputs xx[t+1 .. t+W-1], oldest first."""
    for t in tl.static_range(T):
        for m in tl.static_range(W - 1):
            p = p_win + t * s_win_t + m * s_win_w
            tl.store(p, b_xx[t + 1 + m].to(p.dtype.element_ty), mask=mask)


@triton.jit
def _gate_beta(b_a, b_dt_bias, b_A_log, b_b, lower_bound, SAFE_GATE: tl.constexpr):
    """KDA gate g (per key channel) and beta (per value head), both fp32.

    standard: g = -exp(A_log) * softplus(a + dt_bias)   (softplus linear above 20)
    safe:     g = lower_bound * sigmoid(exp(A_log) * (a + dt_bias)), in (lower_bound, 0)
    """
    b_x = b_a + b_dt_bias
    if SAFE_GATE:
        b_g = lower_bound * tl.sigmoid(tl.exp(b_A_log) * b_x)
    else:
        b_sp = tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
        b_g = -tl.exp(b_A_log) * b_sp
    b_beta = tl.sigmoid(b_b)
    return b_g, b_beta


@triton.jit
def _l2norm(b_x, eps, NORM_ROW: tl.constexpr):
    """x / sqrt(|x|^2 + eps) over the whole (single) axis, fp32.

    NORM_ROW takes the sum over x as a [1, K] row. Same value; what changes is where Triton
    reduces: a [K] vector is spread over all the program's warps, so its sum ends in a
    round trip through shared memory with three barriers; on 2-warp programs of plain
    state tiles the row form lands in a layout that every warp holds whole (the state
    tile's key axis), so the sum stays within a warp. On other tiles it can add layout
    conversions instead (NORM_ROW_TABLE holds where it measured faster)."""
    if NORM_ROW:
        b_x2 = b_x[None, :]
        return tl.reshape(b_x2 / tl.sqrt(tl.sum(b_x2 * b_x2, axis=1) + eps)[:, None], b_x.shape)
    return b_x / tl.sqrt(tl.sum(b_x * b_x, axis=0) + eps)


@triton.jit
def _tile_ptrs(p, o_v, s_v, K: tl.constexpr, KC: tl.constexpr):
    """Pointers to the state rows o_v of p (row stride s_v, K contiguous fp32 each) in the
    shape of a state tile: [len(o_v), K] when KC == K, else [len(o_v), K // KC, KC].

    Why the second shape: Triton lays a load out for coalescing, 4 consecutive floats per
    lane along the contiguous axis. On a [rows, 128] tile that spreads a row over all 32
    lanes, and each row sum of a delta step (S k, S q) then takes 5 rounds of lane
    shuffles per row a lane holds. Split into key chunks of KC, the chunk axis (middle)
    lands in each lane's registers and only KC / 4 lanes share a row: the sums over the
    chunk axis are plain adds and the last KC-wide sum takes log2(KC / 4) shuffle rounds
    (2 for KC = 16). The loads stay coalesced in 16-byte pieces.
    """
    if KC == K:
        return p + o_v[:, None] * s_v + tl.arange(0, K)[None, :]
    else:
        o_c = tl.arange(0, K // KC)
        o_e = tl.arange(0, KC)
        return p + o_v[:, None, None] * s_v + (o_c[:, None] * KC + o_e[None, :])[None, :, :]


@triton.jit
def _tile_rows(m_v, K: tl.constexpr, KC: tl.constexpr):
    """A per-row mask [rows] broadcast against a state tile of `_tile_ptrs`' shape."""
    if KC == K:
        return m_v[:, None]
    else:
        return m_v[:, None, None]


@triton.jit
def _key_vec(b_x, K: tl.constexpr, KC: tl.constexpr):
    """A key-axis vector [K] in the shape that broadcasts against a state tile."""
    if KC == K:
        return b_x[None, :]
    else:
        return tl.reshape(b_x, [K // KC, KC])[None, :, :]


@triton.jit
def _key_sum(b_X, K: tl.constexpr, KC: tl.constexpr):
    """Row sums over the key axis of a state-shaped tile: [rows] (chunk axis first: it
    sits in registers, see `_tile_ptrs`)."""
    if KC == K:
        return tl.sum(b_X, axis=1)
    else:
        return tl.sum(tl.sum(b_X, axis=1), axis=1)


@triton.jit
def _delta_step(b_S, b_q, b_k, b_v, b_g, b_beta, K: tl.constexpr, KC: tl.constexpr):
    """One gated delta-rule step on a state tile (rows = value channels); returns (S, o).

    S <- S * exp(g) (key channel i decays by exp(g_i)); u = beta * (v - S k);
    S <- S + u k^T; o = S q.  q, k and g are [K] vectors; q and k are already normalized
    (q also scaled). exp(g) is taken here, where the step uses it: taken once per program
    before the steps instead, the same instructions were scheduled differently and the
    fused kernel measured 4% slower at B=1 (docs/perf/kda.md, v6).
    """
    b_k = _key_vec(b_k, K, KC)
    b_S = b_S * _key_vec(tl.exp(b_g), K, KC)
    b_u = b_beta * (b_v - _key_sum(b_S * b_k, K, KC))
    b_S = b_S + _tile_rows(b_u, K, KC) * b_k
    b_o = _key_sum(b_S * _key_vec(b_q, K, KC), K, KC)
    return b_S, b_o


@triton.jit
def _step_inputs(b_q, b_k, b_a, b_b, b_A_log, b_dt_bias, scale, lower_bound, T: tl.constexpr,
                 SAFE_GATE: tl.constexpr, PROJECT: tl.constexpr,
                 NORM_ROW: tl.constexpr):  # fmt: skip
    """Per-step vectors that do not depend on the state, as tuples of T rows:
    (g [K], beta (scalar), normalized and scaled q [K], normalized k [K]), all fp32, and
    with PROJECT the coefficients of `_projection` (else an empty tuple).

    They are computed once per program, before its loop over state sub-tiles; b_q, b_k,
    b_a, b_b are tuples of the T input rows (q and k already in the input dtype)."""
    b_g = ()
    b_beta = ()
    b_qn = ()
    b_kn = ()
    for t in tl.static_range(T):
        b_gt, b_bt = _gate_beta(
            b_a[t].to(tl.float32), b_dt_bias, b_A_log, b_b[t].to(tl.float32), lower_bound, SAFE_GATE
        )
        b_g = b_g + (b_gt,)
        b_beta = b_beta + (b_bt,)
        b_qn = b_qn + (_l2norm(b_q[t].to(tl.float32), 1e-6, NORM_ROW) * scale,)
        b_kn = b_kn + (_l2norm(b_k[t].to(tl.float32), 1e-6, NORM_ROW),)
    b_pj = ()
    if PROJECT:
        b_pj = _projection(b_qn, b_kn, b_g, T)
    return b_g, b_beta, b_qn, b_kn, b_pj


@triton.jit
def _projection(b_qs, b_ks, b_g, T: tl.constexpr):
    """What the T delta steps need from the key-side vectors alone (the "projected" form).

    With a_t = exp(g_t), c_t = a_0 * ... * a_t and e(j, t) = a_{j+1} * ... * a_t (e(t, t) = 1),
    unrolling S_t = S_{t-1} diag(a_t) + u_t k_t^T from the initial state S gives, per state row,
        S_{t-1} diag(a_t) k_t = S (c_t k_t) + sum_{j<t} A[t, j] u_j,   A[t, j] = k_j . (e(j, t) k_t)
        o_t = S_t q_t        = S (c_t q_t) + sum_{j<=t} B[t, j] u_j,  B[t, j] = k_j . (e(j, t) q_t)
    so u_t = beta_t (v_t - S (c_t k_t) - sum_{j<t} A[t, j] u_j). Every product with the state
    is one of 2T row sums of the *initial* state, and the A and B scalars are shared by all
    rows of the head. Returns (c_t q_t tuple, c_t k_t tuple, A, B): A holds A[t, j] for j
    = t-1 down to 0 after those of t-1 (position t (t-1) / 2 + t-1-j), B holds B[t, t]
    then B[t, j] for j = t-1 down to 0 (position t (t+1) / 2 + t-j).
    """
    b_qc = ()
    b_kc = ()
    b_A = ()
    b_B = ()
    b_c = tl.exp(b_g[0])
    for t in tl.static_range(T):
        if t > 0:
            b_c = b_c * tl.exp(b_g[t])
        b_qc = b_qc + (b_c * b_qs[t],)
        b_kc = b_kc + (b_c * b_ks[t],)
        b_B = b_B + (tl.sum(b_ks[t] * b_qs[t], axis=0),)
        b_e = tl.exp(b_g[t])
        for jj in tl.static_range(t):  # j = t - 1 - jj
            if jj > 0:
                b_e = b_e * tl.exp(b_g[t - jj])
            b_A = b_A + (tl.sum(b_ks[t - 1 - jj] * (b_e * b_ks[t]), axis=0),)
            b_B = b_B + (tl.sum(b_ks[t - 1 - jj] * (b_e * b_qs[t]), axis=0),)
    return b_qc, b_kc, b_A, b_B


@triton.jit
def _store_ring_shared(p_rawk, s_rawk_r, p_g, s_g_r, p_beta, s_beta_r, b_k, b_g, b_beta, o_k,
                       m_rawk, m_gb, T: tl.constexpr):  # fmt: skip
    """The ring entries shared by the whole value head (g, beta: mask m_gb) or q/k head
    (rawk, the conv output before normalization: mask m_rawk), ring position t = step t."""
    for t in tl.static_range(T):
        tl.store(p_rawk + t * s_rawk_r + o_k, b_k[t].to(p_rawk.dtype.element_ty), mask=m_rawk)
        tl.store(p_g + t * s_g_r + o_k, b_g[t], mask=m_gb & (o_k >= 0))
        tl.store(p_beta + t * s_beta_r, b_beta[t], mask=m_gb)


@triton.jit
def _store_o(p_o, s_o_n, b_os, valid, T: tl.constexpr):
    """Stores the T outputs of a sub-tile (rows p_o, step stride s_o_n; zeros where not
    `valid`), four steps per store where T allows: each store moves its values from the
    layout of the row sums to one that suits the store through shared memory (a barrier
    on each side), so one [rows, 2, 2] store costs that once instead of four times. The
    stores come after all the steps: the T steps do not wait on them."""
    DT = p_o.dtype.element_ty
    T4: tl.constexpr = T - T % 4
    if T4 > 0:
        # join(join(o_t, o_t+1), join(o_t+2, o_t+3))[r, j, i] is o_{t + 2 i + j}.
        o_t = tl.arange(0, 2)[:, None] + 2 * tl.arange(0, 2)[None, :]
        for t in tl.static_range(0, T4, 4):
            b_x = tl.join(tl.join(b_os[t], b_os[t + 1]), tl.join(b_os[t + 2], b_os[t + 3]))
            p = p_o[:, None, None] + (t + o_t)[None, :, :] * s_o_n
            tl.store(p, tl.where(valid, b_x, 0.0).to(DT))
    for t in tl.static_range(T4, T):
        tl.store(p_o + t * s_o_n, tl.where(valid, b_os[t], 0.0).to(DT))


@triton.jit
def _verify_steps(
    b_S,
    b_qs,
    b_ks,
    b_v,
    b_g,
    b_beta,
    b_pj,
    valid,
    p_o,
    s_o_n,
    p_snap,
    s_snap_t,
    s_snap_v,
    p_rawv,
    s_rawv_r,
    o_v,
    T: tl.constexpr,
    K: tl.constexpr,
    KC: tl.constexpr,
    SNAPSHOT: tl.constexpr,
    SNAP_CM: tl.constexpr,
    RING: tl.constexpr,
    PROJECT: tl.constexpr,
):
    """The T steps of one state sub-tile (SUB_V rows, in `_tile_ptrs`' shape); returns
    the state after the last step (unchanged with PROJECT and no SNAPSHOT: nothing then
    needs it).

    b_qs, b_ks, b_g, b_beta, b_pj: tuples from `_step_inputs`; b_v: tuple of the T rows of
    this sub-tile's value channels (input dtype). Per step: the delta step, o (zeros where
    not `valid`), then the saves: the state sub-tile (SNAPSHOT) or its slice of rawv (RING;
    the shared ring entries are `_store_ring_shared`'s). Nothing but o is written unless
    `valid`.

    PROJECT takes every product with the state from the initial state (`_projection`):
    the 2T row sums are independent of each other and of the steps, and the steps become
    scalar work per row. Without snapshots the state is never updated at all (the ring
    modes need only o); with them each step is a decay and a rank-1 update, no row sum.
    """
    m_v = valid & (o_v >= 0)
    b_os = ()
    if PROJECT:
        b_qc, b_kc, b_A, b_B = b_pj
        b_x = ()
        b_y = ()
        for t in tl.static_range(T):
            b_x = b_x + (_key_sum(b_S * _key_vec(b_kc[t], K, KC), K, KC),)
            b_y = b_y + (_key_sum(b_S * _key_vec(b_qc[t], K, KC), K, KC),)
        b_u = ()
        for t in tl.static_range(T):
            b_r = b_v[t].to(tl.float32) - b_x[t]
            b_o = b_y[t]
            for jj in tl.static_range(t):  # j = t - 1 - jj
                b_r = b_r - b_A[t * (t - 1) // 2 + jj] * b_u[t - 1 - jj]
            b_ut = b_beta[t] * b_r
            b_u = b_u + (b_ut,)
            b_o = b_o + b_B[t * (t + 1) // 2] * b_ut
            for jj in tl.static_range(t):
                b_o = b_o + b_B[t * (t + 1) // 2 + 1 + jj] * b_u[t - 1 - jj]
            b_os = b_os + (b_o,)
            if SNAPSHOT:
                b_k = _key_vec(b_ks[t], K, KC)
                b_S = b_S * _key_vec(tl.exp(b_g[t]), K, KC) + _tile_rows(b_ut, K, KC) * b_k
                p = _tile_ptrs(p_snap + t * s_snap_t, o_v, s_snap_v, K, KC)
                tl.store(p, b_S, mask=_tile_rows(m_v, K, KC), cache_modifier=SNAP_CM)
            if RING:
                tl.store(p_rawv + t * s_rawv_r + o_v, b_v[t].to(p_rawv.dtype.element_ty), mask=m_v)
    else:
        for t in tl.static_range(T):
            b_S, b_o = _delta_step(
                b_S, b_qs[t], b_ks[t], b_v[t].to(tl.float32), b_g[t], b_beta[t], K, KC
            )
            b_os = b_os + (b_o,)
            if SNAPSHOT:
                p = _tile_ptrs(p_snap + t * s_snap_t, o_v, s_snap_v, K, KC)
                tl.store(p, b_S, mask=_tile_rows(m_v, K, KC), cache_modifier=SNAP_CM)
            if RING:
                tl.store(p_rawv + t * s_rawv_r + o_v, b_v[t].to(p_rawv.dtype.element_ty), mask=m_v)
    _store_o(p_o, s_o_n, b_os, valid, T)
    return b_S


# ---------------------------------------------------------------------------------------
# Host-side checks (no device synchronization but in validate_indices, called on request)
# ---------------------------------------------------------------------------------------


def check_devices(tensors):
    """All named tensors on one device: CUDA, or CPU under the Triton interpreter."""
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        names = ", ".join(f"{n}={t.device}" for n, t in tensors.items() if t is not None)
        raise ValueError(f"all tensors must be on one device, got {names}")
    (dev,) = devices
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if dev.type != "cuda" and not (interp and dev.type == "cpu"):
        raise ValueError(
            f"tensors must be on a CUDA device (CPU only with TRITON_INTERPRET=1), got {dev}"
        )


def check_tensor(name, t, ndim=None, shape=None, dtype=None, unit_last=False):
    """Type, rank, shape (None entries are free), dtype and unit last stride of one argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(
            s is not None and s != d for s, d in zip(shape, t.shape, strict=True)
        ):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise TypeError(
                f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}"
            )
    if unit_last and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got strides {t.stride()}")


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_index(name, t, n):
    """An index vector of `n` int32/int64 entries (its values are not read: negative or
    outside the pool = padding, bounded in the kernels)."""
    check_tensor(name, t, shape=(n,), dtype=INDEX_DTYPES)
    if n > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def validate_indices(indices, lines, name="indices", distinct=True):
    """Check the values of one index vector against the pool it addresses; raise if broken.

    The kernels never read these values on the host: an entry that is negative or >= the
    pool's number of lines makes its sequence padding there (zero outputs, nothing read or
    written), and two sequences given one line that the call writes is undefined. This
    check turns both into errors, for a scheduler that wants to know.

    Args:
        indices: [B] int32/int64 tensor (any device), e.g. cache_indices.
        lines: the pool's number of lines, an int >= 0, or the pool tensor itself (its
            leading dimension: ssm_states, conv_state, intermediate_conv_window, ...).
        name: the argument's name, for the messages.
        distinct: also refuse a line that two sequences share (negative entries may
            repeat). Pass True for every index whose lines the call writes (ring slots,
            snapshot and window lines, a conv state rolled in place, a state written back);
            False for a pool that is only read (conv_state or ssm_states during verify).
    Raises TypeError for a non-tensor or a non-integer dtype, ValueError for a rank other
    than 1, an entry >= lines, or (distinct) a repeated line. Negative entries (padding)
    pass. Reads the values (syncs the device): call it where the indices are made, not
    inside a captured graph.
    """
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"{name} must be a [B] vector, got shape {tuple(indices.shape)}")
    if isinstance(lines, torch.Tensor):
        if lines.dim() == 0:
            raise ValueError(f"lines of {name} must be an int or a pool tensor, got a 0-d tensor")
        lines = lines.shape[0]
    if not isinstance(lines, int) or isinstance(lines, bool) or lines < 0:
        raise ValueError(f"lines of {name} must be an int >= 0 or a pool tensor, got {lines!r}")
    idx = indices.detach().to(device="cpu", dtype=torch.int64)
    over = (idx >= lines).nonzero().flatten()
    if over.numel():
        n = int(over[0])
        raise ValueError(
            f"{name}[{n}] = {int(idx[n])} is outside its pool of {lines} lines "
            "(a negative entry marks padding)"
        )
    if distinct and idx.numel() > 1:
        vals, order = torch.sort(idx, stable=True)
        rep = ((vals[1:] == vals[:-1]) & (vals[1:] >= 0)).nonzero().flatten()
        if rep.numel():
            j = int(rep[0])
            raise ValueError(
                f"{name} gives line {int(vals[j])} to sequences {int(order[j])} and "
                f"{int(order[j + 1])}: a line the call writes must be distinct"
            )


def check_pow2(name, value):
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")


def check_ring(rawk, rawv, g, beta, slots, H, HV, K, V, T, dtype):
    """Ring buffers rawk [slots,H,R,K], rawv [slots,HV,R,V] (input dtype), g [slots,HV,R,K],
    beta [slots,HV,R] (fp32), R a power of two with R >= 2*T. Returns R."""
    names = {
        "replayssm_rawk": rawk,
        "replayssm_rawv": rawv,
        "replayssm_g": g,
        "replayssm_beta": beta,
    }
    for name, t in names.items():
        if t is None:
            raise ValueError(f"cache_ring=True needs {name}")
    check_tensor("replayssm_rawk", rawk, ndim=4, dtype=dtype, unit_last=True)
    R = rawk.shape[2]
    check_tensor("replayssm_rawk", rawk, shape=(slots, H, R, K))
    check_tensor("replayssm_rawv", rawv, shape=(slots, HV, R, V), dtype=dtype, unit_last=True)
    check_tensor("replayssm_g", g, shape=(slots, HV, R, K), dtype=torch.float32, unit_last=True)
    check_tensor("replayssm_beta", beta, shape=(slots, HV, R), dtype=torch.float32)
    check_pow2("ring length R (replayssm_rawk.shape[2])", R)
    if 2 * T > R:
        raise ValueError(f"T={T} exceeds half the ring length R={R} (replayssm_rawk.shape[2])")
    return R


def check_heads(H, HV, K, V):
    for name, val in (
        ("num_q_heads", H),
        ("num_v_heads", HV),
        ("head_k_dim", K),
        ("head_v_dim", V),
    ):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if HV % H:
        raise ValueError(f"num_v_heads={HV} must be a multiple of num_q_heads={H}")
    check_pow2("head_k_dim", K)
    check_pow2("head_v_dim", V)


def check_lower_bound(lower_bound):
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound must be None or < 0, got {lower_bound}")


def num_warps_for(block_v, K):
    """Warps for a [block_v, K] fp32 state tile: about 32 state values per thread, 1..8 warps."""
    return max(1, min(8, block_v * K // 1024))


# Default tiles of the recurrence kernels by mode and batch: rows (largest batch, BLOCK_V,
# SUB_V, num_warps, stages), first match wins. "fused*" is the fused kernel, "unfused*" the
# recurrent kernel of the unfused pair. A program owns BLOCK_V value rows of one value
# head: it computes the head's per-step q, k, gate and beta once, then walks its rows in
# sub-tiles of SUB_V (a loop of BLOCK_V / SUB_V iterations, software-pipelined over
# `stages` when > 1, so that the next sub-tile's state loads while this one computes).
# Small batches use narrow tiles so that B * HV * (V / BLOCK_V) programs fill the GPU;
# large batches use wide ones so that the q/k work is shared by more of the state. The
# fp32 sub-tile takes SUB_V * K / (32 * num_warps) registers per thread.
# tools/dev/gpu_tune_kda.py times the tiles on a GPU (cold timings, H = HV = 8, K = V = 128,
# T = 4) and prints the table its best tiles make; docs/perf/kda.md has the runs. The
# B > 32 rows of the ring modes come from the v5 sweep: two sub-tiles of 32 rows per 64-row
# program (q/k work shared by 64 rows, 32-row tiles in registers); a pipelined loop
# (stages > 1) was slower at almost every measured point. The B <= 2 rows of the fused modes
# (more warps per program at B=1) are from the v5 sweep at B=1 too. v6 sweeps: unfused+ring
# at B=16 in 64-row one-piece tiles; at B > 32, fused+ring and unfused+ring in 128-row
# programs of two 64-row sub-tiles; all of these with key chunks (KEY_CHUNK_TABLE). v9: with
# the first sub-tile's loads ahead (fused_verify.KDA_VERIFY_FIRST_AHEAD), fused at B > 32 in
# the 32-row one-piece tiles of B <= 32 (54.24 vs 55.43 us for 128/64, cold, B=64). v10:
# fused at B > 32 in 128-row programs of four 32-row sub-tiles, each loaded while the one
# before computes (fused_verify.KDA_VERIFY_PREFETCH; 53.71 vs 54.48 us). v11: the ring
# modes at 16 < B <= 32 (fused+ring up to 48) in 64-row programs of two 32-row sub-tiles,
# fused+ring with a register cap (MAXNREG_TABLE); unfused+ring at B=32: 21.50 -> 18.70 us.
# v12: the ring modes at B > 16 in the projected form (PROJECT_TABLE) on 2 warps, key
# chunks of 32: 64-row programs of two 32-row sub-tiles at B <= 32, 128-row programs of
# four above, the sub-tile loop pipelined over 2 stages but unfused+ring's at B > 32. Two
# warps of 255 registers make a 128-row program 64 threads, so four fit per SM: the 512
# programs of B=64 are one wave. Cold us, B = 32 / 48 / 64: fused+ring 16.10 / 23.15 /
# 26.71 -> 13.30 / 19.75 / 22.14; unfused+ring 18.64 / 27.10 / 28.83 -> 16.91 / 20.91 /
# 23.01 (docs/perf/kda.md, v12). At 2 < B <= 8 the ring modes take the projected form too,
# on one-piece tiles of 16-32 rows on 2 warps (the recurrent kernel's 4-row tile on 1 warp
# at B <= 4): the stepwise tiles there had fused+ring slower than unfused+ring (B=4: 9.27
# vs 8.89 us, B=8: 10.37 vs 9.88); now B=4 6.81 / 7.85, B=8 7.88 / 9.27. v13 (truly cold
# timing, every buffer set out of L2): the fused kernel's 8-row tiles at 2 < B <= 8 were
# slower than the recurrent kernel's alike (B=8: 11.22 vs 11.40 us, asv 11.78 vs 11.68);
# 16-row tiles on 4 warps take 7.52 at B=4, and at B=8 the 32-row tiles of B <= 32 9.35:
# those now start at B=5. v14: fused+ring at B <= 2 on the fused mode's 4-row tile on 2
# warps, with the norms summed as rows (NORM_ROW_TABLE): 4.73 / 5.37 us at B = 1 / 2
# against 5.04 / 5.59 on 8 rows and 4 warps; at 4 < B <= 8 on 16-row tiles on 2 warps,
# stepwise, plain, norms as rows: B = 6 / 8 6.68 / 7.18 against 7.31 / 8.02 (the projected
# 32-row tile); the fused mode at B > 32 in 64-row programs of two 32-row sub-tiles, the
# second loaded while the first computes: B = 48 / 64 39.85 / 54.20 against 45.28 / 54.52.
BLOCK_V_TABLE = {
    "fused": (
        (2, 4, 4, 2, 1),
        (4, 16, 16, 4, 1),
        (32, 32, 32, 4, 1),
        (None, 64, 32, 4, 1),
    ),  # fmt: skip
    "fused+ring": (
        (2, 4, 4, 2, 1),
        (4, 16, 16, 2, 1),
        (8, 16, 16, 2, 1),
        (16, 64, 64, 4, 1),
        (32, 64, 32, 2, 2),
        (None, 128, 32, 2, 2),
    ),  # fmt: skip
    "unfused": ((2, 4, 4, 1, 1), (8, 8, 8, 1, 1), (32, 16, 16, 2, 1), (None, 8, 8, 2, 1)),
    "unfused+ring": (
        (2, 4, 4, 1, 1),
        (4, 4, 4, 1, 1),
        (8, 16, 16, 2, 1),
        (16, 64, 64, 4, 1),
        (32, 64, 32, 2, 2),
        (None, 128, 32, 2, 1),
    ),  # fmt: skip
}
# Register cap per thread (ptxas maxnreg) of the table's tiles, by mode and batch: rows
# (largest batch, cap), first match wins; None = no cap. Used only when the module's
# MAXNREG knob is None and no tile knob (BLOCK_V, SUB_V, NUM_WARPS) is forced. Why a cap
# helps: at these batches the ring modes' time goes with how many waves of programs the
# GPU runs, and the registers set the programs per SM. Uncapped, the fused kernel's 64/32
# ring tile takes 144 registers with plain key rows (B <= 32) and 202 with key chunks of 64
# (B > 32): three 128-thread programs per SM (396 on the H200's 132 SMs), or two (264).
# Capped at 128, four fit (528: one wave for the B * HV = 512 programs of B=32); at 168,
# three. Spills go to the L1-cached stack. Measured (docs/perf/kda.md, v11, cold us, B=24 /
# 32 / 48): fused+ring with v10's table 14.54 / 20.40 / 25.01; 64/32 capped at 128 13.75 /
# **16.41** / 24.93, at 168 **13.61** / 21.04 / **23.11**. B=16 and B=64 were slower with
# every cap tried. (The recurrent kernel's 64/32 tile takes 128 registers uncapped.) v12's
# projected ring tiles (BLOCK_V_TABLE) beat those capped ones uncapped (B=32: 13.30 us,
# B=48: 19.75), so no row caps a tile now; the mechanism stays for the next tuning.
MAXNREG_TABLE = {
    "fused": ((None, None),),
    "fused+ring": ((None, None),),
    "unfused": ((None, None),),
    "unfused+ring": ((None, None),),
}


def table_maxnreg(mode, knobs, B):
    """The table's register cap (MAXNREG_TABLE) of `mode` at batch B, or None when one of
    the tile knobs is forced (the cap was measured with the table's tile only)."""
    if any(knobs.get(k) is not None for k in ("BLOCK_V", "SUB_V", "NUM_WARPS")):
        return None
    return next(cap for b, cap in MAXNREG_TABLE[mode] if b is None or B <= b)


def _check_pow2_knob(name, value):
    if value is not None and (not isinstance(value, int) or value < 1 or value & (value - 1)):
        raise ValueError(f"{name} must be None or a power of two, got {value!r}")


# Width of the key chunks of a state tile (see `_tile_ptrs`), by mode and batch: rows
# (largest batch, KC), first match wins; None keeps the plain [rows, K] tile. The math and
# the order of every fp32 operation but the row sums' are the same either way; the ring
# bytes never depend on it (the ring holds no state). Measured (docs/perf/kda.md, v6, cold
# us, tuning script): chunks of 32 help the ring modes' 64-row one-piece tiles at B=16
# (10.3 vs 11.6 fused+ring, 10.8 vs 13.6 unfused+ring); chunks of 64 the 128-row programs
# at B=64 (fused+ring 26.9 vs 29.8 for the best plain tile, fused 56.8 vs 58.0). 16-wide
# chunks, and chunks at small batches, were slower: each lane then holds 16-32 values of
# every per-step key vector (registers, and a shared-memory broadcast per step). The fused
# kernel's 32-row tiles at B > 32 (v9) were timed with chunks of 64. v12: the ring modes'
# projected tiles at B > 16 take chunks of 32 (fused+ring B=64: 22.05 us, 23.77 with 64).
# v14: fused+ring's stepwise 16-row tile at 4 < B <= 8 is plain (its norms are summed as
# rows, NORM_ROW_TABLE, which pays on plain tiles only).
KEY_CHUNK_TABLE = {
    "fused": ((32, None), (None, 64)),
    "fused+ring": ((2, None), (4, 32), (8, None), (None, 32)),
    "unfused": ((None, None),),
    "unfused+ring": ((4, None), (None, 32)),
}
# Forced key chunk width for both recurrence kernels, read at every call: None = the table;
# a power of two >= 4 (clipped to K; K is the plain tile).
STATE_KEY_CHUNK = None


def key_chunk(mode, B, K):
    """KC kernel argument of `mode` at batch B: STATE_KEY_CHUNK if set (checked), else the
    table's; clipped to K."""
    kc = STATE_KEY_CHUNK
    if kc is None:
        kc = next(c for b, c in KEY_CHUNK_TABLE[mode] if b is None or B <= b) or K
    elif not isinstance(kc, int) or isinstance(kc, bool) or kc < 4 or kc & (kc - 1):
        raise ValueError(f"STATE_KEY_CHUNK must be None or a power of two >= 4, got {kc!r}")
    return min(kc, K)


# Whether the recurrence kernels take the projected form of the T steps (`_projection`,
# `_verify_steps`) by mode and batch, when the module's knob is None: rows (largest batch,
# flag), first match wins. The ring modes need no state after the steps, so there it
# replaces the per-step decays, row sums and rank-1 updates of the whole state tile by 2T
# independent row sums of the initial state; the snapshot modes would still update and
# store the state each step. Measured (docs/perf/kda.md, v12, cold us): on the table's
# B > 16 ring tiles (64/32 and 128/32 on 2 warps, key chunks of 32) it is what makes them
# fast (fused+ring B=64: 22.1 projected, 24.1 stepwise on a like tile, 26.7 v11's table);
# so it does at 2 < B <= 8 on small 2-warp tiles (fused+ring B=4: 6.81 vs 9.27). At B <= 2
# and 8 < B <= 16 the stepwise form on its tiles stays faster (B=1: 5.39 vs 6.21 at best,
# B=16: 9.0 vs 9.8), and in the snapshot modes it was slower at every batch (v7, v11).
# v14: fused+ring at 4 < B <= 8 stepwise again, on a plain 16-row tile with the norms
# summed as rows (B=8: 7.18 against 8.02 projected); at B = 3, 4 the projected 16-row tile
# stays (5.82 / 6.36 against 6.01 / 6.14 stepwise: a tie).
PROJECT_TABLE = {
    "fused": ((None, False),),
    "fused+ring": ((2, False), (4, True), (16, False), (None, True)),
    "unfused": ((None, False),),
    "unfused+ring": ((2, False), (8, True), (16, False), (None, True)),
}


def project_flag(mode, knob, name, needs_state, B):
    """PROJECT kernel argument at batch B: the knob (None = PROJECT_TABLE's row), checked.
    Never with `needs_state` (the final state is stored but no snapshot is: the projected
    form without snapshots never forms it)."""
    if knob is None:
        knob = next(flag for b, flag in PROJECT_TABLE[mode] if b is None or B <= b)
    elif not isinstance(knob, bool):
        raise ValueError(f"{name} must be None or a bool, got {knob!r}")
    return knob and not needs_state


# Whether the q/k norms are summed as [1, K] rows (`_l2norm`'s NORM_ROW) by mode and batch,
# when NORM_ROW is None: rows (largest batch, flag), first match wins. It pays on 2-warp
# programs of plain state tiles (both fused modes at B <= 2, the recurrent kernel from
# B = 9), where it takes the norms' cross-warp round trips out of the per-program chain:
# 49 -> 25 barriers (tools/dev/compile_kda_sm90.py --sass). Measured (docs/perf/kda.md, v14,
# cold us): fused B=1 4.97 -> 4.86, B=2 6.04 -> 5.58; fused+ring on that tile instead of
# 8 rows on 4 warps, B=1 5.04 -> 4.73, B=2 5.59 -> 5.37; unfused B = 16 / 32 / 64 16.34 /
# 29.05 / 55.82 -> 15.91 / 28.48 / 53.98; fused+ring's stepwise 16-row tile at 4 < B <= 8
# (see BLOCK_V_TABLE). On the 4-warp tiles it added layout conversions (fused B=16 14.34
# -> 15.39, fused+ring B=1 on 8 rows 4.70 -> 5.09), and on the key-chunked ones as well.
NORM_ROW_TABLE = {
    "fused": ((2, True), (None, False)),
    "fused+ring": ((2, True), (4, False), (8, True), (None, False)),
    "unfused": ((8, False), (None, True)),
    "unfused+ring": ((None, False),),
}
# Forced NORM_ROW for both recurrence kernels, read at every call: None = the table.
NORM_ROW = None


def norm_row_flag(mode, B):
    """NORM_ROW kernel argument of `mode` at batch B: the knob if set (checked), else the
    table's."""
    if NORM_ROW is None:
        return next(flag for b, flag in NORM_ROW_TABLE[mode] if b is None or B <= b)
    if not isinstance(NORM_ROW, bool):
        raise ValueError(f"NORM_ROW must be None or a bool, got {NORM_ROW!r}")
    return NORM_ROW


# Cache modifier of the snapshot stores (PTX st with it), read at every call: "" (the
# default write-back), ".cs" (streaming: likely accessed once), ".cg" (L2 only) or ".wt".
# The snapshots are written once per call and read only after a rejection, so they are
# streamed: ".cs" measured 1-3% faster than "" in the snapshot modes (v6), ".cg" the same.
SNAPSHOT_CACHE_MODIFIER = ".cs"


def snapshot_cache_modifier():
    """SNAP_CM kernel argument: SNAPSHOT_CACHE_MODIFIER, checked."""
    cm = SNAPSHOT_CACHE_MODIFIER
    if cm not in ("", ".cs", ".cg", ".wt"):
        raise ValueError(f'SNAPSHOT_CACHE_MODIFIER must be "", ".cs", ".cg" or ".wt", got {cm!r}')
    return cm


def maxnreg_kwargs(name, value, default=None):
    """Launch keywords of a register cap knob (None: `default`, the table's cap, or no cap
    when that is None too): {"maxnreg": n} for an int n in 24..255; checked, so a bad value
    raises before anything runs."""
    if value is None:
        return {} if default is None else {"maxnreg": default}
    if not isinstance(value, int) or isinstance(value, bool) or not 24 <= value <= 255:
        raise ValueError(f"{name} must be None or an int in 24..255, got {value!r}")
    return {"maxnreg": value}


def pick_tile(mode, knobs, B, V, K):
    """(BLOCK_V, SUB_V, num_warps, stages) of `mode` at batch B.

    knobs: the module's forced values {"BLOCK_V", "SUB_V", "NUM_WARPS", "STAGES"} (None =
    the table's). A forced BLOCK_V without a forced SUB_V walks its rows in one piece
    (SUB_V = BLOCK_V, one stage) with `num_warps_for` warps; a forced SUB_V larger than
    BLOCK_V is clipped to it. The knob names in messages carry `prefix`."""
    prefix = knobs.get("prefix", "")
    _, bv, sub, nw, st = next(row for row in BLOCK_V_TABLE[mode] if row[0] is None or B <= row[0])
    f_bv, f_sub, f_nw, f_st = (knobs.get(k) for k in ("BLOCK_V", "SUB_V", "NUM_WARPS", "STAGES"))
    _check_pow2_knob(f"{prefix}BLOCK_V", f_bv)
    _check_pow2_knob(f"{prefix}SUB_V", f_sub)
    if f_bv is not None:
        bv, sub, st = f_bv, f_bv, 1
        nw = num_warps_for(f_bv, K)
    bv = min(bv, V)
    if f_sub is not None:
        sub = f_sub
        nw = num_warps_for(min(sub, bv), K) if f_nw is None else nw
    sub = min(sub, bv)
    if f_nw is not None:
        if f_nw not in (1, 2, 4, 8, 16):
            raise ValueError(f"{prefix}NUM_WARPS must be None or 1, 2, 4, 8 or 16, got {f_nw!r}")
        nw = f_nw
    if f_st is not None:
        if not isinstance(f_st, int) or not 1 <= f_st <= 4:
            raise ValueError(f"{prefix}STAGES must be None or an int in 1..4, got {f_st!r}")
        st = f_st
    return bv, sub, nw, st


def check_state_and_saves(
    ssm_states,
    ssm_name,
    slot_indices,
    slot_name,
    snapshots,
    snapshot_indices,
    cache_ring,
    ring,
    B,
    T,
    H,
    HV,
    K,
    V,
    dtype,
    require_save,
):
    """Checks the recurrent state, its slot indices and the save buffers (snapshots xor ring).

    ssm_states [slots, HV, V, K] fp32; snapshots [lines, >=T, HV, V, K] fp32 with
    snapshot_indices [B]; ring = (rawk, rawv, g, beta), used only when cache_ring is true.
    """
    check_tensor(ssm_name, ssm_states, ndim=4, dtype=torch.float32, unit_last=True)
    if ssm_states.shape[1:] != (HV, V, K):
        raise ValueError(
            f"{ssm_name} must be [slots, {HV}, {V}, {K}], got {tuple(ssm_states.shape)}"
        )
    check_index(slot_name, slot_indices, B)
    if cache_ring and snapshots is not None:
        raise ValueError("give either intermediate_states_buffer or cache_ring=True, not both")
    if require_save and not cache_ring and snapshots is None:
        raise ValueError("verify needs intermediate_states_buffer or cache_ring=True")
    if snapshots is not None:
        check_tensor(
            "intermediate_states_buffer", snapshots, ndim=5, dtype=torch.float32, unit_last=True
        )
        if snapshots.shape[1] < T or snapshots.shape[2:] != (HV, V, K):
            raise ValueError(
                f"intermediate_states_buffer must be [lines, >={T}, {HV}, {V}, {K}], got {tuple(snapshots.shape)}"
            )
        if snapshot_indices is None:
            raise ValueError(
                "intermediate_state_indices is required with intermediate_states_buffer"
            )
        check_index("intermediate_state_indices", snapshot_indices, B)
    if cache_ring:
        check_ring(*ring, ssm_states.shape[0], H, HV, K, V, T, dtype)


def save_args(snapshots, ring, cache_ring, ssm_states, dtype):
    """Kernel arguments for the save buffers: 5 pointers, then 4 + 3*4 strides.

    Unused buffers are replaced by a 1-element dummy with zero strides (never touched)."""
    f32 = ssm_states.new_empty(1)
    low = ssm_states.new_empty(1, dtype=dtype)
    snap = snapshots if snapshots is not None else f32
    rawk, rawv, g, beta = ring if cache_ring else (low, low, f32, f32)
    ptrs = [snap, rawk, rawv, g, beta]
    strides = list(snapshots.stride()[:4]) if snapshots is not None else [0] * 4
    for t, n in ((rawk, 3), (rawv, 3), (g, 3), (beta, 3)):
        strides += list(t.stride()[:n]) if cache_ring else [0] * n
    return ptrs, strides


def tokens_view(name, t, N, width):
    """View a read-only per-token tensor ([N, width] or [1, N, width]) as [N, width]."""
    check_tensor(name, t, dtype=FLOAT_DTYPES, unit_last=True)
    if t.dim() == 0 or t.shape[-1] != width or t.numel() != N * width:
        raise ValueError(f"{name} must hold {N} tokens of {width} values, got {tuple(t.shape)}")
    return t.reshape(N, width)
