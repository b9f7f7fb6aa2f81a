"""GPU tuning run for the NSA selection kernels: bf16 correctness, timings, knob sweeps, memory.

Usage (on a CUDA machine, from the repository root):
    PYTHONPATH=src python -m tools.dev.gpu_tune_nsa --out OUT_DIR [--budget 200] [--no-sweep]

1. Correctness: bf16 forward and backward against the dense fp32 reference at T = 2048,
   patterns 'recent' and 'random', G = 4 (Hq 16 / Hkv 4) and G = 16 (Hq 16 / Hkv 1); the
   bound is 1e-2.
2. Timings (triton.testing.do_bench, median) with the default tuning: the seed shape
   (B 1, Hq 16, Hkv 4, D 64, bs 64, S 16) at T = 8192 and 32768, both patterns, and the paper
   shape (Hq 64, Hkv 4) at T = 65536 'recent'; % of the bf16 matmul rate measured here;
   T = 8192 -> 32768 time ratios; pass/fail against the targets.
3. Backward peak memory at the seed shape, T = 32768 (inputs resident, lse given) against
   the bytes of q, k, v, block_idx, o, do, dq, dk, dv (target <= 1.5x).
4. Sweeps of `kernels.nsa.tuning` fields, one group at a time, the others at their
   defaults: the forward (tile_rows, num_warps, num_stages), the dq kernel (dq_rows,
   dq_warps, dq_stages) and the dk/dv kernel (dkdv_rows, dkdv_warps, dkdv_stages,
   segment_chunks), passed as `tuning=`, at T = 32768 for
   both patterns and on the paper shape; every config's outputs are compared with the
   default's. Then the best of each group together, per case. Sweeps stop when --budget
   seconds have passed (the rest is listed as skipped).
Prints short tables; writes OUT_DIR/nsa_tune.json.
"""

import argparse
import contextlib
import itertools
import json
import os
import time
import traceback

import torch
import triton

from kernels.nsa import (
    make_block_idx_random,
    make_block_idx_recent,
    selection_backward_triton,
    selection_forward_reference,
    selection_forward_triton,
    tuning,
)

BS, S, D = 64, 16, 64
DTYPE = torch.bfloat16
# name: (Hq, Hkv, T, pattern, forward target ms, backward target ms)
CASES = {
    "seed-8k-recent": (16, 4, 8192, "recent", None, None),
    "seed-8k-random": (16, 4, 8192, "random", None, None),
    "seed-32k-recent": (16, 4, 32768, "recent", 0.60, 2.0),
    "seed-32k-random": (16, 4, 32768, "random", 1.0, 6.0),
    "paper-64k-recent": (64, 4, 65536, "recent", 6.0, 13.0),
}
SWEEP_CASES = ["seed-32k-recent", "seed-32k-random", "paper-64k-recent"]

FWD_KNOBS = ["tile_rows", "num_warps", "num_stages"]  # `kernels.nsa.tuning` field names
DQ_KNOBS = ["dq_rows", "dq_warps", "dq_stages"]
DKDV_KNOBS = ["dkdv_rows", "dkdv_warps", "dkdv_stages", "segment_chunks"]
ALL_KNOBS = FWD_KNOBS + DQ_KNOBS + DKDV_KNOBS
TUNING = tuning.DEFAULT  # what every call passes; `knobs` replaces fields of it

# Forward and dq: rows x warps x stages (and one unpipelined point).
TILE_SWEEP = [(64, 4, 1)] + list(itertools.product([16, 32, 64, 128], [4, 8], [2, 3]))
DKDV_SWEEP = [(r, w, s, 256) for r, w, s in itertools.product([32, 64, 128], [4, 8], [2, 3])]
DKDV_SWEEP += [(64, 4, 1, 256)] + [(64, 4, 2, c) for c in (32, 64, 1024)]


def rel_err(got, ref):
    return ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def bench(fn, rep=40):
    return triton.testing.do_bench(fn, warmup=5, rep=rep, return_mode="median")


def matmul_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / bench(lambda: a @ b) / 1e9


@contextlib.contextmanager
def knobs(settings):
    """Replace tuning fields (name -> value) for the duration of the block."""
    global TUNING
    saved = TUNING
    TUNING = tuning.with_fields(TUNING, **settings)
    try:
        yield
    finally:
        TUNING = saved


def default_values():
    flat = {}
    for group in ("forward", "block_major", "backward"):
        flat.update(vars(getattr(tuning.DEFAULT, group)))
    return {n: flat[n] for n in ALL_KNOBS}


def make_inputs(Hq, Hkv, T, pattern, seed=0):
    g = torch.Generator(device="cuda").manual_seed(T + Hq + seed)
    q, k, v, do = [
        torch.randn(1, H, T, D, generator=g, device="cuda", dtype=DTYPE) for H in (Hq, Hkv, Hkv, Hq)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    return q, k, v, do, make(1, Hkv, T, BS, S, "cuda")


def run_all(x):
    q, k, v, do, idx = x
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=TUNING)
    return (o, lse, *selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=TUNING))


def check_correctness():
    """bf16 kernels vs the dense fp32 reference at T = 2048, G = 4 and 16."""
    rows = []
    for (Hq, Hkv), pattern in itertools.product([(16, 4), (16, 1)], ["recent", "random"]):
        row = dict(G=Hq // Hkv, pattern=pattern)
        try:
            x = make_inputs(Hq, Hkv, 2048, pattern)
            o, _, *grads = run_all(x)
            again = run_all(x)
            q, k, v, do, idx = x
            ref = [t.float().requires_grad_() for t in (q, k, v)]
            ro = selection_forward_reference(*ref, idx, BS)
            rg = torch.autograd.grad(ro, ref, do.float())
            errs = [rel_err(o, ro)] + [rel_err(a, b) for a, b in zip(grads, rg, strict=True)]
            row.update(err_o=errs[0], err_dq=errs[1], err_dk=errs[2], err_dv=errs[3])
            row["deterministic"] = all(
                torch.equal(a, b) for a, b in zip((o, *grads), (again[0], *again[2:]), strict=True)
            )
            row["ok"] = max(errs) < 1e-2 and row["deterministic"]
        except Exception as e:  # report and continue
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            row["traceback"] = traceback.format_exc()
        rows.append(row)
        errs = " ".join(f"{row.get('err_' + n, float('nan')):.1e}" for n in ("o", "dq", "dk", "dv"))
        print(f"  G={row['G']:>2} {pattern:>6}: {'ok ' if row['ok'] else 'FAIL'} "
              f"err o/dq/dk/dv {errs} {row.get('error', '')}", flush=True)  # fmt: skip
    return rows


def time_case(x, rep=40):
    q, k, v, do, idx = x
    t = TUNING
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t)
    selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t)
    fwd = bench(lambda: selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t), rep)
    bwd = bench(lambda: selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t), rep)
    return fwd, bwd


def backward_peak(x):
    """Peak allocated bytes of one backward (lse given) with its inputs resident."""
    q, k, v, do, idx = x
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=TUNING)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    grads = selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=TUNING)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    tensors = sum(t.numel() * t.element_size() for t in (q, k, v, idx, o, do, *grads))
    return dict(peak_gb=peak / 1e9, tensors_gb=tensors / 1e9, ratio=peak / tensors)


def sweep_group(name, knob_list, configs, x, base, deadline, bwd):
    """Time each config of one knob group; compare its outputs with the default's."""
    rows = []
    for cfg in configs:
        row = dict(group=name, config=dict(zip(knob_list, cfg, strict=True)))
        if time.time() > deadline:
            row["skipped"] = True
            rows.append(row)
            continue
        try:
            with knobs(dict(zip(knob_list, cfg, strict=True))):
                out = run_all(x)
                fwd, bwd_ms = time_case(x, rep=25) if bwd else (None, None)
                if not bwd:
                    q, k, v, _, idx = x
                    t = TUNING
                    fwd = bench(
                        lambda: selection_forward_triton(
                            q, k, v, idx, BS, return_lse=True, tuning=t
                        ),
                        25,
                    )
            # o, dq, dk, dv (not lse) against the default tuning's results.
            row["max_rel_diff_vs_default"] = max(
                rel_err(out[i], base[i]) for i in range(len(out)) if i != 1
            )
            row["ms"] = bwd_ms if bwd else fwd
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    return rows


def sweep_case(name, deadline):
    """All three knob groups on one case, then the best of each together."""
    Hq, Hkv, T, pattern, *_ = CASES[name]
    x = make_inputs(Hq, Hkv, T, pattern)
    base = run_all(x)
    groups = (("fwd", FWD_KNOBS, TILE_SWEEP), ("dq", DQ_KNOBS, TILE_SWEEP))
    groups += (("dkdv", DKDV_KNOBS, DKDV_SWEEP),)
    rows, best = [], {}
    for g, knob_list, configs in groups:
        got = sweep_group(g, knob_list, configs, x, base, deadline, bwd=g != "fwd")
        rows += got
        best[g] = b = best_of(got)
        done = [r for r in got if "ms" in r]
        bad = [r for r in got if "error" in r]
        skipped = sum(1 for r in got if r.get("skipped"))
        desc = f"{tuple(b['config'].values())} {b['ms']:.3f} ms" if b else "-"
        print(f"  {g:>4}: best {desc}  ({len(done)} timed, {len(bad)} errors, {skipped} skipped)")
        for r in bad[:3]:
            print(f"        error {tuple(r['config'].values())}: {r['error'][:160]}")
        for r in done:
            if r["max_rel_diff_vs_default"] >= 2e-2:
                diff = r["max_rel_diff_vs_default"]
                print(f"        MISMATCH {tuple(r['config'].values())}: {diff:.1e}")
    combined = {}
    if best["fwd"] and best["dq"] and best["dkdv"]:
        with knobs(knob_values(best["fwd"], FWD_KNOBS)):
            combined["fwd_ms"] = time_case(x)[0]
        bwd_set = {**knob_values(best["dq"], DQ_KNOBS), **knob_values(best["dkdv"], DKDV_KNOBS)}
        with knobs(bwd_set):
            combined["bwd_ms"] = time_case(x)[1]
        combined["fwd_config"] = best["fwd"]["config"]
        combined["bwd_config"] = {**best["dq"]["config"], **best["dkdv"]["config"]}
        print(f"  best together: fwd {combined['fwd_ms']:.3f} ms, bwd {combined['bwd_ms']:.3f} ms")
    return dict(rows=rows, best=best, combined=combined)


def best_of(rows):
    ok = [r for r in rows if "ms" in r and r["max_rel_diff_vs_default"] < 2e-2]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def knob_values(cfg_row, knob_list):
    return {n: cfg_row["config"][n] for n in knob_list}


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=200.0, help="seconds before sweeps stop")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    deadline = t0 + args.budget
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    result["triton"] = triton.__version__
    result["defaults"] = default_values()
    peak = result["matmul_bf16_tflops"] = matmul_tflops()
    print(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s; defaults {result['defaults']}")

    print("\ncorrectness, bf16 vs dense fp32 reference, T=2048:")
    result["correctness"] = check_correctness()

    print(f"\ndefault tuning ({time.time() - t0:.0f}s):")
    times = {}
    for name, (Hq, Hkv, T, pattern, tf, tb) in CASES.items():
        row = dict(Hq=Hq, Hkv=Hkv, T=T, pattern=pattern, fwd_target=tf, bwd_target=tb)
        try:
            x = make_inputs(Hq, Hkv, T, pattern)
            row["fwd_ms"], row["bwd_ms"] = time_case(x)
            flops = 4 * Hq * T * S * BS * D
            row["fwd_pct_peak"] = 100 * flops / row["fwd_ms"] / 1e9 / peak
            row["bwd_pct_peak"] = 100 * 2.5 * flops / row["bwd_ms"] / 1e9 / peak
            if T == 32768:
                row["memory"] = backward_peak(x)
            del x
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["traceback"] = traceback.format_exc()
        torch.cuda.empty_cache()
        times[name] = row
        verdict = ""
        if tf is not None and "fwd_ms" in row:
            verdict = f"fwd {'OK ' if row['fwd_ms'] <= tf else 'MISS'} (<= {tf}) "
            verdict += f"bwd {'OK ' if row['bwd_ms'] <= tb else 'MISS'} (<= {tb})"
        mem = row.get("memory")
        if mem:
            verdict += f"  bwd peak {mem['peak_gb']:.3f} GB = {mem['ratio']:.2f}x tensors"
        print(
            f"  {name:>17} fwd {fmt(row.get('fwd_ms'), '7.3f')} ms "
            f"({fmt(row.get('fwd_pct_peak'), '4.1f')}% pk) bwd {fmt(row.get('bwd_ms'), '7.3f')} ms "
            f"({fmt(row.get('bwd_pct_peak'), '4.1f')}% pk)  {verdict} {row.get('error', '')}",
            flush=True,
        )
    for p in ("recent", "random"):
        a, b = times.get(f"seed-8k-{p}", {}), times.get(f"seed-32k-{p}", {})
        if "bwd_ms" in a and "bwd_ms" in b:
            r = (b["fwd_ms"] / a["fwd_ms"], b["bwd_ms"] / a["bwd_ms"])
            times[f"ratio-32k/8k-{p}"] = dict(fwd=r[0], bwd=r[1])
            print(f"  T 8192->32768 time ratio {p}: fwd {r[0]:.2f} bwd {r[1]:.2f} (<= 4.4)")
    result["default"] = times

    sweeps = {}
    if not args.no_sweep:
        for name in SWEEP_CASES:
            print(f"\nsweep {name} ({time.time() - t0:.0f}s)", flush=True)
            try:
                sweeps[name] = sweep_case(name, deadline)
            except Exception as e:  # report and continue
                sweeps[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                print("  failed:", sweeps[name]["error"])
            torch.cuda.empty_cache()
    result["sweeps"] = sweeps
    result["seconds"] = time.time() - t0
    path = os.path.join(args.out, "nsa_tune.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print(f"\nwrote {path} ({result['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
