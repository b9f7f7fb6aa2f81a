"""Shared machinery of the asv suite: mode switches, grids, device-side timing, VRAM, OOM.

Modes (read once, at import, from the environment; asv passes the environment through
to every benchmark process):

    ATTNBENCH_SMOKE=1      tiny sizes on the CPU through Triton's interpreter (fp32, host
                           timers). Default when no NVIDIA GPU is visible; =0 forces GPU mode.
    ATTNBENCH_SUITE=nightly  the full parameter grids (default: a subset that fits the
                           per-commit budget of the PR gate).
    ATTNBENCH_SUITE=view   the seed's view: the NSA kernels against the dense reference over
                           seq_len 512..32768, with the eager per-call figure of both
                           (scripts/main.sh runs it for HEAD under a machine of its own).

Nothing here touches CUDA at import time or in parameter lists: with asv's `forkserver`
launch method the modules are imported once in a server process that then forks one child
per benchmark, and a CUDA driver initialized before a fork is unusable in the child. GPU
presence is therefore read from the device nodes, never from `torch.cuda`.
"""

import functools
import gc
import itertools
import math
import os
import statistics
import time
from pathlib import Path


def _gpu_visible():
    """An NVIDIA GPU is visible to this process (checked without initializing CUDA)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _smoke_from_env():
    flag = os.environ.get("ATTNBENCH_SMOKE", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return not _gpu_visible()


SMOKE = _smoke_from_env()
SUITE = os.environ.get("ATTNBENCH_SUITE", "default").strip().lower()
NIGHTLY = SUITE == "nightly"
# The seed's view (benchmarks/nsa.py: VIEW_BENCHMARKS is the selection that runs it). Only
# the NSA grids and figures differ from the default suite's; the other classes keep theirs.
VIEW = SUITE == "view"
# The default suite (what the PR gate and the history on main run) holds the gated figures,
# time and peak VRAM, and fits a few minutes per commit on an H200. The device ceilings
# (benchmarks/ceilings.py), the KDA peak VRAM and the BLOCK_V tuning sweep run in the nightly
# sweep, and in smoke mode so CI exercises their plumbing. Rates relative to the times
# (tokens/s, TFLOP/s, % of a ceiling) are no benchmarks: tools/report.py derives them from
# the stored times and ceilings.
FULL_SUITE = NIGHTLY or SMOKE

# Triton reads TRITON_INTERPRET when a kernel is decorated, so it is set before `kernels`
# is imported anywhere. On the GPU, autotuning choices are cached on disk (keyed by the
# kernel's source), so every benchmark process of a commit runs the same configuration.
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
else:
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import torch  # noqa: E402  (after the Triton switches above)

DEVICE = "cpu" if SMOKE else "cuda"
# The interpreter is wrong for bf16 (it computes on the raw bits), so smoke runs fp32.
DTYPE = torch.float32 if SMOKE else torch.bfloat16
# Relative-error bounds of the correctness checks, by dtype.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}

# Per-process VRAM cap, as in the seed benchmarks: the dense reference's OOM is data.
MEMORY_FRACTION = 0.70
# Timing: samples per process, and the device time each sample covers (the number of graph
# replays is calibrated to it). asv's Mann-Whitney U test needs p < 0.002 (two-sided): with
# 6 samples a side even a complete separation gives p = 2/924 = 0.0022, never significant;
# 7 is the least that can flag a change, 8 tolerates one overlapping pair.
SAMPLES = 8 if SMOKE else 10
# The eager and host figures: gated like the graph figure on a GPU; in smoke, where every
# sample is one interpreted call (seconds), the least that still gives asv a median and an
# interval.
PER_CALL_SAMPLES = 3 if SMOKE else SAMPLES
SAMPLE_SECONDS = 0.005 if SMOKE else 0.025
# The interpreter has nothing to compile, and smoke calls are slow: no warm-up there.
WARMUP_CALLS = 0 if SMOKE else 3

MODE_NAME = "smoke" if SMOKE else ("nightly" if NIGHTLY else ("view" if VIEW else "default"))


def grid(default, nightly=None, smoke=None, view=None):
    """The values of one parameter axis for the active mode (smoke wins over the suite
    switch: a CPU run of any suite uses the smoke sizes)."""
    if SMOKE:
        return list(smoke if smoke is not None else default[:1])
    if NIGHTLY and nightly is not None:
        return list(nightly)
    if VIEW and view is not None:
        return list(view)
    return list(default)


def require_device():
    """Skip (NotImplementedError) without a GPU unless smoke mode is on; cap VRAM on a GPU."""
    if SMOKE:
        return
    if not torch.cuda.is_available():
        raise NotImplementedError("needs a CUDA GPU (or ATTNBENCH_SMOKE=1 for the CPU smoke run)")
    torch.cuda.set_per_process_memory_fraction(MEMORY_FRACTION)


class DeviceBenchmark:
    """Base of both families' benchmark classes: the kernel package a class needs and the
    device it runs on.

    A subclass sets `package` (its module's guarded import of the kernel package; None
    where that import failed) and `api_names` (the names its calls use), and calls
    `open_device()` first in its setup: it raises NotImplementedError, which asv records as
    a skipped point, for a commit whose package lacks a name, and without a GPU outside
    smoke mode.
    """

    timeout = 300
    package = None
    api_names = ()

    def open_device(self):
        """self.api = the package, checked (`require_api`); then the device (`require_device`)."""
        self.api = require_api(self.package, *self.api_names)
        require_device()
        return self.api


def require_api(package, *names):
    """The kernel package `package` when it has every one of `names`.

    `package` comes from the benchmark module's one guarded import (None where that import
    failed: a commit before the kernels, or one whose package does not import). A commit
    that lacks the package or a name raises NotImplementedError, which asv records as a
    skipped point, so today's suite runs against every older commit."""
    if package is None:
        raise NotImplementedError("the kernel package does not import at this commit")
    missing = [n for n in names if not hasattr(package, n)]
    if missing:
        raise NotImplementedError(f"{package.__name__} lacks the benchmarked API: {missing}")
    return package


def warm_process_caches():
    """Fill, once in asv's forkserver, the per-process caches every benchmark child would
    otherwise fill on its own (measured on the H200 by tools/dev/asv_process_cost.py, see
    docs/perf/asv.md). None of them touches CUDA:
    - Triton's hash of its own installation (about 0.5 s, taken at a process's first kernel
      compile or cache lookup);
    - the symbolic-shapes modules (sympy) that torch.autograd.grad imports on first use
      (about 3 s);
    - Triton's Gluon modules, which its argument specialization imports at a process's
      first launch, and the Triton-backed operators torch registers at CUDA's lazy
      initialisation (together about 0.15-0.3 s per process): registered here, the lazy
      initialisation finds them registered and skips them."""
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # functools.lru_cache: the forked children inherit the result
    except (ImportError, AttributeError):  # another Triton layout: only the saving is lost
        pass
    import torch.fx.experimental.symbolic_shapes  # noqa: F401

    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:  # a Triton without Gluon: nothing to import
        pass
    register = getattr(torch.cuda, "_register_triton_kernels", None)
    if register is not None:
        try:
            register()
        except Exception:  # a torch whose registration differs: only the saving is lost
            pass


warm_process_caches()


def generator(seed):
    """A seeded generator on the benchmark device (inputs are identical across commits)."""
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(gen, *shape, dtype=None, scale=1.0):
    x = torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.float32) * scale
    return x.to(dtype or DTYPE)


def rel_err(got, ref):
    """||got - ref|| / ||ref|| over the whole tensor, in fp64."""
    got, ref = got.detach().double(), ref.detach().double()
    norm = torch.linalg.vector_norm
    return (norm(got - ref) / norm(ref).clamp_min(1e-30)).item()


def check_close(what, got, ref, dtype=None):
    """Raise when a kernel result differs from its reference: no fast number for a wrong kernel."""
    tol = TOLERANCE[dtype or DTYPE]
    err = rel_err(got, ref)
    if not err <= tol:  # also catches NaN
        raise AssertionError(f"{what}: relative error {err:.3g} > {tol:g} against the reference")


def synchronize():
    if not SMOKE:
        torch.cuda.synchronize()


OOM_ERRORS = (torch.OutOfMemoryError, MemoryError)
# Where a benchmark appends the out-of-memory points it records (ci/na_reasons.py's log,
# `<results>/<machine>/na_reasons.jsonl`); the runner that knows the results directory and
# the machine sets it. Unset: the points are NaN only (asv: n/a, reason unknown).
NA_LOG_ENV = "ATTNBENCH_NA_LOG"


def free_memory():
    if not SMOKE:
        torch.cuda.empty_cache()


def run_checks(checks):
    """Run correctness checks once, for a class's asv `setup_cache`: `checks` maps a key
    (the parameters a check depends on) to a zero-argument callable that raises when the
    kernel is wrong. Returns {key: None (passed) or (kind, message)}, kind "skip"
    (NotImplementedError), "oom" (out of memory) or "failed" (any other error).

    asv runs a class's `setup_cache` once per commit and environment, in a process of its
    own, and hands the result to every point's `setup`, which re-raises its key's outcome
    (`raise_check`). A check depends on fewer parameters than a point (NSA's runs at a fixed
    small seq_len, KDA's at a fixed small batch), so running it in every point's process
    repeated the same work; a wrong kernel still fails every point that uses it."""
    out = {}
    for key, check in checks.items():
        try:
            check()
            out[key] = None
        except NotImplementedError as e:
            out[key] = ("skip", str(e))
        except OOM_ERRORS as e:
            out[key] = ("oom", str(e))
        except Exception as e:  # a failed check: the point's setup raises it
            out[key] = ("failed", f"{type(e).__name__}: {e}")
        free_memory()
    return out


def set_up(bench, *params, cache=None):
    """Set a benchmark instance up outside asv (tools, tests) as asv would: with a
    `setup_cache` on its class, `bench.setup(cache, *params)` where `cache` is that
    setup_cache's result (computed here when None; pass one to share it between points),
    else `bench.setup(*params)`. Returns the cache (None without one)."""
    if hasattr(bench, "setup_cache"):
        if cache is None:
            cache = bench.setup_cache()
        bench.setup(cache, *params)
        return cache
    bench.setup(*params)
    return None


class CheckFailed(AssertionError):
    """A correctness check failed in `setup_cache` (`run_checks`); raised by the setup of
    every point that depends on it."""


def raise_check(outcome):
    """Re-raise, in a point's setup, its check's outcome from `run_checks`: nothing when it
    passed; NotImplementedError (asv: skipped), an out-of-memory error (n/a, through
    `setup_oom_as_nan`) or CheckFailed (the point fails) as the check did."""
    if outcome is None:
        return
    kind, message = outcome
    if kind == "skip":
        raise NotImplementedError(message)
    if kind == "oom":
        raise torch.OutOfMemoryError(f"in the correctness check: {message}")
    raise CheckFailed(f"correctness check: {message}")


def benchmark_name(obj, method_name):
    """asv's name of a benchmark method: `module.Class.method`, the module relative to the
    suite's package (`benchmarks.nsa` -> `nsa`)."""
    module = type(obj).__module__
    if module.startswith("benchmarks."):
        module = module[len("benchmarks.") :]
    return f"{module}.{type(obj).__name__}.{method_name}"


@functools.cache
def _na_reasons():
    """ci/na_reasons.py, loaded by its path: asv's benchmark processes can import the
    suite's own package but not the repository's `ci` package."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "ci" / "na_reasons.py"
    spec = importlib.util.spec_from_file_location("attnbench_na_reasons", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_oom(obj, method_name, params):
    """Append the point (benchmark `obj.method_name` at `params`) to the OOM log named by
    $ATTNBENCH_NA_LOG, in ci/na_reasons.py's encoding (asv's parameter strings: each value's
    repr); no-op when the variable is unset."""
    path = os.environ.get(NA_LOG_ENV, "").strip()
    if not path:
        return
    na_reasons = _na_reasons()
    commit = os.environ.get("ASV_COMMIT", "unknown")
    name = benchmark_name(obj, method_name)
    na_reasons.record_oom(path, commit, name, [repr(p) for p in params])


def setup_oom_as_nan(setup):
    """A `setup` after which an out-of-memory error anywhere in it (inputs, correctness
    checks, warm-up) leaves `self.oom` set, so that every method records NaN (asv: n/a), the
    same in every benchmark family. Other errors propagate: NotImplementedError is asv's
    skip, anything else (a failed check) fails the point."""

    @functools.wraps(setup)
    def wrapper(self, *params):
        self.oom = False
        try:
            return setup(self, *params)
        except OOM_ERRORS:
            self.oom = True
        free_memory()  # outside the handler: the traceback no longer holds the frames

    return wrapper


def oom_as_nan(method):
    """A benchmark method that records NaN (asv: n/a) after an out-of-memory error.

    Setup may already have hit the OOM (it sets `self.oom`, see `setup_oom_as_nan`); the
    method then reports NaN without trying again. An OOM is a measurement, not a failure:
    the sweep goes on. Either way the point goes to the OOM log (`record_oom`).
    """

    @functools.wraps(method)
    def wrapper(self, *params):
        if not getattr(self, "oom", False):
            try:
                return method(self, *params)
            except OOM_ERRORS:
                self.oom = True
            free_memory()
        record_oom(self, method.__name__, point_params(self, params))
        return math.nan

    return wrapper


def point_params(obj, args):
    """A benchmark method's parameter values from the arguments it was called with: asv
    passes the class's `setup_cache` result first where it has one (`args` then holds one
    value more than the class has parameter axes); tools that call a method directly pass
    the parameters alone."""
    axes = getattr(obj, "params", None) or []
    if hasattr(obj, "setup_cache") and len(args) == len(axes) + 1:
        return args[1:]
    return args


def metric(unit):
    """Declare a track_* method's unit (and wrap it so an OOM records NaN)."""

    def decorate(method):
        wrapped = oom_as_nan(method)
        wrapped.unit = unit
        return wrapped

    return decorate


def per_call_seconds(fns, calls, graph=True, samples=SAMPLES):
    """Per-call time samples (seconds) of `calls` consecutive calls, as a list of `samples`.

    `fns` is a list of zero-argument callables; call i runs fns[i % len(fns)] (one callable
    for seed-style timing on the same buffers; several for "cold" timing over disjoint
    buffer sets). Warm-up calls (JIT compile, autotune, allocator) come first and are not
    timed.

    GPU: the calls are captured in one CUDA graph (graph=False: plain back-to-back
    launches, for code that cannot be captured, such as autograd) and replayed enough times
    that one sample covers about SAMPLE_SECONDS of device time, between two CUDA events.
    Each sample is the elapsed time divided by the number of calls it covers.
    Smoke: the same schedule timed with the host clock.
    """
    seq = [fns[i % len(fns)] for i in range(calls)]

    def run_all():
        for f in seq:
            f()

    for f in fns:
        for _ in range(WARMUP_CALLS):
            f()
    if SMOKE:
        return _host_samples(run_all, calls, samples)
    torch.cuda.synchronize()
    run = run_all
    if graph:
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            run_all()
        run = cuda_graph.replay
    return _event_samples(run, calls, samples)


def _host_samples(run, calls, count):
    samples = []
    for _ in range(count):
        n, t0 = 0, time.perf_counter()
        while True:
            run()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= SAMPLE_SECONDS:
                break
        samples.append(elapsed / (n * calls))
    return samples


def _event_samples(run, calls, count):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(reps):
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    once = timed(1)
    reps = max(1, min(1000, math.ceil(SAMPLE_SECONDS / max(once, 1e-7))))
    return [timed(reps) / (reps * calls) for _ in range(count)]


# Eager and host figures (`eager_seconds`, `host_seconds`): the input sets the calls rotate
# over, each with its own storage, so no call finds its tensors where the previous one left
# them (in L2, or in a cache keyed on addresses).
ROTATION_SETS = 3
# Host figure: device operations (kernels, memsets, copies) queued behind one sleep at most.
# CUDA's launch queue holds about 1024 before the host blocks; 256 leaves room.
HOST_QUEUE_OPS = 256
# Host time one host sample covers at least (several slept rounds when one round is shorter),
# in at most HOST_MAX_ROUNDS rounds.
HOST_SAMPLE_SECONDS = 0.01
HOST_MAX_ROUNDS = 100
# Attempts at a slept round, the sleep doubled after each that ended before the host did.
HOST_SLEEP_ATTEMPTS = 4


def _cycle(fns):
    """An endless rotation over `fns` (callables), each used in turn."""
    if not fns:
        raise ValueError("fns: at least one callable is needed")
    return itertools.cycle(fns)


def _warm_up(fns):
    for f in fns:
        for _ in range(WARMUP_CALLS):
            f()


def _host_call_seconds(rotation, calls):
    """Host seconds of `calls` calls from `rotation`, garbage collection off (as timeit)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            next(rotation)()
        return time.perf_counter() - t0
    finally:
        if enabled:
            gc.enable()


def eager_seconds(fns, samples=PER_CALL_SAMPLES):
    """Per-call time samples (seconds) of back-to-back eager calls, as a training loop pays.

    fns: zero-argument callables on distinct input sets (ROTATION_SETS of them), called in
    turn, warm (WARMUP_CALLS each first, untimed). GPU: N calls between two CUDA events with
    no sync between the calls and no graph, N chosen so a sample spans about SAMPLE_SECONDS
    (at least one call per set, at most 1000); a sample is elapsed / N. Where the host issues
    calls slower than the device runs them, the figure is the host's pace: what a step pays.
    Smoke: one call per sample, host clock (interpreted calls take seconds).
    """
    rotation = _cycle(fns)
    _warm_up(fns)
    if SMOKE:
        return [_host_call_seconds(rotation, 1) for _ in range(samples)]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(n):
        start.record()
        for _ in range(n):
            next(rotation)()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    once = timed(len(fns)) / len(fns)
    n = max(len(fns), min(1000, math.ceil(SAMPLE_SECONDS / max(once, 1e-7))))
    return [timed(n) / n for _ in range(samples)]


def host_calls(device_ops):
    """Calls per slept round of `host_seconds` for a call of at most `device_ops` device
    operations: N with N * device_ops <= HOST_QUEUE_OPS (at least 1)."""
    if isinstance(device_ops, bool) or not isinstance(device_ops, int) or device_ops < 1:
        raise ValueError(f"device_ops must be a positive int, got {device_ops!r}")
    return max(1, HOST_QUEUE_OPS // device_ops)


@functools.cache
def _sleep_cycles_per_second():
    """The rate of torch.cuda._sleep on this device (cycles per second), from one timed
    sleep of 10**7 cycles (several milliseconds on any current GPU)."""
    cycles = 10**7
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e-3)


def _slept_round(rotation, calls, sleep_s, warm_calls=0):
    """(host seconds of `calls` calls issued behind a device sleep of `sleep_s`, the sleep
    used). `warm_calls` more calls go first, untimed, behind the same sleep. The round
    counts only if the sleep is still running when the last call returns: then no call
    waited for the device (a sync, an `.item()`, a full launch queue would have waited for
    the sleep to end). Otherwise the sleep doubles and the round runs again; RuntimeError
    after HOST_SLEEP_ATTEMPTS."""
    rate = _sleep_cycles_per_second()
    marker = torch.cuda.Event()
    for _ in range(HOST_SLEEP_ATTEMPTS):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(sleep_s * rate))
        marker.record()
        for _ in range(warm_calls):
            next(rotation)()
        seconds = _host_call_seconds(rotation, calls)
        outlasted = not marker.query()
        torch.cuda.synchronize()
        if outlasted:
            return seconds, sleep_s
        sleep_s *= 2
    raise RuntimeError(
        f"host timing: {calls} calls still waited for the device behind a {sleep_s / 2:.3g} s "
        "sleep: the call synchronizes with the device, or queues more device operations than "
        "its device_ops bound"
    )


def host_seconds(fns, device_ops, samples=PER_CALL_SAMPLES, warm_calls=0):
    """Host time samples (seconds per call): what the Python side of a call costs.

    fns: zero-argument callables on distinct input sets, called in turn, warm (WARMUP_CALLS
    each first); device_ops: an upper bound on the device operations one call queues.
    GPU: `perf_counter` around N = host_calls(device_ops) - warm_calls calls issued behind a
    `torch.cuda._sleep` that outlasts them (checked: `_slept_round`), so the device never
    paces the host and (N + warm_calls) * device_ops <= HOST_QUEUE_OPS keeps the launch
    queue from pushing back; argument checks, allocations and launches all count. A sample
    sums enough slept rounds to cover HOST_SAMPLE_SECONDS of host time.
    warm_calls: untimed calls at the start of each slept round, after the synchronize that
    ends the round before it: they wake what the wait left idle (autograd's device thread),
    as a training loop that calls back to back keeps it awake. ValueError where no timed
    call is left. Smoke: one call per sample, host clock, no sleep (there is no device).
    """
    if isinstance(warm_calls, bool) or not isinstance(warm_calls, int) or warm_calls < 0:
        raise ValueError(f"warm_calls must be a non-negative int, got {warm_calls!r}")
    rotation = _cycle(fns)
    calls = host_calls(device_ops) - warm_calls
    if calls < 1:
        raise ValueError(
            f"warm_calls={warm_calls}: no timed call is left within the queue bound "
            f"({host_calls(device_ops)} calls of {device_ops} device operations)"
        )
    _warm_up(fns)
    if SMOKE:
        return [_host_call_seconds(rotation, 1) for _ in range(samples)]
    torch.cuda.synchronize()
    estimate = _host_call_seconds(rotation, calls)  # unslept; the queue stays short
    torch.cuda.synchronize()
    rounds = max(1, min(HOST_MAX_ROUNDS, math.ceil(HOST_SAMPLE_SECONDS / max(estimate, 1e-7))))
    sleep_s = 2 * estimate * (calls + warm_calls) / calls + 1e-3  # the warm calls too
    out = []
    for _ in range(samples):
        total = 0.0
        for _ in range(rounds):
            seconds, sleep_s = _slept_round(rotation, calls, sleep_s, warm_calls)
            total += seconds
        out.append(total / (rounds * calls))
    return out


def timing_result(samples):
    """asv's internal timing format for a track_* method (median, CI, Mann-Whitney U).

    This relies on asv 0.6.6 / asv_runner 0.3.2, which are pinned.
    """
    return {"samples": [float(s) for s in samples], "number": 1}


def median(samples):
    return statistics.median(samples)


def _host_hwm_bytes():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def peak_bytes(fn):
    """Peak memory over one call of `fn` with its inputs resident.

    GPU: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(); every benchmark
    runs in its own process, so nothing from another benchmark is counted. Smoke: the
    process's resident-set high-water mark (reset through /proc/self/clear_refs), a host
    figure that only exercises the plumbing; NaN where the kernel does not allow the reset.
    """
    if not SMOKE:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        fn()
        return _host_hwm_bytes()
    except OSError:
        return math.nan
