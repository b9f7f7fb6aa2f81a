"""A/B of KDA verify tuning settings in one process: checks, then cold timings alternated.

    PYTHONPATH=src python3 -m tools.dev.gpu_kda_ab --set A 'PART.FIELD=VALUE ...' --set B '...'
        [--batch 1 16 64] [--modes fused fused+ring] [--rounds 2]

PART is `verify`, `recurrent` or `conv` (the parts of kernels.kda.tuning.KdaTuning), FIELD
one of its fields, VALUE a Python literal (None included); a setting is
`dataclasses.replace` of DEFAULT's parts, passed to every call as `tuning=`. Each setting is
first checked in bf16 against the reference at B = 4 and 64 (`gpu_check_kda.check_mode`,
every mode, safe gate) and for ring bit-equality at B = 64, and o's relative error is
printed for each (with fp32 inputs too, B = 64, the timed modes); then, per batch and mode,
the settings are timed in turn, `--rounds` times, on the same cold buffer sets
(`gpu_check_kda`: a CUDA graph of calls over enough input sets that no call finds its state
in L2; median of 5 samples), and the best round of each is printed with its ratio to the
first setting. Timing the settings in one process, interleaved, takes the card and the
process out of the comparison.
"""

import argparse
import ast
import dataclasses
import json
import statistics

import torch

from tools import gpu_check_kda as chk  # first: puts src/ on the path

# isort: split
from kernels.kda import tuning as kt

PARTS = ("verify", "recurrent", "conv")
MODES = ("unfused", "unfused+ring", "fused", "fused+ring")


def parse(spec):
    """A KdaTuning: DEFAULT with the spec's PART.FIELD=VALUE items replaced."""
    fields = {part: {} for part in PARTS}
    for item in spec.split():
        target, value = item.split("=", 1)
        part, name = target.split(".", 1)
        if part not in PARTS or name not in {
            f.name for f in dataclasses.fields(getattr(kt.DEFAULT, part))
        }:
            raise SystemExit(f"unknown tuning field {target}")
        fields[part][name] = ast.literal_eval(value)
    return kt.KdaTuning(
        **{part: dataclasses.replace(getattr(kt.DEFAULT, part), **fields[part]) for part in PARTS}
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", nargs=2, action="append", metavar=("NAME", "KNOBS"), required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    settings = {name: parse(spec) for name, spec in args.set}

    bad = []
    errs = {}
    for name, tn in settings.items():
        for B in (4, 64):
            for mode in MODES:
                m, ok = chk.check_mode(mode, B, 8, -5.0, tn)
                errs[f"{name} {mode} B={B} bf16"] = m["o_err"]
                if not ok:
                    bad.append(f"{name} {mode} B={B}")
        if not all(chk.check_ring_bits(64, 8, -5.0, tn).values()):
            bad.append(f"{name} ring bits")
        # o's relative error with fp32 inputs too (the checks above are bf16's).
        dt, chk.DT = chk.DT, torch.float32
        for mode in args.modes:
            errs[f"{name} {mode} B=64 fp32"] = chk.check_mode(mode, 64, 8, -5.0, tn)[0]["o_err"]
        chk.DT = dt
    print(json.dumps({"checks_ok": not bad, "failed": bad}), flush=True)
    print(json.dumps({"o_err": {k: f"{v:.2e}" for k, v in errs.items()}}), flush=True)
    first = next(iter(settings))
    for B in args.batch:
        sets = chk.cold_sets(B, 8, 200)
        for mode in args.modes:
            times = {}
            for _ in range(args.rounds):
                for name, tn in settings.items():
                    fns = [chk.runner(mode, s, B, 8, -5.0, tn) for s in sets]
                    us = statistics.median(chk.bench(fns, 20) for _ in range(5))
                    times.setdefault(name, []).append(us)
            best = {name: min(xs) for name, xs in times.items()}
            cells = " ".join(
                f"{n}={t:.2f} ({t / best[first]:.3f})" for n, t in best.items()
            )  # fmt: skip
            print(f"{mode} B={B} cold us: {cells}", flush=True)
        del sets


if __name__ == "__main__":
    main()
