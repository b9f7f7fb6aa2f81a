"""The KDA chain-verify cases: one layer's verify buffers and the call of each mode.

The benchmarks (benchmarks/kda.py), the kernel tests and tools/gpu_check_kda.py all build
their inputs and calls here, so every caller runs the kernels with the same keywords and
tensor views (the KDA spec, docs/specs/kda_verify.md, "Inputs and outputs").

The four modes (module constants; the values are the strings the asv parameters carry):

- `UNFUSED`: `causal_conv1d_update`, then the recurrent kernel, per-step state snapshots;
- `UNFUSED_RING`: the same two kernels, saving the replay ring instead;
- `FUSED`: `fused_kda_conv_gating_verify` (one kernel), snapshots;
- `FUSED_RING`: the fused kernel, replay ring.

The kernels are reached only through an `api` object (the `kernels.kda` package, as the
benchmarks' guarded import gives it, or a stand-in with the same names), never imported
here: asv runs today's benchmarks against every older commit's package, so this module must
not depend on anything newer than the entry points it calls.

Buffer names of `make_inputs` (shapes with `lines` pool rows):

| name | shape | dtype |
| --- | --- | --- |
| `mixed` | `[B*T, 2*H*K + HV*V]` | input dtype |
| `w`, `bias` | `[dim, W]`, `[dim]` | input dtype |
| `a`, `b` | `[B*T, HV*K]`, `[B*T, HV]` | input dtype |
| `A_log`, `dt_bias` | `[HV]`, `[HV*K]` | fp32 |
| `conv_pool` | `[lines, W-1, dim]` (used as a `[lines, dim, W-1]` view) | input dtype |
| `ssm` | `[lines, HV, V, K]` | fp32 |
| `win_pool` | `[lines, T, W-1, dim]` (used as `[lines, T, dim, W-1]`) | input dtype |
| `inter_ssm` | `[lines, T, HV, V, K]` (snapshot modes) | fp32 |
| `rawk`, `rawv` | `[lines, H, R, K]`, `[lines, HV, R, V]` (ring modes) | input dtype |
| `g`, `beta` | `[lines, HV, R, K]`, `[lines, HV, R]` (ring modes) | fp32 |
| `cache_indices` | `[B]`: state slot (and conv line) of each sequence | int32 |
| `inter_indices` | `[B]`: line of the windows and snapshots | int32 |
| `cu` | `[B+1]`: `arange(B+1) * T` | int32 |
"""

import torch

UNFUSED = "unfused"
UNFUSED_RING = "unfused+ring"
FUSED = "fused"
FUSED_RING = "fused+ring"
MODES = (UNFUSED, UNFUSED_RING, FUSED, FUSED_RING)
RING_MODES = (UNFUSED_RING, FUSED_RING)
CONV_W = 4  # the depthwise conv's width W
RING_LEN = 16  # the pool's ring length R (a power of two, >= 2*T)
RING_NAMES = ("rawk", "rawv", "g", "beta")


def check_mode(mode):
    """`mode` itself; a ValueError naming it unless it is one of MODES."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def is_ring(mode):
    """Whether `mode` saves the replay ring (else per-step snapshots)."""
    return check_mode(mode) in RING_MODES


def is_fused(mode):
    """Whether `mode` runs the one fused kernel (else conv, then the recurrent kernel)."""
    return check_mode(mode) in (FUSED, FUSED_RING)


def make_inputs(
    B, T, H, HV, K, V, *, dtype, device, seed, mode=None, lines=None, ring_len=RING_LEN,
    poison=False, shuffle=False, pad=None, generator_device=None,
):  # fmt: skip
    """One verify's buffers (the table in the module docstring), seeded.

    B sequences of T draft tokens; H q/k heads and HV value heads of dims K and V. Inputs
    are `randn` draws in fp32 on a generator on `generator_device` (default `device`),
    scaled and cast to `dtype` (activations, the conv pool, ring raw k/v) or fp32 (gate
    parameters, states); the same seed gives the same values on every commit.

    mode: None builds both the snapshot and the ring buffers; a mode only the ones it
        writes (`inter_ssm` or the ring).
    lines: rows of every pool (default B + 1).
    poison: the buffers the kernels write (windows, snapshots, ring) are NaN, so that a
        missing write and a write to a row that must stay untouched both show; otherwise
        windows and snapshots are zeros and the ring is random (as a running pool holds).
    shuffle: the slots and the lines are random distinct rows (drawn first), two separate
        maps, so that a wrong index shows; otherwise both are arange(B), one tensor.
    pad: sequence index (or indices) whose slot is set to -1, a padded sequence.
    """
    if mode is not None:
        check_mode(mode)
    lines = B + 1 if lines is None else lines
    gen_device = device if generator_device is None else generator_device
    gen = torch.Generator(device=gen_device).manual_seed(seed)
    f32 = torch.float32

    def rnd(*shape, dt=dtype, scale=1.0):
        x = torch.randn(*shape, generator=gen, device=gen_device, dtype=f32) * scale
        return x.to(device=device, dtype=dt)

    def out(*shape, dt=dtype):
        return torch.full(shape, float("nan") if poison else 0.0, device=device, dtype=dt)

    if shuffle:
        slots = torch.randperm(lines, generator=gen, device=gen_device)[:B]
        inter = torch.randperm(lines, generator=gen, device=gen_device)[:B]
        slots, inter = (t.to(device=device, dtype=torch.int32) for t in (slots, inter))
    else:
        slots = inter = torch.arange(B, device=device, dtype=torch.int32)
    if pad is not None:
        slots = slots.clone()  # the lines keep their row (one tensor when not shuffled)
        slots[pad] = -1
    dim = 2 * H * K + HV * V
    x = {
        "mixed": rnd(B * T, dim, scale=0.5),
        "w": rnd(dim, CONV_W, scale=0.3),
        "bias": rnd(dim, scale=0.1),
        "a": rnd(B * T, HV * K, scale=0.5),
        "b": rnd(B * T, HV),
        "A_log": rnd(HV, dt=f32, scale=0.5),
        "dt_bias": rnd(HV * K, dt=f32, scale=0.5),
        "conv_pool": rnd(lines, CONV_W - 1, dim),
        "ssm": rnd(lines, HV, V, K, dt=f32, scale=0.2),
        "win_pool": out(lines, T, CONV_W - 1, dim),
        "cache_indices": slots,
        "inter_indices": inter,
        "cu": torch.arange(B + 1, device=device, dtype=torch.int32) * T,
    }
    if mode is None or not is_ring(mode):
        x["inter_ssm"] = out(lines, T, HV, V, K, dt=f32)
    if mode is None or is_ring(mode):
        ring = rnd if not poison else lambda *s, dt=dtype: out(*s, dt=dt)
        x["rawk"] = ring(lines, H, ring_len, K)
        x["rawv"] = ring(lines, HV, ring_len, V)
        x["g"] = ring(lines, HV, ring_len, K, dt=f32)
        x["beta"] = ring(lines, HV, ring_len, dt=f32)
    return x


def _ring_kwargs(inp, ring):
    return dict(cache_ring=ring, **{f"replayssm_{n}": inp[n] if ring else None for n in RING_NAMES})


def fused_kwargs(mode, inp, T, H, HV, K, V, lower_bound=None, scale=None):
    """Keywords of the fused call (`fused_kda_conv_gating_verify`) in `mode` on buffers
    `inp`; `scale` is passed only when given (the kernel's default is K ** -0.5)."""
    ring = is_ring(mode)
    kw = dict(
        mixed_qkv=inp["mixed"], conv_weight=inp["w"], conv_bias=inp["bias"],
        conv_state=inp["conv_pool"].transpose(-1, -2), conv_state_indices=inp["cache_indices"],
        intermediate_conv_window=inp["win_pool"].transpose(-1, -2),
        intermediate_state_indices=inp["inter_indices"], a=inp["a"], b=inp["b"],
        A_log=inp["A_log"], dt_bias=inp["dt_bias"], ssm_states=inp["ssm"],
        cache_indices=inp["cache_indices"],
        intermediate_states_buffer=None if ring else inp["inter_ssm"], T=T, num_q_heads=H,
        num_v_heads=HV, head_k_dim=K, head_v_dim=V, lower_bound=lower_bound,
        **_ring_kwargs(inp, ring),
    )  # fmt: skip
    if scale is not None:
        kw["scale"] = scale
    return kw


def conv_args(inp, B, T):
    """Positional and keyword arguments of the unfused modes' `causal_conv1d_update` call:
    x as `[B, dim, T]`, the transposed conv pool, weight, bias."""
    x3 = inp["mixed"].reshape(B, T, -1).transpose(1, 2)
    args = (x3, inp["conv_pool"].transpose(-1, -2), inp["w"], inp["bias"])
    kwargs = dict(
        activation="silu",
        conv_state_indices=inp["cache_indices"],
        intermediate_conv_window=inp["win_pool"].transpose(-1, -2),
        intermediate_state_indices=inp["inter_indices"],
    )
    return args, kwargs


def recurrent_kwargs(mode, inp, conv_out, T, H, HV, K, V, lower_bound=None):
    """Keywords of the unfused modes' recurrent call (`fused_sigmoid_gating_delta_rule_update`);
    `conv_out` is `[B, dim, T]` as the conv returns it; q/k/v go in as `[1, B*T, heads, dim]`."""
    ring = is_ring(mode)
    N = inp["mixed"].shape[0]
    q, k, v = conv_out.transpose(1, 2).reshape(N, -1).split([H * K, H * K, HV * V], -1)
    return dict(
        A_log=inp["A_log"], a=inp["a"], dt_bias=inp["dt_bias"], softplus_beta=1.0,
        softplus_threshold=20.0, q=q.unflatten(-1, (H, K)).unsqueeze(0),
        k=k.unflatten(-1, (H, K)).unsqueeze(0), v=v.unflatten(-1, (HV, V)).unsqueeze(0),
        b=inp["b"], initial_state_source=inp["ssm"], initial_state_indices=inp["cache_indices"],
        use_qk_l2norm_in_kernel=True, cu_seqlens=inp["cu"], is_kda=True,
        disable_state_update=True, intermediate_states_buffer=None if ring else inp["inter_ssm"],
        intermediate_state_indices=None if ring else inp["inter_indices"], cache_steps=T,
        retrieve_parent_token=None, lower_bound=lower_bound, **_ring_kwargs(inp, ring),
    )  # fmt: skip


def validate_call_indices(api, inp):
    """Range and duplicate check of every index of a call on buffers `inp` against the pool
    it addresses (`validate_indices` of the package `api`, or of `api.module` for a
    stand-in; it reads the values, so it belongs at setup, never in a timed graph). The conv
    lines are only read during verify, so they may repeat. Packages without the helper
    skip the check."""
    validate = getattr(getattr(api, "module", api), "validate_indices", None)
    if validate is None:
        return
    validate(inp["cache_indices"], inp["conv_pool"], "conv_state_indices", distinct=False)
    validate(inp["cache_indices"], inp["ssm"], "cache_indices")
    validate(inp["inter_indices"], inp["win_pool"], "intermediate_state_indices")
    if "inter_ssm" in inp:
        validate(inp["inter_indices"], inp["inter_ssm"], "intermediate_state_indices")


def make_call(
    api, mode, inp, B, T, H, HV, K, V, lower_bound=None, *, validate=True, scale=None, tuning=None
):
    """A zero-argument callable running one verify in `mode` on buffers `inp`; it returns o
    (`[B*T, HV, V]` fused, `[1, B*T, HV, V]` unfused, in the input dtype).

    api: has `fused_kda_conv_gating_verify`, `causal_conv1d_update` and
        `fused_sigmoid_gating_delta_rule_update` (the `kernels.kda` package, or a stand-in
        with those names).
    validate: check the indices first (validate_call_indices); off for tests that pass
        indices outside the pools on purpose.
    tuning: a `kernels.kda.tuning.KdaTuning` handed to every kernel call as `tuning=`; None
        passes nothing (packages older than `tuning=` take no such keyword).
    """
    if validate:
        validate_call_indices(api, inp)
    tune = {} if tuning is None else {"tuning": tuning}
    if is_fused(mode):
        kw = fused_kwargs(mode, inp, T, H, HV, K, V, lower_bound, scale)
        return lambda: api.fused_kda_conv_gating_verify(**kw, **tune)

    def unfused():
        args, kwargs = conv_args(inp, B, T)
        conv_out = api.causal_conv1d_update(*args, **kwargs, **tune)
        kw = recurrent_kwargs(mode, inp, conv_out, T, H, HV, K, V, lower_bound)
        return api.fused_sigmoid_gating_delta_rule_update(**kw, **tune)

    return unfused


def reference_verify(reference, inp, T, H, HV, K, V, lower_bound=None):
    """`reference.verify` (the `kernels.kda.reference` module) on buffers `inp`: a dict with
    o, windows, states, the ring entries and the pad mask; it writes nothing."""
    return reference.verify(
        inp["mixed"], inp["w"], inp["bias"], inp["conv_pool"].transpose(-1, -2),
        inp["cache_indices"], inp["a"], inp["b"], inp["A_log"], inp["dt_bias"], inp["ssm"],
        inp["cache_indices"], T, H, HV, K, V, lower_bound=lower_bound,
    )  # fmt: skip
