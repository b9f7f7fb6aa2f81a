"""Where does process-to-process spread come from? Buffer placement, inside one process.

    PYTHONPATH=src:. python3 tools/gpu_placement_probe.py --out DIR [--placements 6]

The gate study (docs/measurement.md) finds that a point's median moves by up to ~0.5%
between fresh processes while its samples within one process agree to ~0.05%. One
candidate cause is where the allocator puts the benchmark's buffers (DRAM channels, L2
slices, TLB reach), which is fixed for a process and differs between processes. This probe
keeps one process and, for a few of the noisiest points of the default suite, rebuilds the
benchmark's inputs P times behind a spacer allocation of a different size each time, so
that each rebuild lands elsewhere in device memory. Each placement is timed twice back to
back with the suite's own timer (`benchmarks.common.per_call_seconds`, 10 samples).

If the spread over placements (CV of the first medians) is as large as the spread over
processes in `docs/perf/noise.md`, placement explains the process noise, and rotating
every timed point over several placements would shrink it; if it is much smaller, the
process noise has another cause. The repeat column (the two medians of one placement)
says how much of any spread is plain timer noise. Writes DIR/placement.json and .txt.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "src"))

from benchmarks import common as bc  # noqa: E402
from benchmarks import kda as kda_b  # noqa: E402
from benchmarks import nsa as nsa_b  # noqa: E402

LOG = []


def log(msg):
    print(msg, flush=True)
    LOG.append(msg)


def nsa_point(cls, params):
    inst = cls()
    inst.setup(*params)  # checks the kernel once

    def rebuild():
        inst.x = None
        inst.fn = None
        bc.free_memory()
        inst.x = inst.inputs(params[0], params[3], seed=0)
        inst.prepare()
        inst.peak_fn()
        bc.synchronize()

    return inst, rebuild, lambda: bc.median(inst.samples())


def kda_point(params, cold):
    inst = kda_b.KdaVerify()
    inst.setup(*params)

    def rebuild():
        inst.fn = None
        bc.free_memory()
        inst.fn = inst.call(seed=0)

    if cold:
        return inst, rebuild, lambda: bc.median(inst.cold_samples())
    return inst, rebuild, lambda: bc.median(bc.per_call_seconds([inst.fn], calls=kda_b.GRAPH_CALLS))


POINTS = {
    "NsaBackward.track_time(32768, triton, paper, recent)": lambda: nsa_point(
        nsa_b.NsaBackward, (32768, "triton", "paper", "recent")
    ),
    "NsaForward.track_time(32768, triton, seed, recent)": lambda: nsa_point(
        nsa_b.NsaForward, (32768, "triton", "seed", "recent")
    ),
    "KdaVerify.track_time(16, fused, safe, H8-HV8)": lambda: kda_point(
        (16, "fused", "safe", "H8-HV8"), cold=False
    ),
    "KdaVerify.track_time_cold(64, fused+ring, safe, H8-HV8)": lambda: kda_point(
        (64, "fused+ring", "safe", "H8-HV8"), cold=True
    ),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--placements", type=int, default=6)
    ap.add_argument("--points", nargs="+", default=list(POINTS))
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_end = time.time() + args.budget_s
    bc.warm_process_caches()
    log(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    cols = f"{'P':>2} {'median us':>10} {'CV % over P':>11} {'range %':>8} {'repeat %':>9}"
    log(f"{'point':<58} {cols}")
    result = []
    for name in args.points:
        if time.time() > t_end:
            log(f"{name}: skipped (budget)")
            continue
        firsts, repeats, spacers = [], [], []
        try:
            _, rebuild, timed = POINTS[name]()
            for p in range(args.placements):
                if time.time() > t_end:
                    break
                # A spacer of a different size each time moves the next allocations.
                spacers.append(torch.empty((p * 37 + 3) << 20, dtype=torch.uint8, device="cuda"))
                rebuild()
                a, b = timed(), timed()
                firsts.append(a)
                repeats.append(abs(a - b) / a)
        except Exception as e:  # keep the other points
            log(f"{name}: error {e!r}"[:300])
        rebuild = timed = None  # the closures hold the benchmark instance
        spacers.clear()
        bc.free_memory()
        if len(firsts) < 2:
            continue
        med = statistics.median(firsts)
        cv = statistics.stdev(firsts) / statistics.mean(firsts)
        rng = (max(firsts) - min(firsts)) / med
        rep = max(repeats)
        result.append(dict(point=name, medians_s=firsts, repeat_rel=repeats, cv=cv, range=rng))
        log(
            f"{name:<58} {len(firsts):>2} {med * 1e6:>10.2f} {cv * 100:>11.3f} "
            f"{rng * 100:>8.3f} {rep * 100:>9.3f}"
        )
    with open(os.path.join(args.out, "placement.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "placement.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
