"""Block-index patterns for tests and benchmarks, and the duplicate check.

Both makers return int32 [B, Hkv, T, S] tensors on `device`, built with device-side torch ops.

* recent: query t selects n-1, n-2, ..., n-S with n = (t + 1) // block_size (negative -> -1):
  the partial block holding t is skipped and the first block_size - 1 queries see nothing.
* random: query t always selects block 0, its own block t // block_size and the one before;
  the other S - 3 slots are distinct blocks drawn uniformly from the remaining causal blocks
  0 .. t // block_size, independently per (b, kv head, t), from a fixed seed; -1 pads rows
  that have fewer than S causal blocks. With S < 3 only the first S forced blocks are kept.
"""

import torch

from ._checks import check_block_idx_arg, check_int
from .reference import kept_slots


def _check_sizes(B, Hkv, T, block_size, S):
    for name, x in (("B", B), ("Hkv", Hkv), ("T", T), ("block_size", block_size), ("S", S)):
        check_int(name, x)


def make_block_idx_recent(B, Hkv, T, block_size, S, device):
    """The seed's 'recent' pattern: [B, Hkv, T, S] int32, the S full blocks before t.

    B, Hkv, T, block_size and S are ints >= 1 (TypeError / ValueError naming the argument
    otherwise); block_size may be any such int, not only one the kernels accept.
    """
    _check_sizes(B, Hkv, T, block_size, S)
    n = (torch.arange(T, device=device) + 1) // block_size
    blk = (n[:, None] - 1) - torch.arange(S, device=device)[None, :]
    blk = torch.where(blk >= 0, blk, torch.full_like(blk, -1))
    return blk[None, None].expand(B, Hkv, T, S).to(torch.int32).contiguous()


def make_block_idx_random(B, Hkv, T, block_size, S, device, seed=0):
    """NSA-like random pattern (see module doc): [B, Hkv, T, S] int32, valid entries distinct.

    B, Hkv, T, block_size and S are ints >= 1 and seed an int (TypeError / ValueError naming
    the argument otherwise).
    """
    _check_sizes(B, Hkv, T, block_size, S)
    check_int("seed", seed, minimum=None)
    NB = (T + block_size - 1) // block_size
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = torch.empty(B, Hkv, T, S, dtype=torch.int32, device=device)
    n_rand = max(S - 3, 0)
    # Rows are drawn in chunks so the [rows, NB] random keys stay bounded in memory.
    rows = max(1, (1 << 24) // max(1, B * Hkv * NB))
    for t0 in range(0, T, rows):
        t = torch.arange(t0, min(T, t0 + rows), device=device)
        own = t // block_size
        forced = torch.stack([torch.zeros_like(own), own, own - 1], dim=-1)  # [n, 3]
        # Drop forced entries that are negative or repeat an earlier forced entry.
        dup = torch.zeros_like(forced, dtype=torch.bool)
        dup[:, 1] = forced[:, 1] == forced[:, 0]
        dup[:, 2] = (forced[:, 2] < 0) | (forced[:, 2] == forced[:, 0])
        forced = torch.where(dup, torch.full_like(forced, -1), forced)
        forced = forced[None, None].expand(B, Hkv, -1, -1)
        if n_rand:
            # Uniform sample without replacement: smallest n_rand of i.i.d. uniform keys over
            # the eligible blocks (causal and not forced); ineligible blocks get key 2.
            keys = torch.rand(B, Hkv, len(t), NB, generator=gen, device=device)
            j = torch.arange(NB, device=device)
            eligible = (
                (j <= own[:, None]) & (j != 0) & (j != own[:, None]) & (j != own[:, None] - 1)
            )
            keys = torch.where(eligible, keys, torch.full_like(keys, 2.0))
            k = min(n_rand, NB)
            val, pick = torch.topk(keys, k, dim=-1, largest=False)
            pick = torch.where(val < 2.0, pick, torch.full_like(pick, -1))
            pad = torch.full((B, Hkv, len(t), n_rand - k), -1, dtype=pick.dtype, device=device)
            row = torch.cat([forced, pick, pad], dim=-1)
        else:
            row = forced
        out[:, :, t0 : t0 + len(t)] = row[..., :S].to(torch.int32)
    return out


def validate_block_idx(block_idx, block_size, shape=None):
    """Check a block_idx tensor against the selection contract.

    Args:
        block_idx: [B, Hkv, T, S] int32/int64, every size >= 1 (any strides).
        block_size: keys per block (to know which entries are kept), an int >= 1.
        shape: optional expected (B, Hkv, T, S).
    Raises ValueError whenever block_idx breaks the contract: not a tensor, a wrong dtype, a
    wrong rank or shape, a size below 1, or a kept block (0 <= j < NB and
    j * block_size <= t) appearing twice in one row; TypeError / ValueError on a block_size
    that is not an int >= 1. Reads the values (syncs the device): call it once on a pattern,
    not on every kernel call.
    """
    check_int("block_size", block_size)
    try:
        check_block_idx_arg(block_idx, block_size, contiguous=False)
    except TypeError as e:
        # One exception type for every broken block_idx, so a caller can catch just that.
        raise ValueError(str(e)) from None
    if shape is not None and tuple(block_idx.shape) != tuple(shape):
        raise ValueError(f"block_idx shape {tuple(block_idx.shape)} != expected {tuple(shape)}")
    T, S = block_idx.shape[2], block_idx.shape[3]
    keep = kept_slots(block_idx, block_size, T)
    # Dropped slots get distinct negative sentinels so only kept entries can collide.
    sentinel = -1 - torch.arange(S, device=block_idx.device)
    j = torch.where(keep, block_idx.long(), sentinel).sort(dim=-1).values
    if S > 1 and bool((j[..., 1:] == j[..., :-1]).any()):
        raise ValueError("block_idx has a kept block repeated within one query row")
