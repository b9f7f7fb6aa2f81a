"""NSA selection attention: Triton forward/backward, autograd wrapper, references, indices.

Layout is head-first: q [B, Hq, T, D], k/v [B, Hkv, T, D], block_idx [B, Hkv, T, S].
See the module docstrings of forward.py, block_major.py, backward.py, inverse.py and
tiles.py for the kernel designs; tuning.py for the launch settings every entry point takes as `tuning=`.
"""

from .autograd import selection_attention
from .backward import selection_backward_triton
from .forward import selection_forward_triton
from .indices import make_block_idx_random, make_block_idx_recent, validate_block_idx
from .inverse import invert_block_idx
from .reference import selection_forward_gather_reference, selection_forward_reference
from .tuning import NsaTuning

__all__ = [
    "NsaTuning",
    "invert_block_idx",
    "make_block_idx_random",
    "make_block_idx_recent",
    "selection_attention",
    "selection_backward_triton",
    "selection_forward_gather_reference",
    "selection_forward_reference",
    "selection_forward_triton",
    "validate_block_idx",
]
