"""Facts about how the kernels run, shared by the kernel families."""

import ctypes
import functools
import inspect
import os
import threading

import torch
import triton
from triton.runtime import driver as _driver

try:
    from triton import knobs as _knobs
except ImportError:  # a Triton before knobs: no direct launches (`_direct_version`)
    _knobs = None


def interpreter_active():
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1): kernels then run
    on the CPU in numpy, take CPU tensors, and cannot use compiled-only features (loops over
    a loaded trip count as `range`, libdevice)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# Host-side integer helpers. Triton's own `triton.cdiv` and `triton.next_power_of_2` are
# constexpr functions that also run inside kernels, and a host call through that machinery
# costs microseconds; a launch wrapper computes a few dozen of these per call.
def cdiv(a, b):
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_pow2(n):
    """The smallest power of two >= n for n >= 1 (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


_PDL = {}  # CUDA device index -> whether it supports programmatic dependent launch


def pdl_supported(device):
    """Whether kernels launched on `device` (a torch.device) may use programmatic dependent
    launch (a launch with `launch_pdl=True` that overlaps the tail of the kernel before it,
    and `tl.extra.cuda.gdc_wait` for that kernel's writes): compiled kernels (not the
    interpreter) on a CUDA device of compute capability >= 9.0. Cached per device."""
    if device.type != "cuda" or interpreter_active():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL.get(index)
    if ok is None:
        ok = _PDL[index] = torch.cuda.get_device_capability(index) >= (9, 0)
    return ok


# Kernel launches.
#
# `kernel[grid](*args)` runs Triton's JIT dispatch on every call: it binds the arguments to
# the signature, computes each one's specialization (dtype, 16-byte alignment, ints equal
# to 1 or divisible by 16, i32/i64 range), builds a cache key from them and the options,
# and looks the compiled kernel up. That costs several microseconds per launch on the
# host, and an eager NSA call makes up to a dozen launches. `launch` keeps, per call site's
# key, the compiled kernel the JIT path returned and calls its launcher directly. The key
# holds, for every runtime argument, what Triton specializes on (so a call that Triton
# would compile differently misses and goes through the JIT path), the constexprs and
# options by value, the current device and Triton's debug setting. The launcher's calling
# convention is Triton's own (`CompiledKernel.run`), checked for the versions listed in
# DIRECT_TRITON; other versions and the interpreter always take the JIT path.
#
# Building that key still costs about a microsecond per argument. A wrapper that makes
# several launches per call may instead pass `key=`: one hashable it builds once per call
# that, together with the kernel, determines every runtime argument's specialization and
# every keyword of the launch (the call's shapes, dtypes and tuning, and its input
# tensors' 16-byte alignment; its own allocations are always aligned). The direct path then
# looks the compiled kernel up by (kernel, key, device, debug setting) alone. A key that
# leaves something out would reuse a kernel compiled for other arguments, so with
# ATTNBENCH_CHECK_LAUNCH_KEYS=1 in the environment (the tests set it) every keyed launch
# also builds the full key and raises when one caller key has met two of them.
DIRECT_TRITON = ((3, 6),)
_I32 = (-(2**31), 2**31)
_plans = {}  # key -> (compiled kernel, the constexprs' values in signature order)
_keyed = {}  # (kernel, caller key, device, debug) -> a plan of _plans
_keyed_full = {}  # the same -> the full key it stands for (ATTNBENCH_CHECK_LAUNCH_KEYS)
_kernel_info = {}  # JIT function -> its parameters' names, constexpr flags, defaults
CHECK_LAUNCH_KEYS = os.environ.get("ATTNBENCH_CHECK_LAUNCH_KEYS") == "1"


@functools.cache
def _direct_version():
    """Whether the installed Triton's launcher convention is one `launch` was checked
    against (DIRECT_TRITON)."""
    try:
        version = tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return _knobs is not None and version in DIRECT_TRITON


def direct_supported(kernel):
    """Whether `launch` may call `kernel`'s compiled launchers directly: a Triton version in
    DIRECT_TRITON and a compiled JIT function (under the interpreter, the decorator gives
    an interpreted one instead)."""
    return isinstance(kernel, triton.runtime.jit.JITFunction) and _direct_version()


def _arg_key(a):
    """What Triton's specialization of one runtime argument depends on."""
    t = type(a)
    if t is int:  # 1 becomes a constant; divisibility by 16; i32, i64 or u64
        return (a == 1, a & 15 == 0, _I32[0] <= a < _I32[1], a < 2**63)
    if t is float:  # always fp32, never specialized on its value
        return t
    data_ptr = getattr(a, "data_ptr", None)
    if data_ptr is not None:  # a tensor: its dtype and 16-byte alignment
        return (a.dtype, data_ptr() & 15 == 0)
    return (t, a)  # bool, None and the rest: by value (at least as fine as Triton's key)


def _info(kernel):
    """(parameter names, their constexpr flags, their defaults) of a JIT function."""
    info = _kernel_info.get(kernel)
    if info is None:
        # The Python function's signature: a JITFunction and the interpreter's wrapper of
        # it both keep it as `fn`; a constexpr is annotated `tl.constexpr`.
        params = inspect.signature(kernel.fn).parameters.values()
        info = (
            tuple(p.name for p in params),
            tuple("constexpr" in repr(p.annotation) for p in params),
            tuple(p.default for p in params),
        )
        _kernel_info[kernel] = info
    return info


def _name(kernel):
    return kernel.fn.__name__


def _check_call(kernel, n_args, kwargs):
    """Runtime arguments go by position and constexprs and options by keyword: that is
    what lets a call site's key hold constexprs by value and the rest by specialization."""
    names, constexpr, _ = _info(kernel)
    if n_args > len(names) or any(constexpr[:n_args]):
        raise TypeError(f"{_name(kernel)}: pass constexprs by keyword, not by position")
    for name in kwargs:  # a name that is not a parameter is an option, as for Triton
        if name in names and not constexpr[names.index(name)]:
            raise TypeError(f"{_name(kernel)}: pass runtime argument {name!r} by position")


def _tail(kernel, n_args, kwargs):
    """The values of `kernel`'s parameters after its `n_args` runtime arguments (its
    constexprs), from `kwargs` or their defaults, in signature order: what the compiled
    kernel's launcher takes after the runtime arguments."""
    names, _, defaults = _info(kernel)
    rest = zip(names[n_args:], defaults[n_args:], strict=True)
    return tuple(kwargs.get(n, d) for n, d in rest)


def _current():
    """(current device, the function giving a device's current stream) of Triton's active
    driver: the device and stream the JIT path launches on."""
    drv = _driver.active
    return drv.get_current_device(), drv.get_current_stream


def _jit_launch(kernel, grid, args, kwargs):
    """kernel[grid](*args, **kwargs) with num_stages, when given, lowered until the
    kernel's shared memory fits (large D and block sizes): that check fails when the kernel
    is loaded, before anything runs, so retrying is safe."""
    kwargs = dict(kwargs)
    while True:
        try:
            return kernel[grid](*args, **kwargs)
        except triton.runtime.errors.OutOfResources:
            if kwargs.get("num_stages") is None or kwargs["num_stages"] <= 1:
                raise
            kwargs["num_stages"] -= 1


def launch(kernel, grid, *args, direct=True, key=None, stream=None, **kwargs):
    """Launch the JIT function `kernel` on `grid` (a tuple of 1-3 ints; any other grid,
    such as a function of the meta-parameters, always takes the JIT path) as
    `kernel[grid](*args, **kwargs)` does: runtime arguments by position, constexprs and
    options (num_warps, num_stages, ...) by keyword. With `direct` (and `direct_supported()`),
    a call site's second and later launches with the same key skip the JIT dispatch (module
    comment above); `key`, the caller's key for this launch (module comment), skips
    building that key too. `stream`: a `torch.cuda.Stream` to launch on instead of the
    current one. A num_stages whose shared memory does not fit is lowered to one that does.
    Returns what `kernel[grid](...)` returns (the compiled kernel when compiled)."""
    if not (direct and type(grid) is tuple and direct_supported(kernel)):
        _check_call(kernel, len(args), kwargs)
        if stream is None:
            return _jit_launch(kernel, grid, args, kwargs)
        with torch.cuda.stream(stream):
            return _jit_launch(kernel, grid, args, kwargs)
    return _launch(kernel, grid, args, kwargs, key, stream)


def _launch(kernel, grid, args, kwargs, key, stream):
    """`launch`'s direct path, on `stream` (a torch stream) or, when None, the current one."""
    device, current_stream = _current()
    if stream is not None:
        handle = stream.cuda_stream
        current_stream = lambda device: handle  # noqa: E731
    runtime = _knobs.runtime
    if key is not None:
        keyed = (kernel, key, device, runtime.debug)
        plan = _keyed.get(keyed)
        if plan is not None and not CHECK_LAUNCH_KEYS:
            return _run(plan, grid, current_stream(device), args)
    full = (
        kernel, device, runtime.debug, _knobs.compilation.instrumentation_mode,
        tuple([
            (a.dtype, a.data_ptr() & 15 == 0) if type(a) is torch.Tensor
            else (a == 1, a & 15 == 0, _I32[0] <= a < _I32[1], a < 2**63) if type(a) is int
            else _arg_key(a)
            for a in args
        ]),  # _arg_key, with its two commonest cases inline
        tuple(kwargs.items()),
    )  # fmt: skip
    if key is not None and CHECK_LAUNCH_KEYS:
        seen = _keyed_full.setdefault(keyed, full)
        if seen != full:
            raise RuntimeError(
                f"{_name(kernel)}: launch key {key!r} stands for two specializations "
                f"({seen[4:]} and {full[4:]}); a key must determine every argument's "
                "specialization and every keyword"
            )
    plan = _plans.get(full)
    if plan is None:
        _check_call(kernel, len(args), kwargs)
        if stream is None:
            compiled = _jit_launch(kernel, grid, args, kwargs)
        else:
            with torch.cuda.stream(stream):
                compiled = _jit_launch(kernel, grid, args, kwargs)
        if getattr(compiled, "function", None) is not None:
            _plans[full] = (compiled, _tail(kernel, len(args), kwargs))
            if key is not None:
                _keyed[keyed] = _plans[full]
        return compiled
    if key is not None:
        _keyed[keyed] = plan
    return _run(plan, grid, current_stream(device), args)


# One wrapper call's launches.
#
# Even keyed, `launch` reads the current device and stream, Triton's debug setting and
# launch hooks, hashes the kernel (a JIT function hashes its source's cache key under a
# lock) and the key, and takes keyword options as a dict built at the call site, for every
# launch; a dozen launches per call make that tens of microseconds. A `Call` reads the
# device, the current stream and the settings once, at the start of the call, and its
# `launch` finds each launch's compiled kernel in a table of the call's key by the identity
# of the kernel and of the options dict (the wrapper's per-key plan keeps one dict per
# launch site, `per_key`), so a launch costs a lookup, the tensors' addresses and Triton's
# launcher. Its first launch of each (kernel, options) takes `launch`'s keyed path, which
# compiles or finds the kernel (and, under ATTNBENCH_CHECK_LAUNCH_KEYS=1, where no table is
# used, checks the key on every launch).
#
# Once a call with a key has closed (`Call.close`) with every one of its launches in the
# table, later calls with that key are *direct*: their launches are all known, so the
# call's temporaries can go to them as device addresses (`Scratch` with addresses=True), not
# as tensor views, whose making costs more host time than the launch that reads them. A
# direct call's launch missing from the table raises: Triton's JIT path would take such an
# address for an integer argument.
#
# A direct call is then *recorded*: its device work in order (launches, memsets, the fork
# to a second stream and the join back) with every pointer argument named by where it
# points: the call's i-th bound tensor (the wrapper's inputs and outputs, `close(bound=)`)
# or an offset into its scratch allocation. Everything else a launch takes (grid, scalars,
# constexprs, the side stream) is fixed by the key, as the table's plans are. Later calls
# with the key *replay* the record (`Call.replay`): one allocation for the scratch, then
# each step with the new addresses put in, and none of the wrapper's Python between
# launches (plans, views, list sizes). A record is kept only when every pointer argument
# could be named; a call whose arguments could not (an address outside the call's
# buffers, or two bound tensors at one address, which a later call may not share) leaves
# its key on the direct path, and after RECORD_TRIES such calls no more are recorded.
_call_plans = {}  # (caller key, device index, debug) -> {(id(kernel), id(options)): plan}
_direct_calls = set()  # the keys of `_call_plans` whose calls are direct
_records = {}  # the same keys -> `_Record` of a direct call (replayed by later calls)
_record_misses = {}  # the same keys -> how many recorded calls could not be kept
RECORD_TRIES = 3
_streams = {}  # torch's (stream id, device index, device type) -> (Stream, raw handle)
_EVENTS = threading.local()  # .pairs: device index -> this thread's (fork, join) events


def _stream_of(ids):
    """The torch Stream with `ids` (a value: a Stream is those three integers) and its raw
    handle, made once per stream."""
    entry = _streams.get(ids)
    if entry is None:
        s = torch.cuda.Stream(stream_id=ids[0], device_index=ids[1], device_type=ids[2])
        entry = _streams[ids] = (s, s.cuda_stream)
    return entry


def _current_stream():
    """(current device index, its current torch Stream, that stream's raw handle): the
    device and stream Triton's launches go to."""
    index = torch.cuda.current_device()
    return (index, *_stream_of(torch._C._cuda_getCurrentStream(index)))


def _hooks_set():
    """Whether a launch hook (a profiler's) is installed: each hook None or an empty
    HookChain when not."""
    runtime = _knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def fork_join_events(index):
    """Two CUDA events (no timing) for the fork to a second stream and the join back of one
    call on CUDA device `index`: made once per thread and device and recorded again by
    every call. A wait takes the event's state when it is issued, so each call's
    record-then-wait pair is its own dependency; per thread, so that two threads' calls
    cannot record between the other's pair."""
    pairs = getattr(_EVENTS, "pairs", None)
    if pairs is None:
        pairs = _EVENTS.pairs = {}
    pair = pairs.get(index)
    if pair is None:
        pair = pairs[index] = (torch.cuda.Event(), torch.cuda.Event())
    return pair


def _launcher(compiled):
    """(function, head) to launch `compiled` as `function(gx, gy, gz, stream, cu_function,
    *head, *args, *constexprs)`. Triton's `CompiledKernel.run` is a Python object whose
    call allocates the kernel's global and profile scratch (none for most kernels) and then
    calls the compiled C launcher with two launch flags and those buffers added; with no
    scratch to allocate, the C launcher is called straight. Launch hooks are off here (a
    `Call` with hooks set keeps no table)."""
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    if (
        type(run).__name__ == "CudaLauncher" and callable(c_launch)
        and run.global_scratch_size == 0 and run.profile_scratch_size == 0
    ):  # fmt: skip
        head = (run.launch_cooperative_grid, run.launch_pdl, None, None)
        return c_launch, (*head, compiled.packed_metadata, None, None, None)
    return run, (compiled.packed_metadata, None, None, None)


class _Record:
    """A direct call's device work, for `Call.replay`: `steps`, each ("launch", function,
    (gx, gy, gz), stream handle or None (the call's), the launch's fixed head and tail,
    its arguments with 0 at each pointer's place, ((place, source, offset), ...)),
    ("fill", source, offset, value, count), ("fork", side Stream) or ("join", side Stream);
    a source is a bound tensor's index, or -1 for the scratch allocation of `nbytes`."""

    __slots__ = ("steps", "nbytes", "n_bound")

    def __init__(self, steps, nbytes, n_bound):
        self.steps, self.nbytes, self.n_bound = steps, nbytes, n_bound


class Call:
    """The launches of one wrapper call (module comment above).

    `Call(key, device, replay)` at the start of the call, `key` its launch key
    (`launch_key`) or None, `device` its tensors' torch.device, `replay` whether its calls
    may be recorded and replayed; then `replay(bound)`, and where that returns
    False, `launch(kernel, grid, args, options)` for each launch (and `fill_int32`, `fork`
    and `join` for the call's other device work), then `close(bound, scratch)`. On a CUDA
    device, `stream` is the current stream when the call started (a torch Stream; None
    elsewhere): the call's launches go to it unless told otherwise.
    """

    __slots__ = (
        "key", "stream", "direct", "_handle", "_index", "_plans", "_plans_key", "_complete",
        "_steps", "_record",
    )  # fmt: skip

    def __init__(self, key, device, replay=True):
        self.key, self.stream, self._handle, self._plans = key, None, None, None
        self.direct, self._complete, self._steps, self._record = False, True, None, None
        if device.type != "cuda" or interpreter_active():
            return
        index, self.stream, self._handle = _current_stream()
        self._index = index
        if key is not None and _direct_version() and not CHECK_LAUNCH_KEYS and not _hooks_set():
            plans_key = self._plans_key = (key, index, _knobs.runtime.debug)
            plans = _call_plans.get(plans_key)
            if plans is None:
                plans = _call_plans[plans_key] = {}
            self._plans = plans
            self.direct = plans_key in _direct_calls
            if self.direct and replay:
                self._record = _records.get(plans_key)
                if self._record is None and _record_misses.get(plans_key, 0) < RECORD_TRIES:
                    self._steps = []  # this call is recorded

    def replay(self, bound, scratch=None):
        """Queue the recorded device work of an earlier direct call with this key, with the
        tensors `bound` (the wrapper's inputs and outputs, in the order it binds them at
        `close`) and a fresh scratch allocation in place of that call's: `scratch`'s (a
        `Scratch` of the key, allocated with `allocate`), or a new one, freed on return;
        returns whether there was a record. A call's temporaries may be freed once its
        launches are queued: their next user on the call's stream runs after the recorded
        work (which ends on that stream)."""
        record = self._record
        if record is None:
            return False
        if len(bound) != record.n_bound:
            raise RuntimeError(f"a call with key {self.key!r} bound {len(bound)} tensors, "
                               f"its record {record.n_bound}")  # fmt: skip
        base = [t.data_ptr() for t in bound]
        if scratch is not None and scratch.allocated_bytes >= record.nbytes:
            base.append(scratch.allocate())  # source -1
        else:
            buffer = new_buffer((record.nbytes,), torch.uint8, bound[0].device)
            base.append(buffer.data_ptr())
        handle = self._handle
        for step in record.steps:
            kind = step[0]
            if kind == "launch":
                _, fn, grid, stream, head, tail, fixed, places = step
                args = list(fixed)
                for place, source, offset in places:
                    args[place] = base[source] + offset
                fn(*grid, handle if stream is None else stream, *head, *args, *tail)
            elif kind == "fill":
                _, source, offset, value, count = step
                fill_int32(base[source] + offset, value, count, handle)
            elif kind == "fork":
                self.fork(step[1])  # a replaying call records nothing itself
            else:
                self.join(step[1])
        return True

    def fill_int32(self, address, value, count):
        """`fill_int32` of `count` int32 words at device `address` on the call's stream."""
        if self._steps is not None:
            self._steps.append(("fill", address, value, count))
        fill_int32(address, value, count, self._handle)

    def fork(self, side):
        """Make `side` (a torch Stream) wait for the work queued so far on the call's stream."""
        if self._steps is not None:
            self._steps.append(("fork", side))
        fork = fork_join_events(self._index)[0]
        fork.record(self.stream)
        side.wait_event(fork)

    def join(self, side):
        """Make the call's stream wait for the work queued so far on `side`."""
        if self._steps is not None:
            self._steps.append(("join", side))
        join = fork_join_events(self._index)[1]
        join.record(side)
        self.stream.wait_event(join)

    def close(self, bound=(), scratch=None):
        """The call made every launch: if each of them is in the table, later calls with
        the key are direct. A recorded (direct) call also needs `bound`, the tensors its
        launches took that `replay` will take anew (inputs and outputs, a fixed order per
        key), and `scratch`, its `Scratch`: every pointer argument is named by one of
        them, or the call is not kept as a record."""
        if self._plans is not None and self._complete and not self.direct:
            _direct_calls.add(self._plans_key)
        if self._steps is not None:
            record = _make_record(self._steps, bound, scratch)
            if record is not None:
                _records[self._plans_key] = record
            else:
                _record_misses[self._plans_key] = _record_misses.get(self._plans_key, 0) + 1
            self._steps = None

    def launch(self, kernel, grid, args, options, stream=None):
        """`launch(kernel, grid, *args, key=..., stream=stream, **options)` for this call:
        `args` the runtime arguments (a tuple), `options` the constexprs and launch options
        (a dict the caller keeps for the key: its identity names the launch); `stream` a
        torch Stream, None for the call's."""
        plans = self._plans
        if plans is not None:
            plan = plans.get((id(kernel), id(options)))
            if plan is not None:
                _, _, fn, function, head, tail = plan
                n = len(grid)
                grid = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)
                handle = None if stream is None else stream.cuda_stream
                if self._steps is not None:
                    self._steps.append(("launch", fn, grid, handle, (function, *head), tail, args))
                fn(
                    *grid, self._handle if handle is None else handle, function, *head,
                    *[a.data_ptr() if type(a) is torch.Tensor else a for a in args], *tail,
                )  # fmt: skip
                return
            if self.direct:
                raise RuntimeError(
                    f"{_name(kernel)}: a launch that the earlier calls with key {self.key!r} "
                    "did not make; the key must determine a call's launches"
                )
        key = None if self.key is None else (self.key, id(options))
        compiled = launch(kernel, grid, *args, key=key, stream=stream, **options)
        if (
            plans is not None and options.get("direct", True) and type(grid) is tuple
            and direct_supported(kernel) and getattr(compiled, "function", None) is not None
        ):  # fmt: skip
            # The plan holds the kernel and the options, so neither id can be reused.
            fn, head = _launcher(compiled)
            plans[(id(kernel), id(options))] = (
                kernel, options, fn, compiled.function, head, _tail(kernel, len(args), options)
            )  # fmt: skip
        else:
            self._complete = False


def _make_record(steps, bound, scratch):
    """The `_Record` of a direct call's `steps` (as `Call` kept them, pointers as tensors
    or addresses), with each pointer named by `bound` (tensors, by identity) or `scratch`
    (addresses in its allocation); None where one cannot be: an address outside both, or
    bound tensors that share an address (a later call's may not)."""
    ptrs = {id(t): i for i, t in enumerate(bound)}
    starts = [t.data_ptr() for t in bound]
    if len(set(starts)) != len(starts):
        return None
    lo = scratch._ptr if scratch is not None and scratch.addresses else None
    hi = None if lo is None else lo + _layouts[scratch.key][0]

    def name(a):
        """(source, offset) of a pointer argument, or None where it is not one; raises
        LookupError for an address that cannot be named."""
        if type(a) is torch.Tensor:
            i = ptrs.get(id(a))
            if i is not None:
                return i, 0
            a = a.data_ptr()
        elif type(a) is not int:
            return None
        if lo is not None and lo <= a < hi:
            return -1, a - lo
        if a in starts or not _I32[0] <= a < 2**32:
            raise LookupError(a)  # an address (or an int of that size) we cannot name
        return None

    out = []
    try:
        for step in steps:
            if step[0] == "launch":
                _, fn, grid, stream, head, tail, args = step
                fixed, places = list(args), []
                for place, a in enumerate(args):
                    named = name(a)
                    if named is not None:
                        fixed[place] = 0
                        places.append((place, *named))
                    elif type(a) is torch.Tensor:
                        raise LookupError(a)
                out.append(("launch", fn, grid, stream, head, tail, tuple(fixed), tuple(places)))
            elif step[0] == "fill":
                named = name(step[1])
                if named is None:
                    raise LookupError(step[1])
                out.append(("fill", *named, step[2], step[3]))
            else:
                out.append(step)
    except LookupError:
        return None
    return _Record(tuple(out), hi - lo if lo is not None else SCRATCH_ALIGN, len(bound))


_interned = {}  # LaunchKey -> itself: one object per distinct key (`launch_key`)


def launch_key(*parts):
    """The `launch` key of a call, from hashable `parts`: hashed once here, and one shared
    object per distinct value, so each of the call's launches finds its plan by identity
    (comparing parts such as tuning dataclasses on every launch would cost microseconds)."""
    key = LaunchKey(*parts)
    return _interned.setdefault(key, key)


class LaunchKey:
    """A `launch` key (see `launch_key`): a tuple of parts with its hash kept."""

    __slots__ = ("parts", "_hash")

    def __init__(self, *parts):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return type(other) is LaunchKey and self._hash == other._hash and self.parts == other.parts

    def __repr__(self):
        return f"LaunchKey{self.parts!r}"


_per_key = {}  # (caller key, function, device) -> its value (`per_key`)


def per_key(key, device, fn, *args):
    """fn(*args), computed once per (key, fn, device): for what a call's launch key and
    device determine (grids, sizes, scalar arguments, launch keywords), which a wrapper
    would otherwise recompute on every call. With key None, computed every time. Under
    ATTNBENCH_CHECK_LAUNCH_KEYS=1 (the tests) every call recomputes it and raises when the
    value differs: the key failed to determine it."""
    if key is None:
        return fn(*args)
    memo = (key, fn, device)
    value = _per_key.get(memo)
    if value is None:
        value = _per_key[memo] = fn(*args)
    elif CHECK_LAUNCH_KEYS and fn(*args) != value:
        raise RuntimeError(f"{fn.__name__}: launch key {key!r} does not determine its value")
    return value


# A call's temporaries in one allocation.
#
# Each `torch.empty` on a CUDA device goes through the caching allocator (a lock, a search of
# its free blocks, bookkeeping) and the dispatcher: microseconds of host time, and an eager
# call makes a dozen of them for buffers that live only until it returns. A `Scratch` hands
# out those buffers as views of one allocation instead. Which buffers a call needs (their
# shapes and dtypes, in order) is determined by the same key as its launches, so the first
# call with a key allocates each buffer on its own and records the sequence; later calls
# with that key allocate the recorded total once and carve the views from it, each a
# multiple of SCRATCH_ALIGN bytes past its start (CUDA allocations start on 512-byte
# boundaries, so every view is as aligned as its own allocation would be, which Triton
# specializes on). A request that differs from the recorded one at its place
# raises: the key failed to determine the allocations.
SCRATCH_ALIGN = 256
_layouts = {}  # caller key -> (total bytes, ((shape, dtype, stride, byte offset), ...))


def _strides(shape):
    """Contiguous strides of `shape`, in elements."""
    stride, out = 1, []
    for n in reversed(shape):
        out.append(stride)
        stride *= max(n, 1)
    return tuple(reversed(out))


def new_buffer(shape, dtype, device):
    """An uninitialised tensor: every `Scratch` allocation goes through here, so that tests
    can poison them and show which elements a kernel reads before writing."""
    return torch.empty(shape, dtype=dtype, device=device)


class Scratch:
    """The temporaries of one call (module comment above).

    `Scratch(device, key, addresses)`; then `empty(shape, dtype)` per buffer, in the same
    order on every call with `key`, and `close()` once the call has made all of them (only a
    closed first call records its layout). With key None, `empty` is `torch.empty`. Buffers
    are uninitialised, as `torch.empty`'s; all of them share one lifetime: the allocation is
    freed once every view of it, and the Scratch, are. addresses: the call is direct
    (`Call.direct`): once the layout is recorded, `empty` returns each buffer's device
    address (an int, for a launch's pointer argument) instead of a view, unless asked for a
    tensor; the caller keeps the Scratch until its launches are queued.
    """

    __slots__ = ("device", "key", "_layout", "_views", "_made", "_i", "_addresses", "_ptr")

    def __init__(self, device, key=None, addresses=False):
        self.device, self.key, self._i, self._ptr = device, key, 0, None
        self._layout = _layouts.get(key) if key is not None else None
        self._views = None  # one view of the allocation per dtype, made on first use
        self._made = [] if key is not None and self._layout is None else None
        self._addresses = addresses and self._layout is not None

    @property
    def addresses(self):
        """Whether `empty` returns addresses (a direct call with a recorded layout)."""
        return self._addresses

    def empty(self, shape, dtype, tensor=False):
        """An uninitialised `dtype` buffer of `shape` (a tuple of ints), contiguous: a tensor,
        or its address (an int) for a Scratch made with addresses, unless `tensor`."""
        layout = self._layout
        if layout is None:
            x = new_buffer(shape, dtype, self.device)
            if self._made is not None:
                self._made.append((tuple(shape), dtype))
            return x
        total, parts = layout
        i = self._i
        if i >= len(parts) or parts[i][0] != shape or parts[i][1] is not dtype:
            raise RuntimeError(
                f"scratch request {i} ({tuple(shape)}, {dtype}) differs from the layout "
                f"recorded for key {self.key!r}"
            )
        self._i = i + 1
        _, _, stride, offset = parts[i]
        views = self._views
        if views is None:
            self.allocate()
            views = self._views
        if self._addresses and not tensor:
            return self._ptr + offset
        base = views.get(dtype)
        if base is None:
            base = views[dtype] = views[torch.uint8].view(dtype)
        return base.as_strided(shape, stride, offset // base.element_size())

    @property
    def allocated_bytes(self):
        """The size of the allocation `allocate` makes: the recorded layout's, 0 without one."""
        return 0 if self._layout is None else self._layout[0]

    def allocate(self):
        """Make the call's one allocation now, where the layout is recorded (it is made at the
        first `empty` otherwise): where it sits among the call's other allocations is then
        the caller's choice. Returns its device address, None without a layout."""
        if self._layout is None:
            return None
        if self._views is None:
            buffer = new_buffer((self._layout[0],), torch.uint8, self.device)
            self._views, self._ptr = {torch.uint8: buffer}, buffer.data_ptr()
        return self._ptr

    def close(self):
        """The call made every buffer: on the first call with the key, record the layout."""
        if self._made is not None and self.key not in _layouts:
            parts, total = [], 0
            for shape, dtype in self._made:
                parts.append((shape, dtype, _strides(shape), total))
                nbytes = dtype.itemsize
                for n in shape:
                    nbytes *= n
                total += -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
            _layouts[self.key] = (max(total, SCRATCH_ALIGN), tuple(parts))
        elif self._layout is not None and self._i != len(self._layout[1]):
            raise RuntimeError(
                f"the call made {self._i} scratch buffers, the layout recorded for key "
                f"{self.key!r} has {len(self._layout[1])}"
            )


@functools.cache
def _memset_d32():
    """The CUDA driver's cuMemsetD32Async (libcuda, the library Triton's launcher calls)."""
    fn = ctypes.CDLL("libcuda.so.1").cuMemsetD32Async
    fn.argtypes = (ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def fill_int32(address, value, count, stream):
    """Set `count` int32 words at device `address` (an int) to `value`, queued on `stream`
    (a raw stream handle, as `Call` keeps it); captured as a memset node under a CUDA graph
    capture. One driver call: a direct call's fill of a scratch buffer, where `fill_` on a
    tensor view would also make the view and go through torch's dispatcher and a kernel
    launch."""
    err = _memset_d32()(address, value & 0xFFFFFFFF, count, stream)
    if err:
        raise RuntimeError(f"cuMemsetD32Async failed: CUDA driver error {err}")


def aligned(*tensors):
    """Which of `tensors` start on a 16-byte boundary (what Triton specializes a pointer
    on), as one int, bit i for tensor i: the part of a `launch` key that the inputs' data
    pointers decide."""
    bits = 0
    for i, x in enumerate(tensors):
        if x is not None and x.data_ptr() & 15 == 0:
            bits |= 1 << i
    return bits


def _run(plan, grid, stream, args):
    """Call a plan's compiled launcher on `grid` and `stream` with the runtime `args`."""
    compiled, tail = plan
    # No profiler hooked in: the launcher calls nothing.
    if not _hooks_set():
        enter = leave = meta = None
    else:
        enter, leave = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
        meta = compiled.launch_metadata(grid, stream, *args, *tail)
    n = len(grid)
    # Tensors go to the launcher as their addresses. Given a tensor, Triton's launcher calls
    # its data_ptr() and then asks the driver whether that address is device memory
    # (cuPointerGetAttribute), for every pointer of every launch; an integer it passes as
    # it is. The callers have checked their tensors' devices before launching.
    compiled.run(
        grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
        compiled.packed_metadata, meta, enter, leave,
        *[a.data_ptr() if type(a) is torch.Tensor else a for a in args], *tail,
    )  # fmt: skip
    return compiled
