"""What the KDA cold figure depends on: buffer sets against L2, and graph size.

    PYTHONPATH=src python3 -m tools.dev.gpu_cold_probe [--batch 1 4 16 64]

For each batch and mode (safe gate, H8-HV8), builds the asv benchmark's inputs
(`benchmarks.kda.KdaVerify`, its check included) and `cold_set_count` sets, then times one
call per set (median of the suite's samples, `benchmarks.common._event_samples`) in six
arrangements; us per call:
  seed10    one set, a graph of 10 calls replayed (the seed-style figure);
  old10     10 sets, one graph of 10 (the cold figure before version 2: warm below B = 16);
  1set_g10  one set, N calls in graphs of 10 replayed in turn (graph switching, warm data);
  N_g10     N sets in graphs of 10; N_g40: in graphs of 40; N_g1: all N in one graph (the
            cold figure since version 2).
"""

import argparse
import statistics

import torch

from benchmarks import common as bc
from benchmarks import kda as kb


def per_call_us(fns, calls, per_graph):
    """Median us per call of `calls` calls (call i runs fns[i % len(fns)]) captured in
    graphs of `per_graph` calls, replayed in order."""
    seq = [fns[i % len(fns)] for i in range(calls)]
    for f in fns:
        f()
    torch.cuda.synchronize()
    graphs = []
    for i0 in range(0, calls, per_graph):
        graphs.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(graphs[-1]):
            for f in seq[i0 : i0 + per_graph]:
                f()

    def run():
        for g in graphs:
            g.replay()

    return statistics.median(bc._event_samples(run, calls, bc.SAMPLES)) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    args = ap.parse_args()
    print("L2 bytes", kb.l2_bytes())
    for B in args.batch:
        for mode in kb.MODES:
            inst = kb.KdaVerify()
            bc.set_up(inst, B, mode, "safe", "H8-HV8")
            n = kb.cold_set_count(B, 8, 8, mode, kb.l2_bytes())
            fns = [inst.call(seed=1 + i) for i in range(n)]
            r = {
                "seed10": per_call_us([inst.fn], 10, 10),
                "old10": per_call_us(fns[:10], 10, 10),
                "1set_g10": per_call_us([inst.fn], n, 10),
                "N_g10": per_call_us(fns, n, 10),
                "N_g40": per_call_us(fns, n, 40),
                "N_g1": per_call_us(fns, n, n),
            }
            cells = " ".join(f"{k}={v:.2f}" for k, v in r.items())
            print(f"B={B:>2} {mode:>12} N={n:>3} {cells}", flush=True)
            del fns, inst
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
