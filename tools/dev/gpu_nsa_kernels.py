"""Device time per kernel of one NSA call, for an A/B of two checkouts on one GPU.

    PYTHONPATH=<checkout>/src python3 -m tools.dev.gpu_nsa_kernels TAG [--calls fwd bwd]
        [--points 32768:recent:seed 4096:random:seed ...]                  (about 20 s)

Seed shape (B=1, Hkv=4, D=64, bs=64, S=16; Hq=16 for 'seed', 64 for 'paper'), bf16. Per
point and call (forward, or backward with lse given): 3 warm calls, then 5 eager calls under
torch.profiler; prints the total device time per call, the device operations per call and
the 12 largest kernels (device time per call, launches per call). Run it from each
checkout in turn (PYTHONPATH picks the package); the tool itself only uses the public API.
"""

import argparse
import collections

import torch

from kernels.nsa import (
    make_block_idx_random,
    make_block_idx_recent,
    selection_backward_triton,
    selection_forward_triton,
)

B, HKV, D, BS, S = 1, 4, 64, 64, 16
HQ = {"seed": 16, "paper": 64}
CALLS = 5


def calls(T, pattern, preset):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(B, n, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for n in (HQ[preset], HKV, HKV, HQ[preset])
    )
    if pattern == "recent":
        idx = make_block_idx_recent(B, HKV, T, BS, S, device="cuda")
    else:
        idx = make_block_idx_random(B, HKV, T, BS, S, device="cuda", seed=0)
    o, lse = selection_forward_triton(q, k, v, idx, BS, return_lse=True)
    return {
        "fwd": lambda: selection_forward_triton(q, k, v, idx, BS),
        "bwd": lambda: selection_backward_triton(q, k, v, idx, BS, do, o, lse),
    }


def per_kernel(fn):
    """{kernel name: (device us per call, launches per call)} over CALLS eager calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    us, n = collections.defaultdict(float), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us[e.name[:60]] += e.device_time / CALLS
            n[e.name[:60]] += 1
    return {name: (us[name], n[name] // CALLS) for name in us}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tag")
    ap.add_argument("--calls", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument(
        "--points",
        nargs="+",
        default=["32768:recent:seed", "32768:random:seed", "4096:random:seed", "4096:recent:seed"],
    )
    a = ap.parse_args()
    for point in a.points:
        T, pattern, preset = point.split(":")
        fns = calls(int(T), pattern, preset)
        for name in a.calls:
            kernels = per_kernel(fns[name])
            total = sum(us for us, _ in kernels.values())
            ops = sum(n for _, n in kernels.values())
            print(f"== {a.tag} {name} T={T} {preset} {pattern}: total {total:.1f} us, {ops} ops")
            for kname, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]:
                print(f"   {us:9.1f}  x{n}  {kname}")


if __name__ == "__main__":
    main()
