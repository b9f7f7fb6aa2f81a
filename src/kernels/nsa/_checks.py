"""Host-side argument checks shared by the NSA selection wrappers.

Every check here reads only shapes, dtypes, strides and devices, never tensor values, so a
call stays free of device syncs (and capturable in a CUDA graph). A failed check raises
before anything is allocated or launched, and the message names the offending argument.
"""

import math
from dataclasses import dataclass

import torch

from .. import _runtime

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
HEAD_DIMS = (32, 64, 128)
BLOCK_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class Dims:
    """Sizes of one selection-attention call (head-first layout)."""

    B: int
    Hq: int
    Hkv: int
    T: int
    D: int
    S: int
    block_size: int
    scale: float

    @property
    def G(self) -> int:
        """Query heads per kv head (GQA group size)."""
        return self.Hq // self.Hkv

    @property
    def NB(self) -> int:
        """Number of key blocks, the last one possibly partial."""
        return (self.T + self.block_size - 1) // self.block_size


def _tensor(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_int(name, x, minimum=1):
    """x must be a Python int (a bool is refused) and, unless minimum is None, >= minimum."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")


def _contiguous(name, x):
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


def _devices(named):
    """All tensors on one device; CUDA unless the Triton interpreter is active."""
    devs = {x.device for _, x in named}
    if len(devs) > 1:
        where = ", ".join(f"{n} on {x.device}" for n, x in named)
        raise ValueError(f"all tensors must be on one device: {where}")
    dev = devs.pop()
    # The interpreter runs kernels on host memory, so it takes CPU (or CUDA) tensors; a
    # device without storage (meta) or any other backend can run no kernel at all.
    if dev.type != "cuda" and not (_runtime.interpreter_active() and dev.type == "cpu"):
        raise ValueError(
            f"q must be a CUDA tensor (got device {dev}); CPU tensors need TRITON_INTERPRET=1"
        )


def check_forward_args(q, k, v, block_idx, block_size, scale) -> Dims:
    """Validate the forward inputs; return the call's sizes.

    q: [B, Hq, T, D], k/v: [B, Hkv, T, D] (same float dtype), block_idx: [B, Hkv, T, S]
    int32/int64; all contiguous on one device.
    """
    for name, x in (("q", q), ("k", k), ("v", v), ("block_idx", block_idx)):
        _tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (head-first), got shape {tuple(x.shape)}")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be bf16, fp16 or fp32, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} dtype {x.dtype} must equal q dtype {q.dtype}")
    if block_idx.dtype not in INDEX_DTYPES:
        raise TypeError(f"block_idx must be int32 or int64, got {block_idx.dtype}")
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    if k.shape != (B, Hkv, T, D):
        raise ValueError(f"k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v shape {tuple(v.shape)} must equal k shape {tuple(k.shape)}")
    if Hkv < 1 or Hq < 1 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a positive multiple of k/v heads ({Hkv})")
    if B < 1 or T < 1:
        raise ValueError(f"q must have B >= 1 and T >= 1, got shape {tuple(q.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"q head dim {D} unsupported; use one of {HEAD_DIMS}")
    if block_idx.shape[:3] != (B, Hkv, T) or block_idx.shape[3] < 1:
        raise ValueError(
            f"block_idx shape {tuple(block_idx.shape)} must be [B={B}, Hkv={Hkv}, T={T}, S>=1]"
        )
    check_int("block_size", block_size)
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size {block_size} unsupported; use one of {BLOCK_SIZES}")
    if scale is None:
        scale = D**-0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    elif not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    for name, x in (("q", q), ("k", k), ("v", v), ("block_idx", block_idx)):
        _contiguous(name, x)
    _devices((("q", q), ("k", k), ("v", v), ("block_idx", block_idx)))
    return Dims(B, Hq, Hkv, T, D, block_idx.shape[3], block_size, float(scale))


def check_block_idx_arg(block_idx, block_size, name="block_idx", contiguous=True):
    """Validate a block_idx handed to an index helper on its own; return (B, Hkv, T, S).

    block_idx: [B, Hkv, T, S] int32/int64 with every size >= 1 (what the kernels accept),
    contiguous unless contiguous=False; block_size: an int >= 1 (any size: the helpers are
    not limited to the kernels' BLOCK_SIZES). Reads no values.
    """
    _tensor(name, block_idx)
    if block_idx.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {block_idx.dtype}")
    if block_idx.dim() != 4 or min(block_idx.shape) < 1:
        raise ValueError(
            f"{name} must be [B, Hkv, T, S] with every size >= 1, got shape "
            f"{tuple(block_idx.shape)}"
        )
    if contiguous:
        _contiguous(name, block_idx)
    check_int("block_size", block_size)
    return tuple(block_idx.shape)


def check_backward_args(q, k, v, block_idx, block_size, do, o, lse, scale) -> Dims:
    """Validate the backward inputs (forward ones plus do, o and optional lse)."""
    dims = check_forward_args(q, k, v, block_idx, block_size, scale)
    named = [("do", do), ("o", o)] + ([("lse", lse)] if lse is not None else [])
    for name, x in named:
        _tensor(name, x)
    for name, x in (("do", do), ("o", o)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} dtype {x.dtype} must equal q dtype {q.dtype}")
        if x.shape != q.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} must equal q shape {tuple(q.shape)}")
    if lse is not None:
        if lse.dtype != torch.float32:
            raise TypeError(f"lse must be float32, got {lse.dtype}")
        if lse.shape != q.shape[:3]:
            raise ValueError(
                f"lse shape {tuple(lse.shape)} must be [B, Hq, T] = {tuple(q.shape[:3])}"
            )
    for name, x in named:
        _contiguous(name, x)
    _devices([("q", q)] + named)
    return dims


def new_empty(shape, dtype, device):
    """Allocate a kernel output (uninitialised). Every output goes through here so tests can
    swap in a NaN-filled allocation and prove that the kernels write every element."""
    return torch.empty(shape, dtype=dtype, device=device)
