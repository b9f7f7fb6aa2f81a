"""Differentiable NSA selection attention over the Triton forward and backward kernels."""

import torch

from .backward import selection_backward_triton
from .forward import selection_forward_triton


class SelectionAttention(torch.autograd.Function):
    """o = selection attention(q, k, v); saves lse so the backward does not recompute it."""

    @staticmethod
    def forward(ctx, q, k, v, block_idx, block_size, scale):
        o, lse = selection_forward_triton(q, k, v, block_idx, block_size, scale, return_lse=True)
        ctx.save_for_backward(q, k, v, block_idx, o, lse)
        ctx.block_size = block_size
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, block_idx, o, lse = ctx.saved_tensors
        dq, dk, dv = selection_backward_triton(
            q, k, v, block_idx, ctx.block_size, do.contiguous(), o, lse, ctx.scale
        )
        return dq, dk, dv, None, None, None


def selection_attention(q, k, v, block_idx, block_size, scale=None):
    """Autograd-enabled NSA selection attention (Triton kernels).

    Args and shapes as for `selection_forward_triton`: q [B, Hq, T, D], k/v [B, Hkv, T, D],
    block_idx [B, Hkv, T, S] int32/int64. Returns o [B, Hq, T, D] in q's dtype; gradients
    flow to q, k and v.
    """
    return SelectionAttention.apply(q, k, v, block_idx, block_size, scale)
