"""Pure-PyTorch references for NSA selection attention (readable, autograd-able).

Both references compute, for every query position t of kv head h and each of its G query
heads, softmax attention over the keys of the blocks listed in block_idx[b, h, t, :]:

* a slot j is kept when 0 <= j < NB and j * block_size <= t (the block starts at or before t);
* inside a kept block, key p is visible when p <= t (causal);
* a block listed twice in one row is one block: its keys count once;
* a row with no visible key yields o = 0 and lse = -inf, and no NaN in any gradient;
* keys a row does not see take no part in its result, whatever their values: a NaN or inf in
  k or v there changes nothing, in o, lse or the autograd gradients. A non-finite key or
  value that a row does see makes that row's result non-finite (NaN here).

`selection_forward_reference` builds the dense [T, T] mask (O(T^2) memory, the contrast of
the benchmark); `selection_forward_gather_reference` gathers each query's S * block_size keys
(O(T * S * block_size) memory per chunk of queries) so it also runs at longer T.
Math runs in fp32, or fp64 when the inputs are fp64 (tests use that as ground truth).
"""

import torch


def _compute_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)


def _scale(q, scale):
    return q.shape[-1] ** -0.5 if scale is None else scale


def kept_slots(block_idx, block_size, T, t=None):
    """Boolean [..., T, S]: which slots are kept (in range and not starting after t)."""
    NB = (T + block_size - 1) // block_size
    if t is None:
        t = torch.arange(T, device=block_idx.device)
    j = block_idx.long()
    return (j >= 0) & (j < NB) & (j * block_size <= t[:, None])


def visibility_mask(block_idx, block_size, T):
    """Dense boolean [B, Hkv, T, T]: mask[..., t, p] is True when query t sees key p."""
    NB = (T + block_size - 1) // block_size
    B, Hkv, _, S = block_idx.shape
    # Mark the selected blocks of each query on a [.., T, NB + 1] grid; dropped slots write
    # into the spare column NB, so duplicates and invalid entries need no special case.
    j = torch.where(kept_slots(block_idx, block_size, T), block_idx.long(), NB)
    chosen = torch.zeros(B, Hkv, T, NB + 1, dtype=torch.bool, device=block_idx.device)
    chosen.scatter_(-1, j, True)
    pos = torch.arange(T, device=block_idx.device)
    mask = chosen[..., pos // block_size]  # [B, Hkv, T, T]: key p's block chosen by t
    return mask & (pos[None, :] <= pos[:, None])


def _finite_part(x):
    """(x with its non-finite entries set to 0, bool mask of those entries), or (x, None)
    when every entry is finite (one host sync: the references are not for graph capture)."""
    bad = ~torch.isfinite(x)
    if not bad.any():
        return x, None
    return x.masked_fill(bad, 0), bad


def _masked_softmax(scores, mask):
    """Softmax of scores over the visible keys; empty rows give p = 0 and lse = -inf.

    The row max is detached (softmax does not depend on it) and made finite for empty rows,
    so exp(-inf - m) = 0 and the normaliser is guarded: no NaN in values or gradients.
    Returns (p, lse) with p normalised and lse without the trailing singleton dim.
    """
    scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    l = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(l > 0, l, torch.ones_like(l))
    return p, (m + torch.log(l)).squeeze(-1)  # log(0) = -inf for empty rows


def selection_forward_reference(q, k, v, block_idx, block_size, scale=None, return_lse=False):
    """Dense masked selection attention (O(T^2) memory).

    Args:
        q: [B, Hq, T, D]; k, v: [B, Hkv, T, D], same dtype; Hq % Hkv == 0.
        block_idx: [B, Hkv, T, S] int32/int64 selected key blocks per query (see module doc).
        block_size: keys per block.
        scale: softmax scale, default D ** -0.5.
        return_lse: also return the fp32 (fp64 for fp64 inputs) log-sum-exp [B, Hq, T].
    Returns:
        o [B, Hq, T, D] in q's dtype (and lse when asked).
    """
    B, Hq, T, D = q.shape
    G = Hq // k.shape[1]
    cdt = _compute_dtype(q)
    kf = k.to(cdt).repeat_interleave(G, dim=1)
    vf = v.to(cdt).repeat_interleave(G, dim=1)
    mask = visibility_mask(block_idx, block_size, T).repeat_interleave(G, dim=1)
    # The products below run over all T keys; a key a row does not see gets p = 0 there,
    # and 0 * NaN (or 0 * inf) is NaN. So the non-finite entries are taken out of k and v
    # (zeroed), and put back only where a row sees them: a key with one gives NaN scores
    # (masked to -inf below wherever it is not visible), a value entry v[p, d] gives NaN in
    # o[t, d] of every row t that sees key p. Clean inputs skip both steps (no extra
    # [T, T] memory).
    kf, k_bad = _finite_part(kf)
    vf, v_bad = _finite_part(vf)
    scores = (q.to(cdt) @ kf.transpose(-1, -2)) * _scale(q, scale)
    if k_bad is not None:
        scores = scores.masked_fill(k_bad.any(-1)[..., None, :], float("nan"))
    p, lse = _masked_softmax(scores, mask)
    o = p @ vf
    if v_bad is not None:
        o = o.masked_fill((mask.to(cdt) @ v_bad.to(cdt)) > 0, float("nan"))
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o


def selection_forward_gather_reference(
    q, k, v, block_idx, block_size, scale=None, return_lse=False, chunk=1024
):
    """Gather-based selection attention, same contract as `selection_forward_reference`.

    Each query gathers the S * block_size keys of its slots ([.., S * bs, D] per query), so the
    memory is O(chunk * S * bs * D) per chunk of `chunk` query positions instead of O(T^2).
    Dropped slots, repeats of an earlier slot's block in the same row, and keys after t are
    masked, so the result is the dense one. Masked keys are zeroed in the gathered k and v
    (the softmax gives them p = 0, and 0 * NaN would be NaN), so non-finite values there
    take no part; visible ones propagate through the products as IEEE arithmetic carries
    them.
    """
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], block_idx.shape[-1]
    G = Hq // Hkv
    cdt = _compute_dtype(q)
    sc = _scale(q, scale)
    offs = torch.arange(block_size, device=q.device)
    qg = q.to(cdt).view(B, Hkv, G, T, D)
    kf, vf = k.to(cdt), v.to(cdt)
    outs, lses = [], []
    for t0 in range(0, T, chunk):
        t = torch.arange(t0, min(T, t0 + chunk), device=q.device)
        idx = block_idx[:, :, t0 : t0 + len(t)].long()
        keep = kept_slots(idx, block_size, T, t)  # [B, Hkv, n, S]
        # A slot that repeats the block of an earlier slot of its row is dropped.
        earlier = torch.ones(S, S, dtype=torch.bool, device=q.device).tril(-1)  # s' < s
        keep &= ~((idx[..., :, None] == idx[..., None, :]) & earlier).any(-1)
        pos = idx.clamp(min=0)[..., None] * block_size + offs  # [B, Hkv, n, S, bs]
        vis = keep[..., None] & (pos <= t[:, None, None])
        pos = pos.clamp(max=T - 1).reshape(B, Hkv, -1)  # masked keys read any valid row
        kk = torch.gather(kf, 2, pos[..., None].expand(-1, -1, -1, D)).view(B, Hkv, len(t), -1, D)
        vv = torch.gather(vf, 2, pos[..., None].expand(-1, -1, -1, D)).view(B, Hkv, len(t), -1, D)
        hidden = ~vis.reshape(B, Hkv, len(t), -1, 1)  # each query's own masked keys
        kk, vv = kk.masked_fill(hidden, 0), vv.masked_fill(hidden, 0)
        qc = qg[:, :, :, t0 : t0 + len(t)]  # [B, Hkv, G, n, D]
        scores = torch.einsum("bhgtd,bhtkd->bhgtk", qc, kk) * sc
        mask = vis.reshape(B, Hkv, 1, len(t), S * block_size)
        p, lse = _masked_softmax(scores, mask)
        o = torch.einsum("bhgtk,bhtkd->bhgtd", p, vv)
        outs.append(o)
        lses.append(lse)
    o = torch.cat(outs, dim=3).reshape(B, Hq, T, D).to(q.dtype)
    lse = torch.cat(lses, dim=3).reshape(B, Hq, T)
    return (o, lse) if return_lse else o
