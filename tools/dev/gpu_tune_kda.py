"""Tune the KDA verify kernels on a GPU: bf16 correctness, timings, (BLOCK_V, num_warps) sweep.

    PYTHONPATH=src python -m tools.dev.gpu_tune_kda --out DIR      (about 4 minutes on an H200)

Shape: H=8, K=V=128, T=4, W=4, ring length 16 (the seed's). Sections, each logged as a
short table and all written to DIR/kda_tune.json and DIR/kda_tune.txt:
  1. correctness of the four modes against kernels.kda.reference and bitwise equal rings
     (fused+ring vs unfused+ring) at B in {1, 4, 64}, HV in {8, 16}, both gates, with the
     default tiles (kernels.kda.tuning.DEFAULT);
  2. us per call (CUDA graph of 10 calls; "seed" replays one buffer set, "cold" rotates
     over disjoint sets) of each mode at B in 1..64 with the default tiles, and the GQA
     (HV=16) and safe-gate cost per state byte relative to the standard shape;
  3. a sweep of BLOCK_V in {4, 8, 16, 32} x SUB_V (--sub-v; 0 = one piece) x stages
     (--stages) x num_warps in {1, 2, 4, 8} (the recurrent kernel for the unfused modes,
     the fused kernel for the fused ones; --sweep-modes) at B in {1, 4, 16, 64},
     cold timings; every tile is first checked for correctness and ring bytes (B=4, HV=8,
     standard gate; the CPU tests cover the GQA ownership rules at every BLOCK_V). Prints
     the best tile per (mode, B) and the `tiles` rows to paste into kernels/kda/tuning.py;
     then the conv kernel's BLOCK_D x warps at B in {1, 64};
  4. section 2's table again with the suggested tiles, if time is left.
The time budget (--budget-s) skips what is left of sections 3 and 4 once spent.
--key-chunk N runs everything with key_chunk = N (the width of the key chunks of the
recurrences' state tiles; 128 = the plain tile); --skip-timings leaves out section 2;
--snap-cache M sets snapshot_cache_modifier (the snapshot stores'). Every choice reaches
the kernels as the wrappers' `tuning=` (a kernels.kda.tuning.KdaTuning).
Reuses the inputs, calls, checks and timer of tools/gpu_check_kda.py. `--cpu-smoke` runs
the whole script at a tiny fp32 shape under the Triton interpreter, with one plain call
in place of each timing (it checks the script, not the speed).
"""

import argparse
import dataclasses
import json
import os
import time

import torch

from tools import gpu_check_kda as chk  # first: puts src/ on the path, reads --cpu-smoke

# isort: split
import kernels.kda.conv as conv_mod
import kernels.kda.tuning as kt
from tools.dev.compile_kda_sm90 import tile_grid

MODES = chk.MODES
HV_STD, HV_GQA = 8, 16  # value heads of the standard and the GQA shape
log = chk.log


def run_tuning(key_chunk, snap_cache, tables=None, **tile):
    """The KdaTuning of the run: both recurrence kernels with `key_chunk`, `snap_cache` and
    the forced `tile` fields (block_v, num_warps, sub_v, stages; none = the table's);
    `tables`: {mode: tiles rows} replacing the default rows of those modes."""
    parts = {}
    for part, modes in (
        ("verify", ("fused", "fused+ring")),
        ("recurrent", ("unfused", "unfused+ring")),
    ):
        tn = getattr(kt.DEFAULT, part)
        mt = {}
        for field, mode in zip(("snapshot", "ring"), modes, strict=True):
            mt[field] = getattr(tn, field)
            if tables and mode in tables:
                mt[field] = dataclasses.replace(mt[field], tiles=tuple(tables[mode]))
        parts[part] = dataclasses.replace(
            tn, key_chunk=key_chunk, snapshot_cache_modifier=snap_cache, **mt, **tile
        )
    return kt.KdaTuning(**parts)


def correctness(result, batch_sizes, hv_heads, tag, tuning, gates=None):
    """Section 1 (and the per-tile checks of section 3): modes vs reference, ring bytes."""
    n_ok = n_all = n_rb = n_rb_all = 0
    errors = result["errors"]
    for HV in hv_heads:
        for gname, lb in (gates or chk.GATES).items():
            for B in batch_sizes:
                for mode in MODES:
                    r = chk.safe(
                        f"{tag} check {mode} HV={HV} {gname} B={B}",
                        lambda: chk.check_mode(mode, B, HV, lb, tuning),
                        errors,
                    )
                    n_all += 1
                    if r is not None:
                        m, ok = r
                        n_ok += ok
                        result["correctness"].append(
                            dict(tag=tag, HV=HV, gate=gname, B=B, mode=mode, ok=ok, **m)
                        )
                        if not ok:
                            log(f"  FAIL {tag} {mode} HV={HV} {gname} B={B}: {m}")
                rb = chk.safe(
                    f"{tag} ring bits HV={HV} {gname} B={B}",
                    lambda: chk.check_ring_bits(B, HV, lb, tuning),
                    errors,
                )
                n_rb_all += 1
                if rb is not None:
                    result["ring_bits"].append(dict(tag=tag, HV=HV, gate=gname, B=B, **rb))
                    n_rb += all(rb.values())
                    if not all(rb.values()):
                        log(f"  RING BYTES DIFFER {tag} HV={HV} {gname} B={B}: {rb}")
    return n_ok, n_all, n_rb, n_rb_all


def timing_table(result, key, batch_sizes, iters, deadline, tuning):
    """Sections 2 and 4: seed / cold us per call of every mode, std gate, HV=8; plus HV=16
    and the safe gate at a few batch sizes for the per-state-byte ratios."""
    log(f"{'HV':>3} {'gate':>4} {'B':>3} " + "".join(f"{m:>20}" for m in MODES))
    rows = result[key]
    extra = [B for B in (1, 16, 64) if B in batch_sizes] or batch_sizes[:1]
    shapes = [(HV_STD, "std", B) for B in batch_sizes]
    shapes += [(HV_GQA, "std", B) for B in extra] + [(HV_STD, "safe", B) for B in extra]
    for HV, gname, B in shapes:
        if time.time() > deadline:
            log(f"  {key}: HV={HV} {gname} B={B} and after skipped (budget)")
            break
        sets = chk.cold_sets(B, HV, 100)
        cells = []
        for mode in MODES:
            r = chk.safe(
                f"{key} {mode} HV={HV} {gname} B={B}",
                lambda: chk.time_mode(mode, sets, B, HV, chk.GATES[gname], iters, tuning),
                result["errors"],
            )
            if r is not None:
                rows.append(dict(HV=HV, gate=gname, B=B, mode=mode, seed_us=r[0], cold_us=r[1]))
            cells.append("error" if r is None else f"{r[0]:7.2f} /{r[1]:7.2f}")
        log(f"{HV:>3} {gname:>4} {B:>3} " + "".join(f"{c:>20}" for c in cells))
        sets = None
        torch.cuda.empty_cache()
    cold = {(r["HV"], r["gate"], r["B"], r["mode"]): r["cold_us"] for r in rows}
    ratios = []
    for (HV, gname, B, mode), us in sorted(cold.items()):
        base = cold.get((HV_STD, "std", B, mode))
        if (HV, gname) != (HV_STD, "std") and base:
            # Per state byte: the GQA shape moves HV / HV_STD times the state.
            ratio = us / base / (HV / HV_STD)
            ratios.append(dict(HV=HV, gate=gname, B=B, mode=mode, per_byte_ratio=ratio))
    if ratios:
        log(f"  cold cost per state byte vs HV={HV_STD} std (target <= 1.15):")
        for r in ratios:
            flag = "" if r["per_byte_ratio"] <= 1.15 else "  <-- over"
            shape = f"HV={r['HV']:>2} {r['gate']:>4} B={r['B']:>2} {r['mode']:>12}"
            log(f"    {shape}: {r['per_byte_ratio']:.2f}{flag}")
    result[key + "_ratios"] = ratios
    for B in batch_sizes:
        c = {m: cold.get((HV_STD, "std", B, m)) for m in MODES}
        if all(c.values()):
            log(
                f"  B={B:>2}: fused/unfused {c['fused'] / c['unfused']:.2f}, "
                f"fused+ring/unfused+ring {c['fused+ring'] / c['unfused+ring']:.2f}"
            )


def sweep(result, args, deadline):
    """Section 3: every tile (BLOCK_V, SUB_V, stages, num_warps), checked, then timed cold at
    each batch size. SUB_V 0 = BLOCK_V (one piece, one stage)."""
    tiles = tile_grid(args.block_v, args.sub_v, args.stages, args.warps)
    modes = args.sweep_modes
    log(
        f"{'mode':>13} {'BV':>3} {'SUB':>3} {'st':>2} {'nw':>2} "
        + "".join(f"{'B=' + str(B):>9}" for B in args.sweep_b)
    )
    sets = {B: chk.cold_sets(B, HV_STD, 200) for B in args.sweep_b}
    for bv, sub, st, nw in tiles:
        if time.time() > deadline:
            log(f"  sweep: tiles from BV={bv} SUB={sub} st={st} nw={nw} on skipped (budget)")
            break
        tn = run_tuning(
            args.key_chunk, args.snap_cache, block_v=bv, num_warps=nw, sub_v=sub or None, stages=st
        )
        tag = f"tile{bv}/{sub or bv}/{st}x{nw}"
        # Same shape and gate as the timings below, so that no extra kernels are compiled.
        n_ok, n_all, n_rb, n_rb_all = correctness(
            result, args.check_b[1:2] or args.check_b, [HV_STD], tag, tn, {"std": None}
        )
        if (n_ok, n_rb) != (n_all, n_rb_all):
            log(f"  {tag}: {n_ok}/{n_all} modes ok, {n_rb}/{n_rb_all} ring bits ok")
        for mode in modes:
            cells = []
            for B in args.sweep_b:
                r = chk.safe(
                    f"sweep {mode} {tag} B={B}",
                    lambda: chk.bench(
                        [chk.runner(mode, s, B, HV_STD, None, tn) for s in sets[B]],
                        args.iters // 2,
                    ),
                    result["errors"],
                )
                if r is not None:
                    result["sweep"].append(
                        dict(
                            mode=mode, B=B, block_v=bv, sub_v=sub or bv, stages=st,
                            num_warps=nw, cold_us=r,
                        )
                    )  # fmt: skip
                cells.append("error" if r is None else f"{r:9.2f}")
            log(f"{mode:>13} {bv:>3} {sub or bv:>3} {st:>2} {nw:>2} " + "".join(cells))
    sets = None
    torch.cuda.empty_cache()


def best_tiles(result, sweep_b):
    """Best tile per (mode, B) from the sweep, and a table built from them."""
    best = {}
    for r in result["sweep"]:
        k = (r["mode"], r["B"])
        if k not in best or r["cold_us"] < best[k]["cold_us"]:
            best[k] = r
    table = {}
    log(f"{'mode':>13} " + "".join(f"{'B=' + str(B):>22}" for B in sweep_b))
    for mode in MODES:
        cells = []
        rows = []
        for i, B in enumerate(sweep_b):
            b = best.get((mode, B))
            if b is None:
                cells.append("-")
            else:
                tile = f"{b['block_v']}/{b['sub_v']}/{b['stages']}x{b['num_warps']}"
                cells.append(f"{tile} {b['cold_us']:.2f}")
            if b is not None:
                rows.append(
                    (
                        None if i == len(sweep_b) - 1 else B,
                        b["block_v"], b["sub_v"], b["num_warps"], b["stages"],
                    )
                )  # fmt: skip
        log(f"{mode:>13} " + "".join(f"{c:>22}" for c in cells))
        if rows:
            table[mode] = tuple(rows)
    result["best"] = [dict(v) for v in best.values()]
    return table


def conv_sweep(result, args, deadline):
    """The conv kernel's BLOCK_D x warps, timed alone (unfused+ring's first kernel)."""
    b_lo, b_hi = args.sweep_b[0], args.sweep_b[-1]
    cols = f"{'B=' + str(b_lo):>9} {'B=' + str(b_hi):>9}"
    log(f"{'BLOCK_D':>7} {'warps':>5} {cols}   (conv alone, cold us)")
    for bd in (128, 256, 512):
        for nw in (1, 2, 4):
            if time.time() > deadline:
                log("  conv sweep: rest skipped (budget)")
                return
            conv = kt.ConvTuning(block_d=bd, num_warps=nw)
            cells = []
            for B in (b_lo, b_hi):
                sets = chk.cold_sets(B, HV_STD, 300)
                fns = [conv_call(s, B, conv) for s in sets]
                r = chk.safe(
                    f"conv BLOCK_D={bd} nw={nw} B={B}",
                    lambda: chk.bench(fns, 10),
                    result["errors"],
                )
                if r is not None:
                    result["conv_sweep"].append(dict(B=B, block_d=bd, num_warps=nw, cold_us=r))
                cells.append("error" if r is None else f"{r:9.2f}")
            log(f"{bd:>7} {nw:>5} " + "".join(cells))


def conv_call(s, B, tuning):
    dim = s["mixed"].shape[1]
    x3 = s["mixed"].reshape(B, chk.T, dim).transpose(1, 2)
    return lambda: conv_mod.causal_conv1d_update(
        x3, s["conv_pool"].transpose(-1, -2), s["w"], s["bias"], activation="silu",
        conv_state_indices=s["cache_indices"], intermediate_state_indices=s["inter_indices"],
        intermediate_conv_window=s["win_pool"].transpose(-1, -2), tuning=tuning,
    )  # fmt: skip


def cpu_smoke(args):
    """Shrink everything and time nothing: every code path runs once on the CPU."""
    global HV_STD, HV_GQA
    chk.DEV, chk.DT, chk.H, chk.K, chk.V = "cpu", torch.float32, 1, 16, 16
    HV_STD, HV_GQA = 1, 2
    chk.L2_BYTES = 0  # the fewest cold sets

    def one_call(fns, iters):
        start = time.time()
        fns[0]()
        return (time.time() - start) * 1e6

    chk.bench = one_call
    args.batch_sizes, args.check_b, args.sweep_b = [1, 2], [1, 2], [1, 2]
    args.block_v, args.warps, args.sub_v, args.stages = [4, 8], [1, 2], [0, 2], [1, 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--check-b", type=int, nargs="+", default=[1, 4, 64])
    ap.add_argument("--sweep-b", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--block-v", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sub-v", type=int, nargs="+", default=[0], help="0: BLOCK_V in one piece")
    ap.add_argument("--stages", type=int, nargs="+", default=[1])
    ap.add_argument("--sweep-modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--skip-timings", action="store_true", help="no section 2 table")
    ap.add_argument(
        "--key-chunk",
        type=int,
        default=None,
        help="key_chunk for the whole run (key chunk width of the state tiles; default: "
        "the key_chunks tables by mode and batch)",
    )
    ap.add_argument(
        "--snap-cache",
        default=kt.DEFAULT.verify.snapshot_cache_modifier,
        help="snapshot_cache_modifier for the whole run (snapshot stores)",
    )
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=225)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny run under the interpreter")
    args = ap.parse_args()
    if args.cpu_smoke:
        cpu_smoke(args)
    os.makedirs(args.out, exist_ok=True)
    base = run_tuning(args.key_chunk, args.snap_cache)
    t0 = time.time()
    deadline = t0 + args.budget_s
    import triton

    result = {
        "device": "cpu" if args.cpu_smoke else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    for k in (
        "correctness",
        "ring_bits",
        "timings",
        "sweep",
        "conv_sweep",
        "timings_tuned",
        "errors",
    ):
        result[k] = []
    result["default_table"] = {
        mode: list(getattr(kt.DEFAULT, part).tables(ring).tiles)
        for mode, part, ring in (
            ("fused", "verify", False), ("fused+ring", "verify", True),
            ("unfused", "recurrent", False), ("unfused+ring", "recurrent", True),
        )
    }  # fmt: skip
    result["state_key_chunk"] = args.key_chunk
    log(
        f"{result['device']}  torch {torch.__version__}  triton {triton.__version__}  "
        f"key_chunk={args.key_chunk} snapshot_cache_modifier={args.snap_cache!r}"
    )

    def save():
        with open(os.path.join(args.out, "kda_tune.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, "kda_tune.txt"), "w") as f:
            f.write("\n".join(chk.LOG) + "\n")

    try:
        log("\n== 1. correctness (bf16, default tiles) and ring bytes")
        n_ok, n_all, n_rb, n_rb_all = correctness(
            result, args.check_b, [HV_STD, HV_GQA], "default", base
        )
        log(f"  modes ok: {n_ok}/{n_all}; ring bitwise ok: {n_rb}/{n_rb_all}")
        log(f"  ({time.time() - t0:.0f} s)")

        if not args.skip_timings:
            log("\n== 2. us per call, seed / cold, default tiles")
            timing_table(result, "timings", args.batch_sizes, args.iters, deadline, base)
            log(f"  ({time.time() - t0:.0f} s)")
        save()

        log("\n== 3. tile sweep (BLOCK_V/SUB_V/stages x num_warps), cold us per call, HV=8 std")
        sweep(result, args, deadline - 45)
        log("\n  best tile per (mode, B) as BV/SUB/stages x warps, us:")
        table = best_tiles(result, args.sweep_b)
        result["suggested_table"] = {k: list(v) for k, v in table.items()}
        log("  suggested tiles rows (kernels/kda/tuning.py) = {")
        for mode, rows in table.items():
            log(f'      "{mode}": {rows},')
        log("  }")
        log(f"  ({time.time() - t0:.0f} s)")
        save()
        conv_sweep(result, args, deadline - 35)

        if len(table) == len(MODES):
            log("\n== 4. us per call, seed / cold, suggested tiles")
            tuned = run_tuning(args.key_chunk, args.snap_cache, tables=table)
            timing_table(
                result, "timings_tuned", args.batch_sizes, args.iters, deadline + 10, tuned
            )
    finally:
        log(f"\ntotal {time.time() - t0:.0f} s, {len(result['errors'])} errors")
        save()


if __name__ == "__main__":
    main()
