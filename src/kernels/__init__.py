"""Triton kernels for sparse and linear attention, each beside a pure-PyTorch reference.

Subpackages:
    kernels.nsa  NSA selection attention (forward, backward, autograd).
    kernels.kda  KDA chain-verify for speculative decoding (conv update, gated delta rule).
"""

__version__ = "0.1.0"
