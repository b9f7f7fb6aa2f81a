"""Bad input to the NSA public functions: a ValueError/TypeError whose message names the
argument, raised on the host before any kernel runs; and the edge of each contract (sizes of
1, strided input where allowed) still accepted."""

import pytest
import torch
from test_nsa_reference import qkv

from kernels.nsa import (
    invert_block_idx,
    make_block_idx_random,
    make_block_idx_recent,
    selection_attention,
    selection_backward_triton,
    selection_forward_reference,
    selection_forward_triton,
    validate_block_idx,
)

SIZES = dict(B=1, Hkv=2, T=20, block_size=16, S=2)


def _recent(**over):
    return make_block_idx_recent(**{**SIZES, **over}, device="cpu")


def _random(**over):
    return make_block_idx_random(**{**SIZES, **over}, device="cpu")


def _idx():
    return _recent()


def _strided_idx():
    """A valid pattern, as a non-contiguous view."""
    return _idx().transpose(2, 3).contiguous().transpose(2, 3)


# (id, call, expected error, regex the message must match: it names the argument)
HELPER_CASES = [
    ("validate-bs0", lambda: validate_block_idx(_idx(), 0), ValueError, r"^block_size must"),
    ("validate-bs-neg", lambda: validate_block_idx(_idx(), -16), ValueError, r"^block_size"),
    ("validate-bs-float", lambda: validate_block_idx(_idx(), 16.0), TypeError, r"^block_size"),
    ("validate-list", lambda: validate_block_idx([[0]], 16), ValueError, r"^block_idx"),
    ("validate-float", lambda: validate_block_idx(_idx().float(), 16), ValueError, r"^block_idx"),
    ("validate-bool", lambda: validate_block_idx(_idx() >= 0, 16), ValueError, r"^block_idx"),
    ("validate-3d", lambda: validate_block_idx(_idx()[0], 16), ValueError, r"^block_idx"),
    ("validate-S0", lambda: validate_block_idx(_idx()[..., :0], 16), ValueError, r"^block_idx"),
    ("invert-bs0", lambda: invert_block_idx(_idx(), 0), ValueError, r"^block_size must"),
    ("invert-bs-bool", lambda: invert_block_idx(_idx(), True), TypeError, r"^block_size"),
    ("invert-3d", lambda: invert_block_idx(_idx()[0], 16), ValueError, r"^block_idx must be \["),
    ("invert-5d", lambda: invert_block_idx(_idx()[None], 16), ValueError, r"^block_idx"),
    (
        "invert-strided",
        lambda: invert_block_idx(_strided_idx(), 16),
        ValueError,
        r"^block_idx must be contiguous",
    ),  # fmt: skip
    ("invert-S0", lambda: invert_block_idx(_idx()[..., :0], 16), ValueError, r"^block_idx"),
    ("invert-T0", lambda: invert_block_idx(_idx()[:, :, :0], 16), ValueError, r"^block_idx"),
    ("invert-float", lambda: invert_block_idx(_idx().float(), 16), TypeError, r"^block_idx"),
    ("invert-bool", lambda: invert_block_idx(_idx() >= 0, 16), TypeError, r"^block_idx"),
    ("invert-list", lambda: invert_block_idx([[0]], 16), TypeError, r"^block_idx"),
    ("recent-bs0", lambda: _recent(block_size=0), ValueError, r"^block_size must be >= 1"),
    ("recent-bs-float", lambda: _recent(block_size=16.0), TypeError, r"^block_size"),
    ("recent-S0", lambda: _recent(S=0), ValueError, r"^S must be >= 1"),
    ("recent-T-neg", lambda: _recent(T=-1), ValueError, r"^T must be >= 1"),
    ("recent-B0", lambda: _recent(B=0), ValueError, r"^B must be >= 1"),
    ("recent-Hkv-bool", lambda: _recent(Hkv=True), TypeError, r"^Hkv must be an int"),
    ("random-T-neg", lambda: _random(T=-1), ValueError, r"^T must be >= 1"),
    ("random-S0", lambda: _random(S=0), ValueError, r"^S must be >= 1"),
    ("random-bs-neg", lambda: _random(block_size=-16), ValueError, r"^block_size must"),
    ("random-Hkv0", lambda: _random(Hkv=0), ValueError, r"^Hkv must be >= 1"),
    ("random-B-float", lambda: _random(B=1.5), TypeError, r"^B must be an int"),
    ("random-seed-float", lambda: _random(seed=1.5), TypeError, r"^seed must be an int"),
]


@pytest.mark.parametrize("name,call,err,msg", HELPER_CASES, ids=[c[0] for c in HELPER_CASES])
def test_index_helpers_reject_bad_arguments(name, call, err, msg):
    with pytest.raises(err, match=msg):
        call()


def _args(**over):
    """Tiny valid kernel arguments (G = 2, T = 20 so the last block is partial)."""
    q, k, v = qkv(1, 4, 2, 20, 32, dtype=torch.float32, seed=3)
    a = dict(q=q, k=k, v=v, block_idx=_idx(), block_size=16, scale=None)
    a.update(over)
    return a


def _meta(a):
    return {n: x.to("meta") if isinstance(x, torch.Tensor) else x for n, x in a.items()}


KERNEL_CASES = [  # id, change to the arguments, expected error, regex on the message
    ("meta", _meta, ValueError, r"q must be a CUDA tensor \(got device meta\)"),
    ("Hq0", lambda a: {**a, "q": a["q"][:, :0].contiguous()}, ValueError, r"q heads \(0\)"),
    ("scale-nan", lambda a: {**a, "scale": float("nan")}, ValueError, r"^scale must be finite"),
    ("scale-inf", lambda a: {**a, "scale": float("inf")}, ValueError, r"^scale must be finite"),
    ("bs-bool", lambda a: {**a, "block_size": True}, TypeError, r"^block_size must be an int"),
    ("idx-bool", lambda a: {**a, "block_idx": a["block_idx"] >= 0}, TypeError, r"^block_idx"),
]


@pytest.mark.parametrize("name,change,err,msg", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_kernels_reject_bad_arguments(name, change, err, msg, monkeypatch):
    # Under the interpreter too (where CPU tensors are allowed), a meta tensor is refused.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a = change(_args())
    with pytest.raises(err, match=msg):
        selection_forward_triton(**a)
    with pytest.raises(err, match=msg):
        selection_backward_triton(**a, do=a["q"], o=a["q"])
    with pytest.raises(err, match=msg):
        selection_attention(**a)


def test_double_backward_refused_at_the_first_grad():
    a = _args()
    q, k, v = (a[n].requires_grad_() for n in "qkv")
    o = selection_attention(q, k, v, a["block_idx"], 16)
    with pytest.raises(ValueError, match=r"create_graph=True.*double backward"):
        torch.autograd.grad(o.sum(), (q, k, v), create_graph=True)
    # The graph survives the refusal: a first-order gradient still works, and matches the
    # fp64 reference's.
    dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
    x = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(selection_forward_reference(*x, a["block_idx"], 16).sum(), x)
    for got, want in zip((dq, dk, dv), ref, strict=True):
        assert (got.double() - want).norm() <= 1e-5 * want.norm()


def test_smallest_valid_arguments_still_work():
    """Every size at its lower bound of 1, any positive block_size in the helpers, strided
    input where the helper reads only values, int64 indices, and a seed of 0."""
    one = dict(B=1, Hkv=1, T=1, block_size=1, S=1, device="cpu")
    recent, rand = make_block_idx_recent(**one), make_block_idx_random(**one, seed=0)
    assert recent.tolist() == rand.tolist() == [[[[0]]]]  # block 0 is full at t = 0
    for idx in (recent, rand):
        validate_block_idx(idx, 1, shape=(1, 1, 1, 1))
    validate_block_idx(_strided_idx(), 16)
    validate_block_idx(_random(block_size=5).long(), 5)
    row_ptr, col = invert_block_idx(rand, 1)
    assert row_ptr.tolist() == [[0, 1]] and col.tolist() == [[0]]
    row_ptr, col = invert_block_idx(_random(block_size=7, S=3).long(), 7)
    assert row_ptr.shape == (2, 4) and col.shape == (2, 60) and int(row_ptr[0, -1]) > 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("schedule", "fastest"),
        ("fix_pdl", "on"),
        ("fix_pdl", 1),
        ("overlap_tile_kernel", 1),
        ("chain_pdl", "yes"),
    ],
)
def test_forward_tuning_refuses_unknown_values(field, value):
    """A tuning value outside its documented set is a ValueError naming the field."""
    from kernels.nsa.tuning import with_fields

    with pytest.raises(ValueError, match=field):
        with_fields(**{field: value})
