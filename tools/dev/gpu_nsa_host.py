"""Where an eager NSA call's host time goes: per point, the suite's host, eager and graph
figures, the device operations one call queues (torch.profiler) and the largest entries of
a cProfile of 50 calls.

    PYTHONPATH=.:src python3 -m tools.dev.gpu_nsa_host [--out DIR] [T ...]   (about 1 min)

Seed shape (B=1, Hq=16, Hkv=4, D=64, bs=64, S=16), bf16, both patterns; T defaults to 2048
8192 32768. Calls: the autograd step (`selection_attention`, then `torch.autograd.grad` of
q, k and v, as the suite's NsaAutograd), the same step through an autograd Function that
runs no kernel (`autograd_floor`: what autograd itself costs), the step with the engine's
multithreading off (`autograd_serial`: the backward on the calling thread, not on the
engine's device thread), the forward, the backward with lse given, and the backward with
lse=None. Prints one table (µs per call), then, at the first T, the autograd step's host
time split between our forward and backward and the rest (timers around the
`checked_forward` and `checked_backward` that `SelectionAttention` calls below its
checks), with the engine's threads on and off. With --out, writes host.json, cprofile.txt
(a cProfile listing per call) and torch_profile.txt (a torch.profiler table per call,
every thread) to DIR.

    ... [--calls forward backward ...] [--vs FIELD=VALUE ...]

--calls: only these calls. --vs: every call again, right after the default one on the same
inputs, with those NSA tuning fields set (`kernels.nsa.tuning.with_fields`, e.g.
overlap_tile_kernel=False): an A/B within one process, whose host figures move less between
its two sides than between two processes; its rows are named CALL[FIELD=VALUE,...].

    ... [--host-warm]

--host-warm: each row's host figure again with one untimed call at the start of every
slept round (`host_seconds(..., warm_calls=1)`), printed as `warm`: how much of the host
figure is the wake-up of what the round's synchronize left idle (autograd's device thread).

    ... [--rounds N]

--rounds: each point's rows timed in N interleaved rounds, each round starting one row
later (`interleaved`); the table gives each figure's median over the rounds, host.json
each round's figures too. With one round (the default) the rows run once, in order, and
the first rows take whatever drift the process has.

    ... [--backward-from FILE ...]

--backward-from: another version of `kernels/nsa/backward.py` (e.g. `git show
REV:src/kernels/nsa/backward.py > FILE`), loaded beside this tree's as a module of
`kernels.nsa` (`load_sibling`: its relative imports take this tree's modules, its launch
keys are its own); the backward with lse given runs again through it, in rows named
backward[FILE's stem]. An A/B of a wrapper's versions in one process, kernels and runtime
shared, for a graph or host change that the kernels alone do not explain. A loaded file's
rows may sit apart from the tree's own by an offset of the loading itself (docs/perf/nsa.md
v41): load every version under comparison, this tree's included, and compare those rows.
"""

import argparse
import ast
import cProfile
import importlib.util
import io
import json
import math
import pathlib
import pstats
import re
import statistics
import sys
import time

import torch

import kernels.nsa.autograd as nsa_autograd
from benchmarks.common import eager_seconds, host_calls, host_seconds, per_call_seconds
from kernels.nsa import (
    make_block_idx_random,
    make_block_idx_recent,
    selection_attention,
    selection_backward_triton,
    selection_forward_triton,
)
from kernels.nsa import tuning as nsa_tuning
from tools.dev.asv_process_cost import side_order

B, HQ, HKV, D, BS, S = 1, 16, 4, 64, 64, 16
SETS = 3


def inputs(T, pattern, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (
        torch.randn(B, n, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for n in (HQ, HKV, HKV, HQ)
    )
    if pattern == "recent":
        idx = make_block_idx_recent(B, HKV, T, BS, S, device="cuda")
    else:
        idx = make_block_idx_random(B, HKV, T, BS, S, device="cuda", seed=seed)
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True)
    return dict(q=q, k=k, v=v, idx=idx, do=do, o=o, lse=lse)


class _Floor(torch.autograd.Function):
    """What autograd costs around our kernels: the same inputs, saved tensors and outputs
    as `selection_attention`, and no kernel (outputs allocated, never written)."""

    @staticmethod
    def forward(ctx, q, k, v, idx, block_size):
        o = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, idx, o, torch.empty(q.shape[:3], device=q.device))
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None


def calls(x, tuning=None):
    """The calls of one input set x, with `tuning` (an NsaTuning; None: the default)."""
    qkv = (x["q"], x["k"], x["v"])
    leaves = tuple(t.detach().requires_grad_(True) for t in qkv)
    tn = dict(tuning=tuning)

    def autograd_step():
        o = selection_attention(*leaves, x["idx"], BS, **tn)
        return torch.autograd.grad(o, leaves, x["do"])

    def autograd_serial():
        with torch.autograd.set_multithreading_enabled(False):
            o = selection_attention(*leaves, x["idx"], BS, **tn)
            return torch.autograd.grad(o, leaves, x["do"])

    def autograd_floor():
        o = _Floor.apply(*leaves, x["idx"], BS)
        return torch.autograd.grad(o, leaves, x["do"])

    return {
        "autograd": autograd_step,
        "autograd_serial": autograd_serial,
        "autograd_floor": autograd_floor,
        "forward": lambda: selection_forward_triton(*qkv, x["idx"], BS, **tn),
        "backward": lambda: selection_backward_triton(
            *qkv, x["idx"], BS, x["do"], x["o"], x["lse"], **tn
        ),
        "backward_lse_none": lambda: selection_backward_triton(
            *qkv, x["idx"], BS, x["do"], x["o"], None, **tn
        ),
    }


def parse_fields(pairs):
    """{FIELD: value} of FIELD=VALUE strings (values as Python literals), checked against the
    NSA tuning's fields; None when there are none."""
    if not pairs:
        return None
    fields = {}
    for kv in pairs:
        name, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--vs takes FIELD=VALUE, got {kv!r}")
        fields[name] = ast.literal_eval(value)
    try:
        nsa_tuning.with_fields(**fields)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    return fields


def load_sibling(path):
    """The module in `path` (a version of one of kernels.nsa's modules), loaded as
    kernels.nsa._from_<stem>: a module of that package, so its relative imports resolve to
    this tree's modules, and its launch keys (`_runtime.launch_key` names the module) its
    own."""
    path = pathlib.Path(path)
    name = "kernels.nsa._from_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Triton reads a kernel's source through its module
    spec.loader.exec_module(mod)
    return mod


def sibling_backward(mod, x):
    """The backward with lse given on input set x, through module `mod`."""
    qkv = (x["q"], x["k"], x["v"])
    return lambda: mod.selection_backward_triton(*qkv, x["idx"], BS, x["do"], x["o"], x["lse"])


def device_ops(fn):
    """Kernels, memsets and copies one call queues (torch.profiler, CUDA activity)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def torch_listing(fn, n=20):
    """torch.profiler's CPU and CUDA tables of n calls, by self CPU time: unlike cProfile it
    sees every thread, so the autograd engine's worker (which runs the backward) too."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)


def host_listing(fn, n=50):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    return s.getvalue()


def autograd_split(fns, ops):
    """(host µs per step, µs in the forward, µs in the backward): the suite's host timer
    around the steps, and perf_counter around `checked_forward` and `checked_backward` as
    `SelectionAttention` calls them (summed over every call the timer made, per step)."""
    spent = {"forward": 0.0, "backward": 0.0, "calls": 0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
                spent["calls"] += name == "forward"

        return wrapper

    saved = nsa_autograd.checked_forward, nsa_autograd.checked_backward
    nsa_autograd.checked_forward = timed("forward", saved[0])
    nsa_autograd.checked_backward = timed("backward", saved[1])
    try:
        for f in fns:  # warm, untimed
            f()
        torch.cuda.synchronize()
        spent.update(forward=0.0, backward=0.0, calls=0)
        host = statistics.median(host_seconds(fns, ops + 8)) * 1e6
    finally:
        nsa_autograd.checked_forward, nsa_autograd.checked_backward = saved
    n = max(spent["calls"], 1)
    return host, spent["forward"] / n * 1e6, spent["backward"] / n * 1e6


def interleaved(n, rounds, time_row):
    """Each of rows 0..n-1 timed in `rounds` rounds by `time_row(i)` (a dict of figures):
    returns [row i's figures of each round] in row order. Round r times the rows in turn
    from row r mod n, so a drift within the process (clocks, heat, the allocator's state)
    falls on every row alike rather than on the rows timed first."""
    out = [[] for _ in range(n)]
    for r in range(1, rounds + 1):
        for i in side_order(list(range(n)), r):
            out[i].append(time_row(i))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("T", nargs="*", type=int, default=[2048, 8192, 32768])
    ap.add_argument("--calls", nargs="+", default=None, help="only these calls")
    ap.add_argument("--vs", nargs="+", default=None, help="FIELD=VALUE: a tuning A/B")
    ap.add_argument(
        "--backward-from", nargs="+", default=[], metavar="FILE",
        help="another version of kernels/nsa/backward.py: the backward again through it",
    )  # fmt: skip
    ap.add_argument(
        "--host-warm", action="store_true",
        help="a second host figure per row, with one untimed call first in each slept round",
    )  # fmt: skip
    ap.add_argument(
        "--rounds", type=int, default=1,
        help="time the rows of each point in this many interleaved rounds (medians printed)",
    )  # fmt: skip
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    others = [(pathlib.Path(f).stem, load_sibling(f)) for f in a.backward_from]
    fields = parse_fields(a.vs)
    variants = [("", None)]
    if fields:
        label = ",".join(f"{k}={v}" for k, v in fields.items())
        variants.append((f"[{label}]", nsa_tuning.with_fields(**fields)))
    out = pathlib.Path(a.out) if a.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        for path in ("cprofile.txt", "torch_profile.txt"):
            (out / path).write_text("")
    rows = []
    warm_head = f" {'warm':>8}" if a.host_warm else ""
    print(
        f"{'T':>6} {'pattern':8} {'call':18} {'ops':>4} {'host':>8} {'eager':>8} {'graph':>8}"
        + warm_head
    )
    for T in a.T:
        for pattern in ("recent", "random"):
            xs = [inputs(T, pattern, seed) for seed in range(SETS)]
            sets = [calls(x) for x in xs]
            runs = [
                (name + tag, [calls(x, tn)[name] for x in xs] if tn else [s[name] for s in sets])
                for name in sets[0]
                if a.calls is None or name in a.calls
                for tag, tn in variants
                if not (tn and name == "autograd_floor")  # runs none of our code
            ]  # fmt: skip
            if a.calls is None or "backward" in a.calls:
                runs += [(f"backward[{stem}]", [sibling_backward(mod, x) for x in xs])
                         for stem, mod in others]  # fmt: skip
            ops = [device_ops(fns[0]) for _, fns in runs]

            def time_row(i):
                """Row i's host, eager and graph figures, us per call (medians of samples)."""
                name, fns = runs[i]
                med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
                # The autograd step cannot be captured (the engine runs it on its own
                # thread): no graph figure.
                graph = math.nan
                if not name.startswith("autograd"):
                    graph = med(per_call_seconds(fns, calls=2 * SETS))
                fig = dict(host_us=med(host_seconds(fns, ops[i] + 8)),
                           eager_us=med(eager_seconds(fns)), graph_us=graph)  # fmt: skip
                if a.host_warm:
                    warm = host_calls(ops[i] + 8) >= 2  # room for a warm and a timed call
                    fig["host_warm_us"] = (
                        med(host_seconds(fns, ops[i] + 8, warm_calls=1)) if warm else math.nan
                    )
                return fig

            for i, each in enumerate(interleaved(len(runs), a.rounds, time_row)):
                name = runs[i][0]
                fig = {k: statistics.median(f[k] for f in each) for k in each[0]}
                extra = {"rounds": each} if a.rounds > 1 else {}
                rows.append(dict(T=T, pattern=pattern, call=name, ops=ops[i], **fig, **extra))
                line = f"{T:>6} {pattern:8} {name:18} {ops[i]:>4} {fig['host_us']:8.1f}"
                warm = f" {fig['host_warm_us']:8.1f}" if a.host_warm else ""
                print(f"{line} {fig['eager_us']:8.1f} {fig['graph_us']:8.1f}{warm}", flush=True)
            for name, fns in runs:
                if out and pattern == "recent" and T == a.T[0]:
                    # One file per kind of listing, a section per call: three files in
                    # all, few enough for a device call's returned files.
                    for path, listing in (("cprofile.txt", host_listing),
                                          ("torch_profile.txt", torch_listing)):  # fmt: skip
                        with open(out / path, "a") as f:
                            f.write(f"=== {name}, T={T} {pattern}\n{listing(fns[0])}\n")
            if T == a.T[0] and a.calls is None and fields is None:
                print(
                    f"  autograd split, T={T} {pattern}: host per step / in forward wrapper /"
                    " in backward wrapper / rest (us)"
                )
                for name in ("autograd", "autograd_serial"):
                    fns = [s[name] for s in sets]
                    host, fwd, bwd = autograd_split(fns, device_ops(fns[0]))
                    print(
                        f"    {name:16} {host:8.1f} {fwd:8.1f} {bwd:8.1f} {host - fwd - bwd:8.1f}"
                    )
                    rows.append(
                        dict(
                            T=T,
                            pattern=pattern,
                            call=name + "_split",
                            host_us=host,
                            forward_wrapper_us=fwd,
                            backward_wrapper_us=bwd,
                        )
                    )
    if out:
        (out / "host.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
