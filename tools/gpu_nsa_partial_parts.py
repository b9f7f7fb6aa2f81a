"""Where the NSA block path's partial kernel spends its time: variants with parts switched off.

    PYTHONPATH=src python3 tools/gpu_nsa_partial_parts.py --out DIR     (about 30 s on an H200)

Each variant is `kernels/nsa/forward_blocks.py` with some of the partial kernel's memory
traffic masked off by a runtime test that is always false (`qk_scale < 0`), so the compiler
keeps all the arithmetic: `no_o_store` (the partial o), `no_stores` (o and lse),
`no_q_load` (the gathered q rows), `no_kv_load` (the K/V block), `no_loads_no_stores` (all
of them). Each variant replaces the module's `_partial_kernel` for a few eager forward
calls at the seed shape (Hq 16, Hkv 4, D 64, block 64, S 16), T = 32768, 'random', and
torch.profiler gives the partial kernel's device time per call. The variants' outputs are
wrong by design: nothing is checked. Two rounds; prints a table and writes DIR/parts.json.
"""

import argparse
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from kernels.nsa import forward_blocks, make_block_idx_random, selection_forward_triton  # noqa: E402

NEVER = " & (qk_scale < 0)"
STORE_O = (
    "mask=ok[:, None], eviction_policy=EVICT)",
    "mask=ok[:, None]" + NEVER + ", eviction_policy=EVICT)",
)
STORE_L = ("b_m + b_lg, mask=ok)", "b_m + b_lg, mask=ok" + NEVER + ")")
LOAD_Q = (
    "b_q = tl.load(Q + o_q[:, None] + i_d[None, :])",
    "b_q = tl.load(Q + o_q[:, None] + i_d[None, :], mask=qk_scale < 0, other=0.0)",
)
LOAD_KV = (
    "b_k = tl.load(K + o_kv[:, None] + i_d[None, :])\n"
    "    b_v = tl.load(V + o_kv[:, None] + i_d[None, :])",
    "b_k = tl.load(K + o_kv[:, None] + i_d[None, :], mask=qk_scale < 0, other=0.0)\n"
    "    b_v = tl.load(V + o_kv[:, None] + i_d[None, :], mask=qk_scale < 0, other=0.0)",
)
VARIANTS = {
    "base": [],
    "no_o_store": [STORE_O],
    "no_stores": [STORE_O, STORE_L],
    "no_q_load": [LOAD_Q],
    "no_kv_load": [LOAD_KV],
    "no_loads_no_stores": [STORE_O, STORE_L, LOAD_Q, LOAD_KV],
}


def variant_kernel(name, edits, tmp):
    """The `_partial_kernel` of a copy of forward_blocks.py with `edits` applied."""
    src = open(forward_blocks.__file__).read()
    src = src.replace("from . import _checks", "from kernels.nsa import _checks")
    src = src.replace("from .forward import", "from kernels.nsa.forward import")
    for old, new in edits:
        if old not in src:
            raise SystemExit(f"variant {name}: the kernel source changed, {old!r} not found")
        src = src.replace(old, new)
    path = os.path.join(tmp, f"nsa_partial_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"nsa_partial_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._partial_kernel


def partial_ms(call, n=5):
    """Device time of the partial kernel per call, from torch.profiler over n calls."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    us = sum(
        getattr(e, "device_time_total", 0) or 0
        for e in prof.key_averages()
        if "_partial_kernel" in e.key
    )
    return us / n / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kernels = {k: variant_kernel(k, e, args.out) for k, e in VARIANTS.items()}
    T, Hq, Hkv, D, bs, S = 32768, 16, 4, 64, 64, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, H, T, D, generator=g, device="cuda", dtype=torch.bfloat16)
        for H in (Hq, Hkv, Hkv)
    )
    idx = make_block_idx_random(1, Hkv, T, bs, S, "cuda", 0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    res = {}
    for rnd in range(2):
        for name, kern in kernels.items():
            forward_blocks._partial_kernel = kern
            ms = partial_ms(lambda: selection_forward_triton(q, k, v, idx, bs))
            res.setdefault(name, []).append(ms)
            print(f"round {rnd}  {name:20s} partial kernel {ms:.3f} ms", flush=True)
    with open(os.path.join(args.out, "parts.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
