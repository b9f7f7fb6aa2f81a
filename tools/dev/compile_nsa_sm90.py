"""Compile the NSA selection kernels for an H200 (sm_90) without a GPU: registers, spills.

    .venv/bin/python -m tools.dev.compile_nsa_sm90 [--seq-len 4096] [--shapes seed paper] [--sass]

Every kernel the public forward and backward launch (token-tile path, block path,
backward) is compiled through the wrappers with CPU tensors
in bf16, the way `tools/dev/compile_kda_sm90.py` does for KDA: a stand-in driver reports an
sm_90 target and each launch is replaced by Triton's `warmup`, which specializes the
arguments like a real launch and compiles down to a cubin with ptxas, running nothing
(later kernels see unwritten inputs, which compiling does not mind). Prints registers,
local memory (spills) and static shared memory per kernel and configuration (with --sass
also the SASS instruction count, barriers, lane shuffles and special-function ops); exits
1 on a compile error. The interpreter runs a kernel's Python; this catches what only Triton's GPU
lowering rejects.
"""

import argparse
import sys
import time

import torch
import triton

from tools.dev.compile_kda_sm90 import _Capture, _Sm90Driver, resources, sass_counts

SHAPES = {"seed": (16, 4), "paper": (64, 4)}  # (Hq, Hkv); D=64, block 64, S=16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--shapes", nargs="+", default=["seed"], choices=list(SHAPES))
    ap.add_argument("--sass", action="store_true", help="also count SASS, BAR, SHFL, MUFU")
    args = ap.parse_args()

    triton.runtime.driver.set_active(_Sm90Driver())
    import kernels.nsa as nsa  # noqa: I001  (compiled kernels: no interpreter at import)
    import kernels._runtime as runtime_mod
    import kernels.nsa._checks as checks_mod
    import kernels.nsa.backward as bwd_mod
    import kernels.nsa.block_major as blk_mod
    import kernels.nsa.forward as fwd_mod
    import kernels.nsa.inverse as inv_mod
    import kernels.nsa.tiles as tiles_mod
    from kernels.nsa import tuning

    # CPU tensors stand in for CUDA ones: the wrappers' device check is the only place that
    # minds (the interpreter stays off, so every launch takes its compiled-kernel settings).
    checks_mod._devices = lambda named: None
    # ... and as an sm_90 device, so the launches that are programmatic dependents there
    # (`fix_pdl`, `chain_pdl`) compile with their waits and triggers.
    runtime_mod.pdl_supported = lambda device: True
    compiled = []
    for mod in (tiles_mod, fwd_mod, blk_mod, bwd_mod, inv_mod):
        for name, obj in list(vars(mod).items()):
            if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                setattr(mod, name, _Capture(obj, compiled))

    fmt = "{:>6} {:>6} {:>7} {:>28} {:>4} {:>6} {:>7} {:>5}"
    print(fmt.format("shape", "pat", "path", "kernel", "REG", "LOCAL", "SHARED", "s"))
    n_err = n_spill = 0
    T, D, bs, S = args.seq_len, 64, 64, 16
    for shape in args.shapes:
        Hq, Hkv = SHAPES[shape]
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, Hq, T, D, generator=g).to(torch.bfloat16)
        k = torch.randn(1, Hkv, T, D, generator=g).to(torch.bfloat16)
        v = torch.randn(1, Hkv, T, D, generator=g).to(torch.bfloat16)
        do = torch.randn(1, Hq, T, D, generator=g).to(torch.bfloat16)
        for pattern in ("recent", "random"):
            if pattern == "recent":
                idx = nsa.make_block_idx_recent(1, Hkv, T, bs, S, "cpu")
            else:
                idx = nsa.make_block_idx_random(1, Hkv, T, bs, S, "cpu", 0)
            for path in ("tile", "blocks", "backward"):
                compiled.clear()
                t0 = time.time()
                tag = f"{shape:>6} {pattern:>6} {path:>7}"
                try:
                    if path == "backward":
                        o, lse = nsa.selection_forward_triton(q, k, v, idx, bs, return_lse=True)
                        compiled.clear()
                        nsa.selection_backward_triton(q, k, v, idx, bs, do, o, lse)
                    else:
                        t = tuning.with_fields(schedule=path)
                        nsa.selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=t)
                except Exception as e:  # report and go on
                    n_err += 1
                    print(f"{tag}  COMPILE ERROR {e!r}"[:400])
                    continue
                took = f"{time.time() - t0:.1f}"
                for kname, _, ck in compiled:
                    r = resources(ck)
                    n_spill += r["LOCAL"] > 0
                    extra = ""
                    if args.sass:
                        extra = "  " + " ".join(f"{k}={v}" for k, v in sass_counts(ck).items())
                    print(
                        fmt.format(shape, pattern, path, kname, r["REG"], r["LOCAL"],
                                   r["SHARED"], took) + extra
                    )  # fmt: skip
    print(f"{n_err} compile errors, {n_spill} kernels with local memory (spills)")
    return 1 if n_err else 0


if __name__ == "__main__":
    sys.exit(main())
