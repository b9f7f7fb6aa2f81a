"""One process: the NSA forward (`auto` schedule) at the seed shape, T = 32768, both patterns,
timed with the suite's timer, and the random pattern's device time per kernel.

    PYTHONPATH=src python3 -m tools.dev.gpu_nsa_profile TAG [FIELD=VALUE ...]    (about 15 s)
    PYTHONPATH=src python3 -m tools.dev.gpu_nsa_profile --timeline TAG [FIELD=VALUE ...]

FIELD=VALUE sets a field of the NSA tuning (`kernels.nsa.tuning`, e.g. partial_stages=3 or
overlap_tile_kernel=False) for the run.
Before timing a pattern it checks o and lse against the token-tile schedule (exits if
they differ beyond bf16 rounding). Prints one JSON line: the tag, o's relative error per
pattern, ms per call for 'random' and 'recent' (median of
`benchmarks.common.per_call_seconds`: 2 calls captured in a CUDA graph, as the asv suite
times them) and ms per call of each block-path kernel (torch.profiler, 5 eager calls).
For an A/B of two commits, run it from two checkouts in turn, alternating, on one GPU:
cards of one model differ by several percent on this memory-bound path.
--timeline: also one 'random' call captured in a CUDA graph as the suite times it, replayed
under torch.profiler; prints every kernel of the last replay (fills and memsets included)
with its start and end in us from the replay's first kernel, and the replay's span, so the
gaps between the kernels show.
"""

import ast
import json
import statistics
import sys

import torch

from benchmarks.common import per_call_seconds
from kernels.nsa import selection_forward_triton, tuning
from kernels.nsa.indices import make_block_idx_random, make_block_idx_recent

KERNELS = ("_partial_kernel", "_combine_kernel", "_fill_kernel", "_sel_fwd_kernel",
           "_tile_list_kernel", "_prefix_kernel")  # fmt: skip


def check(q, k, v, idx, bs, t):
    """o's relative error against the token-tile schedule (another algorithm: each token's
    blocks in turn, no partials), and lse's largest difference; exits before any timing
    when they are beyond bf16 rounding, so a wrong setting never prints a time."""
    o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=t)
    tile = tuning.with_fields(t, schedule="tile")
    ro, rlse = selection_forward_triton(q, k, v, idx, bs, return_lse=True, tuning=tile)
    err = ((o.float() - ro.float()).norm() / ro.float().norm()).item()
    finite = torch.isfinite(rlse)
    dlse = (lse[finite] - rlse[finite]).abs().max().item()
    if not (err < 1e-2 and dlse < 2e-2 and torch.equal(finite, torch.isfinite(lse))):
        raise SystemExit(f"check failed: o rel err {err:.2e}, lse max diff {dlse:.2e}")
    return float(f"{err:.2e}")


def timeline(call):
    """Kernels of one graph replay of `call`: (name, start us, end us) from its first
    kernel, sorted by start; and the replay's span in us."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    # Every replay launches the same kernels: the last third is the last replay.
    if len(kernels) % 3:
        raise SystemExit(f"timeline: {len(kernels)} kernels in 3 replays")
    last = kernels[-len(kernels) // 3 :]
    t0 = last[0].time_range.start
    rows = [(e.name[:60], e.time_range.start - t0, e.time_range.end - t0) for e in last]
    return rows, max(r[2] for r in rows)


def main():
    show_timeline = sys.argv[1] == "--timeline"
    if show_timeline:
        del sys.argv[1]
    tag, fields = sys.argv[1], sys.argv[2:]
    t = tuning.DEFAULT
    for kv in fields:
        name, value = kv.split("=", 1)
        try:
            t = tuning.with_fields(t, **{name: ast.literal_eval(value)})
        except ValueError as e:
            raise SystemExit(str(e)) from None
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 32768, 64, 64, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(B, h, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for h in (Hq, Hkv, Hkv)
    )
    res = {"tag": tag}
    for pattern in ("random", "recent"):
        if pattern == "random":
            idx = make_block_idx_random(B, Hkv, T, bs, S, "cuda", 0)
        else:
            idx = make_block_idx_recent(B, Hkv, T, bs, S, "cuda")

        def call():
            return selection_forward_triton(q, k, v, idx, bs, tuning=t)

        res[f"{pattern}_err"] = check(q, k, v, idx, bs, t)
        res[pattern] = round(statistics.median(per_call_seconds([call], 2)) * 1e3, 4)
        if pattern == "random":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
            for evt in prof.key_averages():
                us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
                name = next((n for n in KERNELS if n in evt.key), None)
                if name and us:
                    res[name] = round(us / 5 / 1e3, 4)
            if show_timeline:
                rows, span = timeline(call)
                for name, t_start, t_end in rows:
                    print(f"  {t_start:9.1f} {t_end:9.1f} {t_end - t_start:8.1f}  {name}")
                res["random_graph_span_us"] = round(span, 1)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
