"""GPU check of the KDA chain-verify kernels: bf16 correctness, ring bytes, timings, BLOCK_V sweep.

    python tools/gpu_check_kda.py --out DIR      (about 2-4 minutes on an H200)

Shape: H=8, HV in {8, 16}, K=V=128, T=4, W=4, ring length 16, B in 1..64, standard and safe
gate (lower_bound -5). For every (HV, gate, B):
  * correctness of the four modes against kernels.kda.reference (o, conv windows,
    snapshots or ring entries, untouched ring positions / rows, read-only states);
  * fused+ring vs unfused+ring ring buffers compared bitwise (whole buffers);
  * time per call from CUDA-graph replays: "seed" replays 10 captured calls on the same
    buffers; "cold" captures one call per disjoint input set, with enough sets (>= 10) that
    their data is about 3x the L2, so no call finds its state in L2.
Then a BLOCK_V sweep (2..32, `tuning=`) of the fused modes at B in {1, 16, 64}.
Failures are recorded and the run continues. Writes DIR/kda_check.json and DIR/kda_check.txt.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

if "--cpu-smoke" in sys.argv:  # the interpreter switch is read when kernels are imported
    os.environ["TRITON_INTERPRET"] = "1"
# This tool picks its mode itself: the suite's package (imported for its KDA builder) must
# not switch the interpreter on because the machine has no GPU (benchmarks/common.py).
os.environ.setdefault("ATTNBENCH_SMOKE", "1" if "--cpu-smoke" in sys.argv else "0")
# The checkout's root (the folder holding benchmarks/ and src/), wherever tools/ keeps this file.
ROOT = next(
    p for p in Path(__file__).resolve().parents if (p / "benchmarks" / "kda_cases.py").exists()
)
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

import kernels.kda as kda  # noqa: E402
import kernels.kda.tuning as kt  # noqa: E402
from benchmarks import kda_cases as cases  # noqa: E402
from kernels.kda import reference as ref_mod  # noqa: E402

H, K, V, T, RING = 8, 128, 128, 4, 16
DT = torch.bfloat16
DEV = "cuda"
MODES = cases.MODES
GATES = {"std": None, "safe": -5.0}
L2_BYTES = 60 * 2**20
LOG = []


def log(msg=""):
    print(msg, flush=True)
    LOG.append(msg)


def make_set(B, HV, seed):
    """One input set on the device (kda_cases.make_inputs): outputs NaN-poisoned, slots and
    lines two shuffled maps over B + 1 rows."""
    return cases.make_inputs(
        B, T, H, HV, K, V, dtype=DT, device=DEV, seed=seed, lines=B + 1, ring_len=RING,
        poison=True, shuffle=True,
    )  # fmt: skip


def cold_sets(B, HV, seed):
    """Input sets for the cold timing: at least 10, and enough that the bytes a ring-mode call
    touches (everything but the snapshot buffer) add up to about 3x the L2."""
    first = make_set(B, HV, seed)
    touched = sum(t.numel() * t.element_size() for n, t in first.items() if n != "inter_ssm")
    n_sets = max(10, min(256, math.ceil(3 * L2_BYTES / touched)))
    return [first] + [make_set(B, HV, seed + i) for i in range(1, n_sets)]


BASE = kt.DEFAULT  # every call's tuning (main: --table-heads sets it)


def runner(mode, s, B, HV, lb, tuning=None):
    """The benchmark's call pattern for one mode on input set s (kda_cases.make_call);
    `tuning`: a kernels.kda.tuning.KdaTuning, or None for BASE."""
    tuning = BASE if tuning is None else tuning
    return cases.make_call(kda, mode, s, B, T, H, HV, K, V, lb, scale=K**-0.5, tuning=tuning)


def block_v_tuning(bv):
    """BASE with the fused kernel's BLOCK_V forced to bv."""
    return dataclasses.replace(BASE, verify=dataclasses.replace(BASE.verify, block_v=bv))


def with_table_heads(heads):
    """The default tuning with both recurrence kernels' tables read at HV / heads times the
    batch (`kernels.kda.tuning.table_batch`); None: the default itself (the fused kernel's
    tables at HV / 8 times the batch, the recurrent kernel's at the batch)."""
    if heads is None:
        return kt.DEFAULT
    return kt.KdaTuning(
        verify=dataclasses.replace(kt.DEFAULT.verify, table_heads=heads),
        recurrent=dataclasses.replace(kt.DEFAULT.recurrent, table_heads=heads),
    )


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def rel(got, ref):
    got, ref = got.float(), ref.float()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def bits(x):
    return x.view({2: torch.int16, 4: torch.int32}[x.element_size()])


def check_mode(mode, B, HV, lb, tuning=None):
    """Run one mode on fresh poisoned buffers; return its error metrics and a pass flag."""
    s = make_set(B, HV, seed=11)
    if B > 1:
        s["cache_indices"][0] = -1  # one padded sequence
    keep = {n: s[n].clone() for n in ("ssm", "conv_pool")}
    ref = cases.reference_verify(ref_mod, s, T, H, HV, K, V, lb)
    o = runner(mode, s, B, HV, lb, tuning)().reshape(B * T, HV, V)
    sync()
    valid = (~ref["pad"]).nonzero().flatten()
    slots, lines = s["cache_indices"][valid].long(), s["inter_indices"][valid].long()
    unused = lambda buf, rows: bool(
        buf[~torch.isin(torch.arange(len(buf), device=DEV), rows)].isnan().all()
    )
    m = {
        "o_err": rel(o, ref["o"]),
        "pad_o_zero": bool((o.view(B, T, HV, V)[ref["pad"]] == 0).all()),
    }
    m["states_untouched"] = all(torch.equal(bits(s[n]), bits(keep[n])) for n in keep)
    win = s["win_pool"].transpose(-1, -2)
    m["windows_exact"] = torch.equal(bits(win[lines]), bits(ref["windows"][valid].contiguous()))
    m["windows_unused_untouched"] = unused(win, lines)
    if cases.is_ring(mode):
        m["snapshots_untouched"] = bool(s["inter_ssm"].isnan().all())
        for n in cases.RING_NAMES:
            m[f"{n}_err"] = rel(s[n][slots][:, :, :T], ref[n][valid])
            m[f"{n}_tail_untouched"] = bool(s[n][slots][:, :, T:].isnan().all()) and unused(
                s[n], slots
            )
    else:
        m["snap_err"] = rel(s["inter_ssm"][lines], ref["states"][valid])
        m["snap_unused_untouched"] = unused(s["inter_ssm"], lines)
        m["ring_untouched"] = all(bool(s[n].isnan().all()) for n in cases.RING_NAMES)
    ok = all(v < 1e-2 if k.endswith("_err") else v for k, v in m.items())
    return m, ok


def check_ring_bits(B, HV, lb, tuning=None):
    sets = {}
    for mode in cases.RING_MODES:
        sets[mode] = make_set(B, HV, seed=7)
        runner(mode, sets[mode], B, HV, lb, tuning)()
    sync()
    a, b = sets[cases.UNFUSED_RING], sets[cases.FUSED_RING]
    return {n: torch.equal(bits(a[n]), bits(b[n])) for n in (*cases.RING_NAMES, "win_pool")}


def bench(fns, iters):
    """us per call: replays of a CUDA graph that captures the calls `fns` once each."""
    for fn in fns[:2]:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    graph.reset()
    return start.elapsed_time(end) * 1e3 / (iters * len(fns))


def time_mode(mode, sets, B, HV, lb, iters, tuning=None):
    seed = bench([runner(mode, sets[0], B, HV, lb, tuning)] * 10, iters)
    cold = bench([runner(mode, s, B, HV, lb, tuning) for s in sets], max(5, iters // 4))
    return seed, cold


def safe(what, fn, errors):
    try:
        return fn()
    except Exception as e:  # report and continue
        errors.append({"what": what, "error": repr(e), "trace": traceback.format_exc()[-2000:]})
        log(f"  ERROR {what}: {e!r}")
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--hv-heads", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--sweep-batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=200, help="skip the rest of the sweep after")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny fp32 correctness run on the CPU")
    ap.add_argument(
        "--table-heads",
        type=int,
        default=None,
        help="both kernels' tables read at batch B * HV / N (default: each kernel's own)",
    )
    args = ap.parse_args()
    global BASE
    BASE = with_table_heads(args.table_heads)
    if args.cpu_smoke:  # exercises the checking code under the Triton interpreter
        global DEV, DT, H, K, V
        DEV, DT, H, K, V = "cpu", torch.float32, 1, 16, 16
        args.batch_sizes, args.hv_heads = [1, 3], [2]
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    dev_name = "cpu" if DEV == "cpu" else torch.cuda.get_device_name()
    result = {"device": dev_name, "torch": torch.__version__, "table_heads": args.table_heads}
    result.update(correctness=[], ring_bits=[], timings=[], sweep=[], errors=[])
    errors = result["errors"]
    import triton

    result["triton"] = triton.__version__
    log(f"{result['device']}  torch {torch.__version__}  triton {triton.__version__}")

    log(f"\n== correctness ({DT}) and ring bytes")
    n_ok = n_all = 0
    for HV in args.hv_heads:
        for gname, lb in GATES.items():
            for B in args.batch_sizes:
                for mode in MODES:
                    r = safe(
                        f"check {mode} HV={HV} {gname} B={B}",
                        lambda: check_mode(mode, B, HV, lb),
                        errors,
                    )
                    n_all += 1
                    if r is not None:
                        m, ok = r
                        n_ok += ok
                        result["correctness"].append(
                            dict(HV=HV, gate=gname, B=B, mode=mode, ok=ok, **m)
                        )
                        if not ok:
                            log(f"  FAIL {mode} HV={HV} {gname} B={B}: {m}")
                rb = safe(
                    f"ring bits HV={HV} {gname} B={B}", lambda: check_ring_bits(B, HV, lb), errors
                )
                if rb is not None:
                    result["ring_bits"].append(dict(HV=HV, gate=gname, B=B, **rb))
                    if not all(rb.values()):
                        log(f"  RING BYTES DIFFER HV={HV} {gname} B={B}: {rb}")
    n_rb = sum(
        all(v for k, v in r.items() if k not in ("HV", "gate", "B")) for r in result["ring_bits"]
    )
    log(f"  modes ok: {n_ok}/{n_all}; ring bitwise ok: {n_rb}/{len(result['ring_bits'])}")
    log(f"  ({time.time() - t_start:.0f} s)")
    if DEV == "cpu":
        return

    log("\n== time per call, us (seed: same buffers / cold: one input set per captured call)")
    head = f"{'HV':>3} {'gate':>4} {'B':>3} {'sets':>4} " + "".join(f"{m:>21}" for m in MODES)
    for HV in args.hv_heads:
        log(head)
        for B in args.batch_sizes:
            sets = cold_sets(B, HV, 100)
            n_sets = len(sets)
            for gname, lb in GATES.items():
                cells = []
                for mode in MODES:
                    r = safe(
                        f"time {mode} HV={HV} {gname} B={B}",
                        lambda: time_mode(mode, sets, B, HV, lb, args.iters),
                        errors,
                    )
                    if r is not None:
                        result["timings"].append(
                            dict(
                                HV=HV,
                                gate=gname,
                                B=B,
                                mode=mode,
                                seed_us=r[0],
                                cold_us=r[1],
                                sets=n_sets,
                            )
                        )
                    cells.append("error" if r is None else f"{r[0]:8.2f} /{r[1]:8.2f}")
                log(f"{HV:>3} {gname:>4} {B:>3} {n_sets:>4} " + "".join(f"{c:>21}" for c in cells))
            sets = None  # free this batch size's buffers
            torch.cuda.empty_cache()
    log(f"  ({time.time() - t_start:.0f} s)")
    write(args.out, result)  # the timings stay if the sweep below is cut short

    log("\n== BLOCK_V sweep, fused modes, us seed / cold (default = table)")
    bvs = (None, 2, 4, 8, 16, 32)
    log(
        f"{'HV':>3} {'gate':>4} {'B':>3} {'mode':>10} "
        + "".join(f"{str(bv or 'table'):>19}" for bv in bvs)
    )
    for HV in args.hv_heads:
        for B in args.sweep_batch_sizes:
            if time.time() - t_start > args.budget_s:
                log(f"  sweep HV={HV} B={B} skipped: past --budget-s {args.budget_s}")
                continue
            sets = cold_sets(B, HV, 200)
            for gname, lb in GATES.items():
                for mode in (cases.FUSED, cases.FUSED_RING):
                    cells = []
                    for bv in bvs:
                        tn = None if bv is None else block_v_tuning(bv)
                        r = safe(
                            f"sweep {mode} bv={bv} HV={HV} {gname} B={B}",
                            lambda: time_mode(mode, sets, B, HV, lb, args.iters // 2, tn),
                            errors,
                        )
                        if r is not None:
                            result["sweep"].append(
                                dict(
                                    HV=HV,
                                    gate=gname,
                                    B=B,
                                    mode=mode,
                                    block_v=bv,
                                    seed_us=r[0],
                                    cold_us=r[1],
                                )
                            )
                        cells.append("error" if r is None else f"{r[0]:7.2f} /{r[1]:7.2f}")
                    log(
                        f"{HV:>3} {gname:>4} {B:>3} {mode:>10} "
                        + "".join(f"{c:>19}" for c in cells)
                    )
            sets = None  # free this batch size's buffers
            torch.cuda.empty_cache()
    log(f"\ntotal {time.time() - t_start:.0f} s, {len(errors)} errors")
    write(args.out, result)


def write(out, result):
    """DIR/kda_check.json (the results so far) and DIR/kda_check.txt (the log so far)."""
    with open(os.path.join(out, "kda_check.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "kda_check.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
