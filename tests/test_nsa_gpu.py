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
