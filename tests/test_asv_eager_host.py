"""The eager and host figures of the asv suite (benchmarks/common.py:eager_seconds and
host_seconds, the NSA classes' track_time_eager and track_time_host).

On the CPU (smoke mode: host timers, interpreted kernels at tiny sizes): the helpers' rotation
and output format, the queue bound, the figures' names and grids, and the new NSA figures
end to end. On a GPU (marked gpu): the sleep that the host figure hides the device behind,
its refusal of a call that waits for the device, and the device-operation bounds of the
benchmarked calls.
"""

import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import common, nsa  # noqa: E402  (smoke mode without a GPU: no CUDA)
from ci.render_comment import Row  # noqa: E402

smoke_only = pytest.mark.skipif(not common.SMOKE, reason="host-timer path (smoke mode) only")


def counting_calls(n):
    """n callables and the list of how often each ran."""
    counts = [0] * n
    fns = [lambda i=i: counts.__setitem__(i, counts[i] + 1) for i in range(n)]
    return fns, counts


@smoke_only
@pytest.mark.parametrize("helper", ["eager", "host"])
def test_helpers_rotate_over_the_sets_and_return_samples(helper):
    fns, counts = counting_calls(3)
    if helper == "eager":
        samples = common.eager_seconds(fns, samples=6)
    else:
        samples = common.host_seconds(fns, device_ops=9, samples=6)
    # Smoke: one call per sample, each set in turn.
    assert counts == [2, 2, 2]
    assert len(samples) == 6 and all(s > 0 and math.isfinite(s) for s in samples)
    result = common.timing_result(samples)
    assert result == {"samples": samples, "number": 1}
    with pytest.raises(ValueError, match="fns"):
        common.eager_seconds([], samples=1)


def test_host_calls_keep_the_launch_queue_bound():
    assert common.HOST_QUEUE_OPS == 256
    for ops in (1, 9, 16, 64, 96, 112, 128, 256):
        n = common.host_calls(ops)
        assert n >= 1 and n * ops <= 256 < (n + 1) * ops
    assert common.host_calls(300) == 1  # one call cannot be split; _slept_round checks it
    for bad in (0, -3, 1.5, True, None):
        with pytest.raises(ValueError, match="device_ops"):
            common.host_calls(bad)


def test_new_figures_are_timings_on_the_gated_grid():
    gated = nsa.GATED_GRID
    assert gated[1] == ["triton"]
    for cls in (nsa.NsaForward, nsa.NsaBackward):
        assert cls.track_time.__dict__.get("params") is None  # the class's grid, unchanged
        for name in ("track_time_eager", "track_time_host"):
            method = getattr(cls, name)
            assert method.params == gated and method.unit == "seconds"
    for cls in (nsa.NsaAutograd, nsa.NsaSeedBackward):
        for name in ("track_time_eager", "track_time_host"):
            assert getattr(cls, name).unit == "seconds"
    assert nsa.NsaSeedBackward.track_time.unit == "seconds"
    assert not hasattr(nsa.NsaAutograd, "track_time")  # no graph figure of its own
    # The PR comment and ci/confirm file them with the graph timings (`track_time*`).
    for method in ("track_time_eager", "track_time_host"):
        row = Row("", "", "", "", f"nsa.NsaForward.{method}(4096, 'triton', 'seed', 'recent')")
        assert row.kind == "time"
    # Every call of the host figure fits the queue bound.
    for cls in (nsa.NsaForward, nsa.NsaBackward, nsa.NsaAutograd, nsa.NsaSeedBackward):
        assert common.host_calls(cls.device_ops) * cls.device_ops <= common.HOST_QUEUE_OPS


class FakeCuda:
    """Stands in for torch.cuda in the GPU path of host_seconds: `_sleep` records its cycles;
    the marker event reports the sleep as finished when the host is done for the first
    `late` rounds (the calls waited for the device), as still running after that."""

    def __init__(self, late):
        self.late, self.sleeps = late, []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def query(self):  # the sleep of the current round has ended
                return len(fake.sleeps) <= fake.late

        self.Event = Event

    def synchronize(self):
        pass

    def _sleep(self, cycles):
        self.sleeps.append(cycles)


@pytest.mark.parametrize("late", [0, 2])
def test_host_seconds_behind_the_sleep_retries_until_it_outlasts_the_calls(monkeypatch, late):
    fake = FakeCuda(late)
    monkeypatch.setattr(common, "SMOKE", False)
    monkeypatch.setattr(common.torch, "cuda", fake)
    monkeypatch.setattr(common, "_sleep_cycles_per_second", lambda: 1e9)
    fns, counts = counting_calls(3)
    samples = common.host_seconds(fns, device_ops=64, samples=2)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    # 4 calls a round (256 // 64); every round behind a sleep; a late round doubles it.
    rounds = len(fake.sleeps) - late
    assert sum(counts) == 3 * common.WARMUP_CALLS + 4 * (1 + late + rounds)
    first = fake.sleeps[0]
    assert fake.sleeps[late] == pytest.approx(first * 2**late, abs=8)  # whole cycles
    assert len(set(fake.sleeps[late:])) == 1


def test_host_seconds_warm_calls_go_first_behind_each_sleep_and_untimed(monkeypatch):
    """warm_calls: that many calls at the start of every slept round, after its sleep and
    before its timer; the timed calls are the rest of the queue bound."""
    fake = FakeCuda(late=0)
    monkeypatch.setattr(common, "SMOKE", False)
    monkeypatch.setattr(common.torch, "cuda", fake)
    monkeypatch.setattr(common, "_sleep_cycles_per_second", lambda: 1e9)
    events = []
    real_timer = common._host_call_seconds

    def timer(rotation, calls):
        events.append(("timed", calls))
        return real_timer(rotation, calls)

    monkeypatch.setattr(common, "_host_call_seconds", timer)
    fns, counts = counting_calls(3)
    fns = [lambda f=f: (events.append("call"), f()) for f in fns]
    sleep = fake._sleep
    monkeypatch.setattr(fake, "_sleep", lambda c: (events.append("sleep"), sleep(c)))
    samples = common.host_seconds(fns, device_ops=64, samples=2, warm_calls=1)
    assert len(samples) == 2 and all(s > 0 for s in samples)
    rounds = len(fake.sleeps)
    # 256 // 64 = 4 calls a round: 1 warm, 3 timed; plus the unslept estimate of 3.
    assert sum(counts) == 3 * common.WARMUP_CALLS + 3 + 4 * rounds
    first = events.index("sleep")
    per_round = ["sleep", "call", ("timed", 3), "call", "call", "call"]
    assert events[first:] == per_round * rounds
    for device_ops, warm in ((128, 2), (256, 1), (300, 1)):
        with pytest.raises(ValueError, match="warm_calls"):
            common.host_seconds(fns, device_ops=device_ops, samples=1, warm_calls=warm)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="warm_calls"):
            common.host_seconds(fns, device_ops=64, samples=1, warm_calls=bad)


def test_host_seconds_refuses_when_the_sleep_never_outlasts_the_calls(monkeypatch):
    fake = FakeCuda(late=10**6)
    monkeypatch.setattr(common, "SMOKE", False)
    monkeypatch.setattr(common.torch, "cuda", fake)
    monkeypatch.setattr(common, "_sleep_cycles_per_second", lambda: 1e9)
    fns, _ = counting_calls(3)
    with pytest.raises(RuntimeError, match="waited for the device"):
        common.host_seconds(fns, device_ops=64, samples=2)
    assert len(fake.sleeps) == common.HOST_SLEEP_ATTEMPTS
    doubled = fake.sleeps[0] * 2 ** (common.HOST_SLEEP_ATTEMPTS - 1)
    assert fake.sleeps[-1] == pytest.approx(doubled, abs=8)  # whole cycles


@smoke_only
def test_rotation_sets_have_their_own_storage():
    b = nsa.NsaForward()
    common.set_up(b, nsa.SMOKE_SEQ_LEN, "triton", "tiny-seed", "random")
    b.call = lambda x: x  # the sets themselves instead of callables on them
    sets = b.rotation()
    assert len(sets) == common.ROTATION_SETS >= 3
    assert sets[0] is b.x
    for name in sets[0]:
        ptrs = {s[name].data_ptr() for s in sets}
        assert len(ptrs) == len(sets), name
        for s in sets[1:]:
            assert torch.equal(s[name], sets[0][name]), name  # the same work every call


@smoke_only
@pytest.mark.parametrize("cls", [nsa.NsaForward, nsa.NsaAutograd], ids=["forward", "autograd"])
def test_nsa_eager_and_host_figures_in_smoke_mode(cls):
    """End to end on the interpreter (the asv smoke run covers every class; the seed
    backward's call is checked by the next test)."""
    params = (nsa.SMOKE_SEQ_LEN, "triton", "tiny-seed", "random")
    b = cls()
    common.set_up(b, *params)  # checks the call against the reference first
    assert not b.oom
    for name in ("track_time_eager", "track_time_host"):
        result = getattr(b, name)(*params)
        assert result["number"] == 1 and len(result["samples"]) == common.PER_CALL_SAMPLES
        assert all(s > 0 and math.isfinite(s) for s in result["samples"])


@smoke_only
def test_seed_backward_passes_no_lse(monkeypatch):
    """NsaSeedBackward's call is the backward with lse=None (lse recomputed)."""
    b = nsa.NsaSeedBackward()
    common.set_up(b, nsa.SMOKE_SEQ_LEN, "triton", "tiny-seed", "recent")
    seen = []
    real = b.api.selection_backward_triton

    def spy(*args, **kwargs):
        seen.append(args[7] if len(args) > 7 else kwargs.get("lse"))
        return real(*args, **kwargs)

    monkeypatch.setattr(b.api, "selection_backward_triton", spy)
    b.call(b.x)()
    assert seen == [None]
    b2 = nsa.NsaBackward()
    b2.api, b2.p, b2.impl = b.api, b.p, "triton"
    b2.call(b.x)()
    assert seen[1] is not None and seen[1].dtype == torch.float32


# GPU mode of the suite (run with `pytest -m gpu` on a CUDA machine).


@pytest.mark.gpu
@pytest.mark.parametrize("helper", ["eager", "host"])
def test_helpers_on_the_gpu(helper):
    if common.SMOKE:
        pytest.skip("GPU mode of the suite")
    xs = [torch.zeros(1024, device="cuda") for _ in range(3)]
    fns = [lambda x=x: x.add_(1.0) for x in xs]
    if helper == "eager":
        samples = common.eager_seconds(fns, samples=10)
    else:
        samples = common.host_seconds(fns, device_ops=1, samples=10)
    torch.cuda.synchronize()
    # A bound on units, not speed: other processes' kernels (the test command's parallel
    # GPU workers) can hold the GPU for milliseconds between two calls.
    assert len(samples) == 10 and all(0 < s < 5e-2 for s in samples), samples
    counts = [x[0].item() for x in xs]
    assert min(counts) >= common.WARMUP_CALLS + 1 and max(counts) - min(counts) <= 1, counts


@pytest.mark.gpu
def test_host_seconds_refuses_calls_that_wait_for_the_device():
    if common.SMOKE:
        pytest.skip("GPU mode of the suite")
    x = torch.zeros(16, device="cuda")
    with pytest.raises(RuntimeError, match="waited for the device"):
        common.host_seconds([lambda: x.add_(1.0).sum().item()] * 3, device_ops=2, samples=2)


def _device_ops(fn):
    """Device operations (kernels, memsets, copies) one call of `fn` queues, by the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


@pytest.fixture
def gpu_suite():
    if common.SMOKE:
        pytest.skip("GPU mode of the suite")
    yield
    torch.cuda.set_per_process_memory_fraction(1.0)  # setup caps it for a benchmark process


CASES = [
    (nsa.NsaForward, 4096, preset, pattern) for preset in ("seed", "paper")
    for pattern in ("recent", "random")
] + [
    (nsa.NsaBackward, 4096, preset, pattern) for preset in ("seed", "paper")
    for pattern in ("recent", "random")
] + [
    (nsa.NsaAutograd, 4096, "seed", "recent"),
    (nsa.NsaAutograd, 4096, "seed", "random"),
    (nsa.NsaSeedBackward, 2048, "seed", "recent"),
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("cls, T, preset, pattern", CASES)
def test_benchmarked_calls_stay_within_their_device_ops_bound(gpu_suite, cls, T, preset, pattern):
    b = cls()
    common.set_up(b, T, "triton", preset, pattern)
    ops = _device_ops(b.fn)
    assert 1 <= ops <= cls.device_ops, f"{cls.__name__}: {ops} device operations per call"
