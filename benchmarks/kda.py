"""KDA chain-verify: one layer's verify of T draft tokens, four ways, timed in CUDA graphs.

Modes (see the KDA spec): `unfused` (causal_conv1d_update, then the recurrent kernel, with
per-step state snapshots), `unfused+ring` (same kernels, replay ring), `fused` and
`fused+ring` (one kernel). Each sample is a per-call time from CUDA-graph replays, in two
variants: seed-style (a graph of 10 calls on the same buffers, so at large batch the working
set can sit in L2) and cold (speed targets are stated on this one): the calls rotate over
enough disjoint buffer sets that no call finds its state in L2, one call per set, all
captured in one graph. Between two uses of a set, the calls on the other sets touch three
times the L2's bytes (`cold_set_count`: 280 sets at B = 1, 10 at B = 64); ten sets would not
do below B = 16 (at B = 1 they touch about 7 MB, which stays in the H200's 60 MB L2). One
graph rather than graphs of ten: on cold buffers each graph boundary cost about 14 us on
the H200 (B = 1: 7.1 us per call in graphs of 10, 5.8 in graphs of 40, 5.7 in one graph;
docs/perf/kda.md, v13), a cost of graph launches, not of the kernels, and a
decode step's graph holds every layer's call anyway.

Before timing, the mode's output is checked against the PyTorch reference on a small batch
and, for ring modes, fused+ring and unfused+ring must fill the ring with the same bytes
(torch.equal): `KdaVerify` runs each (mode, gate, heads) check once per commit in asv's
`setup_cache` and every point that depends on a failed one fails in setup; `KdaBlockV`,
whose checks depend on its tile, checks in each process.

The bandwidth figure (`verify_bytes` per call over the cold time, % of the copy rate) is not
timed here: tools/report.py derives it from the stored `track_time_cold` values and the
stored `ceilings.CopyRate` ceiling of the same commit (docs/benchmarks.md, "Derived figures").
"""

import functools
import math

import torch

from . import kda_cases as cases
from .common import (
    DEVICE,
    DTYPE,
    FULL_SUITE,
    SAMPLES,
    SMOKE,
    DeviceBenchmark,
    check_close,
    grid,
    metric,
    peak_bytes,
    per_call_seconds,
    raise_check,
    require_api,
    run_checks,
    setup_oom_as_nan,
    timing_result,
)

# The one import of the kernels, guarded as in benchmarks/nsa.py (the reasons are there).
try:
    import kernels.kda as kda_kernels
except Exception:  # any failure of an older package surfaces per benchmark, in setup
    kda_kernels = None

MODES = list(cases.MODES)  # the asv parameter values: the modes' strings
GATES = {"standard": None, "safe": -5.0}  # the safe gate's lower_bound
T_DRAFT, CONV_W, RING = (2 if SMOKE else 4), cases.CONV_W, cases.RING_LEN
HEAD_DIM = 16 if SMOKE else 128  # K = V
GRAPH_CALLS = 1 if SMOKE else 10  # calls per captured graph (the seed's GRAPH_BATCH on a GPU)
COLD_L2_FACTOR = 3  # bytes touched between two uses of a cold set, in L2 sizes
MAX_COLD_SETS = 400  # at most (B = 1: about 280 sets, 1.6 GB with the snapshot buffers)
CHECK_BATCH, RING_CHECK_BATCH = (1, 1) if SMOKE else (2, 4)
# heads values name the shape, so smoke results (H=1) can never pass for GPU ones (H=8).
HEADS = grid(["H8-HV8"], nightly=["H8-HV8", "H8-HV16"], smoke=["H1-HV2"])


def parse_heads(heads):
    """'H8-HV16' -> (8, 16)."""
    h, hv = heads.split("-")
    return int(h[1:]), int(hv[2:])


def make_inputs(B, H, HV, mode, seed):
    """One verify's buffers at the suite's sizes (kda_cases.make_inputs): only the save
    buffers `mode` writes, identity slot/line maps, zero windows and snapshots."""
    return cases.make_inputs(
        B, T_DRAFT, H, HV, HEAD_DIM, HEAD_DIM, dtype=DTYPE, device=DEVICE, seed=seed, mode=mode,
        ring_len=RING,
    )  # fmt: skip


def make_call(api, mode, x, B, H, HV, lower_bound, tuning=None):
    """A zero-argument callable running one verify in `mode` on buffers `x`; returns o
    (kda_cases.make_call; the indices are checked first, at setup). `tuning`: a
    kernels.kda.tuning.KdaTuning passed as `tuning=`, or None (nothing passed)."""
    return cases.make_call(
        api, mode, x, B, T_DRAFT, H, HV, HEAD_DIM, HEAD_DIM, lower_bound, tuning=tuning
    )


def check_against_reference(api, mode, H, HV, lower_bound, tuning=None):
    """The mode's o (and snapshots) against kernels.kda.reference.verify on a small batch."""
    B, K = CHECK_BATCH, HEAD_DIM
    x = make_inputs(B, H, HV, mode, seed=7)
    ref = cases.reference_verify(api.reference, x, T_DRAFT, H, HV, K, K, lower_bound)
    o = make_call(api, mode, x, B, H, HV, lower_bound, tuning)()
    check_close(f"{mode} o", o.reshape(ref["o"].shape), ref["o"])
    if "inter_ssm" in x:
        check_close(f"{mode} snapshots", x["inter_ssm"][:B], ref["states"])


def check_ring_bitwise(api, H, HV, lower_bound, tuning=None):
    """fused+ring must write exactly the ring bytes unfused+ring writes (whole buffers)."""
    B = RING_CHECK_BATCH
    ref = make_inputs(B, H, HV, cases.UNFUSED_RING, seed=11)
    fus = make_inputs(B, H, HV, cases.FUSED_RING, seed=11)
    make_call(api, cases.UNFUSED_RING, ref, B, H, HV, lower_bound, tuning)()
    make_call(api, cases.FUSED_RING, fus, B, H, HV, lower_bound, tuning)()
    if not SMOKE:
        torch.cuda.synchronize()
    for name in cases.RING_NAMES:
        if not torch.equal(ref[name], fus[name]):
            raise AssertionError(f"ring mismatch in {name}: fused+ring != unfused+ring bytes")


class _Verify(DeviceBenchmark):
    """Inputs and checks shared by the KDA classes."""

    package = kda_kernels
    api_names = (
        "causal_conv1d_update",
        "fused_sigmoid_gating_delta_rule_update",
        "fused_kda_conv_gating_verify",
        "fused_verify",
        "reference",
    )
    tuning = None  # a kernels.kda.tuning.KdaTuning for every call (None: the package default)

    def check_case(self, mode, gate, heads):
        """The correctness checks of one (mode, gate, heads), at their own small batches."""
        H, HV = parse_heads(heads)
        check_against_reference(self.api, mode, H, HV, GATES[gate], self.tuning)
        if cases.is_ring(mode):
            check_ring_bitwise(self.api, H, HV, GATES[gate], self.tuning)

    def checks(self):
        """Every (mode, gate, heads) of the class's grid checked once (`run_checks`), for its
        `setup_cache`; {} where the commit lacks the API or there is no device (every
        point's setup skips then)."""
        try:
            self.open_device()
        except NotImplementedError:
            return {}
        _, modes, gates, heads = self.params
        return run_checks(
            {
                (m, g, h): functools.partial(self.check_case, m, g, h)
                for m in modes
                for g in gates
                for h in heads
            }
        )

    @setup_oom_as_nan  # an out-of-memory error anywhere here, checks included, records n/a
    def setup_case(self, batch, mode, gate, heads, checks=None):
        """`checks`: the outcomes from `checks` (setup_cache), or None: check here."""
        self.open_device()
        H, HV = parse_heads(heads)
        self.case = (batch, H, HV, mode, GATES[gate])
        if checks is None:
            self.check_case(mode, gate, heads)
        else:
            raise_check(checks[mode, gate, heads])
        self.fn = self.call(seed=0)

    def call(self, seed):
        batch, H, HV, mode, lower_bound = self.case
        x = make_inputs(batch, H, HV, mode, seed)
        return make_call(self.api, mode, x, batch, H, HV, lower_bound, self.tuning)

    def cold_samples(self, samples=SAMPLES):
        # One disjoint buffer set per captured call: a set is reused only after all others.
        batch, H, HV, mode, _ = self.case
        n = 2 if SMOKE else cold_set_count(batch, H, HV, mode, l2_bytes())
        fns = [self.call(seed=1 + i) for i in range(n)]
        return per_call_seconds(fns, calls=max(GRAPH_CALLS, n), samples=samples)


def l2_bytes():
    """The L2 size of the benchmark's GPU."""
    return torch.cuda.get_device_properties(torch.device(DEVICE)).L2_cache_size


def cold_set_count(B, H, HV, mode, l2):
    """Buffer sets the cold variant rotates over, a multiple of GRAPH_CALLS: enough
    that the calls between two uses of one set touch COLD_L2_FACTOR times the L2's `l2`
    bytes (at most MAX_COLD_SETS). A call's bytes are `verify_bytes` less the snapshot
    stores, which are streamed and never read back, so they are not counted on to evict
    anything."""
    touched = verify_bytes(B, H, HV, mode)
    if not cases.is_ring(mode):
        touched -= B * T_DRAFT * HV * HEAD_DIM * HEAD_DIM * 4
    n = math.ceil(COLD_L2_FACTOR * l2 / touched) + 1  # + 1: the set itself
    n = GRAPH_CALLS * math.ceil(n / GRAPH_CALLS)
    return max(GRAPH_CALLS, min(MAX_COLD_SETS, n))


class _Timed(_Verify):
    """The two per-call timings (seed-style and cold) of KdaVerify and KdaBlockV."""

    @metric("seconds")
    def track_time(self, *params):
        return timing_result(per_call_seconds([self.fn], calls=GRAPH_CALLS))

    @metric("seconds")
    def track_time_cold(self, *params):
        return timing_result(self.cold_samples())

    # 2: the rotation over enough sets to be cold at every batch (version 1 used 10 sets,
    # which at B < 16 fit in L2).
    track_time_cold.version = "2"


class KdaVerify(_Timed):
    """One layer's verify: per-call time (seed-style and cold) and, nightly, peak VRAM."""

    version = "1"
    params = [
        grid([1, 16, 64], nightly=[1, 2, 4, 8, 16, 32, 64], smoke=[1]),
        MODES,
        grid(["safe"], nightly=list(GATES), smoke=["safe"]),
        HEADS,
    ]
    param_names = ["batch", "mode", "gate", "heads"]

    def setup_cache(self):
        return self.checks()

    def setup(self, checks, batch, mode, gate, heads):
        self.setup_case(batch, mode, gate, heads, checks)

    if FULL_SUITE:  # nightly sweep and smoke mode only (common.FULL_SUITE)
        # The verify kernels allocate only their outputs, so this figure follows the buffers
        # the benchmark itself builds far more than the kernels; the per-commit budget keeps
        # it out of the default suite (12 processes), the nightly sweep tracks it.
        @metric("bytes")
        def track_peak_vram_bytes(self, *params):
            return peak_bytes(self.fn)


def block_v_tuning(block_v):
    """A KdaTuning forcing the fused kernel's BLOCK_V, or None for a package whose wrappers
    take no `tuning=` (older commits: they read fused_verify.KDA_VERIFY_BLOCK_V instead)."""
    import dataclasses
    import inspect

    kt = getattr(kda_kernels, "tuning", None)
    fv = getattr(kda_kernels, "fused_verify", None)
    if kt is None or fv is None:
        return None
    params = inspect.signature(fv.fused_kda_conv_gating_verify).parameters
    if "tuning" not in params or not hasattr(kt, "DEFAULT"):
        return None
    return kt.KdaTuning(verify=dataclasses.replace(kt.DEFAULT.verify, block_v=block_v))


def verify_bytes(B, H, HV, mode):
    """Bytes one verify must move at least (the KDA spec's count, "Bytes and the floor"):
    read the fp32 state once, write T snapshots of it or the ring entries; read mixed_qkv,
    a, b and the conv state; write the conv windows and o. The same for fused and unfused
    modes (the unfused pair's intermediate round trip is its own cost, not a floor)."""
    K = V = HEAD_DIM
    T, W, elt = T_DRAFT, CONV_W, torch.finfo(DTYPE).bits // 8
    dim = 2 * H * K + HV * V
    state = HV * V * K * 4
    if cases.is_ring(mode):
        saves = T * (H * K * elt + HV * V * elt + HV * K * 4 + HV * 4)
    else:
        saves = T * state
    reads = T * dim * elt + T * HV * K * elt + T * HV * elt + (W - 1) * dim * elt
    writes = T * dim * (W - 1) * elt + T * HV * V * elt
    return B * (state + saves + reads + writes)


if FULL_SUITE:  # the tuning sweep: nightly and smoke only (common.FULL_SUITE)

    class KdaBlockV(_Timed):
        """Tuning sweep of the fused kernel's value tile (safe gate, the first heads shape):
        `tuning=` with block_v replaced; a package without `tuning=` takes it from
        kernels.kda.fused_verify.KDA_VERIFY_BLOCK_V, set on the module before the first
        call."""

        version = "1"
        params = [
            grid([2, 4, 8, 16, 32], smoke=[4]),
            grid([cases.FUSED, cases.FUSED_RING], smoke=[cases.FUSED_RING]),
            grid([64], nightly=[1, 16, 64], smoke=[1]),
        ]
        param_names = ["block_v", "mode", "batch"]

        def setup(self, block_v, mode, batch):
            self.tuning = block_v_tuning(block_v)
            if self.tuning is None:  # an older package: the module attribute
                self.module = require_api(kda_kernels, "fused_verify").fused_verify
                require_api(self.module, "KDA_VERIFY_BLOCK_V")
                self.default_block_v = self.module.KDA_VERIFY_BLOCK_V
                self.module.KDA_VERIFY_BLOCK_V = block_v
            self.setup_case(batch, mode, "safe", HEADS[0])

        def teardown(self, *params):
            module = getattr(self, "module", None)
            if module is not None:
                module.KDA_VERIFY_BLOCK_V = self.default_block_v
