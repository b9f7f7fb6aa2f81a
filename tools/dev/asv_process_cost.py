#!/usr/bin/env python3
"""Where one asv benchmark process spends its time, and what it measures, on this machine.

    python3 -m tools.dev.asv_process_cost [--out DIR] [--repeat 2] [--no-profile]
        [--spacer MIB] [--json FILE --tag TAG] [NAME ...]
    python3 -m tools.dev.asv_process_cost --side TAG=SRC --side TAG=SRC ... [--rounds 3]
        [--spacers 0,8,24] --out DIR NAME ...

asv (launch method forkserver, asv.conf.json) imports the suite once in a server and forks
one child per (benchmark method, parameter point); each child runs `setup`, the method and
`teardown`. This does the same, without asv: it imports `benchmarks`, then for each NAME
(`module.Class.method(param, ...)`, the form asv prints; default: one point of every class
of the active suite) forks `--repeat` children that run the point, under cProfile unless
`--no-profile`. It prints one line per child (wall seconds: setup, method; the figure the
method returned, the median of its samples for a timing) and writes the 25 most expensive
calls (cumulative) per child, and the modules the child imported that the parent had not
(candidates for `benchmarks.common.warm_process_caches`), to DIR/process_cost.txt. With
the default two children, the first may compile Triton kernels into the on-disk cache, the
second shows what asv's later processes pay. A class with a `setup_cache` (its correctness
checks, which asv runs once per class and commit) gets it run first in a child of its own,
timed on a line of its own, and its result handed to the point's children as asv does.
`--spacer MIB` makes each child allocate MIB MiB on the device before `setup`, kept until it
exits: every later allocation of the point, the graph's included, lands elsewhere.
`--json FILE` appends one record per child (tag, point, spacer, figure) to FILE.

`--side` answers "is this point's difference between two checkouts the code, or where its
buffers landed?": for each of `--rounds` rounds (the side that starts a round rotating),
each spacer and each side, it runs this tool in a fresh process with PYTHONPATH=SRC:<this
checkout> (that side's kernels with this checkout's suite, as asv pairs them; one child per
point, no profile). It then prints, per point and spacer, each side's per-process figures,
their median, and the ratio to the first side. A gate's flag that follows the spacer
rather than the side is placement, not code.
"""

import argparse
import ast
import cProfile
import io
import json
import os
import pickle
import pstats
import statistics
import subprocess
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
ROOT = Path(__file__).resolve().parents[2]


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


def figure(result):
    """The number asv stores for a method's return value: the median of a timing's samples,
    else the value itself."""
    if isinstance(result, dict) and "samples" in result:
        return statistics.median(result["samples"])
    return float(result)


def spacer_buffer(mib):
    """MIB MiB on the device the suite runs on (the CPU where CUDA is not available)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.empty(mib << 20, dtype=torch.uint8, device=device) if mib else None


def run_child(name, fh, cache_file=None, profile=True, spacer_mib=0):
    """In a forked child: one point (under cProfile if `profile`, its report to `fh`), after
    a spacer of `spacer_mib` MiB. `cache_file`: the pickled result of the class's
    setup_cache, passed to setup first. Returns (setup s, method s, figure)."""
    _, _, method, params = parse(name)
    before = set(sys.modules)
    spacer = spacer_buffer(spacer_mib)  # noqa: F841  (held until the child exits)
    bench = instance(name)
    args = params
    if cache_file is not None:
        args = (pickle.loads(cache_file.read_bytes()), *params)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    bench.setup(*args)
    t1 = time.perf_counter()
    value = figure(getattr(bench, method)(*args))
    if hasattr(bench, "teardown"):
        bench.teardown(*args)
    if prof:
        prof.disable()
    t2 = time.perf_counter()
    if prof:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
        imported = sorted(set(sys.modules) - before)
        fh.write(
            f"\n### {name}: setup {t1 - t0:.2f} s, method {t2 - t1:.2f} s\n"
            f"modules the child imported ({len(imported)}): {' '.join(imported)}\n"
            f"{text.getvalue()}"
        )
    return t1 - t0, t2 - t1, value


def in_children(names, out, repeat=2, profile=True, spacer_mib=0, json_file=None, tag=""):
    """The single-checkout mode: each point in `repeat` forked children (module comment)."""
    import benchmarks.kda  # noqa: F401  (the forkserver's imports: nothing touches CUDA)
    import benchmarks.nsa  # noqa: F401

    out.mkdir(parents=True, exist_ok=True)
    report = out / "process_cost.txt"
    report.write_text("")
    print(f"{'point':<75} {'run':>3} {'fork->exit s':>12} {'setup s':>8} {'method s':>8} figure")
    for name in names:
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
        for rep in range(1, repeat + 1):
            r, w = os.pipe()
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                with open(report, "a") as fh:
                    result = run_child(name, fh, cache_file, profile, spacer_mib)
                os.write(w, json.dumps(result).encode())
                os._exit(0)
            os.close(w)
            data = os.read(r, 1000).decode()
            os.waitpid(pid, 0)
            wall = time.perf_counter() - t0
            setup_s, method_s, value = json.loads(data) if data else (float("nan"),) * 3
            print(f"{name:<75} {rep:>3} {wall:>12.2f} {setup_s:>8.2f} {method_s:>8.2f} {value:.6g}")
            if json_file is not None and data:
                record = dict(tag=tag, point=name, spacer_mib=spacer_mib, figure=value)
                with open(json_file, "a") as fh:
                    fh.write(json.dumps(record) + "\n")
    if profile:
        print(f"profiles: {report}")


def side_order(sides, i):
    """Round i's order of the sides: rotated by one each round, so that each side starts a
    round in turn (round 1 in the given order)."""
    k = (i - 1) % len(sides)
    return sides[k:] + sides[:k]


def by_sides(sides, names, out, rounds, spacers):
    """The `--side` mode: `sides` [(tag, src)], fresh processes (module comment)."""
    out.mkdir(parents=True, exist_ok=True)
    times = out / "times.jsonl"
    times.write_text("")
    for i in range(1, rounds + 1):
        for spacer in spacers:
            for tag, src in side_order(sides, i):
                env = dict(os.environ, PYTHONPATH=f"{Path(src).resolve()}:{ROOT}")
                cmd = [
                    sys.executable, "-m", "tools.dev.asv_process_cost", "--no-profile",
                    "--repeat", "1", "--spacer", str(spacer), "--json", str(times),
                    "--tag", tag, "--out", str(out / f"{tag}_{i}_{spacer}"), *names,
                ]  # fmt: skip
                subprocess.run(cmd, env=env, cwd=ROOT, check=False)
    return summary(times, [tag for tag, _ in sides])


def summary(times, tags):
    """Per point and spacer: each side's per-process figures (as recorded: seconds for a
    timing, us printed), their median, and its ratio to the first side's. Returns the rows
    (point, spacer, {tag: [figures]})."""
    groups = {}
    for line in Path(times).read_text().splitlines():
        r = json.loads(line)
        groups.setdefault((r["point"], r["spacer_mib"]), {}).setdefault(r["tag"], []).append(
            r["figure"]
        )
    head = " | ".join(f"{t} (per process) | {t} median | ratio" for t in tags)
    print(f"\n| point | spacer MiB | {head} |")
    print("| --- | --- |" + " --- | --- | --- |" * len(tags))
    rows = []
    for (point, spacer), per_tag in groups.items():
        cells, first = [], None
        for t in tags:
            vals = per_tag.get(t, [])
            med = statistics.median(vals) if vals else float("nan")
            first = med if first is None else first
            shown = ", ".join(f"{v * 1e6:.1f}" for v in vals)
            cells.append(f"{shown} | {med * 1e6:.1f} | {med / first:.3f}")
        print(f"| {point} | {spacer} | " + " | ".join(cells) + " |")
        rows.append((point, spacer, per_tag))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=list(DEFAULT_POINTS))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--spacer", type=int, default=0, metavar="MIB")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tag", default="")
    ap.add_argument("--side", action="append", metavar="TAG=SRC")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spacers", default="0", metavar="MIB,MIB,...")
    args = ap.parse_args()
    out = Path(args.out)
    if args.side:
        sides = [tuple(s.split("=", 1)) for s in args.side]
        spacers = [int(x) for x in args.spacers.split(",")]
        by_sides(sides, args.names, out, args.rounds, spacers)
    else:
        in_children(args.names, out, args.repeat, args.profile, args.spacer, args.json, args.tag)


if __name__ == "__main__":
    main()
