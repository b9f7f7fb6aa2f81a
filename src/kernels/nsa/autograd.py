"""Differentiable NSA selection attention over the Triton forward and backward kernels."""

import torch

from .backward import selection_backward_triton
from .forward import selection_forward_triton


class SelectionAttention(torch.autograd.Function):
    """o = selection attention(q, k, v); saves lse so the backward does not recompute it."""

    @staticmethod
    def forward(ctx, q, k, v, block_idx, block_size, scale, tuning):
        o, lse = selection_forward_triton(
            q, k, v, block_idx, block_size, scale, return_lse=True, tuning=tuning
        )
        ctx.save_for_backward(q, k, v, block_idx, o, lse)
        ctx.block_size = block_size
        ctx.scale = scale
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
        dq, dk, dv = selection_backward_triton(
            q, k, v, block_idx, ctx.block_size, do.contiguous(), o, lse, ctx.scale,
            tuning=ctx.tuning,
        )  # fmt: skip
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
