"""Tuning of the KDA verify kernels: tiles, key chunks and step forms by mode and batch.

Every value a wrapper turns into a launch option or a constexpr lives here, in frozen
dataclasses; `DEFAULT` holds the shipped choices. A wrapper takes its kernel's part
through `tuning=` (None = the default), e.g.

    from dataclasses import replace
    from kernels.kda.tuning import DEFAULT
    fused_kda_conv_gating_verify(..., tuning=replace(DEFAULT.verify, block_v=16))

Tables are tuples of rows whose first entry is the largest batch B the row covers (None:
every larger batch); the first row that covers B wins. A forced field (not None) wins
over its table. The tables hold the fastest choice per batch on an H200 at the seed's
shape (H = HV = 8, K = V = 128, T = 4, bf16). `table_heads` reads them at other head
counts by the work they launch instead of by sequences (`table_batch`).

Modes: "fused" / "fused+ring" are the fused kernel saving snapshots / the replay ring,
"unfused" / "unfused+ring" the recurrent kernel of the unfused pair.
"""

import sys
import types
from dataclasses import dataclass, field

SNAPSHOT_CACHE_MODIFIERS = ("", ".cs", ".cg", ".wt")


@dataclass(frozen=True)
class ModeTables:
    """The by-batch tables of one mode of a recurrence kernel."""

    # (largest B, BLOCK_V, SUB_V, num_warps, stages): a program owns BLOCK_V value rows of
    # one head and walks them in SUB_V-row sub-tiles; narrow tiles while B * HV * V / BLOCK_V
    # programs would not fill the GPU, wide ones once full (q/k work shared by more rows).
    tiles: tuple
    # (largest B, KC or None): key chunk width of the state tiles (None: plain [rows, K]);
    # chunks put the row sums in registers, which pays only on wide tiles (B >= 16).
    key_chunks: tuple
    # (largest B, bool): whether the T steps take the projected form (every state product
    # from the initial state); pays where no state is needed after the steps (ring modes).
    project: tuple
    # (largest B, bool): whether the q/k norms are summed as [1, K] rows; pays on 2-warp
    # programs of plain tiles (the sum stays within a warp), costs layout conversions elsewhere.
    norm_row: tuple
    # (largest B, bool): whether the prologue's reductions (the q/k norms unless norm_row,
    # and the projected form's T^2 dot products) are taken eight at a time, one shared-memory
    # round trip each (`step._sums`); no effect on rows with norm_row on and project off. Pays
    # where the prologue is on the path of a grid of one wave or less (the ring modes' wide
    # tiles, the 16-row snapshot tile); costs on the 32-row snapshot tile. On only where it
    # measured faster: a row where it measured level keeps one reduction each.
    stack_sums: tuple


@dataclass(frozen=True)
class RecurrenceTuning:
    """Fields shared by both recurrence kernels (fused and recurrent)."""

    # The by-batch tables of the snapshot mode.
    snapshot: ModeTables = None
    # The by-batch tables of the ring mode.
    ring: ModeTables = None
    # Forced BLOCK_V (a power of two; clipped to V); alone it walks its rows in one piece.
    block_v: int | None = None
    # Forced SUB_V (a power of two; clipped to BLOCK_V).
    sub_v: int | None = None
    # Forced warps per program (1, 2, 4, 8 or 16).
    num_warps: int | None = None
    # Forced software-pipelining stages of the sub-tile loop (1..4).
    stages: int | None = None
    # Register cap per thread (ptxas maxnreg, 24..255); None: no cap (no table tile needs one).
    maxnreg: int | None = None
    # Forced key chunk width (a power of two >= 4, clipped to K; K is the plain tile).
    key_chunk: int | None = None
    # Forced projected form (never taken when the final state must be formed).
    project: bool | None = None
    # Forced norm-as-row flag.
    norm_row: bool | None = None
    # Forced eight-at-a-time reduction flag (`ModeTables.stack_sums`).
    stack_sums: bool | None = None
    # PTX cache modifier of the snapshot stores: ".cs" (streaming), as the snapshots are
    # written once per call and read only after a rejection.
    snapshot_cache_modifier: str = ".cs"
    # The value heads the tables were tuned at, or None. With a number, a call with HV value
    # heads reads the tables at batch B * HV / table_heads (`table_batch`): a program's work
    # and the program count then match the tuned shape's (twice the heads: twice the
    # programs at a batch, as at twice the batch). None: the tables' B is the batch.
    table_heads: int | None = None

    def tables(self, ring):
        """The ModeTables of the ring (True) or snapshot (False) mode."""
        return self.ring if ring else self.snapshot


@dataclass(frozen=True)
class VerifyTuning(RecurrenceTuning):
    """The fused kernel (`fused_kda_conv_gating_verify`): modes "fused" and "fused+ring"."""

    snapshot: ModeTables = ModeTables(
        tiles=(
            (2, 4, 4, 2, 1),
            (4, 16, 16, 4, 1),
            (None, 32, 32, 4, 1),
        ),
        key_chunks=((None, None),),
        project=((None, False),),
        norm_row=((2, True), (None, False)),
        stack_sums=((4, True), (None, False)),
    )  # fmt: skip
    ring: ModeTables = ModeTables(
        tiles=(
            (2, 4, 4, 2, 1),
            (4, 16, 16, 2, 1),
            (8, 16, 16, 2, 1),
            (16, 64, 64, 4, 1),
            (32, 64, 32, 2, 2),
            (None, 128, 32, 2, 2),
        ),
        key_chunks=((2, None), (4, 32), (8, None), (None, 32)),
        project=((2, False), (4, True), (16, False), (None, True)),
        norm_row=((2, True), (4, False), (8, True), (None, False)),
        stack_sums=((8, True), (16, False), (None, True)),
    )  # fmt: skip
    # The fused kernel's tables are read at the tuned shape's program count (HV = 8): at
    # twice the heads a batch launches what twice the batch does at the tuned shape, and
    # its tile follows. (The recurrent kernel reads its tables at the batch: read by
    # program count, its snapshot mode's rows run slower at twice the heads.)
    table_heads: int | None = 8
    # A measuring probe, not a tuning: True launches this same kernel, tile and grid with the
    # per-step input arithmetic replaced by copies (every conv output is its step's raw
    # input; g, beta, q and k are the raw a, b, q and k rows; the projected form's
    # coefficients are plain q and k with zero cross terms). Every byte the mode reads and
    # writes and every product with the state stay, so the call times the floor of this
    # schedule: what the mode would cost if the conv, the gates and the norms were free.
    # Its outputs are not KDA's (`tools/dev/gpu_kda_floor.py --part schedule`).
    floor_probe: bool = False


@dataclass(frozen=True)
class RecurrentTuning(RecurrenceTuning):
    """The recurrent kernel (`fused_sigmoid_gating_delta_rule_update`): "unfused" and
    "unfused+ring"."""

    snapshot: ModeTables = ModeTables(
        tiles=((2, 4, 4, 1, 1), (8, 8, 8, 1, 1), (32, 16, 16, 2, 1), (None, 8, 8, 2, 1)),
        key_chunks=((None, None),),
        project=((None, False),),
        norm_row=((8, False), (None, True)),
        stack_sums=((None, False),),
    )  # fmt: skip
    ring: ModeTables = ModeTables(
        tiles=(
            (2, 4, 4, 1, 1),
            (4, 4, 4, 1, 1),
            (8, 16, 16, 2, 1),
            (16, 64, 64, 4, 1),
            (32, 64, 32, 2, 2),
            (None, 128, 32, 2, 1),
        ),
        key_chunks=((4, None), (None, 32)),
        project=((2, False), (8, True), (16, False), (None, True)),
        norm_row=((None, False),),
        stack_sums=((8, False), (None, True)),
    )  # fmt: skip


@dataclass(frozen=True)
class ConvTuning:
    """The conv update (`causal_conv1d_update`)."""

    # Channels per program: a multiple of the 128 lanes of 4 warps, so each lane holds two.
    block_d: int = 256
    # Warps per program.
    num_warps: int = 4


@dataclass(frozen=True)
class KdaTuning:
    """All KDA kernels' tuning; each wrapper takes its own part (or this whole object)."""

    verify: VerifyTuning = field(default_factory=VerifyTuning)
    recurrent: RecurrentTuning = field(default_factory=RecurrentTuning)
    conv: ConvTuning = field(default_factory=ConvTuning)


DEFAULT = KdaTuning()


def resolve(tuning, cls, part):
    """`tuning` as a `cls`: None = DEFAULT's part, a KdaTuning gives its `part`."""
    if tuning is None:
        return getattr(DEFAULT, part)
    if isinstance(tuning, KdaTuning):
        tuning = getattr(tuning, part)
    if not isinstance(tuning, cls):
        raise TypeError(f"tuning must be None, a KdaTuning or a {cls.__name__}, got {tuning!r}")
    return tuning


def table_row(rows, B):
    """The first row of `rows` covering batch B (its first entry None or >= B)."""
    return next(row for row in rows if row[0] is None or B <= row[0])


def table_batch(tuning, B, HV):
    """The batch at which a call of B sequences with HV value heads reads its tables: B, or
    with tuning.table_heads set (checked), B * HV // table_heads, at least 1."""
    heads = tuning.table_heads
    if heads is None:
        return B
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise ValueError(f"table_heads must be None or a positive int, got {heads!r}")
    return max(1, B * HV // heads)


def num_warps_for(block_v, K):
    """Warps for a [block_v, K] fp32 state tile: about 32 state values per thread, 1..8 warps."""
    return max(1, min(8, block_v * K // 1024))


def _check_pow2(name, value):
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1)
    ):
        raise ValueError(f"{name} must be None or a power of two, got {value!r}")


def _check_flag(name, value):
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be None or a bool, got {value!r}")


def pick_tile(tuning, ring, B, V, K, block_v=None, block_v_name="block_v"):
    """(BLOCK_V, SUB_V, num_warps, stages) of a recurrence kernel at batch B.

    `block_v` (named `block_v_name` in messages) takes the place of tuning.block_v when
    given. A forced BLOCK_V without a forced SUB_V walks its rows in one piece (SUB_V =
    BLOCK_V, one stage) with `num_warps_for` warps; a forced SUB_V larger than BLOCK_V is
    clipped to it."""
    _, bv, sub, nw, st = table_row(tuning.tables(ring).tiles, B)
    f_bv = tuning.block_v if block_v is None else block_v
    f_sub, f_nw, f_st = tuning.sub_v, tuning.num_warps, tuning.stages
    _check_pow2(block_v_name if block_v is not None else "block_v", f_bv)
    _check_pow2("sub_v", f_sub)
    if f_bv is not None:
        bv, sub, st = f_bv, f_bv, 1
        nw = num_warps_for(f_bv, K)
    bv = min(bv, V)
    if f_sub is not None:
        sub = f_sub
        nw = num_warps_for(min(sub, bv), K) if f_nw is None else nw
    sub = min(sub, bv)
    if f_nw is not None:
        if f_nw not in (1, 2, 4, 8, 16) or isinstance(f_nw, bool):
            raise ValueError(f"num_warps must be None or 1, 2, 4, 8 or 16, got {f_nw!r}")
        nw = f_nw
    if f_st is not None:
        if not isinstance(f_st, int) or isinstance(f_st, bool) or not 1 <= f_st <= 4:
            raise ValueError(f"stages must be None or an int in 1..4, got {f_st!r}")
        st = f_st
    return bv, sub, nw, st


def key_chunk(tuning, ring, B, K):
    """KC kernel argument at batch B: tuning.key_chunk if set (checked), else the table's;
    clipped to K."""
    kc = tuning.key_chunk
    if kc is None:
        kc = table_row(tuning.tables(ring).key_chunks, B)[1] or K
    elif not isinstance(kc, int) or isinstance(kc, bool) or kc < 4 or kc & (kc - 1):
        raise ValueError(f"key_chunk must be None or a power of two >= 4, got {kc!r}")
    return min(kc, K)


def _table_flag(tuning, name, ring, B):
    """A flag of the tuning at batch B: its forced field `name` (None = the mode's table of
    that name), checked."""
    flag = getattr(tuning, name)
    _check_flag(name, flag)
    if flag is None:
        flag = table_row(getattr(tuning.tables(ring), name), B)[1]
    return flag


def project_flag(tuning, ring, needs_state, B):
    """PROJECT kernel argument at batch B: tuning.project (None = the table's), checked.
    Never with `needs_state` (the final state is stored but no snapshot is: the projected
    form without snapshots never forms it)."""
    return _table_flag(tuning, "project", ring, B) and not needs_state


def norm_row_flag(tuning, ring, B):
    """NORM_ROW kernel argument at batch B: tuning.norm_row (None = the table's), checked."""
    return _table_flag(tuning, "norm_row", ring, B)


def stack_sums_flag(tuning, ring, B):
    """STACK_SUMS kernel argument at batch B: tuning.stack_sums (None = the table's), checked."""
    return _table_flag(tuning, "stack_sums", ring, B)


def snapshot_cache_modifier(tuning):
    """SNAP_CM kernel argument: tuning.snapshot_cache_modifier, checked."""
    cm = tuning.snapshot_cache_modifier
    if cm not in SNAPSHOT_CACHE_MODIFIERS:
        raise ValueError(f'snapshot_cache_modifier must be "", ".cs", ".cg" or ".wt", got {cm!r}')
    return cm


def maxnreg_kwargs(tuning):
    """Launch keywords of tuning.maxnreg: {} for None, {"maxnreg": n} for an int n in
    24..255; checked, so a bad value raises before anything runs."""
    value = tuning.maxnreg
    if value is None:
        return {}
    if not isinstance(value, int) or isinstance(value, bool) or not 24 <= value <= 255:
        raise ValueError(f"maxnreg must be None or an int in 24..255, got {value!r}")
    return {"maxnreg": value}


class _RefusesRemovedKnobs(types.ModuleType):
    """Module type whose listed attributes cannot be set (`refuse_removed_knobs`)."""

    _removed: dict = {}

    def __setattr__(self, name, value):
        hint = self._removed.get(name)
        if hint is not None:
            raise AttributeError(
                f"{self.__name__}.{name} is no longer read, so setting it would change "
                f"nothing: pass tuning={hint} to the call instead"
            )
        super().__setattr__(name, value)


def refuse_removed_knobs(module_name, removed):
    """Make setting one of `removed` ({attribute: the `tuning=` replacement to name}) on the
    module `module_name` raise AttributeError: scripts written against the module-level
    knobs that these dataclasses replaced would otherwise run a sweep that changes nothing."""
    module = sys.modules[module_name]
    module.__class__ = type("KdaKernelModule", (_RefusesRemovedKnobs,), {"_removed": dict(removed)})
