"""A/B of two NSA checkouts on one GPU: bitwise outputs, graph and host time per call.

    PYTHONPATH=<checkout>/src:<repo> python3 -m tools.dev.gpu_nsa_ab run TAG --out DIR
        [--points 4096:recent 32768:random ...] [--tuning FIELD=VALUE ...]
                                                                (one process per checkout)
    python3 -m tools.dev.gpu_nsa_ab compare DIR TAG_A TAG_B
    python3 -m tools.dev.gpu_nsa_ab rounds --old OLD_SRC --new NEW_SRC --out DIR [--rounds 3]
        [--points ...] [--old-tuning F=V ...] [--new-tuning F=V ...]
                           (fresh processes, old and new alternating; compare, then summary)

`--tuning` passes `kernels.nsa.tuning.with_fields(FIELD=VALUE, ...)` to every call (VALUE
read as a Python literal, else a string), so that one checkout can be compared with itself
under two tunings (`--old` and `--new` the same src, `--old-tuning` one of them).

`run` builds the seed-shape inputs of each point from a fixed seed (B=1, Hq=16, Hkv=4,
D=64, block 64, S=16, bf16), saves the forward's o and lse and the backward's (lse given)
dq, dk and dv to DIR/TAG.pt, and times both calls with the suite's timers
(`benchmarks.common`: graph replay of 10 calls, and host time per call); `compare` says
whether each output is bitwise equal between the two runs and prints the times side by
side (medians of the samples, us). For a change meant to keep the results bit for bit,
such as a rework of the index inversion or the launch path.

A process's host figure moves by up to a third between processes on the H200 host, so one
process a side cannot show a change of a few tens of microseconds: `rounds` runs N fresh
processes a side, alternating (old1, new1, new2, old2, old3, ...), checks old1 against new1
bit for bit and prints, per call, the median graph time of each side and every process's
host figure (`summary`).
"""

import argparse
import ast
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from tools.dev.asv_process_cost import side_order

B, HQ, HKV, D, BS, S = 1, 16, 4, 64, 64, 16
OPS = {"fwd": 16, "bwd": 96}  # the suite's upper bounds on device operations per call


def parse_tuning(pairs):
    """['fix_pdl=False', 'schedule=tile'] -> {'fix_pdl': False, 'schedule': 'tile'}."""
    fields = {}
    for pair in pairs or ():
        name, _, text = pair.partition("=")
        try:
            fields[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            fields[name] = text
    return fields


def run(tag, out, points, device, tuning_fields=None):
    from benchmarks import common
    from kernels.nsa import (
        make_block_idx_random,
        make_block_idx_recent,
        selection_backward_triton,
        selection_forward_triton,
    )
    from kernels.nsa.tuning import with_fields

    tuning = with_fields(**tuning_fields) if tuning_fields else None

    # bf16 on a GPU; the interpreter (a CPU check of this tool) is wrong for bf16: fp16
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    saved, times = {}, {}
    for point in points:
        T, pattern = point.split(":")
        T = int(T)
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (
            torch.randn(B, n, T, D, device=device, dtype=dtype, generator=g)
            for n in (HQ, HKV, HKV, HQ)
        )
        if pattern == "recent":
            idx = make_block_idx_recent(B, HKV, T, BS, S, device=device)
        else:
            idx = make_block_idx_random(B, HKV, T, BS, S, device=device, seed=0)
        o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=tuning)
        grads = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=tuning)
        for name, x in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, *grads), strict=True):
            saved[f"{point} {name}"] = x.cpu()
        fns = {
            "fwd": lambda: selection_forward_triton(
                q, k, v, idx, BS, return_lse=True, tuning=tuning
            ),
            "bwd": lambda: selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=tuning),
        }
        for call, fn in fns.items():
            graph = statistics.median(common.per_call_seconds([fn], 10)) * 1e6
            host = statistics.median(common.host_seconds([fn], OPS[call], samples=5)) * 1e6
            times[f"{point} {call}"] = (graph, host)
            print(f"{tag} {point:>14} {call}: graph {graph:8.1f} us, host {host:7.1f} us")
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save({"outputs": saved, "times": times}, Path(out) / f"{tag}.pt")


def compare(out, tag_a, tag_b):
    a, b = (torch.load(Path(out) / f"{t}.pt") for t in (tag_a, tag_b))
    print("| output | bitwise equal |\n| --- | --- |")
    for name, x in a["outputs"].items():
        y = b["outputs"].get(name)
        print(f"| {name} | {y is not None and torch.equal(x, y)} |")
    print(f"\n| call | graph {tag_a} | graph {tag_b} | ratio | host {tag_a} | host {tag_b} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (ga, ha) in a["times"].items():
        gb, hb = b["times"].get(name, (float("nan"), float("nan")))
        print(f"| {name} | {ga:.1f} | {gb:.1f} | {gb / ga:.3f} | {ha:.1f} | {hb:.1f} |")


def summary(out, sides=("old", "new")):
    """Per call: each side's median graph time (the median of its processes' medians),
    every process's host figure, and the host ratio new/old by the sides' medians and by
    their fastest processes, from the files `rounds` wrote (TAG = side + round number).
    Returns the rows printed."""
    times = {}
    for f in sorted(Path(out).glob("*.pt")):
        side = f.stem.rstrip("0123456789")
        if side in sides:
            for name, (graph, host) in torch.load(f)["times"].items():
                times.setdefault(name, {}).setdefault(side, []).append((graph, host))
    a, b = sides
    print(f"| call | graph {a} | graph {b} | ratio | host {a} (per process) | host {b} "
          f"(per process) | host {b}/{a} | fastest {b}/{a} |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name, by_side in times.items():
        if a not in by_side or b not in by_side:
            continue
        ga, gb = (statistics.median(g for g, _ in by_side[x]) for x in sides)
        ha, hb = ([h for _, h in by_side[x]] for x in sides)
        # The host figure by the sides' medians, and by their fastest processes: host work
        # only gets slower under interference, and whole processes run slow.
        row = (name, ga, gb, gb / ga, ha, hb, statistics.median(hb) / statistics.median(ha),
               min(hb) / min(ha))  # fmt: skip
        rows.append(row)
        each = [", ".join(f"{h:.0f}" for h in hs) for hs in (ha, hb)]
        print(f"| {name} | {ga:.1f} | {gb:.1f} | {row[3]:.3f} | {each[0]} | {each[1]} | "
              f"{row[6]:.2f} | {row[7]:.3f} |")  # fmt: skip
    return rows


def round_order(i):
    """The sides of round i (from 1) in the order they run: old first in odd rounds, new
    first in even ones (old, new, new, old, old, ...), so that neither side always runs
    right after the other's process (`asv_process_cost.side_order`'s rotation)."""
    return tuple(side_order(["old", "new"], i))


def rounds(old_src, new_src, out, n, points, device, tunings=(None, None)):
    """`run` in 2 * n fresh processes, old and new alternating (`round_order`), each with
    its checkout's src first on PYTHONPATH; then `compare` of the first pair and
    `summary`."""
    repo = Path(__file__).resolve().parents[2]
    sides = {"old": (old_src, tunings[0]), "new": (new_src, tunings[1])}
    for i in range(1, n + 1):
        for side in round_order(i):
            src, tuning = sides[side]
            env = dict(os.environ, PYTHONPATH=f"{Path(src).resolve()}{os.pathsep}{repo}")
            cmd = [sys.executable, "-m", "tools.dev.gpu_nsa_ab", "run", f"{side}{i}",
                   "--out", str(out), "--device", device, "--points", *points]  # fmt: skip
            if tuning:
                cmd += ["--tuning", *tuning]
            subprocess.run(cmd, env=env, cwd=repo, check=True)
    compare(out, "old1", "new1")
    print()
    summary(out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("tag")
    r.add_argument("--out", required=True)
    r.add_argument("--points", nargs="+", default=["4096:recent", "4096:random", "32768:random"])
    r.add_argument("--device", default="cuda", help="cpu: the interpreter, small points only")
    r.add_argument("--tuning", nargs="*", help="FIELD=VALUE: kernels.nsa.tuning.with_fields")
    r2 = sub.add_parser("rounds")
    r2.add_argument("--old", required=True, help="the old checkout's src directory")
    r2.add_argument("--new", required=True, help="the new checkout's src directory")
    r2.add_argument("--out", required=True)
    r2.add_argument("--rounds", type=int, default=3)
    r2.add_argument("--points", nargs="+", default=["4096:recent", "4096:random", "32768:random"])
    r2.add_argument("--device", default="cuda")
    r2.add_argument("--old-tuning", nargs="*", help="FIELD=VALUE for the old side's calls")
    r2.add_argument("--new-tuning", nargs="*", help="FIELD=VALUE for the new side's calls")
    c = sub.add_parser("compare")
    c.add_argument("out")
    c.add_argument("tag_a")
    c.add_argument("tag_b")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.tag, args.out, args.points, args.device, parse_tuning(args.tuning))
    elif args.cmd == "rounds":
        rounds(
            args.old, args.new, args.out, args.rounds, args.points, args.device,
            (args.old_tuning, args.new_tuning),
        )  # fmt: skip
    else:
        compare(args.out, args.tag_a, args.tag_b)


if __name__ == "__main__":
    main()
