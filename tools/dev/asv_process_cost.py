#!/usr/bin/env python3
"""Where one asv benchmark process spends its time, on this machine.

    python3 -m tools.dev.asv_process_cost [--out DIR] [NAME ...]

asv (launch method forkserver, asv.conf.json) imports the suite once in a server and forks
one child per (benchmark method, parameter point); each child runs `setup`, the method and
`teardown`. This does the same, without asv: it imports `benchmarks`, then for each NAME
(`module.Class.method(param, ...)`, the form asv prints; default: one point of every class
of the active suite) forks a child that runs the point under cProfile. It prints one line
per point (wall seconds of the child: setup, method) and writes the 25 most expensive calls
(cumulative) per point, and the modules the child imported that the parent had not
(candidates for `benchmarks.common.warm_process_caches`), to DIR/process_cost.txt. Each
point runs twice: the first child may compile Triton kernels into the on-disk cache, the
second shows what asv's later processes pay. A class with a `setup_cache` (its correctness
checks, which asv runs once per class and commit) gets it run first in a child of its own,
timed on a line of its own, and its result handed to the point's children as asv does.
"""

import argparse
import ast
import cProfile
import io
import os
import pickle
import pstats
import sys
import time
from pathlib import Path

DEFAULT_POINTS = (
    "nsa.NsaForward.track_time(4096, 'triton', 'seed', 'recent')",
    "nsa.NsaForward.track_peak_vram_bytes(32768, 'triton', 'seed', 'random')",
    "nsa.NsaBackward.track_time(32768, 'triton', 'seed', 'random')",
    "kda.KdaVerify.track_time(1, 'unfused', 'safe', 'H8-HV8')",
    "kda.KdaVerify.track_time_cold(64, 'fused+ring', 'safe', 'H8-HV8')",
    "nsa.NsaBackward.track_peak_vram_bytes(4096, 'triton', 'paper', 'recent')",
)


def parse(name):
    """'mod.Class.method(a, b)' -> (module, class, method, params)."""
    head, _, args = name.partition("(")
    module, cls, method = head.split(".")
    params = ast.literal_eval("(" + args.rstrip(")") + ",)") if args.strip(")") else ()
    return module, cls, method, params


def instance(name):
    import importlib

    module, cls, _, _ = parse(name)
    return getattr(importlib.import_module(f"benchmarks.{module}"), cls)()


def run_child(name, fh, cache_file=None):
    """In a forked child: one point under cProfile; the report goes to `fh`. `cache_file`:
    the pickled result of the class's setup_cache, passed to setup first."""
    _, _, method, params = parse(name)
    before = set(sys.modules)
    bench = instance(name)
    args = params
    if cache_file is not None:
        args = (pickle.loads(cache_file.read_bytes()), *params)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    bench.setup(*args)
    t1 = time.perf_counter()
    getattr(bench, method)(*params)
    if hasattr(bench, "teardown"):
        bench.teardown(*params)
    prof.disable()
    t2 = time.perf_counter()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    imported = sorted(set(sys.modules) - before)
    fh.write(
        f"\n### {name}: setup {t1 - t0:.2f} s, method {t2 - t1:.2f} s\n"
        f"modules the child imported ({len(imported)}): {' '.join(imported)}\n{text.getvalue()}"
    )
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(DEFAULT_POINTS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import benchmarks.kda  # noqa: F401  (the forkserver's imports: nothing touches CUDA)
    import benchmarks.nsa  # noqa: F401

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "process_cost.txt"
    report.write_text("")
    print(f"{'point':<75} {'run':>3} {'fork->exit s':>12} {'setup s':>8} {'method s':>8}")
    for name in args.names:
        cache_file = None
        if hasattr(instance(name), "setup_cache"):
            cache_file = out / "setup_cache.pkl"
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                cache_file.write_bytes(pickle.dumps(instance(name).setup_cache()))
                os._exit(0)
            os.waitpid(pid, 0)
            label = name.partition("(")[0].rsplit(".", 1)[0] + ".setup_cache"
            print(f"{label:<75} {1:>3} {time.perf_counter() - t0:>12.2f}")
        for rep in (1, 2):
            r, w = os.pipe()
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                with open(report, "a") as fh:
                    setup_s, method_s = run_child(name, fh, cache_file)
                os.write(w, f"{setup_s} {method_s}".encode())
                os._exit(0)
            os.close(w)
            data = os.read(r, 100).decode().split()
            os.waitpid(pid, 0)
            wall = time.perf_counter() - t0
            setup_s, method_s = (float(x) for x in data) if data else (float("nan"),) * 2
            print(f"{name:<75} {rep:>3} {wall:>12.2f} {setup_s:>8.2f} {method_s:>8.2f}")
    print(f"profiles: {report}")


if __name__ == "__main__":
    main()
