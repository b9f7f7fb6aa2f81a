"""Probe: fused snapshot-mode tiles at the large batches, both head shapes, against unfused.

    PYTHONPATH=src:. python -m tools.dev.gpu_kda_snapshot_tiles --out DIR   (about 2 min, H200)

For each (HV, B) of --points and each candidate tile of the fused kernel's snapshot mode
(--tiles BLOCK_V/SUB_V/warps/stages/key chunk, "plain" for none, forced through `tuning=`),
checks
bf16 correctness once (tools/gpu_check_kda.check_mode), then times seed-style and cold
(tools/gpu_check_kda.time_mode) in --rounds interleaved rounds beside the default fused and
unfused calls, and prints the median of the rounds. Writes DIR/kda_snapshot_tiles.json.
"""

import argparse
import dataclasses
import json
import os
import statistics

from tools import gpu_check_kda as chk  # first: puts src/ on the path

# isort: split
import kernels.kda.tuning as kt


def forced(bv, sub, nw, st, kc):
    v = dataclasses.replace(
        kt.DEFAULT.verify, block_v=bv, sub_v=sub, num_warps=nw, stages=st, key_chunk=kc or chk.K
    )
    return dataclasses.replace(kt.DEFAULT, verify=v)


def parse_tile(text):
    """A tile written BLOCK_V/SUB_V/warps/stages/key chunk, e.g. 32/32/4/1/plain, as
    (32, 32, 4, 1, None)."""
    bv, sub, nw, st, kc = text.split("/")
    return int(bv), int(sub), int(nw), int(st), None if kc == "plain" else int(kc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--points", nargs="+", default=["8:32", "8:64", "16:32", "16:64"])
    ap.add_argument("--tiles", nargs="+", default=["32/32/4/1/plain", "32/32/8/1/plain"])
    ap.add_argument("--gate", default="std", choices=list(chk.GATES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args()
    lb = chk.GATES[args.gate]
    rows = []
    for point in args.points:
        HV, B = map(int, point.split(":"))
        variants = [("default fused", "fused", None), ("default unfused", "unfused", None)]
        for name in args.tiles:
            tn = forced(*parse_tile(name))
            m, ok = chk.check_mode("fused", B, HV, lb, tn)
            if not ok:
                chk.log(f"  FAIL {name} HV={HV} B={B}: {m}")
                continue
            variants.append((name, "fused", tn))
        sets = chk.cold_sets(B, HV, 100)
        samples = {name: ([], []) for name, _, _ in variants}
        for _ in range(args.rounds):
            for name, mode, tn in variants:
                seed, cold = chk.time_mode(mode, sets, B, HV, lb, args.iters, tn)
                samples[name][0].append(seed)
                samples[name][1].append(cold)
        base = statistics.median(samples["default unfused"][1])
        for name, (seed, cold) in samples.items():
            row = dict(HV=HV, B=B, gate=args.gate, variant=name, seed_us=statistics.median(seed),
                       cold_us=statistics.median(cold), seed_all=seed, cold_all=cold)  # fmt: skip
            rows.append(row)
            chk.log(
                f"{args.gate} HV={HV:>2} B={B:>3} {name:>18}: seed {row['seed_us']:7.2f}  cold "
                f"{row['cold_us']:7.2f}  cold / unfused {row['cold_us'] / base:.3f}"
            )
        sets = None
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "kda_snapshot_tiles.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
