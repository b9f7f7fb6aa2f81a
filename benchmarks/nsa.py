"""NSA selection attention: the Triton kernels against the dense O(T^2) reference.

Axes: seq_len, impl (triton | reference), preset (head layout), pattern (block_idx).
Each class checks the Triton kernel against the reference on a small shape of every preset
and pattern of its grid once per commit (asv's `setup_cache`), and a point whose preset and
pattern failed fails in setup, before it reports anything: a wrong kernel never posts a fast
number.
The reference's out-of-memory errors are data: those points record NaN (n/a) and the OOM
ceiling reads off the site as the first seq_len where the reference has no value.

Three time figures (docs/benchmarks.md, "Three time figures"):

    track_time        CUDA-graph replay: the kernels' own device time
    track_time_eager  back-to-back eager calls between two CUDA events: what a step pays
    track_time_host   host time per call behind a device sleep: the Python side's cost

`NsaForward` and `NsaBackward` (lse given) carry all three (the eager and host figures on the
gated grid only); `NsaAutograd` (the autograd call of a training step) the eager and host
figures; `NsaSeedBackward` (the seed benchmark's call, lse recomputed) all three.

The seed's view (ATTNBENCH_SUITE=view, selected by VIEW_BENCHMARKS): `NsaForward` and
`NsaBackward` over seq_len 512..32768, kernel and dense reference, with `track_time` (the
kernel only), `track_time_eager` (both: the figure the seed's own benchmark takes) and
`track_peak_vram_bytes` (both); no host figure.

Tokens/s, TFLOP/s and % of the matmul rate are not timed here: tools/report.py derives them
from the stored `track_time` values and the stored `ceilings.Matmul` ceiling of the same
commit (docs/benchmarks.md, "Derived figures").
"""

import functools
from dataclasses import dataclass

import torch

from .common import (
    DEVICE,
    PER_CALL_SAMPLES,
    ROTATION_SETS,
    SAMPLES,
    SMOKE,
    VIEW,
    DeviceBenchmark,
    check_close,
    eager_seconds,
    generator,
    grid,
    host_seconds,
    metric,
    peak_bytes,
    per_call_seconds,
    raise_check,
    randn,
    run_checks,
    setup_oom_as_nan,
    synchronize,
    timing_result,
)

# The one import of the kernels, guarded: asv runs this suite against older commits, whose
# package may lack the kernels or fail to import; their benchmarks then skip in setup
# (require_api). Importing here also loads the package once in asv's forkserver.
try:
    import kernels.nsa as nsa_kernels
except Exception:  # any failure of an older package surfaces per benchmark, in setup
    nsa_kernels = None

API = (
    "selection_forward_triton",
    "selection_backward_triton",
    "selection_forward_reference",
    "make_block_idx_recent",
    "make_block_idx_random",
)


@dataclass(frozen=True)
class Preset:
    B: int
    Hq: int
    Hkv: int
    D: int
    block_size: int
    S: int


# The seed's shape (G = 4) and the NSA paper's (G = 16); smoke runs tiny stand-ins whose
# names and seq_len values never occur on a GPU.
PRESETS = {
    "seed": Preset(B=1, Hq=16, Hkv=4, D=64, block_size=64, S=16),
    "paper": Preset(B=1, Hq=64, Hkv=4, D=64, block_size=64, S=16),
    "tiny-seed": Preset(B=1, Hq=4, Hkv=1, D=32, block_size=16, S=3),
    "tiny-paper": Preset(B=1, Hq=16, Hkv=1, D=32, block_size=16, S=3),
}
LONG_ONLY_PRESET = "paper"  # the only preset that runs at seq_len 65536 (nightly)
SMOKE_SEQ_LEN = 40  # not a multiple of the tiny block size: exercises the masks
CHECK_SEQ_LEN = SMOKE_SEQ_LEN if SMOKE else 512  # the correctness check's size
GRAPH_CALLS = 1 if SMOKE else 2  # Triton calls per captured CUDA graph

# The per-commit (gated) grid of the kernels. The eager and host figures run on it in every
# mode: the nightly sweep's other sizes and the dense reference add cost, not questions.
GATED_SEQ_LENS = grid([4096, 32768], smoke=[SMOKE_SEQ_LEN])
PRESET_AXIS = grid(["seed", "paper"], smoke=["tiny-seed"])
PATTERN_AXIS = grid(["recent", "random"], smoke=["random"])
GATED_GRID = [GATED_SEQ_LENS, ["triton"], PRESET_AXIS, PATTERN_AXIS]
PARAM_NAMES = ["seq_len", "impl", "preset", "pattern"]

# The seq_len axis of NsaForward and NsaBackward. The view sweeps the seed's range; its smoke
# run takes two tiny sizes, so the report draws lines (the other smoke suites take one).
SEQ_LEN_AXIS = grid(
    [4096, 32768],
    nightly=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
    smoke=[SMOKE_SEQ_LEN, 2 * SMOKE_SEQ_LEN] if VIEW else [SMOKE_SEQ_LEN],
    view=[512, 1024, 2048, 4096, 8192, 16384, 32768],
)
# The dense reference runs in the nightly sweep and the view (crossover, OOM ceiling) and in
# smoke mode; the default suite times what the gate judges, the kernels, with no skipped
# points (each point of the grid costs a process even when it skips).
IMPL_AXIS = grid(
    ["triton"],
    nightly=["triton", "reference"],
    smoke=["triton", "reference"],
    view=["triton", "reference"],
)
# The view runs the dense reference on this pattern only: its cost does not depend on the
# index pattern (it builds the full [T, T] mask and softmax whatever the selection), and
# tools/report.py lends its row to the other pattern. The seed's benchmark uses "recent".
VIEW_REFERENCE_PATTERN = PATTERN_AXIS[0]
# asv's -b selection of the view (scripts/main.sh): asv matches it against
# "name(param, ...)", so one regex picks the classes, the figures and the points: the
# kernel's every point, the reference's on VIEW_REFERENCE_PATTERN only, and the matmul
# ceiling (one process: the report's % of the matmul rate). The points it leaves out spawn
# no process (asv stores NaN there; the report borrows the other row).
VIEW_BENCHMARKS = (
    r"^(nsa\.Nsa(Forward|Backward)\.track_(time|time_eager|peak_vram_bytes)\(\d+, "
    rf"('triton'|'reference', '[^']*', '{VIEW_REFERENCE_PATTERN}')"
    r"|ceilings\.Matmul\.track_bf16_tflops)"
)

# Upper bounds on the device operations (kernels, memsets, copies) one call queues, with
# headroom over today's counts; host_seconds issues 256 // bound calls behind one sleep, so
# the bound is part of what the host figure measures. tests/test_asv_eager_host.py checks
# the calls against them on a GPU.
FORWARD_OPS = 16
BACKWARD_OPS = 96
BACKWARD_RECOMPUTE_OPS = 112  # the backward plus the forward that recomputes lse
AUTOGRAD_OPS = 128  # forward, backward and autograd's own operations


def _graph_time(samples=SAMPLES, params=None):
    """`track_time`: per-call device time from CUDA-graph replays (`per_call_seconds`),
    `samples` per process; `params`: its own grid (default: the class's)."""

    @metric("seconds")
    def track_time(self, *params):
        return timing_result(self.samples(samples))

    if params is not None:
        track_time.params = params
    return track_time


def _per_call_times(params=None):
    """`track_time_eager` and `track_time_host` over ROTATION_SETS input sets (`rotation`);
    `params`: their own grid (default: the class's)."""

    @metric("seconds")
    def track_time_eager(self, *params):
        return timing_result(eager_seconds(self.rotation()))

    @metric("seconds")
    def track_time_host(self, *params):
        return timing_result(host_seconds(self.rotation(), self.device_ops))

    if params is not None:
        track_time_eager.params = track_time_host.params = params
    return track_time_eager, track_time_host


class _Selection(DeviceBenchmark):
    """Shared parameters, set-up and inputs of the NSA classes (no figures of its own).

    A subclass gives `check(x)`, `call(x)` (a zero-argument callable running the timed call
    on input set `x`), `prepare()`, `peak_fn()` and, for the graph figure, `timed_fn()`, and
    a `setup_cache` of its own that returns `self.checks()`: asv keys a setup_cache by its
    module and source line, so one defined here would be shared by every subclass.
    """

    params = [SEQ_LEN_AXIS, IMPL_AXIS, PRESET_AXIS, PATTERN_AXIS]
    param_names = PARAM_NAMES
    package = nsa_kernels
    api_names = API

    def checks(self):
        """The class's correctness checks (`run_checks`): the Triton call against the
        reference at CHECK_SEQ_LEN, for every (preset, pattern) of its grid; {} where the
        commit lacks the API or there is no device (every point's setup skips then)."""
        try:
            self.open_device()
        except NotImplementedError:
            return {}

        def check(preset, pattern):
            self.p = PRESETS[preset]
            self.check(self.inputs(CHECK_SEQ_LEN, pattern, seed=7))

        return run_checks(
            {
                (preset, pattern): functools.partial(check, preset, pattern)
                for preset in self.params[2]
                for pattern in self.params[3]
            }
        )

    @setup_oom_as_nan
    def setup(self, checks, seq_len, impl, preset, pattern):
        """`checks`: the class's `setup_cache` (`checks`)."""
        p = PRESETS[preset]
        if seq_len > 32768 and preset != LONG_ONLY_PRESET:
            raise NotImplementedError("seq_len 65536 runs for the paper preset only")
        self.open_device()
        if impl == "reference" and not SMOKE:
            # One fp32 [T, T] score matrix per head larger than the whole device: skip outright.
            total = torch.cuda.get_device_properties(0).total_memory
            if p.B * p.Hq * seq_len * seq_len * 4 > total:
                raise NotImplementedError("dense reference cannot fit on this device at all")
        self.p, self.T, self.impl = p, seq_len, impl
        # An out-of-memory error from here on (the check's included) records n/a.
        if impl == "triton":
            raise_check(checks[preset, pattern])
        self.x = self.inputs(seq_len, pattern, seed=0)
        self.prepare()
        if not SMOKE:
            self.peak_fn()  # warm-up
            synchronize()

    def inputs(self, T, pattern, seed):
        p, gen = self.p, generator(seed)
        if pattern == "recent":
            idx = self.api.make_block_idx_recent(p.B, p.Hkv, T, p.block_size, p.S, DEVICE)
        else:
            idx = self.api.make_block_idx_random(p.B, p.Hkv, T, p.block_size, p.S, DEVICE, seed)
        return {
            "q": randn(gen, p.B, p.Hq, T, p.D),
            "k": randn(gen, p.B, p.Hkv, T, p.D),
            "v": randn(gen, p.B, p.Hkv, T, p.D),
            "do": randn(gen, p.B, p.Hq, T, p.D),
            "idx": idx,
        }

    def rotation(self):
        """ROTATION_SETS callables of the timed call, on the timed inputs and on copies of
        them with storage of their own: the same values, so every call does the same work
        and meets none of its tensors where the previous call left them. The dense
        reference gets one set: its working set is its [T, T] matrices, far larger than
        L2 at every benchmarked size, and each set of its backward holds a retained
        [T, T] forward graph, which would move its out-of-memory point."""
        sets = ROTATION_SETS if self.impl == "triton" else 1
        copies = [{n: t.clone() for n, t in self.x.items()} for _ in range(sets - 1)]
        return [self.call(x) for x in [self.x, *copies]]

    def samples(self, count=SAMPLES):
        fn, graph = self.timed_fn()
        calls = GRAPH_CALLS if graph else 1
        return per_call_seconds([fn], calls=calls, graph=graph, samples=count)


class _Kernel(_Selection):
    """The figures of the kernel classes (NsaForward, NsaBackward)."""

    if VIEW:
        # The reference is never captured in a graph: its track_time would time the same
        # back-to-back calls as its eager figure, so the view takes that one only.
        track_time = _graph_time(params=[SEQ_LEN_AXIS, ["triton"], PRESET_AXIS, PATTERN_AXIS])
        track_time_eager = _per_call_times()[0]  # kernel and reference, the class's grid
    else:
        track_time = _graph_time()
        track_time_eager, track_time_host = _per_call_times(GATED_GRID)

    @metric("bytes")
    def track_peak_vram_bytes(self, *params):
        return peak_bytes(self.peak_fn)


class NsaForward(_Kernel):
    """Forward: selection_forward_triton vs selection_forward_reference (no autograd)."""

    version = "1"
    device_ops = FORWARD_OPS

    def setup_cache(self):
        return self.checks()

    def check(self, x):
        a, bs = self.api, self.p.block_size
        got = a.selection_forward_triton(x["q"], x["k"], x["v"], x["idx"], bs)
        ref = a.selection_forward_reference(x["q"], x["k"], x["v"], x["idx"], bs)
        check_close("selection_forward_triton o", got, ref)

    def call(self, x):
        """The forward on set `x` (no input requires grad: what a no_grad block would be)."""
        a, bs = self.api, self.p.block_size
        f = a.selection_forward_triton if self.impl == "triton" else a.selection_forward_reference
        return lambda: f(x["q"], x["k"], x["v"], x["idx"], bs)

    def prepare(self):
        self.fn = self.call(self.x)

    def peak_fn(self):
        with torch.no_grad():
            return self.fn()

    def timed_fn(self):
        return self.peak_fn, self.impl == "triton"


class _BackwardCall:
    """The Triton backward on o and lse from the forward (not timed); with_lse = False
    passes lse=None, so the backward recomputes it (the seed benchmark's call). The
    reference: autograd through the dense forward."""

    with_lse = True

    def check(self, x):
        a, bs = self.api, self.p.block_size
        o, lse = a.selection_forward_triton(x["q"], x["k"], x["v"], x["idx"], bs, return_lse=True)
        lse = lse if self.with_lse else None
        got = a.selection_backward_triton(x["q"], x["k"], x["v"], x["idx"], bs, x["do"], o, lse)
        ref = self.reference_grads(x)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref, strict=True):
            check_close(f"selection_backward_triton {name}", g, r)

    def reference_grads(self, x, graph=None):
        """(dq, dk, dv) by autograd through the reference; `graph` reuses a retained forward."""
        leaves, o = graph or self.reference_forward(x)
        return torch.autograd.grad(o, leaves, x["do"], retain_graph=graph is not None)

    def reference_forward(self, x):
        leaves = [x[n].detach().requires_grad_(True) for n in ("q", "k", "v")]
        o = self.api.selection_forward_reference(*leaves, x["idx"], self.p.block_size)
        return leaves, o

    def call(self, x):
        """The backward on set `x`: the Triton backward (its forward runs here, untimed), or
        for the reference, autograd's backward through a dense forward retained here."""
        if self.impl != "triton":
            graph = self.reference_forward(x)
            return lambda: self.reference_grads(x, graph)
        a, bs = self.api, self.p.block_size
        qkv = (x["q"], x["k"], x["v"])
        o, lse = a.selection_forward_triton(*qkv, x["idx"], bs, return_lse=True)
        lse = lse if self.with_lse else None
        return lambda: a.selection_backward_triton(*qkv, x["idx"], bs, x["do"], o, lse)

    def prepare(self):
        if self.impl == "triton":
            self.fn = self.call(self.x)
        else:
            self.fn = lambda: self.reference_grads(self.x)

    def peak_fn(self):
        return self.fn()

    def timed_fn(self):
        if self.impl == "triton":
            return self.fn, True
        graph = self.reference_forward(self.x)  # retained while the backward is timed
        return (lambda: self.reference_grads(self.x, graph)), False


class NsaBackward(_BackwardCall, _Kernel):
    """Backward: selection_backward_triton (o, lse from the forward, not timed) vs autograd
    through the dense reference. The reference's time is the backward of a retained graph;
    its peak memory covers forward + backward, since the backward needs the [T, T] graph.
    """

    version = "1"
    device_ops = BACKWARD_OPS

    def setup_cache(self):
        return self.checks()


class NsaSeedBackward(_BackwardCall, _Selection):
    """The seed benchmark's call: selection_backward_triton(q, k, v, idx, bs, do, o) with
    lse=None, so the call recomputes lse with a forward pass; o from a forward (not timed).
    The seed's shape and pattern (preset seed, recent) at its short sizes, where the host
    bounds an eager call."""

    version = "1"
    with_lse = False
    device_ops = BACKWARD_RECOMPUTE_OPS

    def setup_cache(self):
        return self.checks()

    params = [
        grid([512, 1024, 2048], smoke=[SMOKE_SEQ_LEN]),
        ["triton"],
        grid(["seed"], smoke=["tiny-seed"]),
        ["recent"],
    ]

    # As many samples as the eager and host figures (the same on a GPU, fewer in smoke).
    track_time = _graph_time(PER_CALL_SAMPLES)
    track_time_eager, track_time_host = _per_call_times()


class NsaAutograd(_Selection):
    """A training step's attention through autograd: o = selection_attention(q, k, v, idx,
    bs), then torch.autograd.grad(o, (q, k, v), do); eager and host figures (its graph time
    is the forward's plus the backward's track_time; tests/test_nsa_gpu.py captures it)."""

    version = "1"
    device_ops = AUTOGRAD_OPS

    def setup_cache(self):
        return self.checks()

    api_names = (*API, "selection_attention")
    params = [GATED_SEQ_LENS, ["triton"], grid(["seed"], smoke=["tiny-seed"]), PATTERN_AXIS]

    track_time_eager, track_time_host = _per_call_times()

    def check(self, x):
        a, bs = self.api, self.p.block_size
        leaves = [x[n].detach().requires_grad_(True) for n in ("q", "k", "v")]
        o = a.selection_attention(*leaves, x["idx"], bs)
        got = torch.autograd.grad(o, leaves, x["do"])
        ref_leaves = [x[n].detach().requires_grad_(True) for n in ("q", "k", "v")]
        ref_o = a.selection_forward_reference(*ref_leaves, x["idx"], bs)
        ref = torch.autograd.grad(ref_o, ref_leaves, x["do"])
        check_close("selection_attention o", o, ref_o)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref, strict=True):
            check_close(f"selection_attention {name}", g, r)

    def call(self, x):
        """One step on set `x`: q, k and v are leaves that require grad."""
        a, bs = self.api, self.p.block_size
        leaves = tuple(x[n].detach().requires_grad_(True) for n in ("q", "k", "v"))
        idx, do = x["idx"], x["do"]

        def step():
            o = a.selection_attention(*leaves, idx, bs)
            return torch.autograd.grad(o, leaves, do)

        return step

    def prepare(self):
        self.fn = self.call(self.x)

    def peak_fn(self):
        return self.fn()
