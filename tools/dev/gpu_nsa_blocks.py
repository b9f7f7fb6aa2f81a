"""GPU check of the NSA forward's block-major path: bf16 correctness, CUDA-graph timings of the
three schedules, a sweep of the partial kernel's tuning, peak memory, a per-kernel profile.

Usage (on a CUDA machine, from the repository root):
    PYTHONPATH=src python3 -m tools.dev.gpu_nsa_blocks --out DIR [--budget-s 170]
    .venv/bin/python -m tools.dev.gpu_nsa_blocks --out DIR --cpu-smoke   (tiny, interpreter, fp32)

1. Correctness, bf16 (fp32 in the smoke run): o and lse of schedule 'blocks' and
   'auto' against the dense fp32 reference at T in {1000, 4096}, seed shape (Hq 16, Hkv 4,
   G 4) and paper shape (Hq 64, Hkv 4, G 16), patterns 'recent' and 'random'; two calls
   must agree bitwise. Any rel err of o > 2e-2 (or lse off by more than 5e-2, or a repeat
   that differs) makes the script exit 1, after writing its files.
2. Timings by CUDA-graph replay (2 calls captured, replayed until ~50 ms, median of 7
   samples, per call) of schedules tile / blocks / auto: seed shape at T 8192 and 32768 and
   paper shape at T 65536, both patterns; auto/tile ratios and the T 8192 -> 32768 ratios.
3. Sweep at seed, T = 32768, random: chunk_rows {64, 128, 256} (= 16, 32, 64
   tokens at G = 4) x partial_warps {4, 8} x partial_stages {1, 2, 3, 4}, then at the best
   of those list_window, block_path_ratio, partial_waves and combine_warps; every config's
   o is compared with the default's.
4. Peak VRAM (max_memory_allocated over one auto call, inputs resident) at seed T = 32768,
   both patterns; a per-kernel device-time profile of the auto call there (torch.profiler).
--sections picks which of 1-4 run (default all); --set FIELD=VALUE changes a tuning field for the
whole run (the sweep's "default" is then that setting). A --budget-s guard skips whatever would
start after the budget is spent (listed as skipped). Writes DIR/nsa_blocks.json and
DIR/nsa_blocks.txt (the printed tables).
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
import traceback

SMOKE = "--cpu-smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported

import torch  # noqa: E402
import triton  # noqa: E402

from kernels.nsa import (  # noqa: E402
    make_block_idx_random,
    make_block_idx_recent,
    selection_forward_reference,
    selection_forward_triton,
)
from kernels.nsa import tuning as nsa_tuning  # noqa: E402

if SMOKE:
    DEV, DTYPE, BS, S, D = "cpu", torch.float32, 16, 4, 32
    SEED, PAPER = (4, 1), (8, 1)  # (Hq, Hkv)
    CHECK_T, TIME_T, PAPER_T = (40, 70), (48, 96), 64
    SWEEP_ROWS, SWEEP_WARPS, SWEEP_RATIOS, SWEEP_WAVES = (64,), (4,), (2,), (None,)
    SWEEP_COMBINE, SWEEP_STAGES, SWEEP_WINDOWS = (4,), (1,), (None, 32)
else:
    DEV, DTYPE, BS, S, D = "cuda", torch.bfloat16, 64, 16, 64
    SEED, PAPER = (16, 4), (64, 4)
    CHECK_T, TIME_T, PAPER_T = (1000, 4096), (8192, 32768), 65536
    SWEEP_ROWS, SWEEP_WARPS, SWEEP_RATIOS, SWEEP_WAVES = (64, 128, 256), (4, 8), (1, 2, 4, 8), (
        None, 2, 8, 16,
    )  # fmt: skip
    SWEEP_COMBINE, SWEEP_STAGES = (4, 16), (1, 2, 3, 4)
    SWEEP_WINDOWS = (None, 1024, 2048, 4096, 8192, 16384)
SCHEDULES = ("tile", "blocks", "auto")
TOL_O, TOL_LSE = 2e-2, 5e-2
KNOBS = [  # the tuning fields this tool sweeps or sets (`kernels.nsa.tuning`)
    "schedule",
    "block_path_ratio",
    "overlap_tile_kernel",
    "chunk_rows",
    "partial_warps",
    "partial_waves",
    "partial_stages",
    "combine_warps",
    "combine_waves",
    "list_window",
]
TUNING = nsa_tuning.DEFAULT  # what `call` passes; `knobs` and --set replace fields of it
OUT_LINES = []


def say(*parts):
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    OUT_LINES.append(line)


@contextlib.contextmanager
def knobs(**values):
    """Replace tuning fields by name (see KNOBS) for the duration of the block."""
    global TUNING
    saved = TUNING
    TUNING = nsa_tuning.with_fields(TUNING, **values)
    try:
        yield
    finally:
        TUNING = saved


def type_of(name, value):
    """A field's value from text: str for schedule, bool for overlap_tile_kernel, int (or
    None) for the others."""
    if name == "schedule":
        return value
    if name == "overlap_tile_kernel":
        return {"True": True, "False": False}[value]
    return int(value)


def defaults():
    flat = {}
    for group in ("forward", "block_major", "backward"):
        flat.update(vars(getattr(TUNING, group)))
    return {n: flat[n] for n in KNOBS}


def rel_err(got, ref):
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def make_inputs(Hq, Hkv, T, pattern, seed=0):
    g = torch.Generator(device=DEV).manual_seed(T + Hq + seed)
    q, k, v = [
        torch.randn(1, H, T, D, generator=g, device=DEV, dtype=DTYPE) for H in (Hq, Hkv, Hkv)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    return q, k, v, make(1, Hkv, T, BS, S, DEV)


def call(x):
    q, k, v, idx = x
    return selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=TUNING)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def release():
    sync()
    if DEV == "cuda":
        torch.cuda.empty_cache()


def graph_ms(fn, target_ms=50.0, samples=7):
    """Per-call device time of fn: 2 calls captured in a CUDA graph, replayed until about
    target_ms per sample, median of `samples`. Under the interpreter: wall time of one call."""
    if DEV != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # compile and warm up off the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    n = max(1, math.ceil(target_ms / max(start.elapsed_time(end), 1e-3)))
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (2 * n))
    del graph
    release()
    return statistics.median(times)


def check_case(Hq, Hkv, T, pattern):
    """Both block-using schedules against the dense fp32 reference."""
    x = make_inputs(Hq, Hkv, T, pattern)
    q, k, v, idx = x
    with torch.no_grad():
        ro, rlse = selection_forward_reference(q.float(), k.float(), v.float(), idx, BS, None, True)
    rows = []
    for sched in ("blocks", "auto"):
        row = dict(Hq=Hq, Hkv=Hkv, T=T, pattern=pattern, schedule=sched)
        try:
            with knobs(schedule=sched):
                o, lse = call(x)
                again = call(x)
            sync()
            empty = torch.isinf(rlse)
            row["err_o"] = rel_err(o, ro)
            row["lse_same_empty_rows"] = bool(torch.equal(torch.isinf(lse), empty))
            row["lse_max_abs_err"] = (lse[~empty] - rlse[~empty]).abs().max().item()
            row["finite"] = bool(torch.isfinite(o).all())
            row["deterministic"] = torch.equal(o, again[0]) and torch.equal(lse, again[1])
            row["ok"] = (
                row["err_o"] < TOL_O
                and row["lse_max_abs_err"] < TOL_LSE
                and row["lse_same_empty_rows"]
                and row["finite"]
                and row["deterministic"]
            )
        except Exception as e:  # report and continue
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            row["traceback"] = traceback.format_exc()
        rows.append(row)
        say(
            f"  Hq={Hq:>2} Hkv={Hkv} T={T:>5} {pattern:>6} {sched:>6}: "
            f"{'ok  ' if row['ok'] else 'FAIL'} err o {row.get('err_o', float('nan')):.2e} "
            f"lse {row.get('lse_max_abs_err', float('nan')):.2e} "
            f"repeat-equal {row.get('deterministic')} {row.get('error', '')}"
        )
    del x, ro, rlse
    release()
    return rows


def time_cases(deadline):
    cases = [(SEED, T, p) for T in TIME_T for p in ("recent", "random")]
    cases += [(PAPER, PAPER_T, p) for p in ("recent", "random")]
    rows = []
    say(f"  {'shape':>6} {'T':>6} {'pattern':>7} " + " ".join(f"{s:>8}" for s in SCHEDULES)
        + "  auto/tile")  # fmt: skip
    for (Hq, Hkv), T, pattern in cases:
        row = dict(Hq=Hq, Hkv=Hkv, T=T, pattern=pattern)
        try:
            x = make_inputs(Hq, Hkv, T, pattern)
            for sched in SCHEDULES:
                if time.time() > deadline:
                    row[sched] = "skipped"
                    continue
                with knobs(schedule=sched):
                    row[sched] = graph_ms(lambda x=x: call(x))
            del x
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["traceback"] = traceback.format_exc()
        release()
        if isinstance(row.get("auto"), float) and isinstance(row.get("tile"), float):
            row["auto_over_tile"] = row["auto"] / row["tile"]
        rows.append(row)
        shape = "seed" if (Hq, Hkv) == SEED else "paper"
        cells = " ".join(fmt(row.get(s), "8.3f") for s in SCHEDULES)
        say(f"  {shape:>6} {T:>6} {pattern:>7} {cells}  {fmt(row.get('auto_over_tile'), '.2f')}"
            f" {row.get('error', '')}")  # fmt: skip
    return rows


def fmt(x, spec):
    return format(x, spec) if isinstance(x, float) else f"{str(x or '-'):>8}"


def t_ratios(rows):
    out = {}
    for pattern in ("recent", "random"):
        a, b = [
            next(
                (r for r in rows if r["T"] == T and r["pattern"] == pattern and r["Hq"] == SEED[0]),
                {},
            )  # fmt: skip
            for T in TIME_T
        ]
        for sched in SCHEDULES:
            if isinstance(a.get(sched), float) and isinstance(b.get(sched), float):
                out[f"{pattern}-{sched}"] = b[sched] / a[sched]
    say("  T ratio", TIME_T[0], "->", TIME_T[1], " ".join(f"{k} {v:.2f}" for k, v in out.items()),
        "(target auto <= 4.4)")  # fmt: skip
    return out


def sweep(deadline):
    """Partial-kernel knobs at seed, T = TIME_T[-1], random: rows x warps, then ratio, waves."""
    x = make_inputs(*SEED, TIME_T[-1], "random")
    with knobs(schedule="auto"):
        base = call(x)[0].clone()
    rows = []

    def one(**cfg):
        row = dict(config=cfg)
        if time.time() > deadline:
            row["skipped"] = True
            rows.append(row)
            return row
        try:
            with knobs(schedule="auto", **cfg):
                row["rel_diff_vs_default"] = rel_err(call(x)[0], base)
                row["ms"] = graph_ms(lambda: call(x))
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        say(f"  {cfg}: {fmt(row.get('ms'), '.3f')} ms  diff vs default "
            f"{fmt(row.get('rel_diff_vs_default'), '.1e')} {row.get('error', '')}")  # fmt: skip
        return row

    for rows_, warps, stages in [
        (r, w, st) for r in SWEEP_ROWS for w in SWEEP_WARPS for st in SWEEP_STAGES
    ]:
        one(chunk_rows=rows_, partial_warps=warps, partial_stages=stages)
    bm = TUNING.block_major
    best = best_of(rows) or dict(config=dict(chunk_rows=bm.chunk_rows,
                                             partial_warps=bm.partial_warps,
                                             partial_stages=bm.partial_stages))  # fmt: skip
    for window in SWEEP_WINDOWS:
        one(**best["config"], list_window=window)
    for ratio in SWEEP_RATIOS:
        one(**best["config"], block_path_ratio=ratio)
    for waves in SWEEP_WAVES:
        one(**best["config"], partial_waves=waves)
    for warps in SWEEP_COMBINE:
        one(**best["config"], combine_warps=warps)
    overall = best_of(rows)
    say(f"  best: {overall['config'] if overall else '-'} "
        f"{fmt(overall.get('ms') if overall else None, '.3f')} ms")  # fmt: skip
    return dict(rows=rows, best=overall)


def best_of(rows):
    ok = [r for r in rows if "ms" in r and r["rel_diff_vs_default"] < TOL_O]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def peak_memory():
    """Peak allocated bytes over one auto call with its inputs resident, seed T = TIME_T[-1]."""
    out = {}
    for pattern in ("recent", "random"):
        if DEV != "cuda":
            out[pattern] = None
            continue
        x = make_inputs(*SEED, TIME_T[-1], pattern)
        call(x)
        release()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        o, lse = call(x)
        sync()
        peak = torch.cuda.max_memory_allocated()
        inputs = sum(t.numel() * t.element_size() for t in x)
        out[pattern] = dict(
            peak_gb=peak / 1e9,
            over_resident_gb=(peak - resident) / 1e9,
            inputs_gb=inputs / 1e9,
            outputs_gb=(o.numel() * o.element_size() + lse.numel() * 4) / 1e9,
        )
        say(f"  {pattern}: peak {peak / 1e9:.3f} GB ({(peak - resident) / 1e9:.3f} GB above the "
            f"resident {resident / 1e9:.3f} GB; inputs {inputs / 1e9:.3f} GB)")  # fmt: skip
        del x, o, lse
        release()
    return out


def profile_kernels():
    """Device time per kernel of one auto call at seed T = TIME_T[-1], each pattern
    (eager)."""
    if DEV != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for pattern in ("random", "recent"):
        x = make_inputs(*SEED, TIME_T[-1], pattern)
        call(x)
        sync()
        n = 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                call(x)
            sync()
        per = out[pattern] = {}
        for evt in prof.key_averages():
            us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
            if us:
                per[evt.key] = us / n / 1e3
        say(f"  {pattern}:")
        for name, ms in sorted(per.items(), key=lambda kv: -kv[1])[:12]:
            say(f"  {ms:8.3f} ms  {name[:90]}")
        say(f"  {sum(per.values()):8.3f} ms  total per call")
        del x
        release()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, interpreter, fp32")
    ap.add_argument(
        "--sections", type=int, nargs="+", default=[1, 2, 3, 4], help="which of 1-4 to run"
    )
    ap.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="tuning fields for the whole run (e.g. combine_warps=16; None for None)",
    )
    args = ap.parse_args()
    global TUNING
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in KNOBS:
            ap.error(f"--set: unknown field {name!r} (one of {', '.join(KNOBS)})")
        value = None if value == "None" else type_of(name, value)
        TUNING = nsa_tuning.with_fields(TUNING, **{name: value})
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    deadline = t0 + args.budget_s
    result = dict(torch=torch.__version__, triton=triton.__version__, smoke=SMOKE)
    result["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter)"
    result["defaults"] = defaults()
    result["shape"] = dict(BS=BS, S=S, D=D, dtype=str(DTYPE), seed=SEED, paper=PAPER)
    say(f"{result['device']}, torch {torch.__version__}, triton {triton.__version__}; "
        f"defaults {result['defaults']}")  # fmt: skip

    say("\n1. correctness vs dense fp32 reference:")
    checks = []
    for (Hq, Hkv), T, pattern in [
        (h, T, p) for h in (SEED, PAPER) for T in CHECK_T for p in ("recent", "random")
    ]:
        if 1 not in args.sections:
            say("  not run (--sections)")
            break
        checks += check_case(Hq, Hkv, T, pattern)
    result["correctness"] = checks
    failed = [c for c in checks if not c["ok"]]

    steps = [
        (2, "timings", "2. per-call ms by CUDA-graph replay", lambda: time_cases(deadline)),
        (3, "sweep", "3. sweep (auto, seed, random)", lambda: sweep(deadline)),
        (4, "peak_memory", "4. peak VRAM of one auto call", peak_memory),
        (4, "profile", "   device time per kernel, auto, seed", profile_kernels),
    ]
    for section, key, title, fn in steps:
        say(f"\n{title} ({time.time() - t0:.0f}s):")
        if section not in args.sections:
            result[key] = "not run (--sections)"
            say("  not run (--sections)")
            continue
        if time.time() > deadline:
            result[key] = "skipped (budget)"
            say("  skipped (budget)")
            continue
        try:
            result[key] = fn()
        except Exception as e:  # report and continue
            result[key] = dict(error=f"{type(e).__name__}: {str(e)[:300]}",
                               traceback=traceback.format_exc())  # fmt: skip
            say("  failed:", result[key]["error"])
        release()
        if key == "timings" and isinstance(result[key], list):
            result["t_ratios"] = t_ratios(result[key])

    result["seconds"] = time.time() - t0
    result["failed_checks"] = len(failed)
    with open(os.path.join(args.out, "nsa_blocks.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    say(f"\nwrote {args.out}/nsa_blocks.json and nsa_blocks.txt ({result['seconds']:.0f}s)")
    if failed:
        say(f"CORRECTNESS FAILED in {len(failed)} case(s)")
    with open(os.path.join(args.out, "nsa_blocks.txt"), "w") as fh:
        fh.write("\n".join(OUT_LINES) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
