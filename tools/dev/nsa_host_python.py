"""The NSA wrappers' own Python cost per call, with every Triton launch stubbed out.

    PYTHONPATH=src .venv/bin/python -m tools.dev.nsa_host_python [--seq-len 2048] [--profile]

Runs on any machine (meta or CPU tensors, no GPU, no interpreter): each `*_kernel` of the NSA
modules is replaced by a stub whose launch does nothing, so what is left is the host work
our code adds around the launches (argument checks, allocations, grid and constexpr
arithmetic, and `kernels._runtime.launch`'s key: from the second call on, each launch takes
its direct path). Triton's launcher and the device work are not in it: the suite's
`track_time_host` on a GPU measures the whole call (docs/benchmarks.md).
"""

import argparse
import cProfile
import pstats
import time

import torch
import triton


class _Compiled:
    """What a compiled kernel shows `kernels._runtime.launch`: its launcher does nothing
    (but append (name, runtime arguments) to `record`, a list, when given)."""

    function = packed_metadata = "stub"

    def __init__(self, name=None, record=None):
        self.name, self.record = name, record

    def run(self, *args):
        if self.record is not None:  # after grid, stream, function, metadata and hooks
            self.record.append((self.name, args[9:]))


class _Stub:
    """A JIT function whose launches do nothing; `fn` is the kernel's Python function (the
    launcher reads its signature). record: a list, or None: see `stub_launches`."""

    def __init__(self, jit, name=None, record=None):
        self.fn, self.name, self.record = jit.fn, name, record

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            compiled = _Compiled(self.name, self.record)
            if self.record is not None:
                self.record.append((self.name, args))
            return compiled

        return launch


def stub_launches(patch, modules, record=None):
    """Every `*_kernel` of `modules` (the NSA modules) replaced by a stub whose launch does
    nothing, as is the driver's memset (`_runtime.fill_int32`), and `kernels._runtime` set
    to run them as on CUDA device 0, stream 0, with no driver: each Call keeps its launch
    table and goes direct as on a GPU. patch: `setattr`, or a test's `monkeypatch.setattr`
    (undone after the test). record: a list, or None; given, every launch appends (kernel
    name, its runtime arguments as the launcher got them: tensors on the keyed path,
    addresses on the direct one)."""
    from kernels import _runtime
    from kernels.nsa import _checks

    for mod in modules:
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, triton.runtime.jit.KernelInterface) and name.endswith("_kernel"):
                patch(mod, name, _Stub(obj, name, record))  # a JIT function, or the interpreter's
    patch(_checks, "_devices", lambda named: None)  # CPU tensors stand in for CUDA ones
    patch(_runtime, "_current", lambda: (0, lambda device: 0))  # no driver: device 0, stream 0
    patch(_runtime, "_current_stream", lambda: (0, None, 0))
    patch(_runtime, "interpreter_active", lambda: False)
    call_init = _runtime.Call.__init__  # a Call on these tensors runs as on a CUDA device

    def cuda_call(self, key, device, replay=True):
        call_init(self, key, torch.device("cuda", 0), replay)

    patch(_runtime.Call, "__init__", cuda_call)
    patch(_runtime, "direct_supported", lambda kernel: True)  # the stubs go direct too
    patch(_runtime, "fill_int32", lambda address, value, count, stream: None)  # a memset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--profile", action="store_true", help="also print a cProfile listing")
    ap.add_argument("--profile-call", default="autograd recent", help="the call --profile lists")
    ap.add_argument(
        "--device",
        choices=("cpu", "meta"),
        default="meta",
        help="where the tensors live: meta (default) allocates no memory, so allocations and "
        "fills cost what their Python and dispatch cost, as on a GPU, but every meta tensor "
        "is at address 0, so no direct call is recorded and none replayed "
        "(`kernels._runtime.Call.replay`); cpu replays as a GPU does, and also allocates memory",
    )
    args = ap.parse_args()

    import kernels.nsa as nsa
    from kernels.nsa import backward, block_major, forward, inverse, tiles

    stub_launches(setattr, (tiles, forward, block_major, backward, inverse))

    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, args.seq_len, 64, 64, 16  # the seed shape
    g = torch.Generator().manual_seed(0)
    q, do = (torch.randn(B, Hq, T, D, generator=g).bfloat16().to(args.device) for _ in range(2))
    k, v = (torch.randn(B, Hkv, T, D, generator=g).bfloat16().to(args.device) for _ in range(2))
    calls = {}
    for pattern in ("recent", "random"):
        if pattern == "recent":
            idx = nsa.make_block_idx_recent(B, Hkv, T, bs, S, "cpu")
        else:
            idx = nsa.make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=0)
        idx = idx.to(args.device)
        o, lse = nsa.selection_forward_triton(q, k, v, idx, bs, return_lse=True)
        calls[f"forward {pattern}"] = lambda idx=idx: nsa.selection_forward_triton(
            q, k, v, idx, bs, return_lse=True
        )
        calls[f"backward {pattern}"] = lambda idx=idx, o=o, lse=lse: nsa.selection_backward_triton(
            q, k, v, idx, bs, do, o, lse
        )
        leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))

        def autograd_step(idx=idx, leaves=leaves):
            out = nsa.selection_attention(*leaves, idx, bs)
            return torch.autograd.grad(out, leaves, do)

        calls[f"autograd {pattern}"] = autograd_step
    print(f"seed shape, T={T}, {args.device} tensors, launches stubbed: us of host Python per call")
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        best = float("inf")  # the least of 5 repeats: this box's other load only adds
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / args.calls)
        print(f"  {name:18} {best * 1e6:7.1f}")
    if args.profile:
        fn = calls[args.profile_call]
        prof = cProfile.Profile()
        prof.runcall(lambda: [fn() for _ in range(args.calls)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
