"""Launch settings of the NSA selection kernels, as data.

Every public entry point (`selection_forward_triton`, `selection_backward_triton`,
`selection_attention`) takes `tuning=`, an `NsaTuning` (None: `DEFAULT`); the kernels read
their settings from it and from nothing else. To try another setting, pass a copy:

    from dataclasses import replace
    t = replace(DEFAULT, forward=replace(DEFAULT.forward, tile_rows=32))
    o = selection_forward_triton(q, k, v, block_idx, block_size, tuning=t)

None of these settings changes a result beyond rounding (the tests run the kernels at other
values), only speed and memory. The defaults are the H200's (sm_90, 132 SMs).
"""

import dataclasses
from dataclasses import dataclass, field

SCHEDULES = ("auto", "tile", "blocks")


@dataclass(frozen=True)
class ForwardTuning:
    """The token-tile forward (`forward.py`), its tile lists and its schedule choice."""

    # Query rows (tokens x padded group) per tile: one 64-row wgmma; 16 tokens of G=4 share K/V
    tile_rows: int = 64
    # Warps per token-tile program: one warpgroup, whose wgmma covers the 64-row tile
    num_warps: int = 4
    # Tile-loop pipeline stages (None: 1 for several tokens a tile, 3 for one token a tile)
    num_stages: int | None = None
    # Tiles on the block-major path: "auto" (by block count), "tile" (none), "blocks" (all)
    schedule: str = "auto"
    # "auto": block-handled when distinct blocks > ratio * S ('recent' <= S + 1; 0: none)
    block_path_ratio: float = 2
    # "auto" only for G <= this: at G >= 16 one token's heads fill a tensor-core tile
    block_path_max_g: int = 8
    # ... and while the block path's temporaries fit (1.1 GB at the seed shape, T=32768)
    block_path_max_bytes: int = 2 << 30
    # Tile kernel on a second stream beside the block-major kernels (disjoint rows)
    overlap_tile_kernel: bool = True
    # Warps of the tile-list kernel (forward, dq): one warp sorts by lane shuffles, no barrier
    tile_list_warps: int = 1
    # Tiles per fix-up program (a power of two): clean inputs cost one vector load a program
    fix_tiles: int = 128
    # The fix-up kernel as a programmatic dependent of the token-tile kernel, on GPUs with
    # programmatic dependent launch (compute capability >= 9.0; elsewhere an ordinary
    # launch): the tile kernel lets it launch from its start, so its launch and the check of
    # its flags' placement overlap the tile kernel, and it waits on the device for the
    # writes of the kernels before it
    fix_pdl: bool = True

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("overlap_tile_kernel", "fix_pdl"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class BlockMajorTuning:
    """The block-major phase of the forward (`block_major.py`)."""

    # Rows (entries x padded group) per partial chunk, 16-bit (fp32: half): 4 programs per SM
    chunk_rows: int = 64
    # Warps per partial-kernel program: one warpgroup for the chunk's 64-row dots
    partial_warps: int = 4
    # Persistent partial programs per SM (None: one per chunk): resident slots kept full
    partial_waves: int | None = 16
    # Partial-loop stages: the next chunk's q rows and K/V land in shared memory meanwhile
    partial_stages: int = 2
    # Warps per combine program: one program per SM, a tile's partial loads all in flight
    combine_warps: int = 16
    # Persistent combine programs per SM (None: one per tile): one resident program each
    combine_waves: int | None = 1
    # Most tiles a combine program pre-checks in one vector load of their counts, so that a
    # call with no block-handled tile skips the walk (8 values a thread at 16 warps)
    combine_precheck_tiles: int = 4096
    # Lists per step of the prefix-sum kernel (one program per (b, kv head) loops over them)
    prefix_block: int = 4096
    # Tokens per list window (None: one): a window's q rows are read from DRAM about once
    list_window: int | None = 4096
    # Warps of the fill kernel (per-tile sort and atomics): fastest on the H200
    fill_warps: int = 2
    # Largest fill sort key kept in 32 bits ((NB + 1) * padded slots a tile); then 64-bit
    fill_key32_max: int = 2**31 - 1
    # Largest partial-kernel row offset in 32 bits (T * S * padded group * D); then 64-bit
    partial_off32_max: int = 2**31 - 1
    # 1 / l and log2(l) by the special-function unit (rel. error ~2**-22; compiled only)
    partial_fast_math: bool = True
    # Eviction policy of the partial-o stores: read once by the combine, L2 left to q
    partial_store_evict: str = "evict_first"
    # The fill, partial and combine kernels as programmatic dependents of the kernel before
    # each (compute capability >= 9.0; elsewhere ordinary launches): each one's launch
    # overlaps the end of the one before, and it waits on the device for that one's writes
    chain_pdl: bool = True

    def __post_init__(self):
        if not isinstance(self.chain_pdl, bool):
            raise ValueError(f"chain_pdl must be a bool, got {self.chain_pdl!r}")


@dataclass(frozen=True)
class BackwardTuning:
    """The backward (`backward.py`): the dq kernel and the dk/dv kernels."""

    # Query rows per dq program (None: the forward's tile_rows, so the same tiles)
    dq_rows: int | None = None
    # Warps per dq program: one warpgroup for the tile's dots
    dq_warps: int = 4
    # Pipeline stages of the dq block loop: fastest on the H200
    dq_stages: int = 2
    # Gathered query rows (tokens x padded group) per dk/dv chunk: fastest on the H200
    dkdv_rows: int = 128
    # Chunks per dk/dv program before a block's list is split: bounds the longest program
    segment_chunks: int = 256
    # Warps per dk/dv program: fastest on the H200
    dkdv_warps: int = 4
    # Pipeline stages of the dk/dv chunk loop: fastest on the H200
    dkdv_stages: int = 2
    # Slots per program of the index inversion's sort and fill kernels (tokens a tile:
    # this // S), sorted in registers; also sets its per-tile counts' memory (inverse.py)
    invert_tile_slots: int = 1024
    # Warps of those kernels: 8 sorted slots a thread
    invert_warps: int = 4
    # Buckets per program and tiles per step of the inversion's scan: about one program
    # per SM at the seed shape (T=32768: 513 buckets x 4 heads), 16 counts a thread
    invert_scan_buckets: int = 16
    invert_scan_tiles: int = 256
    # Blocks per step of the inversion's prefix-sum program (one per (b, kv head))
    invert_prefix_block: int = 1024


@dataclass(frozen=True)
class NsaTuning:
    """All NSA launch settings: forward, block-major phase, backward."""

    forward: ForwardTuning = field(default_factory=ForwardTuning)
    block_major: BlockMajorTuning = field(default_factory=BlockMajorTuning)
    backward: BackwardTuning = field(default_factory=BackwardTuning)
    # Repeated launches skip Triton's JIT dispatch (`kernels._runtime.launch`); False sends
    # every launch through `kernel[grid](...)`. Results are the same either way.
    direct_launch: bool = True
    # A key's first direct call is recorded and later calls replay it (`kernels._runtime.
    # Call.replay`); False keeps every call on the direct path. Results are the same.
    replay_calls: bool = True


DEFAULT = NsaTuning()


def resolve(tuning):
    """`tuning` itself when an NsaTuning, DEFAULT when None; anything else is refused."""
    if tuning is None:
        return DEFAULT
    if not isinstance(tuning, NsaTuning):
        raise TypeError(f"tuning must be an NsaTuning or None, got {type(tuning).__name__}")
    return tuning


def with_fields(base=None, **fields):
    """`base` (None: DEFAULT) with the named fields replaced (`dataclasses.replace` on the
    group of each: forward, block_major or backward; field names are unique across the
    groups; `direct_launch` and `replay_calls` are NsaTuning's own), e.g. `with_fields(tile_rows=32,
    dq_rows=16)`. An unknown name is refused."""
    base = resolve(base)
    groups = {n: fields.pop(n) for n in ("direct_launch", "replay_calls") if n in fields}
    for group in ("forward", "block_major", "backward"):
        sub = getattr(base, group)
        mine = {f.name: fields.pop(f.name) for f in dataclasses.fields(sub) if f.name in fields}
        if mine:
            groups[group] = dataclasses.replace(sub, **mine)
    if fields:
        raise ValueError(f"no NSA tuning field named {', '.join(sorted(fields))}")
    return dataclasses.replace(base, **groups)
