"""Compile the KDA verify kernels for an H200 (sm_90) without a GPU: registers, spills, smem.

    .venv/bin/python -m tools.dev.compile_kda_sm90 [--modes fused ...] [--block-v 4 16]
        [--warps 1 4] [--sub-v 0 32] [--stages 1 2] [--key-chunk 16]
        [--maxnreg 168] [--project auto] [--norm-row auto] [--stack-sums auto]
        [--floor-probe] [--sass]
        (sub-v 0: the whole BLOCK_V in one piece; key-chunk: the key chunk width of the
        state tiles; maxnreg: the register cap of both recurrence kernels; project: both
        kernels' projected form,
        auto = the table's; norm-row: the q/k norms summed as rows, auto = the table's;
        stack-sums: the prologue's reductions eight at a time, auto = the table's;
        floor-probe: the fused kernel's `VerifyTuning.floor_probe` form; sass:
        also count the SASS instructions, barriers, lane shuffles and special-function ops of
        each kernel; every choice is passed as the wrappers' `tuning=`)

Every call goes through the public wrappers with CPU tensors (bf16 inputs, the seed's
shape), as the benchmark calls them; a stand-in driver reports an sm_90 target, and each
kernel launch is replaced by Triton's `warmup`, which specializes the arguments like a real
launch, compiles down to a cubin with ptxas and runs nothing. cuobjdump then reports the
registers per thread, local memory (spills of the state tile show up here) and shared
memory of each (mode, BLOCK_V, SUB_V, num_warps, stages). A compile error here would be
one on the GPU.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import torch
import triton
from triton.backends.compiler import GPUTarget


class _Sm90Driver:
    """Just enough of a driver for Triton's JIT to compile for an H200."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


class _Capture:
    """Stands in for a kernel: `kernel[grid](...)` compiles (warmup) and records the result."""

    def __init__(self, jit, out):
        # fn: the kernel's Python function, as a JIT function's own `fn` (launchers read
        # its signature)
        self.jit, self.fn, self.out = jit, jit.fn, out

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.out.append(
                (
                    self.fn.__name__,
                    kwargs.get("num_warps"),
                    self.jit.warmup(*args, grid=grid, **kwargs),
                )
            )

        return launch


def tile_grid(block_v, sub_v, stages, warps):
    """Distinct tiles (BLOCK_V, SUB_V, stages, num_warps) of the given values: SUB_V 0 (or
    equal to BLOCK_V) is the one-piece tile, which has one stage; SUB_V > BLOCK_V is left
    out."""
    tiles = [
        (bv, sub if sub < bv else 0, st, nw)
        for bv in block_v
        for sub in sub_v
        for st in (stages if 0 < sub < bv else [1])
        for nw in warps
        if sub <= bv
    ]
    return list(dict.fromkeys(tiles))


def _cuobjdump(compiled, flag):
    """cuobjdump's output (Triton's own copy of the tool) for a compiled kernel's cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def resources(compiled):
    """REG / LOCAL / SHARED of a compiled kernel, from cuobjdump on its cubin."""
    text = _cuobjdump(compiled, "--dump-resource-usage")
    line = next(ln for ln in text.splitlines() if "REG:" in ln)
    return {
        kv.split(":")[0]: int(kv.split(":")[1])
        for kv in line.split()
        if kv.split(":")[0] in ("REG", "LOCAL", "SHARED", "STACK")
    }


def sass_counts(compiled):
    """Instruction counts of a compiled kernel's SASS (cuobjdump -sass): all, BAR (barriers),
    SHFL (lane shuffles), MUFU (special-function ops)."""
    text = _cuobjdump(compiled, "-sass")
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text, re.M)
    count = {"SASS": len(ops)}
    for key in ("BAR", "SHFL", "MUFU"):
        count[key] = sum(op.startswith(key) for op in ops)
    return count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--modes", nargs="+", default=["fused", "fused+ring", "unfused", "unfused+ring"]
    )
    ap.add_argument("--block-v", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--sub-v", type=int, nargs="+", default=[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[1])
    ap.add_argument("--key-chunk", type=int, default=None, help="default: the module's")
    ap.add_argument("--snap-cache", default="", help="snapshot_cache_modifier of both kernels")
    ap.add_argument("--hv", type=int, default=8)
    ap.add_argument("--safe-gate", action="store_true")
    ap.add_argument("--maxnreg", type=int, default=None, help="register cap of both kernels")
    ap.add_argument("--project", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--sass", action="store_true", help="also count SASS, BAR, SHFL, MUFU")
    ap.add_argument("--norm-row", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--stack-sums", default="auto", choices=["auto", "on", "off"])
    ap.add_argument(
        "--floor-probe", action="store_true", help="the fused kernel's floor probe (tuning)"
    )
    args = ap.parse_args()

    triton.runtime.driver.set_active(_Sm90Driver())
    from tools import gpu_check_kda as chk  # noqa: I001  (imports kernels without the interpreter)
    import kernels.kda.conv as conv_mod
    import kernels.kda.fused_verify as fused_mod
    import kernels.kda.recurrent as rec_mod
    import kernels.kda.tuning as kt

    os.environ["TRITON_INTERPRET"] = (
        "1"  # lets the wrappers accept CPU tensors; kernels stay compiled
    )
    chk.DEV, chk.DT = "cpu", torch.bfloat16
    flag = {"auto": None, "on": True, "off": False}
    base = dict(
        snapshot_cache_modifier=args.snap_cache,
        key_chunk=args.key_chunk,
        maxnreg=args.maxnreg,
        project=flag[args.project],
        norm_row=flag[args.norm_row],
        stack_sums=flag[args.stack_sums],
    )
    compiled = []
    for mod, name in (
        (fused_mod, "_fused_verify_kernel"),
        (rec_mod, "_recurrent_verify_kernel"),
        (conv_mod, "_causal_conv1d_update_kernel"),
    ):
        setattr(mod, name, _Capture(getattr(mod, name), compiled))
    B, lb = 2, (-5.0 if args.safe_gate else None)
    s = chk.make_set(B, args.hv, seed=0)
    head = (
        "mode", "BV", "SUB", "st", "warps", "order", "kernel", "REG", "STACK", "LOCAL", "SHARED",
        "s",
    )  # fmt: skip
    fmt = "{:>13} {:>3} {:>3} {:>2} {:>5} {:>5} {:>30} {:>4} {:>5} {:>6} {:>7} {:>5}"
    print(fmt.format(*head))
    n_err = n_spill = 0
    tiles = tile_grid(args.block_v, args.sub_v, args.stages, args.warps)
    first = tiles[0] if tiles else None
    order = "auto"
    for mode in args.modes:
        for bv, sub, st, nw in tiles:
            fields = dict(base, block_v=bv, sub_v=sub or None, stages=st, num_warps=nw)
            tuning = kt.KdaTuning(
                verify=replace(kt.DEFAULT.verify, **fields, floor_probe=args.floor_probe),
                recurrent=replace(kt.DEFAULT.recurrent, **fields),
            )
            compiled.clear()
            t0 = time.time()
            tag = f"{mode:>13} {bv:>3} {sub or bv:>3} {st:>2} {nw:>5} {order}"
            try:
                chk.runner(mode, s, B, args.hv, lb, tuning=tuning)()
            except Exception as e:  # report and go on
                n_err += 1
                print(f"{tag}  COMPILE ERROR {e!r}"[:400])
                continue
            for kname, warps, ck in compiled:
                if kname == "_causal_conv1d_update_kernel" and (bv, sub, st, nw) != first:
                    continue  # the conv kernel does not depend on the tile
                r = resources(ck)
                took = f"{time.time() - t0:.1f}"
                extra = ""
                if args.sass:
                    extra = "  " + " ".join(f"{k}={v}" for k, v in sass_counts(ck).items())
                print(
                    fmt.format(
                        mode, bv, sub or bv, st, warps, order, kname, r["REG"], r.get("STACK", 0),
                        r["LOCAL"], r["SHARED"], took,
                    )
                    + extra
                )  # fmt: skip
                n_spill += r["LOCAL"] > 0 or r.get("STACK", 0) > 0
    print(f"{n_err} compile errors, {n_spill} kernels with spills (local memory or a stack frame)")
    return 1 if n_err or n_spill else 0


if __name__ == "__main__":
    sys.exit(main())
