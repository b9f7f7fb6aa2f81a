"""The `@triton.jit` step math shared by the KDA verify kernels.

The ring written by the fused kernel must be byte-identical to the ring written by the
unfused pair (conv kernel, then recurrent kernel). Both therefore take every fp32 formula
that feeds a ring entry from the helpers here, so that the same instruction sequence
runs in both: the conv sum (explicit FMAs in tap order), bias, SiLU, the gate and beta.
"""

import triton
import triton.language as tl


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
    and two of the widest tiles (255 registers) then spill."""
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
    conversions instead (the tuning's norm_row tables say where it is taken)."""
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
    (q also scaled). exp(g) is taken here, where the step uses it: hoisted before the
    steps, the same instructions schedule worse.
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
                 NORM_ROW: tl.constexpr, STACK_SUMS: tl.constexpr):  # fmt: skip
    """Per-step vectors that do not depend on the state, as tuples of T rows:
    (g [K], beta (scalar), normalized and scaled q [K], normalized k [K]), all fp32, and
    with PROJECT the coefficients of `_projection` (else an empty tuple). STACK_SUMS takes
    the q/k norms (unless NORM_ROW) and the projection's dot products eight per reduction
    (`_sums`); off, one reduction each.

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
        if NORM_ROW or not STACK_SUMS:
            b_qn = b_qn + (_l2norm(b_q[t].to(tl.float32), 1e-6, NORM_ROW) * scale,)
            b_kn = b_kn + (_l2norm(b_k[t].to(tl.float32), 1e-6, NORM_ROW),)
    if STACK_SUMS and not NORM_ROW:
        # The 2T squared norms from `_sums`: one reduction per eight of them.
        b_x = ()
        for t in tl.static_range(T):
            b_x = b_x + (b_q[t].to(tl.float32), b_k[t].to(tl.float32))
        b_n2 = _sums(b_x, b_x, 2 * T)
        for t in tl.static_range(T):
            b_qn = b_qn + (b_x[2 * t] / tl.sqrt(b_n2[2 * t] + 1e-6) * scale,)
            b_kn = b_kn + (b_x[2 * t + 1] / tl.sqrt(b_n2[2 * t + 1] + 1e-6),)
    b_pj = ()
    if PROJECT:
        b_pj = _projection(b_qn, b_kn, b_g, T, STACK_SUMS)
    return b_g, b_beta, b_qn, b_kn, b_pj


@triton.jit
def _sums8(b_xs, b_ys, i0: tl.constexpr, N: tl.constexpr):
    """The dot products x_i . y_i of [K] vectors for i = i0 .. i0 + 7 (0 past N), as a tuple
    of 8 scalars, from one reduction.

    Each `tl.sum` of a [K] vector spread over several warps ends in a round trip through
    shared memory with barriers, and separate sums are not merged by the compiler. Joined
    into one [K, 2, 2, 2] tensor (`tl.join` puts the new axes in each thread's registers),
    the eight products are reduced over K together: one round trip for eight sums, then
    split back in registers."""
    b_p = ()
    for i in tl.static_range(8):
        if i0 + i < N:
            b_p = b_p + (b_xs[i0 + i] * b_ys[i0 + i],)
        else:
            b_p = b_p + (b_xs[0] * 0.0,)
    b_j = tl.join(
        tl.join(tl.join(b_p[0], b_p[1]), tl.join(b_p[2], b_p[3])),
        tl.join(tl.join(b_p[4], b_p[5]), tl.join(b_p[6], b_p[7])),
    )
    b_lo, b_hi = tl.split(tl.sum(b_j, axis=0))  # products 0-3, 4-7: [2, 2] each
    b_01, b_23 = tl.split(b_lo)
    b_45, b_67 = tl.split(b_hi)
    b_s0, b_s1 = tl.split(b_01)
    b_s2, b_s3 = tl.split(b_23)
    b_s4, b_s5 = tl.split(b_45)
    b_s6, b_s7 = tl.split(b_67)
    return b_s0, b_s1, b_s2, b_s3, b_s4, b_s5, b_s6, b_s7


@triton.jit
def _sums(b_xs, b_ys, N: tl.constexpr):
    """The N dot products x_i . y_i of two tuples of [K] vectors, eight per reduction
    (`_sums8`), as a tuple."""
    b_out = ()
    for i0 in tl.static_range(0, N, 8):
        b_s = _sums8(b_xs, b_ys, i0, N)
        for i in tl.static_range(8):
            if i0 + i < N:
                b_out = b_out + (b_s[i],)
    return b_out


@triton.jit
def _projection(b_qs, b_ks, b_g, T: tl.constexpr, STACK_SUMS: tl.constexpr):
    """What the T delta steps need from the key-side vectors alone (the "projected" form).

    With a_t = exp(g_t), c_t = a_0 * ... * a_t and e(j, t) = a_{j+1} * ... * a_t (e(t, t) = 1),
    unrolling S_t = S_{t-1} diag(a_t) + u_t k_t^T from the initial state S gives, per state row,
        S_{t-1} diag(a_t) k_t = S (c_t k_t) + sum_{j<t} A[t, j] u_j,   A[t, j] = k_j . (e(j, t) k_t)
        o_t = S_t q_t        = S (c_t q_t) + sum_{j<=t} B[t, j] u_j,  B[t, j] = k_j . (e(j, t) q_t)
    so u_t = beta_t (v_t - S (c_t k_t) - sum_{j<t} A[t, j] u_j). Every product with the state
    is one of 2T row sums of the *initial* state, and the A and B scalars are shared by all
    rows of the head. Returns (c_t q_t tuple, c_t k_t tuple, A, B): A holds A[t, j] for j
    = t-1 down to 0 after those of t-1 (position t (t-1) / 2 + t-1-j), B holds B[t, t]
    then B[t, j] for j = t-1 down to 0 (position t (t+1) / 2 + t-j). With STACK_SUMS the T^2
    dot products behind A and B are taken together (`_sums`): A's T (T-1) / 2 first, then
    B's; off, one reduction each, in order.
    """
    b_qc = ()
    b_kc = ()
    b_A = ()
    b_B = ()
    b_ax = ()  # the dot products' operands, A's, in A's order
    b_ay = ()
    b_bx = ()  # B's, in B's order
    b_by = ()
    b_c = tl.exp(b_g[0])
    for t in tl.static_range(T):
        if t > 0:
            b_c = b_c * tl.exp(b_g[t])
        b_qc = b_qc + (b_c * b_qs[t],)
        b_kc = b_kc + (b_c * b_ks[t],)
        if STACK_SUMS:
            b_bx = b_bx + (b_ks[t],)
            b_by = b_by + (b_qs[t],)
        else:
            b_B = b_B + (tl.sum(b_ks[t] * b_qs[t], axis=0),)
        b_e = tl.exp(b_g[t])
        for jj in tl.static_range(t):  # j = t - 1 - jj
            if jj > 0:
                b_e = b_e * tl.exp(b_g[t - jj])
            if STACK_SUMS:
                b_ax = b_ax + (b_ks[t - 1 - jj],)
                b_ay = b_ay + (b_e * b_ks[t],)
                b_bx = b_bx + (b_ks[t - 1 - jj],)
                b_by = b_by + (b_e * b_qs[t],)
            else:
                b_A = b_A + (tl.sum(b_ks[t - 1 - jj] * (b_e * b_ks[t]), axis=0),)
                b_B = b_B + (tl.sum(b_ks[t - 1 - jj] * (b_e * b_qs[t]), axis=0),)
    if STACK_SUMS:
        NA: tl.constexpr = T * (T - 1) // 2
        NB: tl.constexpr = T * (T + 1) // 2
        b_s = _sums(b_ax + b_bx, b_ay + b_by, NA + NB)
        for i in tl.static_range(NA):
            b_A = b_A + (b_s[i],)
        for i in tl.static_range(NB):
            b_B = b_B + (b_s[NA + i],)
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
