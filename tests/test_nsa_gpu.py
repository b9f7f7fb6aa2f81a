"""NSA selection on a CUDA GPU: bf16 against the fp32 reference, fp32 (IEEE dots) against
fp64, and the seed benchmark's shape. Skipped without a GPU."""

import pytest
import torch
from test_nsa_reference import rel_err

from kernels.nsa import (
    make_block_idx_random,
    make_block_idx_recent,
    selection_attention,
    selection_backward_triton,
    selection_forward_reference,
    selection_forward_triton,
)

pytestmark = pytest.mark.gpu


def run_and_compare(B, Hq, Hkv, T, D, bs, S, pattern, dtype, ref_dtype, tol):
    g = torch.Generator(device="cuda").manual_seed(T)
    q, k, v, do = [
        torch.randn(B, H, T, D, generator=g, device="cuda", dtype=dtype) for H in (Hq, Hkv, Hkv, Hq)
    ]
    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    idx = make(B, Hkv, T, bs, S, "cuda")
    o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True)
    grads = selection_backward_triton(q, k, v, idx, bs, do, o, lse)
    x = [t.to(ref_dtype).requires_grad_() for t in (q, k, v)]
    ro = selection_forward_reference(*x, idx, bs)
    rgrads = torch.autograd.grad(ro, x, do.to(ref_dtype))
    assert rel_err(o, ro) < tol
    for got, ref in zip(grads, rgrads, strict=True):
        assert torch.isfinite(got).all() and rel_err(got, ref) < tol
    again = selection_backward_triton(q, k, v, idx, bs, do, o)
    for a, b in zip(grads, again, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pattern", ["recent", "random"])
@pytest.mark.parametrize("G", [1, 4, 16])
def test_bf16_moderate_shape(G, pattern):
    run_and_compare(2, 16, 16 // G, 1000, 64, 64, 8, pattern, torch.bfloat16, torch.float32, 1e-2)


def test_fp32_ieee_matches_fp64():
    run_and_compare(1, 8, 2, 300, 64, 32, 6, "random", torch.float32, torch.float64, 2e-5)


@pytest.mark.parametrize("pattern", ["recent", "random"])
def test_seed_shape_t2048(pattern):
    run_and_compare(1, 16, 4, 2048, 64, 64, 16, pattern, torch.bfloat16, torch.float32, 1e-2)


def test_autograd_bf16_d128():
    B, Hq, Hkv, T, D, bs, S = 1, 8, 1, 700, 128, 128, 4
    q, k, v = [
        torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for H in (Hq, Hkv, Hkv)
    ]
    idx = make_block_idx_random(B, Hkv, T, bs, S, "cuda")
    o = selection_attention(q, k, v, idx, bs)
    o.float().square().sum().backward()
    x = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ro = selection_forward_reference(*x, idx, bs)
    ro.square().sum().backward()
    assert rel_err(o, ro) < 1e-2
    for a, b in zip((q, k, v), x, strict=True):
        assert rel_err(a.grad, b.grad) < 1e-2


def capture(run):
    """A CUDA graph of `run()` captured by a caller, and the outputs it replays into. The
    warm-up runs on a side stream first, as a capture that includes autograd needs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


@pytest.mark.parametrize("checked", [True, False], ids=["keys-checked", "as-users-run"])
@pytest.mark.parametrize("pattern", ["recent", "random"])
def test_calls_inside_a_callers_cuda_graph_match_eager(pattern, checked, monkeypatch):
    """Forward, backward (lse given and recomputed) and the autograd step, each captured in a
    caller's graph and replayed on new input values: bitwise the eager result on those
    values (the kernels are deterministic), and not the result on the captured values.
    checked: every launch key checked (ATTNBENCH_CHECK_LAUNCH_KEYS, as the other tests run),
    or as users run: by the capture, each call is direct (`_runtime.Call.direct`), its
    temporaries passed to the kernels as addresses in the graph's memory pool."""
    from kernels import _runtime

    monkeypatch.setattr(_runtime, "CHECK_LAUNCH_KEYS", checked)
    monkeypatch.setattr(_runtime, "_call_plans", {})  # this test's own launch tables
    monkeypatch.setattr(_runtime, "_direct_calls", set())
    monkeypatch.setattr(_runtime, "_records", {})
    monkeypatch.setattr(_runtime, "_record_misses", {})
    B, Hq, Hkv, T, D, bs, S = 1, 16, 4, 1000, 64, 64, 16  # the seed's heads; T not a multiple
    gen = torch.Generator(device="cuda").manual_seed(11)

    def values():
        return [
            torch.randn(B, H, T, D, generator=gen, device="cuda", dtype=torch.bfloat16)
            for H in (Hq, Hkv, Hkv, Hq)
        ]

    make = make_block_idx_recent if pattern == "recent" else make_block_idx_random
    idx = make(B, Hkv, T, bs, S, "cuda")
    q, k, v, do = values()  # the static inputs every graph reads
    o, lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True)  # static too

    def autograd_step():
        # Fresh leaves on q, k and v's storage at every call: a leaf's gradient accumulator
        # lives on the stream of its first use, and one made by an eager call on the
        # default stream cannot join a capture.
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = selection_attention(*leaves, idx, bs)
        return (out, *torch.autograd.grad(out, leaves, do))

    calls = {
        "forward": lambda: selection_forward_triton(q, k, v, idx, bs, return_lse=True),
        "backward": lambda: selection_backward_triton(q, k, v, idx, bs, do, o, lse),
        "backward, lse=None": lambda: selection_backward_triton(q, k, v, idx, bs, do, o),
        "autograd": autograd_step,
    }
    before = {name: [t.clone() for t in run()] for name, run in calls.items()}
    if not checked:
        for run in calls.values():
            run()  # the second call with each key: direct from here on
        assert len(_runtime._direct_calls) >= 2  # the forward's key and the backward's
    graphs = {name: capture(run) for name, run in calls.items()}
    for static, new in zip((q, k, v, do), values(), strict=True):
        static.copy_(new)
    new_o, new_lse = selection_forward_triton(q, k, v, idx, bs, return_lse=True)
    o.copy_(new_o)
    lse.copy_(new_lse)
    for name, (graph, outs) in graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        eager = calls[name]()
        for i, (got, want, old) in enumerate(zip(outs, eager, before[name], strict=True)):
            assert torch.equal(got, want), f"{name} output {i}: graph replay != eager"
            assert not torch.equal(got, old), f"{name} output {i}: the captured values"
