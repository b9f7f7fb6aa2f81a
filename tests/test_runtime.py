"""The kernels' shared host helpers (`kernels._runtime`: integer helpers, `launch`) and the
host-cost tool."""

import math
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from kernels import _runtime


def test_cdiv_and_next_pow2_agree_with_triton():
    for a in list(range(0, 70)) + [2**31 - 1, 2**31, 2**40 + 3]:
        for b in (1, 2, 3, 16, 64, 1000):
            assert _runtime.cdiv(a, b) == triton.cdiv(a, b)
        assert _runtime.next_pow2(a) == triton.next_power_of_2(a)


def test_host_python_tool_runs_and_reports_every_call():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(root, "src")
    r = subprocess.run(
        [sys.executable, "-m", "tools.dev.nsa_host_python", "--seq-len", "256", "--calls", "3"],
        cwd=root, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    for call in ("forward recent", "backward recent", "forward random", "backward random"):
        assert call in r.stdout, r.stdout


# `launch`: the direct path, against a stand-in for a JIT function and its compiled kernel.


def _kernel_fn(X, n, alpha, flag, BLOCK: tl.constexpr, MODE: tl.constexpr = "a"):
    pass


class _Compiled:
    function, packed_metadata = "handle", "packed"

    def __init__(self, runs):
        self.runs = runs

    def run(self, *args):
        self.runs.append(args)

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream, args)


class _Jit:
    """kernel[grid](...) compiles (records the call) and returns one compiled kernel per
    call, as Triton's JIT path does on a cache miss."""

    fn = staticmethod(_kernel_fn)

    def __init__(self):
        self.jit_calls, self.runs = [], []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return _Compiled(self.runs)

        return call


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(_runtime, "direct_supported", lambda kernel: True)
    monkeypatch.setattr(_runtime, "_current", lambda: (0, lambda device: 7))
    return _Jit()


def test_launch_second_call_goes_direct_with_constexprs_in_signature_order(fake):
    x = torch.zeros(8)
    for _ in range(3):
        _runtime.launch(fake, (4, 2), x, 5, 0.5, True, BLOCK=16, num_warps=4)
    assert len(fake.jit_calls) == 1
    assert fake.jit_calls[0] == ((4, 2), (x, 5, 0.5, True), {"BLOCK": 16, "num_warps": 4})
    # grid padded to 3-D, the current stream, handle, packed metadata, no hooks, then every
    # parameter in order: the runtime ones, BLOCK, and MODE at its default.
    want = (4, 2, 1, 7, "handle", "packed", None, None, None, x.data_ptr(), 5, 0.5, True, 16, "a")
    assert fake.runs == [want, want]


@pytest.mark.parametrize(
    "change",
    ["misaligned tensor", "other dtype", "int 1", "int 16", "int64", "constexpr", "option",
     "bool"],
)  # fmt: skip
def test_launch_misses_where_triton_would_specialize_differently(fake, change):
    base = dict(x=torch.zeros(8), n=5, flag=True, BLOCK=16, num_warps=4)
    other = dict(base)
    if change == "misaligned tensor":
        other["x"] = torch.zeros(9)[1:]  # 4 bytes past a 16-byte boundary
    elif change == "other dtype":
        other["x"] = torch.zeros(8, dtype=torch.float16)
    elif change == "int 1":
        other["n"] = 1  # Triton makes 1 a constant
    elif change == "int 16":
        other["n"] = 32  # divisible by 16
    elif change == "int64":
        other["n"] = 2**31 + 1
    elif change == "constexpr":
        other["BLOCK"] = 32
    elif change == "option":
        other["num_warps"] = 8
    else:
        other["flag"] = False

    def call(a):
        _runtime.launch(fake, (1,), a["x"], a["n"], 0.5, a["flag"], BLOCK=a["BLOCK"],
                        num_warps=a["num_warps"])  # fmt: skip

    call(base)
    call(other)
    assert len(fake.jit_calls) == 2 and fake.runs == []
    call(base)
    call(other)  # both cached now
    assert len(fake.jit_calls) == 2 and len(fake.runs) == 2


def test_launch_same_specialization_shares_a_plan(fake):
    """Values that Triton does not specialize on (other ints of the same class, floats,
    another aligned tensor) reuse the compiled kernel: no plan is keyed on an address, and
    none holds an input."""
    before = len(_runtime._plans)
    _runtime.launch(fake, (1,), torch.zeros(8), 5, 0.5, True, BLOCK=16)
    for _ in range(5):  # fresh storage each time
        _runtime.launch(fake, (1,), torch.zeros(8), 9, 1.5, True, BLOCK=16)
    assert len(_runtime._plans) == before + 1 and len(fake.jit_calls) == 1
    for key, (_, tail) in _runtime._plans.items():
        assert not any(isinstance(x, torch.Tensor) for x in (*key[4], *tail))
    fake.runs.clear()
    y = torch.zeros(4)
    _runtime.launch(fake, (3,), y, 7, 2.5, True, BLOCK=16)
    assert len(fake.jit_calls) == 1
    assert fake.runs == [(3, 1, 1, 7, "handle", "packed", None, None, None, y.data_ptr(), 7,
                          2.5, True, 16, "a")]  # fmt: skip


def test_keyed_launch_goes_direct_on_the_callers_key(fake, monkeypatch):
    """With key=, the second launch finds its plan by (kernel, key): the arguments are not
    inspected (an int of another specialization class, here, rides along; that is what
    the check below exists for), and another key compiles its own."""
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    key = _runtime.LaunchKey("call", 1)
    x = torch.zeros(8)
    _runtime.launch(fake, (2,), x, 5, 0.5, True, BLOCK=16, key=key)
    _runtime.launch(fake, (2,), x, 32, 0.5, True, BLOCK=16, key=_runtime.LaunchKey("call", 1))
    assert len(fake.jit_calls) == 1
    assert fake.runs == [(2, 1, 1, 7, "handle", "packed", None, None, None, x.data_ptr(), 32,
                          0.5, True, 16, "a")]  # fmt: skip
    _runtime.launch(fake, (2,), x, 32, 0.5, True, BLOCK=16, key=_runtime.LaunchKey("call", 2))
    assert len(fake.jit_calls) == 2


@pytest.mark.parametrize("change", ["misaligned tensor", "int 16", "constexpr"])
def test_launch_key_check_refuses_a_key_that_leaves_a_specialization_out(fake, change):
    """ATTNBENCH_CHECK_LAUNCH_KEYS (on in the tests, tests/conftest.py): one caller key met
    with two specializations raises, naming the kernel."""
    assert _runtime.CHECK_LAUNCH_KEYS
    key = _runtime.LaunchKey("call", change)
    _runtime.launch(fake, (1,), torch.zeros(8), 5, 0.5, True, BLOCK=16, key=key)
    _runtime.launch(fake, (1,), torch.zeros(8), 9, 0.5, True, BLOCK=16, key=key)  # same class
    args = [torch.zeros(8), 5, 0.5, True]
    kwargs = {"BLOCK": 16}
    if change == "misaligned tensor":
        args[0] = torch.zeros(9)[1:]
    elif change == "int 16":
        args[1] = 32
    else:
        kwargs["BLOCK"] = 32
    with pytest.raises(RuntimeError, match="_kernel_fn: launch key .* two specializations"):
        _runtime.launch(fake, (1,), *args, key=key, **kwargs)


def test_launch_on_a_given_stream(fake):
    """stream=: the direct path launches on that stream's handle, not the current one."""

    class Stream:
        cuda_stream = 99

    x = torch.zeros(8)
    for key in (None, _runtime.LaunchKey("s")):
        fake.runs.clear()
        _runtime.launch(fake, (1,), x, 5, 0.5, True, BLOCK=16, key=key)  # compiled
        _runtime.launch(fake, (1,), x, 5, 0.5, True, BLOCK=16, key=key, stream=Stream())
        _runtime.launch(fake, (1,), x, 5, 0.5, True, BLOCK=16, key=key)
        assert [run[3] for run in fake.runs][-2:] == [99, 7]


@pytest.fixture
def call_on(monkeypatch):
    """A `_runtime.Call` on a stand-in CUDA device 0 whose current stream's handle is 7."""
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    monkeypatch.setattr(_runtime, "interpreter_active", lambda: False)
    monkeypatch.setattr(_runtime, "_current_stream", lambda: (0, "stream", 7))
    monkeypatch.setattr(_runtime, "_call_plans", {})
    return lambda key: _runtime.Call(key, torch.device("cuda", 0))


def test_call_launches_its_second_and_later_calls_directly(fake, call_on):
    """A Call's first launch of a (kernel, options) takes the keyed path (compiled here);
    later calls with the key, in later Calls, go straight to the launcher: the grid padded,
    the call's stream, tensors as their addresses, the constexprs in signature order. Each
    options dict is its own launch (the same kernel with other constexprs), and other
    tensors of the same specialization take the same plan."""
    key = _runtime.launch_key("call-test", 1)
    small, large = {"BLOCK": 16, "num_warps": 4}, {"BLOCK": 32, "MODE": "b"}
    first = call_on(key)
    assert first.stream == "stream"
    x = torch.zeros(8)
    first.launch(fake, (4, 2), (x, 5, 0.5, True), small)
    first.launch(fake, (4, 2), (x, 5, 0.5, True), large)
    assert [c[2] for c in fake.jit_calls] == [small, large] and fake.runs == []
    y = torch.zeros(8)
    second = call_on(key)
    second.launch(fake, (4, 2), (y, 5, 0.5, True), small)
    second.launch(fake, (3,), (y, 6, 0.5, False), large)
    assert len(fake.jit_calls) == 2
    assert fake.runs == [
        (4, 2, 1, 7, "handle", "packed", None, None, None, y.data_ptr(), 5, 0.5, True, 16, "a"),
        (3, 1, 1, 7, "handle", "packed", None, None, None, y.data_ptr(), 6, 0.5, False, 32, "b"),
    ]

    class Side:
        cuda_stream = 99

    second.launch(fake, (1,), (y, 5, 0.5, True), small, stream=Side())
    assert fake.runs[-1][3] == 99
    call_on(_runtime.launch_key("call-test", 2)).launch(fake, (1,), (y, 5, 0.5, True), small)
    assert len(_runtime._call_plans) == 2  # another key has its own table


@pytest.mark.parametrize("why", ["no key", "direct=False", "check", "hook", "cpu"])
def test_call_takes_the_keyed_path_every_time_where_it_must(fake, call_on, monkeypatch, why):
    """No table without a key, with direct=False, under ATTNBENCH_CHECK_LAUNCH_KEYS (every
    launch checks its key), with a launch hook installed (it needs the launch metadata),
    or off CUDA (the interpreter)."""
    from triton import knobs

    key = None if why == "no key" else _runtime.launch_key("call-test", why)
    options = {"BLOCK": 16, "direct": why != "direct=False"}
    seen = []
    real = _runtime.launch
    monkeypatch.setattr(_runtime, "launch", lambda *a, **k: seen.append(k) or real(*a, **k))
    if why == "check":
        monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", True)
    if why == "hook":
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda meta: None)
    for _ in range(3):
        c = _runtime.Call(key, torch.device("cpu")) if why == "cpu" else call_on(key)
        c.launch(fake, (1,), (torch.zeros(8), 5, 0.5, True), options)
    assert len(seen) == 3


def test_a_call_is_direct_once_an_earlier_call_closed_with_every_launch_in_the_table(
    fake, call_on, monkeypatch
):
    """The first call with a key fills the table; once it closes, later calls are direct.
    A call with a launch that cannot be in the table (direct=False) or that never closed
    leaves its key not direct, and a direct call's launch missing from the table raises
    (its scratch buffers would reach Triton's JIT path as integers)."""
    monkeypatch.setattr(_runtime, "_direct_calls", set())
    monkeypatch.setattr(_runtime, "_records", {})
    monkeypatch.setattr(_runtime, "_record_misses", {})
    x, opts, other = torch.zeros(8), {"BLOCK": 16}, {"BLOCK": 32}
    key = _runtime.launch_key("direct-test", 1)
    first = call_on(key)
    assert not first.direct
    first.launch(fake, (1,), (x, 5, 0.5, True), opts)
    assert not call_on(key).direct  # not closed yet
    first.close()
    second = call_on(key)
    assert second.direct
    second.launch(fake, (1,), (x.data_ptr(), 5, 0.5, True), opts)  # an address: direct
    assert fake.runs[-1][9] == x.data_ptr() and len(fake.jit_calls) == 1
    with pytest.raises(RuntimeError, match="did not make"):
        second.launch(fake, (1,), (x, 5, 0.5, True), other)
    assert len(fake.jit_calls) == 1
    key2 = _runtime.launch_key("direct-test", 2)
    for _ in range(2):
        c = call_on(key2)
        c.launch(fake, (1,), (x, 5, 0.5, True), opts)
        c.launch(fake, (1,), (x, 5, 0.5, True), {"BLOCK": 16, "direct": False})
        c.close()
    assert not call_on(key2).direct
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", True)
    assert not call_on(key).direct  # checked calls use no table


def test_launcher_calls_tritons_c_launcher_straight_where_no_scratch_is_allocated():
    """Triton's launcher object allocates the kernel's global and profile scratch and then
    calls its C launcher with the launch flags and those buffers: with nothing to allocate,
    `_launcher` calls the C launcher with the same arguments; otherwise the object."""

    class CudaLauncher:  # the name and attributes of Triton's (checked on the GPU)
        launch_cooperative_grid, launch_pdl = False, True
        global_scratch_size = profile_scratch_size = 0

        def __init__(self):
            self.launch = lambda *args: ("c", args)

        def __call__(self, *args):
            return ("object", args)

    compiled = _Compiled([])
    compiled.run = CudaLauncher()
    fn, head = _runtime._launcher(compiled)
    assert fn is compiled.run.launch
    assert head == (False, True, None, None, "packed", None, None, None)
    compiled.run.global_scratch_size = 64
    fn, head = _runtime._launcher(compiled)
    assert fn == compiled.run and head == ("packed", None, None, None)


def _kernel2_fn(X, Y, n, BLOCK: tl.constexpr):
    pass


class _Jit2(_Jit):
    fn = staticmethod(_kernel2_fn)


def test_a_direct_call_is_recorded_and_later_calls_replay_it_with_their_own_addresses(
    fake, call_on, monkeypatch
):
    """The first direct call with a key is recorded (its launches and memsets, each pointer
    named as a bound tensor or a scratch offset); later calls replay it: every launch with
    their own bound tensors' addresses and their own scratch allocation, the rest as
    recorded, and no launch of the wrapper's own. A call whose pointers cannot all be
    named (two bound tensors at one address; an address outside the call's buffers) is not
    kept, and after RECORD_TRIES of those the key is no longer recorded."""
    for name, value in (("_direct_calls", set()), ("_records", {}), ("_record_misses", {})):
        monkeypatch.setattr(_runtime, name, value)
    monkeypatch.setattr(_runtime, "_layouts", {})
    fills, buffers = [], []
    monkeypatch.setattr(_runtime, "fill_int32", lambda *args: fills.append(args))
    new_buffer = _runtime.new_buffer
    monkeypatch.setattr(
        _runtime, "new_buffer", lambda *a: buffers.append(new_buffer(*a)) or buffers[-1]
    )
    kernel, opts, cpu = _Jit2(), {"BLOCK": 16}, torch.device("cpu")

    def wrapper(key, bound, y=None):
        """A two-buffer wrapper call on `bound` (tensors): a memset of its second buffer
        (direct calls), then one launch on bound[0] and y (None: that buffer)."""
        call = call_on(key)
        if call.replay(bound):
            return "replayed"
        scratch = _runtime.Scratch(cpu, key, call.direct)
        scratch.empty((3,), torch.float32)
        buf = scratch.empty((4,), torch.int32)
        if scratch.addresses:
            call.fill_int32(buf, -1, 4)
        call.launch(kernel, (2,), (bound[0], buf if y is None else y, 5), opts)
        scratch.close()
        call.close(bound, scratch)
        return "direct" if call.direct else "keyed"

    key = _runtime.launch_key("record-test", 1)
    x = torch.zeros(8)
    assert [wrapper(key, (x,)) for _ in range(2)] == ["keyed", "direct"]
    assert key in {k[0] for k in _runtime._records}
    assert fills[-1][1:] == (-1, 4, 7)
    z = torch.zeros(8)
    assert wrapper(key, (z,)) == "replayed"
    base = buffers[-1].data_ptr()  # the replay's scratch: 512 bytes, the int32s at 256
    assert buffers[-1].numel() == 2 * _runtime.SCRATCH_ALIGN
    assert fills[-1] == (base + 256, -1, 4, 7)
    assert kernel.runs[-1] == (2, 1, 1, 7, "handle", "packed", None, None, None,
                               z.data_ptr(), base + 256, 5, 16)  # fmt: skip
    assert len(kernel.jit_calls) == 1

    key2 = _runtime.launch_key("record-test", 2)  # two bound tensors at one address
    calls = _runtime.RECORD_TRIES + 3
    assert [wrapper(key2, (x, x)) for _ in range(calls)] == ["keyed"] + ["direct"] * (calls - 1)
    assert _runtime._record_misses[(key2, 0, _runtime._knobs.runtime.debug)] == 3
    key3 = _runtime.launch_key("record-test", 3)  # an address outside the call's buffers
    outside = torch.zeros(8)
    results = [wrapper(key3, (x,), outside.data_ptr()) for _ in range(3)]
    assert results == ["keyed", "direct", "direct"]
    assert not any(k[0] in (key2, key3) for k in _runtime._records)


def test_launch_direct_false_always_takes_the_jit_path(fake):
    for _ in range(3):
        _runtime.launch(fake, (1,), torch.zeros(8), 5, 0.5, True, BLOCK=16, direct=False)
    assert len(fake.jit_calls) == 3 and fake.runs == []


def test_launch_grid_functions_always_take_the_jit_path(fake):
    grid = lambda meta: (2,)  # noqa: E731
    for _ in range(3):
        _runtime.launch(fake, grid, torch.zeros(8), 5, 0.5, True, BLOCK=16)
    assert len(fake.jit_calls) == 3 and fake.runs == []


def test_launch_passes_metadata_when_a_hook_is_set(fake, monkeypatch):
    from triton import knobs

    seen = []
    x = torch.zeros(8)
    _runtime.launch(fake, (1,), x, 5, 0.5, True, BLOCK=16)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", seen.append)
    hook = knobs.runtime.launch_enter_hook
    _runtime.launch(fake, (1,), x, 5, 0.5, True, BLOCK=16)
    run = fake.runs[0]
    assert run[6] == ("meta", (1,), 7, (x, 5, 0.5, True, 16, "a")) and run[7] == hook


def test_launch_refuses_constexprs_by_position_and_runtime_args_by_keyword(fake):
    with pytest.raises(TypeError, match="constexprs by keyword"):
        _runtime.launch(fake, (1,), torch.zeros(8), 5, 0.5, True, 16)
    with pytest.raises(TypeError, match="'flag' by position"):
        _runtime.launch(fake, (1,), torch.zeros(8), 5, 0.5, flag=True, BLOCK=16)
    assert fake.jit_calls == []


def test_launch_lowers_num_stages_that_do_not_fit_and_keys_the_plan_by_the_request(fake):
    class Jit(_Jit):
        def __getitem__(self, grid):
            def call(*args, **kwargs):
                self.jit_calls.append(kwargs["num_stages"])
                if kwargs["num_stages"] > 2:
                    raise triton.runtime.errors.OutOfResources(1, 0, "shared memory")
                return _Compiled(self.runs)

            return call

    k = Jit()
    for _ in range(2):
        _runtime.launch(k, (1,), torch.zeros(8), 5, 0.5, True, BLOCK=16, num_stages=4)
    assert k.jit_calls == [4, 3, 2] and len(k.runs) == 1


def test_launch_direct_path_needs_a_compiled_jit_function():
    """Under the interpreter (as on this machine's CPU runs) kernels are interpreted
    functions: never direct. A JIT function is, on the Triton versions checked."""
    from kernels.nsa.forward import _sel_fwd_kernel

    compiled = isinstance(_sel_fwd_kernel, triton.runtime.jit.JITFunction)
    assert _runtime.direct_supported(_sel_fwd_kernel) == (
        compiled and tuple(int(x) for x in triton.__version__.split(".")[:2]) in
        _runtime.DIRECT_TRITON
    )  # fmt: skip
    assert _runtime.direct_supported(_Jit()) is False


def test_per_key_computes_once_per_key_and_device(monkeypatch):
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    calls = []

    def plan(n):
        calls.append(n)
        return (n, n + 1)

    key = _runtime.LaunchKey("per_key test", 1)
    assert _runtime.per_key(key, 0, plan, 5) == (5, 6)
    assert _runtime.per_key(key, 0, plan, 7) == (5, 6)  # the key decides: not recomputed
    assert _runtime.per_key(key, 1, plan, 7) == (7, 8)  # another device
    assert _runtime.per_key(None, 0, plan, 9) == (9, 10)  # no key: every time
    assert calls == [5, 7, 9]


def test_per_key_check_refuses_a_key_that_does_not_determine_the_value(monkeypatch):
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", True)

    def plan(n):
        return n

    key = _runtime.LaunchKey("per_key test", 2)
    _runtime.per_key(key, 0, plan, 5)
    assert _runtime.per_key(key, 0, plan, 5) == 5
    with pytest.raises(RuntimeError, match="does not determine"):
        _runtime.per_key(key, 0, plan, 6)


# `Scratch`: a call's temporaries from one allocation.

_SPECS = [
    ((3, 5), torch.int32),
    ((7,), torch.int64),
    ((2, 3, 4), torch.float32),
    ((1,), torch.int32),
]


def _scratch_call(key, specs=_SPECS, close=True):
    s = _runtime.Scratch(torch.device("cpu"), key)
    out = [s.empty(shape, dtype) for shape, dtype in specs]
    if close:
        s.close()
    return out


def test_scratch_first_call_records_later_calls_carve_one_allocation(monkeypatch):
    key = _runtime.LaunchKey("scratch test", 1)
    made = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: made.append(a) or real_empty(*a, **kw))
    _scratch_call(key)
    assert len(made) == len(_SPECS)  # its own allocation each
    made.clear()
    for _ in range(2):
        views = _scratch_call(key)
        assert len(made) == 1  # one allocation, carved
        made.clear()
        base = views[0].untyped_storage().data_ptr()
        spans = []
        for x, (shape, dtype) in zip(views, _SPECS, strict=True):
            assert x.shape == shape and x.dtype == dtype and x.is_contiguous()
            assert x.untyped_storage().data_ptr() == base  # one storage
            assert (x.data_ptr() - base) % _runtime.SCRATCH_ALIGN == 0
            assert x.data_ptr() % 16 == 0  # as Triton specializes an aligned pointer
            spans.append((x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()))
            x.fill_(1)  # every view is writable over its whole extent
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # disjoint


def test_scratch_refuses_a_call_that_leaves_its_recorded_layout():
    key = _runtime.LaunchKey("scratch test", 2)
    _scratch_call(key)
    other = [(_SPECS[0][0], torch.int64)] + _SPECS[1:]
    with pytest.raises(RuntimeError, match="differs from the layout"):
        _scratch_call(key, other)
    with pytest.raises(RuntimeError, match="differs from the layout"):
        _scratch_call(key, _SPECS + [((1,), torch.int32)])
    with pytest.raises(RuntimeError, match="has 4"):
        _scratch_call(key, _SPECS[:3])


def test_scratch_records_only_a_closed_call_and_no_key_allocates_plainly():
    key = _runtime.LaunchKey("scratch test", 3)
    _scratch_call(key, close=False)  # a call that raised half way
    assert key not in _runtime._layouts
    _scratch_call(key, _SPECS[:2])
    assert len(_runtime._layouts[key][1]) == 2
    a, b = _scratch_call(None), _scratch_call(None)
    assert a[0].untyped_storage().data_ptr() != a[1].untyped_storage().data_ptr()
    assert [x.shape for x in a] == [x.shape for x in b]


def test_scratch_with_addresses_gives_each_buffer_its_address_in_one_allocation():
    """Once the layout is recorded, a Scratch with addresses returns ints: the recorded
    offsets from one allocation's start; `tensor=True` still gives a view at the same place.
    Before the layout exists (the first call) it returns tensors."""
    key = _runtime.LaunchKey("scratch test", 4)
    s = _runtime.Scratch(torch.device("cpu"), key, addresses=True)
    assert not s.addresses
    first = [s.empty(shape, dtype) for shape, dtype in _SPECS]
    s.close()
    assert all(type(x) is torch.Tensor for x in first)
    s = _runtime.Scratch(torch.device("cpu"), key, addresses=True)
    assert s.addresses
    got = [s.empty(shape, dtype) for shape, dtype in _SPECS[:-1]]
    view = s.empty(*_SPECS[-1], tensor=True)
    s.close()
    assert all(type(a) is int for a in got)
    offsets = [part[3] for part in _runtime._layouts[key][1]]
    base = got[0] - offsets[0]
    assert [a - base for a in got] == offsets[:-1]
    assert view.data_ptr() - base == offsets[-1] and view.shape == _SPECS[-1][0]
    assert not _runtime.Scratch(torch.device("cpu"), key).addresses  # not asked


def test_scratch_allocate_makes_the_one_allocation_where_the_caller_asks():
    """`allocate` makes the call's allocation at once (so a wrapper places it among its
    outputs), and later `empty` requests carve that same allocation; without a recorded
    layout (the first call) it makes nothing and reports 0 bytes."""
    key = _runtime.LaunchKey("scratch test", 5)
    s = _runtime.Scratch(torch.device("cpu"), key, addresses=True)
    assert s.allocate() is None and s.allocated_bytes == 0
    _ = [s.empty(shape, dtype) for shape, dtype in _SPECS]
    s.close()
    s = _runtime.Scratch(torch.device("cpu"), key, addresses=True)
    total = _runtime._layouts[key][0]
    assert s.allocated_bytes == total
    base = s.allocate()
    assert type(base) is int and s.allocate() == base  # once
    got = [s.empty(shape, dtype) for shape, dtype in _SPECS]
    s.close()
    offsets = [part[3] for part in _runtime._layouts[key][1]]
    assert [a - base for a in got] == offsets


# On a GPU: real compiled kernels through the direct path.


@triton.jit
def _axpy_kernel(X, Y, n, alpha, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b_x = tl.load(X + i, mask=i < n, other=0.0)
    tl.store(Y + i, b_x * alpha + n, mask=i < n)


@pytest.mark.gpu
def test_launch_direct_on_gpu_matches_torch_across_specializations():
    """Aligned and misaligned pointers, n of 1, 16 and 17, each launched three times (the
    second and third direct); outputs poisoned before every launch."""
    buf = torch.randn(4096 + 8, device="cuda")
    for offset in (0, 1, 0, 3):  # 0: 16-byte aligned; 1 and 3 floats past: not
        for n in (17, 16, 1, 1000):
            x = buf[offset : offset + n]
            for _ in range(3):
                y = torch.full((n + 4,), float("nan"), device="cuda")
                _runtime.launch(_axpy_kernel, (_runtime.cdiv(n, 128),), x, y, n, 0.5,
                                BLOCK=128, num_warps=4)  # fmt: skip
                torch.testing.assert_close(y[:n], x * 0.5 + n, rtol=0, atol=0)
                assert torch.isnan(y[n:]).all()  # nothing written past n
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_fill_int32_writes_exactly_its_words_on_its_stream_and_under_capture():
    """`fill_int32` sets count words from an address: odd offsets and counts, guard words
    around them keep their poison; queued on the stream given (a side stream whose earlier
    work writes the same words first), and captured by a CUDA graph, whose replay refills
    words overwritten since."""
    buf = torch.full((1000,), 7, dtype=torch.int32, device="cuda")
    for start, count in ((0, 1), (3, 17), (100, 899)):
        buf.fill_(7)
        _runtime.fill_int32(
            buf[start:].data_ptr(), -1, count, torch.cuda.current_stream().cuda_stream
        )
        expect = torch.full_like(buf, 7)
        expect[start : start + count] = -1
        assert torch.equal(buf, expect), (start, count)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)
        buf.fill_(5)  # queued behind the sleep: the memset must run after it
        _runtime.fill_int32(buf.data_ptr(), 2**31 - 1, 10, side.cuda_stream)
    torch.cuda.current_stream().wait_stream(side)
    assert buf[:10].eq(2**31 - 1).all() and buf[10:].eq(5).all()
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        _runtime.fill_int32(buf[1:].data_ptr(), -3, 4, s.cuda_stream)
    torch.cuda.current_stream().wait_stream(s)
    buf.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert buf[1:5].eq(-3).all() and buf[0] == 0 and buf[5:].eq(0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["recent", "random"])
def test_nsa_direct_launches_match_the_jit_path_bit_for_bit(pattern, monkeypatch):
    """Forward and backward at the seed's group (every launch site, block-major included),
    bf16: the JIT path's results, then the direct path's calls: with each launch's key
    checked (ATTNBENCH_CHECK_LAUNCH_KEYS, as in the other tests), then as users run them
    (`_runtime.Call`'s table: the launcher called straight), and a call on a misaligned q
    (a new specialization: the JIT path again, then direct)."""
    from kernels.nsa import (
        make_block_idx_random,
        make_block_idx_recent,
        selection_backward_triton,
        selection_forward_triton,
    )
    from kernels.nsa.tuning import with_fields

    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 1000, 64, 64, 8
    g = torch.Generator(device="cuda").manual_seed(3)
    heads = torch.randn(B, 2 * (Hq + Hkv), T, D, device="cuda", generator=g).bfloat16()
    q, k, v, do = (x.contiguous() for x in heads.split([Hq, Hkv, Hkv, Hq], dim=1))
    idx = (
        make_block_idx_recent(B, Hkv, T, bs, S, device="cuda") if pattern == "recent"
        else make_block_idx_random(B, Hkv, T, bs, S, device="cuda", seed=3)
    )  # fmt: skip

    def run(q, tuning=None):
        o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=tuning)
        return (o, lse, *selection_backward_triton(q, k, v, idx, bs, do, o, lse, tuning=tuning))

    want = run(q, with_fields(direct_launch=False))
    for check in (True, True, False, False, False):
        monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", check)
        for got, ref in zip(run(q), want, strict=True):
            assert torch.equal(got, ref)
    flat = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    q_off = flat[1:].view(q.shape)  # contiguous, 2 bytes past a 16-byte boundary
    q_off.copy_(q)
    for _ in range(2):
        for got, ref in zip(run(q_off), want, strict=True):
            assert torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_nsa_replayed_calls_match_the_jit_path_on_rotating_inputs(monkeypatch):
    """Forward (block-major phase, its second stream and its memset included), backward
    with lse given and lse=None, bf16, as users run them: three input sets with their own
    storage (and block_idx), called in turn four rounds over, the later rounds replaying
    the recorded direct call (`_runtime.Call.replay`), one round on a stream of the
    caller's; each result bit for bit the JIT path's on its own inputs, outputs poisoned."""
    from kernels.nsa import (
        _checks,
        make_block_idx_random,
        selection_backward_triton,
        selection_forward_triton,
    )
    from kernels.nsa.tuning import with_fields

    for name, value in (("_call_plans", {}), ("_direct_calls", set()), ("_records", {}),
                        ("_record_misses", {})):  # fmt: skip
        monkeypatch.setattr(_runtime, name, value)
    new_empty = _checks.new_empty
    monkeypatch.setattr(
        _checks, "new_empty", lambda *a: new_empty(*a).fill_(float("nan"))
    )  # fmt: skip
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 4096, 64, 64, 16  # the block-major phase runs
    g = torch.Generator(device="cuda").manual_seed(5)
    sets = []
    for i in range(3):
        q, k, v, do = (torch.randn(B, H, T, D, device="cuda", generator=g).bfloat16()
                       for H in (Hq, Hkv, Hkv, Hq))  # fmt: skip
        sets.append((q, k, v, do, make_block_idx_random(B, Hkv, T, bs, S, "cuda", seed=i)))

    def run(q, k, v, do, idx, tuning=None):
        o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=tuning)
        grads = selection_backward_triton(q, k, v, idx, bs, do, o, lse, tuning=tuning)
        return (o, lse, *grads, *selection_backward_triton(q, k, v, idx, bs, do, o, tuning=tuning))

    want = [run(*x, tuning=with_fields(direct_launch=False)) for x in sets]
    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    caller = torch.cuda.Stream()
    for r in range(4):
        for x, ref in zip(sets, want, strict=True):
            if r == 3:
                caller.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(caller):
                    got = run(*x)
                torch.cuda.current_stream().wait_stream(caller)
            else:
                got = run(*x)
            for a, b in zip(got, ref, strict=True):
                assert torch.equal(a, b), r
    assert len(_runtime._records) == 2  # the forward's key and the backward's
    torch.cuda.synchronize()


def test_a_patched_copy_of_the_nsa_forward_keeps_launch_tables_of_its_own(monkeypatch, tmp_path):
    """Launches stubbed, as on a GPU (`tools.dev.nsa_host_python.stub_launches`): after the
    forward's calls have gone direct, a copy of forward.py loaded under another module name
    (as the gate study loads its patched variants) makes its first calls through the keyed
    path, with tables of its own, instead of meeting the original's direct table (where
    its launches would be missing and raise)."""
    import importlib.util
    import sys

    from kernels.nsa import backward, block_major, forward, inverse, make_block_idx_random, tiles
    from tools.dev.nsa_host_python import stub_launches

    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    monkeypatch.setattr(_runtime, "_call_plans", {})
    monkeypatch.setattr(_runtime, "_direct_calls", set())
    monkeypatch.setattr(_runtime, "_records", {})
    monkeypatch.setattr(_runtime, "_record_misses", {})
    name = "kernels.nsa.forward_copy_for_test"
    path = tmp_path / "forward_copy_for_test.py"
    path.write_text(open(forward.__file__).read())
    spec = importlib.util.spec_from_file_location(name, path)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, copy)
    spec.loader.exec_module(copy)
    stub_launches(monkeypatch.setattr, (tiles, forward, block_major, backward, inverse, copy))
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 4096, 64, 64, 16  # block-major phase included
    q = torch.empty(B, Hq, T, D, device="meta", dtype=torch.bfloat16)
    k = v = torch.empty(B, Hkv, T, D, device="meta", dtype=torch.bfloat16)
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=0).to("meta")
    for fwd in (forward.selection_forward_triton, copy.selection_forward_triton):
        for _ in range(3):
            fwd(q, k, v, idx, bs)
    assert len(_runtime._direct_calls) == 2  # one direct key each


def test_nsa_direct_calls_pass_the_same_arguments_as_the_keyed_path(monkeypatch):
    """Launches stubbed and recorded (`tools.dev.nsa_host_python.stub_launches`), CPU
    tensors standing in for CUDA ones: the forward (block-major phase included), the
    backward with lse given and with lse=None, each called four times, on two input sets in
    turn. The first call takes the keyed path (tensors), the second goes direct (addresses)
    and is recorded, the later ones replay that record (`_runtime.Call.replay`), the first
    replay on the set the record was not made on;
    every launch of every call gets the same kernels in the same order, each input and
    output at the same argument place (by its address), the same scalars, and the same
    scratch buffer at the same byte offset (`_runtime.Scratch` requests, in the call's
    order) wherever the first call had one. What the GPU test checks bit for bit, here
    argument by argument on the CPU."""
    from kernels.nsa import (
        _checks,
        backward,
        block_major,
        forward,
        inverse,
        make_block_idx_random,
        selection_backward_triton,
        selection_forward_triton,
        tiles,
    )
    from kernels.nsa.tuning import with_fields
    from tools.dev.nsa_host_python import stub_launches

    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", False)
    monkeypatch.setattr(_runtime, "_call_plans", {})
    monkeypatch.setattr(_runtime, "_direct_calls", set())
    monkeypatch.setattr(_runtime, "_records", {})
    monkeypatch.setattr(_runtime, "_record_misses", {})
    monkeypatch.setattr(_runtime, "_layouts", {})  # only this test's scratch layouts
    record = []
    stub_launches(monkeypatch.setattr, (tiles, forward, block_major, backward, inverse), record)
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 4096, 64, 64, 16  # block-major phase included
    sets = []  # two input sets with their own storage; the calls alternate between them
    for seed in range(2):
        q, do = (torch.zeros(B, Hq, T, D, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.zeros(B, Hkv, T, D, dtype=torch.bfloat16) for _ in range(2))
        idx = make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=seed)
        o, lse = torch.zeros_like(q), torch.zeros(B, Hq, T)
        sets.append(dict(q=q, k=k, v=v, idx=idx, do=do, o=o, lse=lse))
    inputs = {}  # the set of the call being made
    x = inputs.__getitem__
    calls = {
        "forward": lambda: selection_forward_triton(
            x("q"), x("k"), x("v"), x("idx"), bs, return_lse=True
        ),
        "backward": lambda: selection_backward_triton(
            x("q"), x("k"), x("v"), x("idx"), bs, x("do"), x("o"), x("lse")
        ),
        "backward lse=None": lambda: selection_backward_triton(
            x("q"), x("k"), x("v"), x("idx"), bs, x("do"), x("o")
        ),
    }

    requests = []  # the call's scratch requests, in order: (start address, bytes)
    outputs = []  # the tensors the call allocates for its results (`_checks.new_empty`)
    buffers = []  # its one-allocation scratch buffers (a direct call's, a replay's)
    allocations = []  # the order of the two: "output" and "scratch"
    scratch_empty, new_empty, new_buffer = (
        _runtime.Scratch.empty, _checks.new_empty, _runtime.new_buffer
    )  # fmt: skip

    def empty(self, shape, dtype, tensor=False):
        x = scratch_empty(self, shape, dtype, tensor)
        start = x if type(x) is int else x.data_ptr()
        requests.append((start, dtype.itemsize * math.prod(shape)))
        return x

    def output(shape, dtype, device):
        outputs.append(new_empty(shape, dtype, device))
        allocations.append("output")
        return outputs[-1]

    def buffer(shape, dtype, device):
        x = new_buffer(shape, dtype, device)
        if dtype is torch.uint8:
            buffers.append(x)
            allocations.append("scratch")
        return x

    monkeypatch.setattr(_runtime.Scratch, "empty", empty)
    monkeypatch.setattr(_checks, "new_empty", output)
    monkeypatch.setattr(_runtime, "new_buffer", buffer)

    def label(a):
        """An address as the input there, the call's i-th output, or (scratch request i,
        byte offset)."""
        for name, x in inputs.items():
            if a == x.data_ptr():
                return name
        for i, x in enumerate(outputs):
            if a == x.data_ptr():
                return f"output {i}"
        for i, (start, n) in enumerate(requests):
            if start <= a < start + max(n, 1):
                return f"scratch {i} + {a - start}"
        for x in buffers:  # a replay's scratch: its place in the key's recorded layout
            at = a - x.data_ptr()
            if 0 <= at < x.numel():
                (parts,) = [p for n, p in _runtime._layouts.values() if n == x.numel()]
                for i, (shape, dtype, _, offset) in enumerate(parts):
                    if offset <= at < offset + max(dtype.itemsize * math.prod(shape), 1):
                        return f"scratch {i} + {at - offset}"
        return "elsewhere"

    def launches():
        """The recorded launches: (kernel, arguments), each pointer argument (a tensor, or
        an int too large to be a size) labelled by `label`, each other argument its value."""
        out = []
        for kernel, args in record:
            norm = []
            for a in args:
                if type(a) is torch.Tensor:
                    a = label(a.data_ptr())
                elif type(a) is int and a >= 2**32:
                    a = label(a)
                norm.append(a)
            out.append((kernel, tuple(norm)))
        return out

    replays = []  # whether each call replayed a record (`_runtime.Call.replay`)
    replay = _runtime.Call.replay

    def replay_logged(self, bound, scratch=None):
        replays.append(replay(self, bound, scratch))
        return replays[-1]

    monkeypatch.setattr(_runtime.Call, "replay", replay_logged)
    for name, fn in calls.items():
        runs = []
        for i in range(4):  # sets 0, 1, 0, 1: the first replay is on the other set
            for log in (record, requests, outputs, buffers, allocations):
                log.clear()
            inputs.update(sets[i % 2])
            fn()
            runs.append(launches())
            if name == "backward" and i > 0:
                # Direct (i = 1) and replayed (2, 3) calls place their buffers alike: dq,
                # the scratch, dk, dv.
                assert allocations == ["output", "scratch", "output", "output"], (i, allocations)
        first, later = runs[0], runs[1:]
        for run in later:
            assert [kn for kn, _ in run] == [kn for kn, _ in first], name
            for (kernel, a), (_, b) in zip(first, run, strict=True):
                assert b[: len(a)] == a, (name, kernel, a, b[: len(a)])
        used = {x for _, args in first for x in args if isinstance(x, str)}
        assert {"q", "k", "v", "idx"} <= used, (name, used)
        assert any(x.startswith("scratch") for x in used) and "elsewhere" not in used, (
            name,
            [(kn, a) for kn, a in first if "elsewhere" in a],
        )
    # The forward's key and the backward's (lse given or recomputed: the same key) went
    # direct, the second call with each recorded, and the later ones replayed the record:
    # forward 1, 2 keyed, direct; 3, 4 replays; backward the same; backward lse=None: its
    # forward and itself replayed, 4 times.
    assert len(_runtime._direct_calls) == 2
    assert len(_runtime._records) == 2
    assert replays == [False, False, True, True] * 2 + [True] * 8
    replays.clear()  # replay_calls=False: a new key, direct from its second call, no record
    no_replay = with_fields(replay_calls=False)
    for _ in range(4):
        selection_forward_triton(x("q"), x("k"), x("v"), x("idx"), bs, tuning=no_replay)
    assert replays == [False] * 4 and len(_runtime._records) == 2
    assert len(_runtime._direct_calls) == 3
