"""KDA index bounds: an index outside its pool makes its sequence padding.

Every pool (conv states, windows, recurrent states, snapshots, ring) lives inside a larger
NaN-poisoned buffer with guard rows before and after it, and the kernels get a view of the
pool alone. For each index argument of each entry point, one sequence's index is set to
the pool's number of lines (the first guard row after it) and to 10**7 (far outside the
buffer). Then: the guard rows are bitwise untouched, that sequence gets the padding result
(zero outputs, nothing written), the other sequences match the reference, and the process
lives. `validate_indices`, the on-request check of ranges and duplicates, is tested last.
"""

from dataclasses import replace

import pytest
import torch
from test_kda_verify import (
    MODES,
    NAN,
    check_o,
    check_saves,
    check_verify,
    check_windows,
    conv_args,
    fused_kwargs,
    make_inputs,
    make_runner,
    recurrent_kwargs,
    reference,
    rel_err,
    same_bits,
    tol,
)

import kernels.kda.tuning as kt
from kernels.kda import (
    causal_conv1d_update,
    fused_kda_conv_gating_verify,
    fused_sigmoid_gating_delta_rule_update,
    validate_indices,
)
from kernels.kda import reference as ref_mod

B, T, H, HV, K, V = 3, 2, 1, 2, 16, 16
GUARD = 2  # poisoned rows on each side of every pool
BAD = 1  # the sequence whose index is spoiled
POOLS = ("conv_pool", "ssm", "win_pool", "inter_ssm", "rawk", "rawv", "g", "beta")
OUTSIDE = ("lines", 10**7)  # index values: one past the last line, far past the buffer


def guarded_inputs(device, seed, dtype=torch.float32, dims=(B, T, H, HV, K, V)):
    """make_inputs' tensors with every pool moved into the middle of a NaN-filled buffer
    of GUARD extra rows on each side; inp[name] is the view of the pool, guards[name] the
    whole buffer. The conv lines get their own index tensor (make_inputs shares one with
    the state slots), so that each index can be spoiled alone."""
    inp = make_inputs(*dims, dtype, device, seed=seed)
    guards = {}
    for name in POOLS:
        pool = inp[name]
        n = pool.shape[0]
        full = torch.full((n + 2 * GUARD, *pool.shape[1:]), NAN, dtype=pool.dtype, device=device)
        full[GUARD : GUARD + n] = pool
        inp[name], guards[name] = full[GUARD : GUARD + n], full
    inp["conv_indices"] = inp["cache_indices"].clone()
    return inp, guards


def spoil(idx, value, lines):
    """A copy of idx with sequence BAD's entry outside a pool of `lines` lines."""
    bad = idx.clone()
    bad[BAD] = lines if value == "lines" else value
    return bad


def guard_rows(guards):
    return {n: torch.cat([g[:GUARD], g[-GUARD:]]).clone() for n, g in guards.items()}


def assert_guards_untouched(guards, saved):
    for name, g in guards.items():
        assert same_bits(torch.cat([g[:GUARD], g[-GUARD:]]), saved[name]), f"guard rows of {name}"


def padded_reference(inp, pad_seq=True):
    """The reference with sequence BAD as padding (a negative slot), or as given."""
    slots = inp["cache_indices"].clone()
    if pad_seq:
        slots[BAD] = -1
    return ref_mod.verify(
        inp["mixed"], inp["w"], inp["bias"], inp["conv_pool"].transpose(-1, -2),
        inp["conv_indices"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], inp["ssm"],
        slots, T, H, HV, K, V,
    )  # fmt: skip


@pytest.fixture
def one_tile():
    """`tuning=` keyword of one V tile per value head in the fused kernel (fewest programs
    to interpret)."""
    return {"tuning": replace(kt.DEFAULT.verify, block_v=32)}


# ---------------------------------------------------------------------------------------
# fused kernel: snapshot and ring modes
# ---------------------------------------------------------------------------------------

# (keyword, pool the index addresses, key of the index tensor in inp)
FUSED_INDICES = (
    ("cache_indices", "ssm", "cache_indices"),
    ("conv_state_indices", "conv_pool", "conv_indices"),
    ("intermediate_state_indices", "win_pool", "inter_indices"),
)


@pytest.mark.parametrize("value", OUTSIDE)
@pytest.mark.parametrize("arg,pool,key", FUSED_INDICES, ids=[a[0] for a in FUSED_INDICES])
@pytest.mark.parametrize("mode", ["fused", "fused+ring"])
def test_fused_index_outside_pool_is_padding(mode, arg, pool, key, value, device, one_tile):
    inp, guards = guarded_inputs(device, seed=41)
    saved = guard_rows(guards)
    before = {n: inp[n].clone() for n in ("ssm", "conv_pool")}
    kw = fused_kwargs(mode, inp, T, H, HV, K, V)
    kw["conv_state_indices"] = inp["conv_indices"]
    kw[arg] = spoil(inp[key], value, inp[pool].shape[0])
    o = fused_kda_conv_gating_verify(**kw, **one_tile)
    assert_guards_untouched(guards, saved)
    ref = padded_reference(inp)
    check_o(o, ref, T, torch.float32)
    assert same_bits(inp["ssm"], before["ssm"]) and same_bits(inp["conv_pool"], before["conv_pool"])
    check_windows(inp, ref)
    check_saves(mode, inp, ref, T, torch.float32)


@pytest.mark.parametrize("value", [2**40, -(2**62), 2**63 - 1])
def test_fused_int64_index_far_outside_is_padding(value, device, one_tile):
    """int64 indices beyond 32 bits, either sign, every index of one sequence at once."""
    inp, guards = guarded_inputs(device, seed=79)
    saved = guard_rows(guards)
    kw = fused_kwargs("fused+ring", inp, T, H, HV, K, V)
    for arg, key in (("cache_indices", "cache_indices"), ("conv_state_indices", "conv_indices"),
                     ("intermediate_state_indices", "inter_indices")):  # fmt: skip
        kw[arg] = spoil(inp[key].long(), value, None)
    o = fused_kda_conv_gating_verify(**kw, **one_tile)
    assert_guards_untouched(guards, saved)
    ref = padded_reference(inp)
    check_o(o, ref, T, torch.float32)
    check_windows(inp, ref)
    check_saves("fused+ring", inp, ref, T, torch.float32)


def test_fused_snapshot_line_bounded_by_the_smaller_pool(device, one_tile):
    """intermediate_state_indices addresses two pools (windows and snapshots); a line that
    fits the window pool but not a shorter snapshot pool is padding too."""
    inp, guards = guarded_inputs(device, seed=43)
    n = inp["inter_ssm"].shape[0] - 1  # the snapshot pool loses its last line
    inp["inter_ssm"] = inp["inter_ssm"][:n]
    idx = inp["inter_indices"].clone()
    other = int(idx[BAD])
    idx[BAD] = n
    if n in inp["inter_indices"].tolist():  # keep the lines distinct
        idx[inp["inter_indices"].tolist().index(n)] = other
    inp["inter_indices"] = idx
    saved = guard_rows(guards)
    kw = fused_kwargs("fused", inp, T, H, HV, K, V)
    kw["conv_state_indices"] = inp["conv_indices"]
    o = fused_kda_conv_gating_verify(**kw, **one_tile)
    ref = padded_reference(inp)
    check_o(o, ref, T, torch.float32)
    check_windows(inp, ref)  # the window line n exists, yet nothing is written there
    check_saves("fused", inp, ref, T, torch.float32)
    assert bool(guards["inter_ssm"][GUARD + n].isnan().all()), "line n of the snapshot buffer"
    assert_guards_untouched(guards, saved)


# ---------------------------------------------------------------------------------------
# unfused pair: the conv kernel (verify and decode) and the recurrent kernel
# ---------------------------------------------------------------------------------------

CONV_INDICES = (
    ("conv_state_indices", "conv_pool", "conv_indices"),
    ("intermediate_state_indices", "win_pool", "inter_indices"),
)


@pytest.mark.parametrize("value", OUTSIDE)
@pytest.mark.parametrize("arg,pool,key", CONV_INDICES, ids=[a[0] for a in CONV_INDICES])
def test_conv_verify_index_outside_pool_is_padding(arg, pool, key, value, device):
    inp, guards = guarded_inputs(device, seed=47)
    saved = guard_rows(guards)
    before = inp["conv_pool"].clone()
    args, kw = conv_args(inp, B, T)
    kw["conv_state_indices"] = inp["conv_indices"]
    kw[arg] = spoil(inp[key], value, inp[pool].shape[0])
    out = causal_conv1d_update(*args, **kw)
    assert_guards_untouched(guards, saved)
    assert same_bits(inp["conv_pool"], before)
    ref = padded_reference(inp)
    assert bool((out[BAD] == 0).all()), "padded conv outputs"
    for n in range(B):
        if n != BAD:
            assert rel_err(out[n].transpose(0, 1), ref["conv_out"][n]) < 1e-5, f"sequence {n}"
    check_windows(inp, ref)


@pytest.mark.parametrize("value", OUTSIDE)
def test_conv_decode_index_outside_pool_is_padding(value, device):
    """Decode (no window buffer): the state of the other lines is rolled, no line of the
    pool nor guard row changes for the spoiled sequence."""
    inp, guards = guarded_inputs(device, seed=53)
    saved = guard_rows(guards)
    before = inp["conv_pool"].clone()
    x3 = inp["mixed"].reshape(B, T, -1).transpose(1, 2)
    state = inp["conv_pool"].transpose(-1, -2)
    idx = spoil(inp["conv_indices"], value, state.shape[0])
    out = causal_conv1d_update(x3, state, inp["w"], inp["bias"], conv_state_indices=idx)
    assert_guards_untouched(guards, saved)
    y, _, new_state = ref_mod.conv_steps(
        x3.transpose(1, 2), before.transpose(-1, -2)[inp["conv_indices"].long()], inp["w"],
        inp["bias"],
    )  # fmt: skip
    assert bool((out[BAD] == 0).all()), "padded conv outputs"
    rolled = []
    for n in range(B):
        if n != BAD:
            line = int(idx[n])
            rolled.append(line)
            assert rel_err(out[n].transpose(0, 1), y[n]) < 1e-5, f"sequence {n}"
            assert same_bits(state[line], new_state[n]), f"rolled state of sequence {n}"
    for line in range(state.shape[0]):
        if line not in rolled:
            assert same_bits(inp["conv_pool"][line], before[line]), f"conv line {line}"


# (mode, keyword, pool, key of the index tensor in inp)
RECURRENT_INDICES = (
    ("unfused", "initial_state_indices", "ssm", "cache_indices"),
    ("unfused", "intermediate_state_indices", "inter_ssm", "inter_indices"),
    ("unfused+ring", "initial_state_indices", "ssm", "cache_indices"),
)


@pytest.mark.parametrize("value", OUTSIDE)
@pytest.mark.parametrize(
    "mode,arg,pool,key", RECURRENT_INDICES, ids=[f"{a[0]}-{a[1]}" for a in RECURRENT_INDICES]
)
def test_recurrent_index_outside_pool_is_padding(mode, arg, pool, key, value, device):
    inp, guards = guarded_inputs(device, seed=59)
    saved = guard_rows(guards)
    before = inp["ssm"].clone()
    ref = padded_reference(inp)
    conv_out = padded_reference(inp, pad_seq=False)["conv_out"]  # q, k, v of every sequence
    kw = recurrent_kwargs(mode, inp, conv_out.transpose(1, 2), T, H, HV, K, V)
    kw[arg] = spoil(inp[key], value, inp[pool].shape[0])
    o = fused_sigmoid_gating_delta_rule_update(**kw)
    assert_guards_untouched(guards, saved)
    assert same_bits(inp["ssm"], before)
    check_o(o, ref, T, torch.float32)
    check_saves(mode, inp, ref, T, torch.float32)


@pytest.mark.parametrize("value", OUTSIDE)
def test_recurrent_decode_index_outside_pool_is_padding(value, device):
    """Ordinary decode (the final state written back): the other slots get their final
    state, the spoiled sequence's o is zero and no slot nor guard row changes for it."""
    inp, guards = guarded_inputs(device, seed=61)
    saved = guard_rows(guards)
    before = inp["ssm"].clone()
    ref = padded_reference(inp)
    q, k, v = padded_reference(inp, pad_seq=False)["conv_out"].split([H * K, H * K, HV * V], -1)
    idx = spoil(inp["cache_indices"], value, inp["ssm"].shape[0])
    o = fused_sigmoid_gating_delta_rule_update(
        A_log=inp["A_log"], a=inp["a"], dt_bias=inp["dt_bias"], q=q.unflatten(-1, (H, K)),
        k=k.unflatten(-1, (H, K)), v=v.unflatten(-1, (HV, V)), b=inp["b"],
        initial_state_source=inp["ssm"], initial_state_indices=idx,
    )  # fmt: skip
    assert_guards_untouched(guards, saved)
    check_o(o, ref, T, torch.float32)
    written = []
    for n in range(B):
        if n != BAD:
            slot = int(idx[n])
            written.append(slot)
            assert rel_err(inp["ssm"][slot], ref["final"][n]) < tol(torch.float32), f"seq {n}"
    for slot in range(inp["ssm"].shape[0]):
        if slot not in written:
            assert same_bits(inp["ssm"][slot], before[slot]), f"slot {slot}"


# ---------------------------------------------------------------------------------------
# the references and validate_indices
# ---------------------------------------------------------------------------------------


def test_reference_index_outside_pool_is_padding(device):
    """verify and replay treat an index past the pool like a negative one."""
    inp, _ = guarded_inputs(device, seed=67)
    neg = padded_reference(inp)
    slots = spoil(inp["cache_indices"], "lines", inp["ssm"].shape[0])
    past = ref_mod.verify(
        inp["mixed"], inp["w"], inp["bias"], inp["conv_pool"].transpose(-1, -2),
        inp["conv_indices"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], inp["ssm"],
        slots, T, H, HV, K, V,
    )  # fmt: skip
    assert past["pad"].tolist() == [n == BAD for n in range(B)]
    for name in ("o", "windows", "states", "rawk", "final"):
        assert same_bits(past[name], neg[name]), name
    ring = [torch.zeros_like(inp[n]) for n in ("rawk", "rawv", "g", "beta")]
    new = ref_mod.replay(inp["ssm"], slots, *ring, 1)
    assert bool(new[BAD].isnan().all()) and not bool(new[0].isnan().any())


def test_validate_indices(device):
    """Ranges and duplicates raise ValueError naming the argument; padding passes."""
    pool = torch.zeros(5, 2, device=device)
    ok = torch.tensor([3, -1, 0, -1, 4], dtype=torch.int32, device=device)
    validate_indices(ok, pool, "cache_indices")
    validate_indices(ok.long(), 5, "cache_indices")
    validate_indices(torch.tensor([1, 1], device=device), 5, "conv_state_indices", distinct=False)
    validate_indices(torch.empty(0, dtype=torch.int32, device=device), 0)
    with pytest.raises(ValueError, match=r"cache_indices\[4\] = 5 is outside its pool of 5"):
        validate_indices(torch.tensor([0, 1, 2, 3, 5], device=device), pool, "cache_indices")
    with pytest.raises(ValueError, match=r"x\[0\] = 10000000"):
        validate_indices(torch.tensor([10**7], device=device), pool, "x", distinct=False)
    with pytest.raises(ValueError, match="cache_indices gives line 3 to sequences 0 and 2"):
        validate_indices(torch.tensor([3, 1, 3], device=device), pool, "cache_indices")
    with pytest.raises(TypeError, match="idx must have dtype"):
        validate_indices(torch.zeros(2, device=device), pool, "idx")
    with pytest.raises(TypeError, match="idx must be a torch.Tensor"):
        validate_indices([0, 1], pool, "idx")
    with pytest.raises(ValueError, match=r"idx must be a \[B\] vector"):
        validate_indices(torch.zeros(2, 1, dtype=torch.int32, device=device), pool, "idx")
    with pytest.raises(ValueError, match="lines of idx"):
        validate_indices(ok, -1, "idx")
    with pytest.raises(ValueError, match="lines of idx"):
        validate_indices(ok, 5.0, "idx")


def test_pools_are_views_between_guard_rows():
    """What the guard checks rest on: each pool the kernels get starts GUARD rows into its
    poisoned buffer, and GUARD poisoned rows follow it."""
    inp, guards = guarded_inputs("cpu", seed=71)
    for name in POOLS:
        assert inp[name].data_ptr() == guards[name][GUARD].data_ptr(), name
        assert guards[name].shape[0] == inp[name].shape[0] + 2 * GUARD, name
        assert bool(guard_rows(guards)[name].isnan().all()), name


# ---------------------------------------------------------------------------------------
# bf16 at the benchmark's shape (GPU only)
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("value", OUTSIDE)
@pytest.mark.parametrize("mode", MODES)
def test_gpu_bf16_index_outside_pool(mode, value):
    """The compiled kernels at the seed's shape in bf16, the benchmark's call pattern
    (one index tensor for the conv lines and slots, one for the intermediate lines): one
    sequence's indices past its pools make it padding, every guard row stays poisoned,
    the other sequences match the reference (which pads an index past its pool too)."""
    dims = (4, 4, 8, 8, 128, 128)
    inp, guards = guarded_inputs("cuda", 73, torch.bfloat16, dims)
    saved = guard_rows(guards)
    before = {n: inp[n].clone() for n in ("ssm", "conv_pool")}
    lines = inp["ssm"].shape[0]
    inp["cache_indices"] = spoil(inp["cache_indices"], value, lines)
    inp["inter_indices"] = spoil(inp["inter_indices"], value, lines)
    o = make_runner(mode, inp, *dims)()
    torch.cuda.synchronize()
    assert_guards_untouched(guards, saved)
    ref = reference(inp, *dims[1:])
    assert ref["pad"].tolist() == [n == BAD for n in range(dims[0])]
    check_verify(mode, inp, before, o, ref, dims[1], torch.bfloat16)
