"""GPU check of the NSA selection kernels: bf16 correctness, timings, backward peak memory.

Usage (on a CUDA machine, from the repository root):
    python tools/gpu_check_nsa.py --out OUT_DIR [--quick]

For each shape and index pattern ('recent', 'random') it reports:
  * relative errors ||got - ref|| / ||ref|| of o (and dq, dk, dv where the dense fp32
    reference fits, T <= 8192; above that o is checked against the fp32 gather reference,
    and for the largest shape only the kernel runs);
  * forward and backward median times (triton.testing.do_bench), the backward both with the
    forward's lse and recomputing it (the seed's call), and forward TFLOP/s as % of the bf16
    8192^3 matmul rate measured in the same run;
  * at T = 32768 the backward's peak memory (max_memory_allocated with the inputs resident)
    against the bytes of q, k, v, block_idx, o, do, dq, dk, dv;
  * whether forward + backward capture into a CUDA graph and replay to identical results;
  * a sweep of the kernels' tuning fields at the seed shape, T = 32768 (skip: --no-sweep).
A failing case is recorded and the run continues. Prints a table; writes OUT_DIR/nsa_gpu.json.
"""

import argparse
import json
import os
import sys
import time
import traceback

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from kernels.nsa import (  # noqa: E402
    make_block_idx_random,
    make_block_idx_recent,
    selection_backward_triton,
    selection_forward_gather_reference,
    selection_forward_reference,
    selection_forward_triton,
    tuning,
)

BS, S, D = 64, 16, 64
SEED_SHAPES = [(1, 16, 4, T) for T in (512, 2048, 8192, 32768)]
PAPER_SHAPES = [(1, 64, 4, 8192), (1, 64, 4, 65536)]


def rel_err(got, ref):
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def matmul_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b)
    return 2 * 8192**3 / ms / 1e9


def make_inputs(B, Hq, Hkv, T, pattern):
    g = torch.Generator(device="cuda").manual_seed(T + Hq)
    q, k, v, do = [
        torch.randn(B, H, T, D, generator=g, device="cuda", dtype=torch.bfloat16)
        for H in (Hq, Hkv, Hkv, Hq)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    idx = make(B, Hkv, T, BS, S, "cuda")
    return q, k, v, do, idx


def check_errors(row, q, k, v, do, idx, o, grads):
    """Relative errors vs the dense fp32 reference (o and grads) or the gather one (o)."""
    B, Hq, T, _ = q.shape
    if T <= 8192:
        x = [t.float().requires_grad_() for t in (q, k, v)]
        ro = selection_forward_reference(*x, idx, BS)
        rg = torch.autograd.grad(ro, x, do.float())
        row["ref"] = "dense"
        row["err_o"] = rel_err(o, ro)
        for name, got, ref in zip(("dq", "dk", "dv"), grads, rg, strict=True):
            row["err_" + name] = rel_err(got, ref)
        del x, ro, rg
    elif B * Hq * T <= 16 * 32768:
        with torch.no_grad():
            ro = selection_forward_gather_reference(q.float(), k.float(), v.float(), idx, BS)
        row["ref"] = "gather(o only)"
        row["err_o"] = rel_err(o, ro)
        del ro
    else:
        row["ref"] = "none"


def check_graph(T=2048):
    """Capture forward + backward (lse recomputed, as the seed calls it) in a CUDA graph,
    replay it and compare with eager results; seed shape, both patterns."""
    rows = []
    for pattern in ("recent", "random"):
        row = dict(T=T, pattern=pattern)
        try:
            graph_case(row, *make_inputs(1, 16, 4, T, pattern))
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print(f"CUDA graph {pattern} T={T}: {row}")
        rows.append(row)
    return rows


def graph_case(row, q, k, v, do, idx):
    o = selection_forward_triton(q, k, v, idx, BS)
    ref = (o, *selection_backward_triton(q, k, v, idx, BS, do, o))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as graph capture requires
        o = selection_forward_triton(q, k, v, idx, BS)
        selection_backward_triton(q, k, v, idx, BS, do, o)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        go = selection_forward_triton(q, k, v, idx, BS)
        out = (go, *selection_backward_triton(q, k, v, idx, BS, do, go))
    graph.replay()
    torch.cuda.synchronize()
    row["graph_ok"] = all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    row["graph_ms"] = bench(graph.replay)


def run_case(B, Hq, Hkv, T, pattern, peak_tflops):
    row = dict(B=B, Hq=Hq, Hkv=Hkv, T=T, D=D, bs=BS, S=S, pattern=pattern)
    q, k, v, do, idx = make_inputs(B, Hq, Hkv, T, pattern)
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True)
    grads = selection_backward_triton(q, k, v, idx, BS, do, o, lse)
    torch.cuda.synchronize()
    row["finite"] = all(bool(torch.isfinite(t).all()) for t in (o, *grads))
    try:
        check_errors(row, q, k, v, do, idx, o, grads)
    except torch.cuda.OutOfMemoryError:
        row["ref"] = "reference OOM"
    torch.cuda.empty_cache()
    row["fwd_ms"] = bench(lambda: selection_forward_triton(q, k, v, idx, BS, return_lse=True))
    row["bwd_ms"] = bench(lambda: selection_backward_triton(q, k, v, idx, BS, do, o, lse))
    row["bwd_nolse_ms"] = bench(lambda: selection_backward_triton(q, k, v, idx, BS, do, o))
    flops = 4 * B * Hq * T * S * BS * D
    row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
    row["fwd_pct_peak"] = 100 * row["fwd_tflops"] / peak_tflops
    row["bwd_tflops"] = 2.5 * flops / row["bwd_ms"] / 1e9
    row["bwd_pct_peak"] = 100 * row["bwd_tflops"] / peak_tflops
    if T == 32768:
        del grads
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = selection_backward_triton(q, k, v, idx, BS, do, o, lse)
        torch.cuda.synchronize()
        tensors = sum(t.numel() * t.element_size() for t in (q, k, v, idx, o, do, *grads))
        row["bwd_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        row["bwd_peak_over_resident_gb"] = (torch.cuda.max_memory_allocated() - base) / 1e9
        row["tensors_gb"] = tensors / 1e9
        row["peak_over_tensors"] = torch.cuda.max_memory_allocated() / tensors
    return row


KNOBS = ["tile_rows", "num_warps", "dkdv_rows", "segment_chunks"]  # `kernels.nsa.tuning` fields
_D = tuning.DEFAULT
SWEEP = [  # values of KNOBS, passed as `tuning=`; the first is the default
    (_D.forward.tile_rows, _D.forward.num_warps, _D.backward.dkdv_rows, _D.backward.segment_chunks),
    (16, 4, 64, 256),
    (32, 4, 64, 256),
    (64, 4, 64, 256),
    (16, 2, 64, 256),
    (16, 8, 64, 256),
    (16, 4, 32, 256),
    (16, 4, 128, 256),
    (16, 4, 64, 64),
    (16, 4, 64, 1024),
]


def run_config(cfg, q, k, v, do, idx):
    """Forward + backward and their times with the tuning fields KNOBS set to cfg."""
    t = tuning.with_fields(**dict(zip(KNOBS, cfg, strict=True)))
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t)
    out = (o, *selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t))
    fwd_ms = bench(lambda: selection_forward_triton(q, k, v, idx, BS, return_lse=True, tuning=t))
    bwd_ms = bench(lambda: selection_backward_triton(q, k, v, idx, BS, do, o, lse, tuning=t))
    return out, fwd_ms, bwd_ms


def sweep_pattern(pattern, T):
    q, k, v, do, idx = make_inputs(1, 16, 4, T, pattern)
    rows, base = [], None
    for cfg in SWEEP:
        row = dict(pattern=pattern, T=T, config=dict(zip(KNOBS, cfg, strict=True)))
        try:
            out, row["fwd_ms"], row["bwd_ms"] = run_config(cfg, q, k, v, do, idx)
            base = base or out
            diffs = [rel_err(a, b) for a, b in zip(out, base, strict=True)]
            row["max_rel_diff_vs_default"] = max(diffs)
        except Exception as e:  # report and continue
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
    return rows


def sweep_configs(T=32768):
    """Time the tuning knobs at the seed shape; check each against the default's results."""
    rows = []
    for pattern in ("recent", "random"):
        rows += sweep_pattern(pattern, T)
        torch.cuda.empty_cache()
    print(f"\ntuning sweep, seed shape T={T} ({', '.join(KNOBS)}):")
    for r in rows:
        cfg = str(tuple(r["config"].values()))
        diff = fmt(r.get("max_rel_diff_vs_default"), ".1e")
        print(
            f"  {r['pattern']:>7} {cfg:>20} fwd {fmt(r.get('fwd_ms'), '7.3f')} ms "
            f"bwd {fmt(r.get('bwd_ms'), '7.3f')} ms  diff {diff}  {r.get('error', '')}"
        )
    return rows


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def print_table(rows, peak):
    print(f"\nbf16 matmul 8192^3: {peak:.0f} TFLOP/s (the % of peak below is against this)")
    hdr = (
        f"{'Hq/Hkv':>7} {'T':>6} {'pattern':>7} {'fwd_ms':>8} {'bwd_ms':>8} {'bwd*_ms':>8} "
        f"{'fwd%pk':>6} {'bwd%pk':>6} {'err_o':>8} {'err_dq':>8} {'err_dk':>8} {'err_dv':>8}  note"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        note = r.get("error", "")
        if "bwd_peak_gb" in r:
            note += f"peak {r['bwd_peak_gb']:.3f} GB vs tensors {r['tensors_gb']:.3f} GB "
        if r.get("finite") is False:
            note += "NON-FINITE "
        print(
            f"{r['Hq']:>3}/{r['Hkv']:<3} {r['T']:>6} {r['pattern']:>7} "
            f"{fmt(r.get('fwd_ms'), '8.3f')} {fmt(r.get('bwd_ms'), '8.3f')} "
            f"{fmt(r.get('bwd_nolse_ms'), '8.3f')} {fmt(r.get('fwd_pct_peak'), '6.1f')} "
            f"{fmt(r.get('bwd_pct_peak'), '6.1f')} {fmt(r.get('err_o'), '8.1e')} "
            f"{fmt(r.get('err_dq'), '8.1e')} {fmt(r.get('err_dk'), '8.1e')} "
            f"{fmt(r.get('err_dv'), '8.1e')}  {note}"
        )
    print("bwd = backward with the forward's lse; bwd* = lse recomputed (the seed's call)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="seed shape up to T=8192 only")
    ap.add_argument("--no-sweep", action="store_true", help="skip the tuning sweep")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    peak = matmul_tflops()
    shapes = SEED_SHAPES[:3] if args.quick else SEED_SHAPES + PAPER_SHAPES
    rows = []
    for B, Hq, Hkv, T in shapes:
        for pattern in ("recent", "random"):
            try:
                row = run_case(B, Hq, Hkv, T, pattern, peak)
            except Exception as e:  # report and continue
                row = dict(B=B, Hq=Hq, Hkv=Hkv, T=T, pattern=pattern)
                row["error"] = f"{type(e).__name__}: {str(e)[:200]} "
                row["traceback"] = traceback.format_exc()
            torch.cuda.empty_cache()
            rows.append(row)
            print(f"done Hq={Hq} T={T} {pattern} ({time.time() - t_start:.0f}s)", flush=True)
    print_table(rows, peak)
    graph = check_graph()  # last but the sweep: a failed capture may spoil the context
    sweep = []
    if not (args.quick or args.no_sweep):
        try:
            sweep = sweep_configs()
        except Exception as e:  # report and continue
            sweep = [dict(error=f"{type(e).__name__}: {str(e)[:200]}")]
            print("sweep failed:", sweep[0]["error"])
    result = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        matmul_bf16_tflops=peak,
        rows=rows,
        graph=graph,
        sweep=sweep,
        seconds=time.time() - t_start,
    )
    path = os.path.join(args.out, "nsa_gpu.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {path} ({result['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
