"""Device memory rates of the GPU: write-only, read-only and copy, in GB/s.

    python3 -m tools.dev.gpu_copy_rates [--gib 2]

Times `fill_` (writes only), `sum` (reads only) and `copy_` (a read and a write per byte)
of --gib GiB of fp32 with CUDA events (3 warm-up calls, median of 10) and prints one line
each, bytes moved over time. The KDA snapshot modes mostly write (four fp32 state
snapshots per step read), so whether the card writes as fast as it copies tells whether
their copy-rate targets are reachable at all.
"""

import argparse
import statistics

import torch


def rate(fn, nbytes, reps=10):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return nbytes / statistics.median(times) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    args = ap.parse_args()
    n = int(args.gib * (1 << 30)) // 4
    x = torch.empty(n, device="cuda")
    y = torch.empty(n, device="cuda")
    x.fill_(1.0)
    print(torch.cuda.get_device_name(), torch.__version__)
    print(f"write-only (fill_) GB/s {rate(lambda: x.fill_(1.0), 4 * n):.0f}")
    print(f"copy (read+write) GB/s {rate(lambda: y.copy_(x), 8 * n):.0f}")
    print(f"read-only (sum) GB/s {rate(lambda: x.sum(), 4 * n):.0f}")


if __name__ == "__main__":
    main()
