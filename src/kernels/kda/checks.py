"""Host-side argument checks of the KDA verify wrappers.

None of them synchronizes with the device but `validate_indices`, which reads the index
values and is called on request only.
"""

import torch

from .._runtime import interpreter_active


def check_devices(tensors):
    """All named tensors on one device: CUDA, or CPU under the Triton interpreter."""
    devices = {t.device for t in tensors.values() if t is not None}
    if len(devices) > 1:
        names = ", ".join(f"{n}={t.device}" for n, t in tensors.items() if t is not None)
        raise ValueError(f"all tensors must be on one device, got {names}")
    (dev,) = devices
    if dev.type != "cuda" and not (interpreter_active() and dev.type == "cpu"):
        raise ValueError(
            f"tensors must be on a CUDA device (CPU only with TRITON_INTERPRET=1), got {dev}"
        )


def check_tensor(name, t, ndim=None, shape=None, dtype=None, unit_last=False):
    """Type, rank, shape (None entries are free), dtype and unit last stride of one argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(
            s is not None and s != d for s, d in zip(shape, t.shape, strict=True)
        ):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise TypeError(
                f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}"
            )
    if unit_last and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dim, got strides {t.stride()}")


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_index(name, t, n):
    """An index vector of `n` int32/int64 entries (its values are not read: negative or
    outside the pool = padding, bounded in the kernels)."""
    check_tensor(name, t, shape=(n,), dtype=INDEX_DTYPES)
    if n > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def validate_indices(indices, lines, name="indices", distinct=True):
    """Check the values of one index vector against the pool it addresses; raise if broken.

    The kernels never read these values on the host: an entry that is negative or >= the
    pool's number of lines makes its sequence padding there (zero outputs, nothing read or
    written), and two sequences given one line that the call writes is undefined. This
    check turns both into errors, for a scheduler that wants to know.

    Args:
        indices: [B] int32/int64 tensor (any device), e.g. cache_indices.
        lines: the pool's number of lines, an int >= 0, or the pool tensor itself (its
            leading dimension: ssm_states, conv_state, intermediate_conv_window, ...).
        name: the argument's name, for the messages.
        distinct: also refuse a line that two sequences share (negative entries may
            repeat). Pass True for every index whose lines the call writes (ring slots,
            snapshot and window lines, a conv state rolled in place, a state written back);
            False for a pool that is only read (conv_state or ssm_states during verify).
    Raises TypeError for a non-tensor or a non-integer dtype, ValueError for a rank other
    than 1, an entry >= lines, or (distinct) a repeated line. Negative entries (padding)
    pass. Reads the values (syncs the device): call it where the indices are made, not
    inside a captured graph.
    """
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"{name} must be a [B] vector, got shape {tuple(indices.shape)}")
    if isinstance(lines, torch.Tensor):
        if lines.dim() == 0:
            raise ValueError(f"lines of {name} must be an int or a pool tensor, got a 0-d tensor")
        lines = lines.shape[0]
    if not isinstance(lines, int) or isinstance(lines, bool) or lines < 0:
        raise ValueError(f"lines of {name} must be an int >= 0 or a pool tensor, got {lines!r}")
    idx = indices.detach().to(device="cpu", dtype=torch.int64)
    over = (idx >= lines).nonzero().flatten()
    if over.numel():
        n = int(over[0])
        raise ValueError(
            f"{name}[{n}] = {int(idx[n])} is outside its pool of {lines} lines "
            "(a negative entry marks padding)"
        )
    if distinct and idx.numel() > 1:
        vals, order = torch.sort(idx, stable=True)
        rep = ((vals[1:] == vals[:-1]) & (vals[1:] >= 0)).nonzero().flatten()
        if rep.numel():
            j = int(rep[0])
            raise ValueError(
                f"{name} gives line {int(vals[j])} to sequences {int(order[j])} and "
                f"{int(order[j + 1])}: a line the call writes must be distinct"
            )


def check_pow2(name, value):
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")


def check_ring(rawk, rawv, g, beta, slots, H, HV, K, V, T, dtype):
    """Ring buffers rawk [slots,H,R,K], rawv [slots,HV,R,V] (input dtype), g [slots,HV,R,K],
    beta [slots,HV,R] (fp32), R a power of two with R >= 2*T. Returns R."""
    names = {
        "replayssm_rawk": rawk,
        "replayssm_rawv": rawv,
        "replayssm_g": g,
        "replayssm_beta": beta,
    }
    for name, t in names.items():
        if t is None:
            raise ValueError(f"cache_ring=True needs {name}")
    check_tensor("replayssm_rawk", rawk, ndim=4, dtype=dtype, unit_last=True)
    R = rawk.shape[2]
    check_tensor("replayssm_rawk", rawk, shape=(slots, H, R, K))
    check_tensor("replayssm_rawv", rawv, shape=(slots, HV, R, V), dtype=dtype, unit_last=True)
    check_tensor("replayssm_g", g, shape=(slots, HV, R, K), dtype=torch.float32, unit_last=True)
    check_tensor("replayssm_beta", beta, shape=(slots, HV, R), dtype=torch.float32)
    check_pow2("ring length R (replayssm_rawk.shape[2])", R)
    if 2 * T > R:
        raise ValueError(f"T={T} exceeds half the ring length R={R} (replayssm_rawk.shape[2])")
    return R


def check_heads(H, HV, K, V):
    for name, val in (
        ("num_q_heads", H),
        ("num_v_heads", HV),
        ("head_k_dim", K),
        ("head_v_dim", V),
    ):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if HV % H:
        raise ValueError(f"num_v_heads={HV} must be a multiple of num_q_heads={H}")
    check_pow2("head_k_dim", K)
    check_pow2("head_v_dim", V)


def check_lower_bound(lower_bound):
    if lower_bound is not None and not lower_bound < 0:
        raise ValueError(f"lower_bound must be None or < 0, got {lower_bound}")


def check_state_and_saves(
    ssm_states,
    ssm_name,
    slot_indices,
    slot_name,
    snapshots,
    snapshot_indices,
    cache_ring,
    ring,
    B,
    T,
    H,
    HV,
    K,
    V,
    dtype,
    require_save,
):
    """Checks the recurrent state, its slot indices and the save buffers (snapshots xor ring).

    ssm_states [slots, HV, V, K] fp32; snapshots [lines, >=T, HV, V, K] fp32 with
    snapshot_indices [B]; ring = (rawk, rawv, g, beta), used only when cache_ring is true.
    """
    check_tensor(ssm_name, ssm_states, ndim=4, dtype=torch.float32, unit_last=True)
    if ssm_states.shape[1:] != (HV, V, K):
        raise ValueError(
            f"{ssm_name} must be [slots, {HV}, {V}, {K}], got {tuple(ssm_states.shape)}"
        )
    check_index(slot_name, slot_indices, B)
    if cache_ring and snapshots is not None:
        raise ValueError("give either intermediate_states_buffer or cache_ring=True, not both")
    if require_save and not cache_ring and snapshots is None:
        raise ValueError("verify needs intermediate_states_buffer or cache_ring=True")
    if snapshots is not None:
        check_tensor(
            "intermediate_states_buffer", snapshots, ndim=5, dtype=torch.float32, unit_last=True
        )
        if snapshots.shape[1] < T or snapshots.shape[2:] != (HV, V, K):
            raise ValueError(
                f"intermediate_states_buffer must be [lines, >={T}, {HV}, {V}, {K}], got {tuple(snapshots.shape)}"
            )
        if snapshot_indices is None:
            raise ValueError(
                "intermediate_state_indices is required with intermediate_states_buffer"
            )
        check_index("intermediate_state_indices", snapshot_indices, B)
    if cache_ring:
        check_ring(*ring, ssm_states.shape[0], H, HV, K, V, T, dtype)


def save_args(snapshots, ring, cache_ring, ssm_states, dtype):
    """Kernel arguments for the save buffers: 5 pointers, then 4 + 3*4 strides.

    Unused buffers are replaced by a 1-element dummy with zero strides (never touched)."""
    f32 = ssm_states.new_empty(1)
    low = ssm_states.new_empty(1, dtype=dtype)
    snap = snapshots if snapshots is not None else f32
    rawk, rawv, g, beta = ring if cache_ring else (low, low, f32, f32)
    ptrs = [snap, rawk, rawv, g, beta]
    strides = list(snapshots.stride()[:4]) if snapshots is not None else [0] * 4
    for t, n in ((rawk, 3), (rawv, 3), (g, 3), (beta, 3)):
        strides += list(t.stride()[:n]) if cache_ring else [0] * n
    return ptrs, strides


def tokens_view(name, t, N, width):
    """View a read-only per-token tensor ([N, width] or [1, N, width]) as [N, width]."""
    check_tensor(name, t, dtype=FLOAT_DTYPES, unit_last=True)
    if t.dim() == 0 or t.shape[-1] != width or t.numel() != N * width:
        raise ValueError(f"{name} must hold {N} tokens of {width} values, got {tuple(t.shape)}")
    return t.reshape(N, width)
