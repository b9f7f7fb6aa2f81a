"""Differentiable NSA selection attention over the Triton forward and backward kernels."""

import torch

from . import _checks
from .backward import checked_backward
from .forward import checked_forward
from .tuning import resolve


class SelectionAttention(torch.autograd.Function):
    """o = selection attention(q, k, v); saves lse so the backward does not recompute it.

    The forward checks its inputs as `selection_forward_triton` does. The backward checks
    only do: q, k, v, block_idx, o and lse are the forward's own, and autograd refuses
    saved tensors changed in place since."""

    @staticmethod
    def forward(ctx, q, k, v, block_idx, block_size, scale, tuning):
        tuning = resolve(tuning)
        dims = _checks.check_forward_args(q, k, v, block_idx, block_size, scale)
        o, lse = checked_forward(q, k, v, block_idx, block_size, dims, tuning)
        ctx.save_for_backward(q, k, v, block_idx, o, lse)
        ctx.block_size = block_size
        ctx.dims = dims
        ctx.tuning = tuning
        return o

    @staticmethod
    def backward(ctx, do):
        # Autograd runs a backward with grad mode on exactly when create_graph=True was asked
        # for; the Triton backward is not itself differentiable, so refuse here, at the first
        # backward, rather than return gradients whose own backward fails later.
        if torch.is_grad_enabled():
            raise ValueError(
                "create_graph=True: selection_attention does not support double backward "
                "(second-order gradients); its Triton backward is not differentiable"
            )
        q, k, v, block_idx, o, lse = ctx.saved_tensors
        # Autograd hands over a gradient with o's shape, dtype and device; its layout may
        # differ (an expanded do).
        if do.shape != o.shape or do.dtype != o.dtype or do.device != o.device:
            raise ValueError(
                f"do must match o: got {tuple(do.shape)} {do.dtype} on {do.device}, "
                f"o is {tuple(o.shape)} {o.dtype} on {o.device}"
            )
        dq, dk, dv = checked_backward(
            q, k, v, block_idx, ctx.block_size, do.contiguous(), o, lse, ctx.dims, ctx.tuning
        )
        return dq, dk, dv, None, None, None, None


def selection_attention(q, k, v, block_idx, block_size, scale=None, *, tuning=None):
    """Autograd-enabled NSA selection attention (Triton kernels).

    Args and shapes as for `selection_forward_triton`: q [B, Hq, T, D], k/v [B, Hkv, T, D],
    block_idx [B, Hkv, T, S] int32/int64. Returns o [B, Hq, T, D] in q's dtype; gradients
    flow to q, k and v. First-order only: a backward with create_graph=True (double backward,
    e.g. a Hessian-vector product) raises ValueError. tuning: launch settings, an
    `NsaTuning` (None: `tuning.DEFAULT`).
    """
    return SelectionAttention.apply(q, k, v, block_idx, block_size, scale, tuning)
