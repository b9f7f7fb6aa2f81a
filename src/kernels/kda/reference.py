"""Plain PyTorch reference for KDA chain verify (fp32 math), batched over sequences.

Follows the spec step by step: causal conv (rounded to the input dtype), split, gate and
beta, L2 normalization, gated delta rule; plus `replay`, the commit from the ring.
An index outside its pool (< 0 or >= the pool's leading dimension) marks a padded
sequence, as in the kernels: its outputs are zeros and its other results are NaN (nothing
would be written for them).
"""

import torch
import torch.nn.functional as F

EPS = 1e-6


def conv_steps(x, state, weight, bias=None, silu=True):
    """Causal depthwise conv over T new tokens.

    x: [B, T, dim] raw inputs; state: [B, dim, W-1] saved inputs, oldest first;
    weight [dim, W]; bias [dim] or None. Returns (y [B, T, dim] in x's dtype, windows
    [B, T, dim, W-1] in x's dtype (raw inputs after each step), new_state [B, dim, W-1]).
    """
    W = weight.shape[1]
    T = x.shape[1]
    xx = torch.cat([state, x.transpose(1, 2)], dim=-1)  # [B, dim, W-1+T], x's dtype
    xf, wf = xx.float(), weight.float()
    ys, windows = [], []
    for t in range(T):
        y = (xf[..., t : t + W] * wf).sum(-1)
        if bias is not None:
            y = y + bias.float()
        if silu:
            y = F.silu(y)
        ys.append(y.to(x.dtype))
        windows.append(xx[..., t + 1 : t + W])
    return torch.stack(ys, 1), torch.stack(windows, 1), xx[..., T:]


def kda_gate(a, dt_bias, A_log, lower_bound=None):
    """Per-channel decay g (fp32). a, dt_bias: [..., HV, K]; A_log: [HV]."""
    x = a.float() + dt_bias.float()
    A = A_log.float().exp()[:, None]
    if lower_bound is None:
        return -A * F.softplus(x, beta=1.0, threshold=20.0)
    return lower_bound * torch.sigmoid(A * x)


def l2norm(x, eps=EPS):
    """x / sqrt(|x|^2 + eps) along the last dim, fp32."""
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_step(S, q, k, v, g, beta):
    """One gated delta-rule step. S [..., V, K] fp32; q, k, g [..., K] (q, k normalized,
    q scaled); v [..., V]; beta [...]. Returns (S, o [..., V])."""
    S = S * g.exp()[..., None, :]
    u = beta[..., None] * (v - (S * k[..., None, :]).sum(-1))
    S = S + u[..., :, None] * k[..., None, :]
    return S, (S * q[..., None, :]).sum(-1)


def _heads(x, H, HV):
    """Repeat q/k heads [B, H, K] for the value heads they serve: [B, HV, K]."""
    return x.repeat_interleave(HV // H, dim=1)


def _outside(idx, lines):
    """Entries of idx that address no line of a pool of `lines` (padding)."""
    return (idx < 0) | (idx >= lines)


def _safe(idx, lines):
    """idx as int64 line numbers that can be gathered (padding entries read line 0; their
    results are masked after)."""
    return torch.where(_outside(idx, lines), 0, idx.long())


def verify(
    mixed_qkv,
    conv_weight,
    conv_bias,
    conv_state,
    conv_state_indices,
    a,
    b,
    A_log,
    dt_bias,
    ssm_states,
    cache_indices,
    T,
    H,
    HV,
    K,
    V,
    scale=None,
    lower_bound=None,
):
    """Whole verify of B sequences; one result for all four modes.

    Shapes as in the spec (mixed_qkv [B*T, dim], conv_state [lines, dim, W-1] view, ...).
    Returns a dict, results per sequence n in batch order:
        o [B*T, HV, V] (input dtype), conv_out [B, T, dim] (input dtype),
        windows [B, T, dim, W-1] (input dtype), states [B, T, HV, V, K] (fp32 snapshots),
        rawk [B, H, T, K], rawv [B, HV, T, V] (input dtype), g [B, HV, T, K], beta [B, HV, T]
        (fp32), final [B, HV, V, K] and pad [B] (bool).
    """
    dtype = mixed_qkv.dtype
    dim = mixed_qkv.shape[1]
    B = mixed_qkv.shape[0] // T
    scale = K**-0.5 if scale is None else scale
    slots, lines = ssm_states.shape[0], conv_state.shape[0]
    pad = _outside(cache_indices, slots) | _outside(conv_state_indices, lines)
    x = mixed_qkv.reshape(B, T, dim)
    cs = conv_state[_safe(conv_state_indices, lines)]
    y, windows, _ = conv_steps(x, cs, conv_weight, conv_bias)
    q, k, v = y.split([H * K, H * K, HV * V], dim=-1)
    q, k, v = q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K)), v.unflatten(-1, (HV, V))
    g = kda_gate(a.reshape(B, T, HV, K), dt_bias.reshape(HV, K), A_log, lower_bound)
    beta = torch.sigmoid(b.reshape(B, T, HV).float())

    S = ssm_states[_safe(cache_indices, slots)].float()
    os, states = [], []
    for t in range(T):
        qn = _heads(l2norm(q[:, t]) * scale, H, HV)
        kn = _heads(l2norm(k[:, t]), H, HV)
        S, o_t = delta_step(S, qn, kn, v[:, t].float(), g[:, t], beta[:, t])
        os.append(o_t)
        states.append(S)
    o = torch.stack(os, 1).to(dtype)  # [B, T, HV, V]
    o[pad] = 0
    out = {
        "o": o.reshape(B * T, HV, V),
        "conv_out": y,
        "windows": windows,
        "states": torch.stack(states, 1),
        "rawk": k.transpose(1, 2),
        "rawv": v.transpose(1, 2),
        "g": g.transpose(1, 2),
        "beta": beta.transpose(1, 2),
        "final": S,
        "pad": pad,
    }
    for name in ("conv_out", "windows", "states", "rawk", "rawv", "g", "beta", "final"):
        out[name] = out[name].clone()
        out[name][pad] = float("nan")
    return out


def replay(ssm_states, cache_indices, rawk, rawv, g, beta, accepted, T=None):
    """Commit by replay: the state after `accepted` tokens, from the ring alone.

    ssm_states [slots, HV, V, K] fp32; cache_indices [B]; ring rawk [slots, H, R, K],
    rawv [slots, HV, R, V], g [slots, HV, R, K], beta [slots, HV, R]; accepted: an int or
    [B] ints in 1..T, T the verify's draft length when given, else at most the ring length
    R (an entry outside raises ValueError naming `accepted`). Returns the new states
    [B, HV, V, K] (fp32); writes nothing. Padded sequences (index < 0 or >= slots) get NaN.
    """
    B = cache_indices.shape[0]
    H, HV, R = rawk.shape[1], rawv.shape[1], rawk.shape[2]
    if T is not None and (not isinstance(T, int) or isinstance(T, bool) or not 1 <= T <= R):
        raise ValueError(f"T must be None or an int in 1..R={R}, got {T!r}")
    top, what = (R, f"the ring length R={R}") if T is None else (T, f"T={T}")
    acc = torch.as_tensor(accepted)
    if acc.dtype.is_floating_point or acc.dtype.is_complex or acc.dtype == torch.bool:
        raise TypeError(f"accepted must be an int or a tensor of ints, got {acc.dtype}")
    if acc.dim() > 1 or acc.numel() not in (1, B):
        raise ValueError(f"accepted must be an int or [{B}] ints, got shape {tuple(acc.shape)}")
    if bool(((acc < 1) | (acc > top)).any()):
        raise ValueError(f"accepted must lie in 1..{top} ({what}), got {accepted}")
    acc = acc.to(ssm_states.device).expand(B)
    slot = _safe(cache_indices, ssm_states.shape[0])
    S = ssm_states[slot].float()
    for t in range(int(acc.max())):
        kn = _heads(l2norm(rawk[slot, :, t]), H, HV)
        q0 = torch.zeros_like(kn)
        S_new, _ = delta_step(S, q0, kn, rawv[slot, :, t].float(), g[slot, :, t], beta[slot, :, t])
        S = torch.where((t < acc)[:, None, None, None], S_new, S)
    S = S.clone()
    S[_outside(cache_indices, ssm_states.shape[0])] = float("nan")
    return S
