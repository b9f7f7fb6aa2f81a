"""Depthwise causal conv1d update for decode and chain verify (the first unfused kernel).

One program per (sequence, block of channels). Each channel's T outputs need the W-1
saved inputs plus the T new ones; all W-1+T rows (and the W weight columns) are loaded
once, up front, and every output and window is made from those registers. In verify mode (a window buffer is given) `conv_state` is only read and the window after
every step is written; in decode mode `conv_state` is rolled in place after the outputs
are computed.
"""

import torch
import triton
import triton.language as tl

from .. import _runtime
from . import tuning as _tuning
from .checks import FLOAT_DTYPES, check_devices, check_index, check_tensor
from .step import _conv_out, _load_rows, _pool_line, _store_windows


@triton.jit
def _causal_conv1d_update_kernel(
    x,
    conv_state,
    conv_state_indices,
    weight,
    bias,
    out,
    window,
    window_indices,
    n_cs_lines,
    n_win_lines,
    dim,
    s_x_n,
    s_x_c,
    s_x_t,
    s_cs_l,
    s_cs_c,
    s_cs_w,
    s_w_c,
    s_w_w,
    s_out_n,
    s_out_c,
    s_out_t,
    s_win_l,
    s_win_t,
    s_win_c,
    s_win_w,
    T: tl.constexpr,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    WINDOW: tl.constexpr,
):
    i_n = tl.program_id(0)
    o_c = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_c = o_c < dim
    # The line indices head the longest chain of loads; the new inputs and the weights do
    # not depend on them and are issued before the state rows that do. A line outside its
    # pool (negative or past the end) makes the sequence padding: every state and window
    # access below is masked by `valid`.
    i_line = _pool_line(tl.load(conv_state_indices + i_n).to(tl.int64), n_cs_lines)
    valid = i_line >= 0
    i_wline = i_line
    if WINDOW:
        i_wline = _pool_line(tl.load(window_indices + i_n).to(tl.int64), n_win_lines)
        valid = valid & (i_wline >= 0)
    b_x = _load_rows(x + i_n * s_x_n + o_c * s_x_c, s_x_t, T, m_c)
    b_w = _load_rows(weight + o_c * s_w_c, s_w_w, W, m_c)
    if HAS_BIAS:
        b_bias = tl.load(bias + o_c, mask=m_c, other=0).to(tl.float32)
    else:
        b_bias = tl.zeros([BLOCK_D], dtype=tl.float32)
    m_valid = m_c & valid
    p_state = conv_state + i_line * s_cs_l + o_c * s_cs_c
    b_xx = _load_rows(p_state, s_cs_w, W - 1, m_valid) + b_x

    p_out = out + i_n * s_out_n + o_c * s_out_c
    for t in tl.static_range(T):
        b_y = _conv_out(b_xx, b_w, b_bias, t, W, SILU)
        tl.store(p_out + t * s_out_t, tl.where(valid, b_y, 0.0).to(out.dtype.element_ty), mask=m_c)
    if WINDOW:
        p_win = window + i_wline * s_win_l + o_c * s_win_c
        _store_windows(p_win, s_win_t, s_win_w, b_xx, T, W, m_valid)
    else:
        # Decode: roll the state, conv_state[:, m] <- xx[T + m]. Every row was read above.
        for m in tl.static_range(W - 1):
            tl.store(p_state + m * s_cs_w, b_xx[T + m], mask=m_valid)


def causal_conv1d_update(
    x,
    conv_state,
    weight,
    bias=None,
    activation="silu",
    conv_state_indices=None,
    intermediate_conv_window=None,
    intermediate_state_indices=None,
    cache_seqlens=None,
    *,
    tuning=None,
):
    """Causal depthwise conv1d over T new tokens per sequence, continuing from `conv_state`.

    Args:
        x: [B, dim, T] or [B, dim] (T = 1), fp16/bf16/fp32, any strides (the verify path
            passes `mixed_qkv.reshape(B, T, dim).transpose(1, 2)`).
        conv_state: [lines, dim, W-1], x's dtype, any strides; the last W-1 raw inputs
            of each line, oldest first. Line of sequence n: conv_state_indices[n].
        weight: [dim, W]; bias: [dim] or None (both any float dtype, read as fp32).
        activation: "silu"/"swish" or None.
        conv_state_indices: [B] int32/int64, or None for line n = sequence n. An entry
            outside 0..lines-1 of conv_state (negative, or >= conv_state.shape[0]) marks a
            padded sequence: its outputs are zeros, nothing is read from or written to
            any pool for it.
        intermediate_conv_window: None (decode: `conv_state` is rolled in place), or
            [lines, T', dim, W-1] with T' >= T, x's dtype (verify: `conv_state` is only read
            and the window after step t goes to [intermediate_state_indices[n], t]).
        intermediate_state_indices: [B] int32/int64, required with a window buffer;
            outside 0..lines-1 of the window buffer = padded sequence (as above).
        cache_seqlens: must be None (circular conv states are not supported).
        tuning: a `tuning.ConvTuning` (or a `tuning.KdaTuning`); None = tuning.DEFAULT.

    Returns:
        out shaped and strided like x (x's dtype): out[n, c, t] = act(bias[c] +
        sum_j weight[c, j] * xx[t + j]) with xx = state columns followed by the new inputs.

    The index values are bounded in the kernel (a compare and a select, no host read), so
    the call stays CUDA-graph capturable. Two sequences sharing a line that is written
    (the conv line when the state is rolled, the window line in verify) is undefined;
    `kernels.kda.validate_indices` checks ranges and duplicates on request.
    """
    if cache_seqlens is not None:
        raise ValueError("cache_seqlens must be None: circular conv states are not supported")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    check_tensor("x", x, dtype=FLOAT_DTYPES)
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [B, dim] or [B, dim, T], got shape {tuple(x.shape)}")
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    B, dim, T = x3.shape
    check_tensor("weight", weight, ndim=2, dtype=FLOAT_DTYPES)
    if weight.shape[0] != dim or weight.shape[1] < 2:
        raise ValueError(f"weight must be [dim={dim}, W>=2], got {tuple(weight.shape)}")
    W = weight.shape[1]
    if bias is not None:
        check_tensor("bias", bias, shape=(dim,), dtype=FLOAT_DTYPES)
    check_tensor("conv_state", conv_state, ndim=3, dtype=x.dtype)
    if conv_state.shape[1:] != (dim, W - 1):
        raise ValueError(
            f"conv_state must be [lines, {dim}, {W - 1}], got {tuple(conv_state.shape)}"
        )
    if conv_state_indices is None:
        if conv_state.shape[0] < B:
            raise ValueError(f"conv_state has {conv_state.shape[0]} lines, need {B}")
        conv_state_indices = torch.arange(B, device=x.device, dtype=torch.int32)
    check_index("conv_state_indices", conv_state_indices, B)
    window = intermediate_conv_window
    if window is not None:
        check_tensor("intermediate_conv_window", window, ndim=4, dtype=x.dtype)
        if window.shape[1] < T or window.shape[2:] != (dim, W - 1):
            raise ValueError(
                f"intermediate_conv_window must be [lines, >={T}, {dim}, {W - 1}], got {tuple(window.shape)}"
            )
        if intermediate_state_indices is None:
            raise ValueError("intermediate_state_indices is required with intermediate_conv_window")
        check_index("intermediate_state_indices", intermediate_state_indices, B)
    check_devices(
        {
            "x": x,
            "conv_state": conv_state,
            "weight": weight,
            "bias": bias,
            "conv_state_indices": conv_state_indices,
            "intermediate_conv_window": window,
            "intermediate_state_indices": intermediate_state_indices
            if window is not None
            else None,
        }
    )

    tn = _tuning.resolve(tuning, _tuning.ConvTuning, "conv")
    out3 = torch.empty_like(x3)
    win = window if window is not None else out3.new_empty(1, 1, 1, 1)
    win_idx = intermediate_state_indices if window is not None else conv_state_indices
    grid = (B, _runtime.cdiv(dim, tn.block_d))
    _causal_conv1d_update_kernel[grid](
        x3,
        conv_state,
        conv_state_indices,
        weight,
        bias if bias is not None else weight,
        out3,
        win,
        win_idx,
        conv_state.shape[0],
        win.shape[0],
        dim,
        *x3.stride(),
        *conv_state.stride(),
        *weight.stride(),
        *out3.stride(),
        *win.stride(),
        T=T,
        W=W,
        BLOCK_D=tn.block_d,
        HAS_BIAS=bias is not None,
        SILU=activation is not None,
        WINDOW=window is not None,
        num_warps=tn.num_warps,
    )
    return out3.squeeze(-1) if x.dim() == 2 else out3


# The module-level knobs that `tuning=` replaced: setting one raises instead of doing nothing.
_tuning.refuse_removed_knobs(
    __name__,
    {
        "BLOCK_D": "replace(DEFAULT.conv, block_d=...)",
        "CONV_NUM_WARPS": "replace(DEFAULT.conv, num_warps=...)",
    },
)
