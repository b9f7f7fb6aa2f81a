"""Bad input to the KDA verify entry points: a ValueError/TypeError naming the argument,
raised before anything is written (the poisoned buffers and the states stay as they were)."""

import pytest
import torch
from test_kda_verify import (
    conv_args,
    fused_kwargs,
    make_inputs,
    recurrent_kwargs,
    same_bits,
)

from kernels.kda import (
    causal_conv1d_update,
    fused_kda_conv_gating_verify,
    fused_sigmoid_gating_delta_rule_update,
)
from kernels.kda import reference as ref_mod

B, T, H, HV, K, V = 2, 2, 1, 2, 16, 16
WATCHED = ("ssm", "conv_pool", "win_pool", "inter_ssm", "rawk", "rawv", "g", "beta")


def _setup(device):
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    return inp, {n: inp[n].clone() for n in WATCHED}


def _nothing_written(inp, before):
    for n in WATCHED:
        assert same_bits(inp[n], before[n]), f"{n} was written"


def _dims(**over):
    d = dict(T=T, H=H, HV=HV, K=K, V=V)
    d.update(over)
    return d


# (id, mode, change to the keywords, expected error, text the message must contain)
FUSED_CASES = [
    ("heads-not-divide", "fused", dict(num_q_heads=2, num_v_heads=3), ValueError, "num_v_heads"),
    ("k-not-pow2", "fused", dict(head_k_dim=12), ValueError, "head_k_dim"),
    ("mixed-dim", "fused", dict(num_v_heads=4), ValueError, "mixed_qkv"),
    ("tokens-not-T", "fused", dict(T=3), ValueError, "T=3"),
    ("ssm-dtype", "fused", dict(ssm_states="half"), TypeError, "ssm_states"),
    ("mixed-int", "fused", dict(mixed_qkv="int"), TypeError, "mixed_qkv"),
    ("a-shape", "fused", dict(a="short"), ValueError, "a must"),
    ("idx-length", "fused", dict(cache_indices="short"), ValueError, "cache_indices"),
    ("idx-float", "fused", dict(cache_indices="float"), TypeError, "cache_indices"),
    ("window-shape", "fused", dict(intermediate_conv_window="short-t"), ValueError, "window"),
    ("device-mix", "fused", dict(A_log="meta"), ValueError, "one device"),
    ("lower-bound", "fused", dict(lower_bound=1.0), ValueError, "lower_bound"),
    ("neither", "fused", dict(intermediate_states_buffer=None), ValueError, "intermediate"),
    ("both", "fused+ring", dict(intermediate_states_buffer="snap"), ValueError, "not both"),
    ("ring-missing", "fused+ring", dict(replayssm_g=None), ValueError, "replayssm_g"),
    ("ring-dtype", "fused+ring", dict(replayssm_beta="half"), TypeError, "replayssm_beta"),
    ("ring-short", "fused+ring", dict(T="ring4"), ValueError, "ring length"),
]


def _apply(kw, inp, change):
    """Turn the symbolic changes into tensors (kept small so every case is cheap)."""
    for name, val in change.items():
        if val == "half":
            kw[name] = kw[name].half()
        elif val == "int":
            kw[name] = kw[name].to(torch.int32)
        elif val == "short":
            kw[name] = kw[name][:-1]
        elif val == "short-t":  # fewer steps than T
            kw[name] = kw[name][:, :1]
        elif val == "float":
            kw[name] = kw[name].float()
        elif val == "meta":
            kw[name] = kw[name].to("meta")
        elif val == "snap":
            kw[name] = inp["inter_ssm"]
        elif val == "ring4":  # T=2 in a ring of 2 positions: T > R/2
            for n in ("rawk", "rawv", "g", "beta"):
                kw[f"replayssm_{n}"] = kw[f"replayssm_{n}"][:, :, :2]
        else:
            kw[name] = val


@pytest.mark.parametrize("case", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_fused_bad_input(case, device):
    _, mode, change, err, text = case
    inp, before = _setup(device)
    d = _dims()
    kw = fused_kwargs(mode, inp, d["T"], d["H"], d["HV"], d["K"], d["V"])
    _apply(kw, inp, change)
    with pytest.raises(err, match=text):
        fused_kda_conv_gating_verify(**kw)
    _nothing_written(inp, before)


RECURRENT_CASES = [
    ("cu-values", "unfused", dict(cu_seqlens="cu-bad"), ValueError, "cu_seqlens"),
    ("cu-length", "unfused", dict(cu_seqlens="cu-3"), ValueError, "cu_seqlens"),
    ("parent", "unfused", dict(retrieve_parent_token="x"), ValueError, "retrieve_parent_token"),
    ("not-kda", "unfused", dict(is_kda=False), ValueError, "is_kda"),
    ("no-l2norm", "unfused", dict(use_qk_l2norm_in_kernel=False), ValueError, "l2norm"),
    ("softplus", "unfused", dict(softplus_beta=2.0), ValueError, "softplus"),
    ("cache-steps", "unfused", dict(cache_steps=1), ValueError, "cache_steps"),
    (
        "snap-idx",
        "unfused",
        dict(intermediate_state_indices=None),
        ValueError,
        "intermediate_state",
    ),
    ("neither", "unfused", dict(intermediate_states_buffer=None), ValueError, "intermediate"),
    ("both", "unfused+ring", dict(intermediate_states_buffer="snap"), ValueError, "not both"),
    ("ring-missing", "unfused+ring", dict(replayssm_rawk=None), ValueError, "replayssm_rawk"),
    ("state-dtype", "unfused", dict(initial_state_source="half"), TypeError, "initial_state"),
    ("v-dtype", "unfused", dict(v="half"), TypeError, "v must"),
]


@pytest.mark.parametrize("case", RECURRENT_CASES, ids=[c[0] for c in RECURRENT_CASES])
def test_recurrent_bad_input(case, device):
    _, mode, change, err, text = case
    inp, before = _setup(device)
    conv_out = inp["mixed"].reshape(B, T, -1).transpose(1, 2)  # stands in for the conv output
    kw = recurrent_kwargs(mode, inp, conv_out, T, H, HV, K, V)
    for name, val in change.items():
        if val == "cu-bad":
            kw[name] = torch.tensor([0, 1, 4], dtype=torch.int32, device=device)
        elif val == "cu-3":
            kw[name] = torch.arange(3 + 1, dtype=torch.int32, device=device) * 3
        elif val == "x":
            kw[name] = torch.zeros(B * T, dtype=torch.int32, device=device)
    _apply(kw, inp, {n: v for n, v in change.items() if v not in ("cu-bad", "cu-3", "x")})
    with pytest.raises(err, match=text):
        fused_sigmoid_gating_delta_rule_update(**kw)
    _nothing_written(inp, before)


CONV_CASES = [
    ("activation", dict(activation="relu"), ValueError, "activation"),
    ("idx-length", dict(conv_state_indices="short"), ValueError, "conv_state_indices"),
    ("window-no-idx", dict(intermediate_state_indices=None), ValueError, "intermediate_state"),
    ("window-shape", dict(intermediate_conv_window="short-t"), ValueError, "window"),
    ("cache-seqlens", dict(cache_seqlens="x"), ValueError, "cache_seqlens"),
    ("state-dtype", dict(conv_state="half"), TypeError, "conv_state"),
    ("weight-dim", dict(weight="short"), ValueError, "weight"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_bad_input(case, device):
    _, change, err, text = case
    inp, before = _setup(device)
    args, kw = conv_args(inp, B, T)
    kw.update(zip(("x", "conv_state", "weight", "bias"), args, strict=True))
    if change.get("cache_seqlens") == "x":
        kw["cache_seqlens"] = torch.ones(B, dtype=torch.int32, device=device)
        change = {}
    _apply(kw, inp, change)
    with pytest.raises(err, match=text):
        causal_conv1d_update(**kw)
    _nothing_written(inp, before)


REPLAY_CASES = [
    ("past-ring", dict(accepted=99), ValueError, r"accepted must lie in 1\.\.16"),
    ("zero", dict(accepted=0), ValueError, "accepted must lie"),
    ("negative", dict(accepted=-1), ValueError, "accepted must lie"),
    ("past-T", dict(accepted=3, T=T), ValueError, r"accepted must lie in 1\.\.2 \(T=2\)"),
    ("one-past-T", dict(accepted="per-seq-3", T=T), ValueError, "accepted"),
    ("per-seq-past-ring", dict(accepted="per-seq-17"), ValueError, "accepted"),
    ("float", dict(accepted=1.5), TypeError, "accepted"),
    ("shape", dict(accepted="three"), ValueError, "accepted must be an int or"),
    ("bad-T", dict(accepted=1, T=0), ValueError, "T must be"),
]


@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c[0] for c in REPLAY_CASES])
def test_replay_bad_accepted(case, device):
    """The reference replay refuses an accepted length outside 1..T (1..R without T),
    naming `accepted`, and writes nothing."""
    _, change, err, text = case
    inp, before = _setup(device)
    kw = dict(change)
    if kw["accepted"] == "per-seq-3":
        kw["accepted"] = torch.tensor([1, 3], device=device)
    elif kw["accepted"] == "per-seq-17":
        kw["accepted"] = torch.tensor([17, 1], device=device)
    elif kw["accepted"] == "three":
        kw["accepted"] = torch.ones(B + 1, dtype=torch.int64, device=device)
    ring = [inp[n] for n in ("rawk", "rawv", "g", "beta")]
    with pytest.raises(err, match=text):
        ref_mod.replay(inp["ssm"], inp["cache_indices"], *ring, **kw)
    _nothing_written(inp, before)
