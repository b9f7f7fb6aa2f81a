"""Floors of the KDA verify's state traffic on the GPU: how fast a kernel that only moves the
state (with the least arithmetic the math allows) runs in the verify's grid.

    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part ring|snap|small|persist|full|launch
        [--batch B ...] [--out DIR]
    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part ringio [--hv 8 16] [--batch 64]
    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part schedule [--hv 8 16] [--batch 64]
        [--rounds 3] [--gate safe|std] [--tiles TILE ...] [--out DIR]
    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part stream [--hv 8 16] [--batch 64]
        [--rounds 3] [--out DIR]
    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part compile   (CPU: compile for sm_90)
    PYTHONPATH=src python3 -m tools.dev.gpu_kda_floor --part ringio|stream --cpu-smoke   (CPU)

Each floor kernel has the verify's grid (sequence, value head, tile of BLOCK_V value rows,
walked in sub-tiles of SUB_V), reads the sequence's slot index first, then its fp32 state
rows [slots, HV, V, K]:
  * ring: per step t, two row sums S x over the key axis (the closed form's 2T products
    of the initial state, x from `a`'s rows), o[t] written (bf16): the ring modes' state
    bytes and the fewest products their math needs;
  * snap: per step t, the tile scaled by exp(x_t) (the decay) and stored as snapshot t of
    the sequence's line (`.cs`), plus one row sum into o[t]: the snapshot modes' bytes.
  * persist: the ring and snapshot floors' work in persistent programs (a few per SM) that walk the
    (sequence, value head, sub-tile) items in a software-pipelined loop, so that the next
    items' index and state loads are in flight while one computes;
  * full: the snapshot floors (grid and persistent, short tile lists) beside the same with
    the delta rule's whole step (a second row sum and the rank-1 update before the store);
  * launch: the per-call time of an empty kernel (one program) in a graph, with and without
    programmatic dependent launch (PDL), the fixed cost every call of a stream carries;
  * ringio: the ring modes' whole traffic, nothing else: the ring floor's state rows, row
    sums and o (in the input dtype), plus every other byte a ring-mode call reads or writes
    (the T new input rows and the conv state line of its channels, a and b, the T conv
    windows of its line, raw v, raw k, g and beta into its ring slot), at HV = 8 and 16
    (--hv), beside the shipped fused+ring and unfused+ring in the same sets; each tile
    twice: raw k and the q/k windows owned by one value head per q/k head (as the verify
    kernels do), and spread evenly over every program of the sequence. `--cpu-smoke`
    checks both under Triton's interpreter at a tiny shape.
  * schedule: the floor of the shipped fused kernel's own schedule. Its floor probe
    (`VerifyTuning.floor_probe`) is the same launch, tile and grid with the per-step input
    arithmetic (conv, SiLU, gates, norms, the projected form's coefficients) replaced by
    copies, so it moves every byte of the mode and keeps every product with the state (the
    whole delta step in the snapshot mode; the 2T row sums of the projected ring mode). Per
    (HV, B), at --gate (default safe): fused and fused+ring, each beside its probe, and the
    unfused pair, seed-style and cold on the same sets, --rounds interleaved rounds (median
    per entry); the probe's o and saves are checked against its definition first. With
    --tiles, the snapshot mode alone, kernel and probe at each forced tile beside the
    table's (tiles written as `gpu_kda_snapshot_tiles` takes them: 32/32/2/1/plain,
    64/32/4/2/64).
  * stream: the bytes of each mode (`mode_bytes`: state rows, inputs, conv lines, a and
    b read; o, windows and the ring or the snapshots written) as one contiguous fp32 read
    and one contiguous write in the same programs, the best of a few block sizes: what the
    mode's traffic costs at the card's streaming rate, with no layout, index or arithmetic
    in the way, beside the shipped fused and unfused calls of that mode on the same cold
    sets. `--cpu-smoke` checks the kernel and that `mode_bytes` equals what the fused
    kernel writes in each mode.
Sweeps tiles (BLOCK_V, SUB_V, warps, stages of the sub-tile loop, key chunk) at B = 16 and
64 (`ring`, `snap`) or B = 1 and 16 (`small`), timed like `gpu_check_kda` (cold: a CUDA
graph over input sets that do not fit in L2; median of 5), beside the shipped kernels
(`small` also times the unfused pair's two kernels alone). Prints one line per point and
the best floor per (part, B); writes DIR/kda_floor_<part>.json when --out is given.
"""

import argparse
import dataclasses
import itertools
import json
import os
import statistics

import torch

# First: puts src/ on the path, and with --cpu-smoke switches Triton's interpreter on, which
# must happen before triton.language is imported (its own jit functions read the switch).
from tools import gpu_check_kda as chk

# isort: split
import triton
import triton.language as tl

from kernels.kda import causal_conv1d_update, fused_sigmoid_gating_delta_rule_update
from kernels.kda import tuning as kt
from kernels.kda.step import _key_sum, _key_vec, _tile_ptrs
from tools.dev import gpu_kda_snapshot_tiles as snap_tiles

H, K, V, T, HV = chk.H, chk.K, chk.V, chk.T, 8


@triton.jit
def _floor_step(b_S, b_x, p_snap_t, p_o_t, o_sv, K: tl.constexpr, KC: tl.constexpr,
                SNAP: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """One step of a floor kernel on a state tile; returns the tile. Ring (not SNAP): two
    row sums of the initial state, o written. SNAP: the tile decayed by exp(x), stored as
    the step's snapshot (`.cs`), one row sum into o; FULL adds the delta rule's other work
    (a row sum u = S x and the rank-1 update S += (1 - u) x^T before the store)."""
    if SNAP:
        b_S = b_S * _key_vec(tl.exp(b_x), K, KC)
        if FULL:
            b_u = 1.0 - _key_sum(b_S * _key_vec(b_x, K, KC), K, KC)
            if KC == K:
                b_S += b_u[:, None] * _key_vec(b_x, K, KC)
            else:
                b_S += b_u[:, None, None] * _key_vec(b_x, K, KC)
        tl.store(_tile_ptrs(p_snap_t, o_sv, K, K, KC), b_S, cache_modifier=".cs")
        b_o = _key_sum(b_S * _key_vec(b_x * b_x if FULL else b_x, K, KC), K, KC)
    else:
        b_o = _key_sum(b_S * _key_vec(b_x, K, KC), K, KC)
        b_o += _key_sum(b_S * _key_vec(b_x * b_x, K, KC), K, KC)
    tl.store(p_o_t + o_sv, b_o.to(p_o_t.dtype.element_ty))
    return b_S


@triton.jit
def _floor_kernel(ssm, idx, lines, a, o, snap, s_ssm_s, s_ssm_h, s_a_n, s_o_n, s_o_h,
                  s_snap_l, s_snap_t, s_snap_h, T: tl.constexpr, K: tl.constexpr,
                  BLOCK_V: tl.constexpr, SUB_V: tl.constexpr, KC: tl.constexpr,
                  STAGES: tl.constexpr, SNAP: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    o_k = tl.arange(0, K)
    i_slot = tl.load(idx + i_n).to(tl.int64)
    p_h0 = ssm + i_slot * s_ssm_s + i_hv * s_ssm_h
    b_x = ()
    for t in tl.static_range(T):
        b_x = b_x + (tl.load(a + (i_n * T + t) * s_a_n + i_hv * K + o_k).to(tl.float32),)
    p_snap = snap
    if SNAP:
        i_line = tl.load(lines + i_n).to(tl.int64)
        p_snap = snap + i_line * s_snap_l + i_hv * s_snap_h
    for i_s in tl.range(0, BLOCK_V // SUB_V, num_stages=STAGES):
        o_sv = i_v * BLOCK_V + i_s * SUB_V + tl.arange(0, SUB_V)
        b_S = tl.load(_tile_ptrs(p_h0, o_sv, K, K, KC))
        for t in tl.static_range(T):
            p_o_t = o + (i_n * T + t) * s_o_n + i_hv * s_o_h
            b_S = _floor_step(b_S, b_x[t], p_snap + t * s_snap_t, p_o_t, o_sv, K, KC, SNAP, FULL)


@triton.jit
def _persist_kernel(ssm, idx, lines, a, o, snap, s_ssm_s, s_ssm_h, s_a_n, s_o_n, s_o_h,
                    s_snap_l, s_snap_t, s_snap_h, N_ITEMS, HV: tl.constexpr, V: tl.constexpr,
                    T: tl.constexpr, K: tl.constexpr, SUB_V: tl.constexpr, KC: tl.constexpr,
                    STAGES: tl.constexpr, SNAP: tl.constexpr,
                    FULL: tl.constexpr):  # fmt: skip
    # Items are (sequence, value head, sub-tile of SUB_V rows), walked with a stride of the
    # grid; the loop is software-pipelined so that later items' loads overlap this one.
    # The work per item is the grid floor's (`_floor_kernel`).
    NSUB: tl.constexpr = V // SUB_V
    o_k = tl.arange(0, K)
    for i in tl.range(tl.program_id(0), N_ITEMS, tl.num_programs(0), num_stages=STAGES):
        i_n = i // (HV * NSUB)
        i_hv = (i // NSUB) % HV
        o_sv = (i % NSUB) * SUB_V + tl.arange(0, SUB_V)
        i_slot = tl.load(idx + i_n).to(tl.int64)
        b_S = tl.load(_tile_ptrs(ssm + i_slot * s_ssm_s + i_hv * s_ssm_h, o_sv, K, K, KC))
        p_snap = snap
        if SNAP:
            i_line = tl.load(lines + i_n).to(tl.int64)
            p_snap = snap + i_line * s_snap_l + i_hv * s_snap_h
        for t in tl.static_range(T):
            b_x = tl.load(a + (i_n * T + t) * s_a_n + i_hv * K + o_k).to(tl.float32)
            p_o_t = o + (i_n * T + t) * s_o_n + i_hv * s_o_h
            b_S = _floor_step(b_S, b_x, p_snap + t * s_snap_t, p_o_t, o_sv, K, KC, SNAP, FULL)


@triton.jit
def _store_window_rows(p_win, s_win_t, s_win_j, p_cs, s_cs_j, p_x, s_m_n, c, T: tl.constexpr,
                       W: tl.constexpr):  # fmt: skip
    """The T conv windows of channels c: window t holds inputs t + 1 .. t + W - 1 of the
    sequence [conv state (W - 1 rows), the T new rows]."""
    b_seq = ()
    for j in tl.static_range(W - 1):
        b_seq = b_seq + (tl.load(p_cs + j * s_cs_j + c),)
    for t in tl.static_range(T):
        b_seq = b_seq + (tl.load(p_x + t * s_m_n + c),)
    for t in tl.static_range(T):
        for j in tl.static_range(W - 1):
            tl.store(p_win + t * s_win_t + j * s_win_j + c, b_seq[t + 1 + j])


@triton.jit
def _ring_bytes_kernel(ssm, idx, lines, mixed, conv_pool, a, b, o, win, rawk, rawv, g, beta,
                       s_ssm_s, s_ssm_h, s_m_n, s_cs_l, s_cs_j, s_a_n, s_b_n, s_o_n, s_o_h,
                       s_win_l, s_win_t, s_win_j, s_rk_s, s_rk_h, s_rk_r, s_rv_s, s_rv_h,
                       s_rv_r, s_g_s, s_g_h, s_g_r, s_beta_s, s_beta_h, T: tl.constexpr,
                       W: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BLOCK_V: tl.constexpr, SUB_V: tl.constexpr,
                       KC: tl.constexpr, STAGES: tl.constexpr,
                       SPREAD: tl.constexpr = False):  # fmt: skip
    # The ring floor (`_floor_kernel`, not SNAP) plus the rest of a ring-mode call's
    # traffic. The value rows' raw v and windows go with their tile's program, g and beta
    # with the head's first tile. Raw k and the q/k windows (2 * H * K channels):
    # not SPREAD, owned by the first value head of each q/k head, as in the verify kernels;
    # SPREAD, sliced evenly over all HV * V / BLOCK_V programs of the sequence, so that no
    # program carries more than its share (a floor must not be slowed by its own layout).
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, K)
    i_slot = tl.load(idx + i_n).to(tl.int64)
    i_line = tl.load(lines + i_n).to(tl.int64)
    p_h0 = ssm + i_slot * s_ssm_s + i_hv * s_ssm_h
    p_x = mixed + i_n * T * s_m_n
    p_cs = conv_pool + i_slot * s_cs_l
    p_win = win + i_line * s_win_l
    b_x = ()
    for t in tl.static_range(T):
        b_x = b_x + (tl.load(a + (i_n * T + t) * s_a_n + i_hv * K + o_k).to(tl.float32),)
    if i_v == 0:
        for t in tl.static_range(T):
            p_g = g + i_slot * s_g_s + i_hv * s_g_h + t * s_g_r
            tl.store(p_g + o_k, b_x[t])
            b_beta = tl.load(b + (i_n * T + t) * s_b_n + i_hv).to(tl.float32)
            tl.store(beta + i_slot * s_beta_s + i_hv * s_beta_h + t, b_beta)
    if SPREAD:
        QK: tl.constexpr = 2 * H * K // (HV * (V // BLOCK_V))  # q/k channels per program
        c_qk = (i_hv * (V // BLOCK_V) + i_v) * QK + tl.arange(0, QK)
        is_k = c_qk >= H * K
        c_kk = tl.where(is_k, c_qk - H * K, 0)  # k channel: head c_kk // K, lane c_kk % K
        for t in tl.static_range(T):
            p_rk = rawk + i_slot * s_rk_s + (c_kk // K) * s_rk_h + t * s_rk_r + c_kk % K
            tl.store(p_rk, tl.load(p_x + t * s_m_n + c_qk), mask=is_k)
        _store_window_rows(p_win, s_win_t, s_win_j, p_cs, s_cs_j, p_x, s_m_n, c_qk, T, W)
    if i_v == 0 and not SPREAD:
        if i_hv % (HV // H) == 0:
            c_q = i_h * K + o_k
            c_k = H * K + i_h * K + o_k
            for t in tl.static_range(T):
                p_rk = rawk + i_slot * s_rk_s + i_h * s_rk_h + t * s_rk_r
                tl.store(p_rk + o_k, tl.load(p_x + t * s_m_n + c_k))
            _store_window_rows(p_win, s_win_t, s_win_j, p_cs, s_cs_j, p_x, s_m_n, c_q, T, W)
            _store_window_rows(p_win, s_win_t, s_win_j, p_cs, s_cs_j, p_x, s_m_n, c_k, T, W)
    for i_s in tl.range(0, BLOCK_V // SUB_V, num_stages=STAGES):
        o_sv = i_v * BLOCK_V + i_s * SUB_V + tl.arange(0, SUB_V)
        c_v = 2 * H * K + i_hv * V + o_sv
        b_S = tl.load(_tile_ptrs(p_h0, o_sv, K, K, KC))
        for t in tl.static_range(T):
            p_rv = rawv + i_slot * s_rv_s + i_hv * s_rv_h + t * s_rv_r
            tl.store(p_rv + o_sv, tl.load(p_x + t * s_m_n + c_v))
        _store_window_rows(p_win, s_win_t, s_win_j, p_cs, s_cs_j, p_x, s_m_n, c_v, T, W)
        for t in tl.static_range(T):
            p_o_t = o + (i_n * T + t) * s_o_n + i_hv * s_o_h
            b_S = _floor_step(b_S, b_x[t], p_o_t, p_o_t, o_sv, K, KC, False, False)


@triton.jit
def _empty_kernel(x, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(x + tl.program_id(0), 1.0)


@triton.jit
def _stream_kernel(src, dst, n_read, n_write, BLOCK: tl.constexpr):
    """The `stream` floor: program i reads fp32 elements [i * BLOCK, (i + 1) * BLOCK) of src
    where they are below n_read, and writes the same range of dst, below n_write, with the
    values it read plus one (so that no read can be dropped as dead)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    b_x = tl.load(src + i, mask=i < n_read, other=0.0)
    tl.store(dst + i, b_x + 1.0, mask=i < n_write)


def persist_fn(s, B, snap, sub, warps, stages, kc, per_sm):
    o = s.setdefault("o_floor", torch.empty(B * T, HV, V, device=chk.DEV, dtype=torch.float32))
    n_items = B * HV * (V // sub)
    n_sm = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(n_items, n_sm * per_sm),)

    def fn():
        sn = s["inter_ssm"]
        _persist_kernel[grid](
            s["ssm"], s["cache_indices"], s["inter_indices"], s["a"], o, sn, s["ssm"].stride(0),
            s["ssm"].stride(1), s["a"].stride(0), o.stride(0), o.stride(1), sn.stride(0),
            sn.stride(1), sn.stride(2), n_items, HV=HV, V=V, T=T, K=K, SUB_V=sub, KC=kc,
            STAGES=stages, SNAP=snap > 0, FULL=snap == 2, num_warps=warps,
        )  # fmt: skip

    return fn


def persist_tiles(snap):
    stages_, per_sm_ = ((2, 3), (2, 4)) if snap else ((2, 3, 4), (1, 2, 4))
    for sub, warps, stages, kc, per_sm in itertools.product(
        (16, 32, 64), (2, 4, 8), stages_, (K, 32) if snap else (32,), per_sm_
    ):
        if sub * K * 4 * stages * per_sm > 200 * 1024 or sub * K // (32 * warps) > 64:
            continue
        if sub * K // (32 * warps) < 16:
            continue
        yield sub, warps, stages, kc, per_sm


def launch_probe():
    x = torch.zeros(1024, device=chk.DEV)
    rows = []
    for pdl in (False, True, False, True):
        fn = lambda: _empty_kernel[(1,)](x, PDL=pdl, launch_pdl=pdl)
        us = time_fns([fn] * 100)
        rows.append({"empty kernel, pdl": pdl, "us_per_call": round(us, 3)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def floor_fn(s, B, snap, bv, sub, warps, stages, kc):
    o = s.setdefault("o_floor", torch.empty(B * T, HV, V, device=chk.DEV, dtype=torch.float32))
    sn = s["inter_ssm"]
    grid = (B, HV, V // bv)

    def fn():
        _floor_kernel[grid](
            s["ssm"], s["cache_indices"], s["inter_indices"], s["a"], o, sn,
            s["ssm"].stride(0), s["ssm"].stride(1), s["a"].stride(0), o.stride(0), o.stride(1),
            sn.stride(0), sn.stride(1), sn.stride(2),
            T=T, K=K, BLOCK_V=bv, SUB_V=sub, KC=kc, STAGES=stages, SNAP=snap > 0,
            FULL=snap == 2, num_warps=warps,
        )  # fmt: skip

    return fn


def check_tile(make_fn, B, snap, tile):
    """The floor kernel of `make_fn` computes what it claims (so the timed work is real)."""
    s = chk.make_set(B, HV, 3)
    make_fn(s, B, snap, *tile)()
    chk.sync()
    return check_outputs(s, B, snap)


def check_outputs(s, B, snap):
    """Relative error of a floor kernel's o (and snapshots) against PyTorch (snap: 0 ring,
    1 snapshots, 2 snapshots with the full step, as `_floor_step`)."""
    S = s["ssm"][s["cache_indices"].long()]  # [B, HV, V, K]
    x = s["a"].float().view(B, T, HV, K)
    o = s["o_floor"].float().view(B, T, HV, V)
    err = 0.0
    for t in range(T):
        xt = x[:, t]
        if snap:
            S = S * torch.exp(xt)[:, :, None, :]
            if snap == 2:
                u = 1.0 - torch.einsum("bhvk,bhk->bhv", S, xt)
                S = S + u[..., None] * xt[:, :, None, :]
            want = torch.einsum("bhvk,bhk->bhv", S, xt * xt if snap == 2 else xt)
            got_s = s["inter_ssm"][s["inter_indices"].long(), t]
            err = max(err, chk.rel(got_s, S))
        else:
            want = torch.einsum("bhvk,bhk->bhv", S, xt + xt**2)
        err = max(err, chk.rel(o[:, t], want))
    return err


def time_fns(fns):
    return min(statistics.median(chk.bench(fns, 20) for _ in range(5)) for _ in range(2))


def tiles(part, B):
    if part == "small":
        for bv, warps in itertools.product((2, 4, 8, 16, 32), (1, 2, 4)):
            if bv * K // (32 * warps) >= 4:
                yield bv, bv, warps, 1, K
        return
    for bv, sub, warps, stages, kc in itertools.product(
        (32, 64, 128), (16, 32, 64), (2, 4, 8), (1, 2), (K, 32)
    ):
        if sub > bv or (stages > 1 and sub == bv) or sub * K // (32 * warps) > 128:
            continue
        if sub * K // (32 * warps) < 8:
            continue
        yield bv, sub, warps, stages, kc


# Short tile lists of the `full` part: the best snapshot-floor tiles of v12's grid sweep and
# of the persistent sweep, and the fused kernel's B > 32 tile (64 rows in 32-row sub-tiles,
# 4 warps, key chunks of 64).
FULL_GRID_TILES = (
    (128, 64, 2, 1, K), (64, 64, 8, 1, K), (32, 32, 2, 1, K), (32, 32, 4, 1, K),
    (32, 32, 8, 1, K), (64, 32, 4, 1, 64),
)  # fmt: skip
FULL_PERSIST_TILES = (
    (32, 2, 3, K, 4), (16, 2, 3, K, 4), (32, 4, 3, K, 4), (32, 2, 3, K, 2), (64, 8, 3, K, 2),
)  # fmt: skip


# Tiles of the `ringio` floor: the fused+ring kernel's B > 32 tile (128 rows in 32-row
# sub-tiles, 2 warps, 2 stages, key chunks of 32) and the best ring-floor tiles of the
# earlier sweeps, plain and chunked.
RING_BYTES_TILES = (
    (128, 32, 2, 2, 32), (64, 32, 2, 2, 32), (64, 64, 4, 1, 32), (128, 64, 4, 1, K),
    (128, 32, 2, 1, K), (32, 32, 2, 1, K), (32, 32, 4, 1, K), (64, 32, 4, 2, K),
)  # fmt: skip


def ring_bytes_launch(s, B, hv, bv, sub, warps, stages, kc, spread=False):
    """(grid, args, keywords) of one `ringio` floor launch on input set s (B sequences, hv
    value heads; the other dimensions from the buffers); o goes to s["o_ringio"] in the
    input dtype. spread: the q/k traffic sliced over every program of a sequence (SPREAD)."""
    _, h, _, k = s["rawk"].shape
    t, w1 = s["win_pool"].shape[1:3]
    v = s["rawv"].shape[-1]
    o = s.setdefault("o_ringio", torch.empty(B * t, hv, v, device=s["ssm"].device,
                                             dtype=s["mixed"].dtype))  # fmt: skip
    x, cs, win = s["mixed"], s["conv_pool"], s["win_pool"]
    rk, rv, g, beta = s["rawk"], s["rawv"], s["g"], s["beta"]
    args = (
        s["ssm"], s["cache_indices"], s["inter_indices"], x, cs, s["a"], s["b"], o, win,
        rk, rv, g, beta, s["ssm"].stride(0), s["ssm"].stride(1), x.stride(0), cs.stride(0),
        cs.stride(1), s["a"].stride(0), s["b"].stride(0), o.stride(0), o.stride(1),
        win.stride(0), win.stride(1), win.stride(2), *rk.stride()[:3], *rv.stride()[:3],
        *g.stride()[:3], *beta.stride()[:2],
    )  # fmt: skip
    kwargs = dict(T=t, W=w1 + 1, H=h, HV=hv, K=k, V=v, BLOCK_V=bv, SUB_V=sub, KC=kc,
                  STAGES=stages, SPREAD=spread, num_warps=warps)  # fmt: skip
    if spread and (2 * h * k) % (hv * (v // bv)):
        raise ValueError(f"spread: {2 * h * k} q/k channels do not split over "
                         f"{hv * (v // bv)} programs")  # fmt: skip
    return (B, hv, v // bv), args, kwargs


def ring_bytes_fn(s, B, hv, *tile, spread=False):
    """A zero-argument callable launching the `ringio` floor (ring_bytes_launch)."""
    grid, args, kwargs = ring_bytes_launch(s, B, hv, *tile, spread=spread)
    return lambda: _ring_bytes_kernel[grid](*args, **kwargs)


def check_ring_bytes(s, B, hv):
    """The `ringio` floor's outputs against PyTorch: (relative error of o, whether every
    window and ring entry is bit-exact and nothing else in their pools was written)."""
    slots, lines = s["cache_indices"].long(), s["inter_indices"].long()
    _, h, _, k = s["rawk"].shape
    t, w1, dim = s["win_pool"].shape[1:]
    v = s["rawv"].shape[-1]
    x = s["a"].float().view(B, t, hv, k)
    S = s["ssm"][slots]
    o = s["o_ringio"].float().view(B, t, hv, v)
    err = max(
        chk.rel(o[:, i], torch.einsum("bhvk,bhk->bhv", S, x[:, i] + x[:, i] ** 2)) for i in range(t)
    )
    mixed = s["mixed"].view(B, t, dim)
    seq = torch.cat([s["conv_pool"][slots], mixed], dim=1)
    want = {
        "win_pool": (lines, torch.stack([seq[:, i + 1 : i + w1 + 1] for i in range(t)], 1)),
        "rawv": (slots, mixed[..., 2 * h * k :].reshape(B, t, hv, v).transpose(1, 2)),
        "rawk": (slots, mixed[..., h * k : 2 * h * k].reshape(B, t, h, k).transpose(1, 2)),
        "g": (slots, x.transpose(1, 2)),
        "beta": (slots, s["b"].float().view(B, t, hv).transpose(1, 2)),
    }
    exact = True
    for name, (rows, ref) in want.items():
        buf = s[name]
        got = buf[rows] if name == "win_pool" else buf[rows][:, :, :t]
        exact &= torch.equal(got, ref.to(buf.dtype))
        rest = torch.ones(buf.shape[0], dtype=torch.bool, device=buf.device)
        rest[rows] = False
        exact &= bool(buf[rest].isnan().all())
        if name != "win_pool":
            exact &= bool(buf[rows][:, :, t:].isnan().all())
    return err, exact


def ring_bytes_smoke():
    """The `ringio` floor under Triton's interpreter at a tiny shape (2 value heads on one
    q/k head, poisoned pools, shuffled slots and lines), three tiles; returns whether all
    matched (main exits 1 when not)."""
    B, t, h, hv, k, v = 3, 2, 1, 2, 16, 16
    bad = n = 0
    for spread in (False, True):
        for bv, sub, warps, stages, kc in ((16, 8, 1, 2, 8), (8, 8, 1, 1, 16), (16, 16, 1, 1, 16)):
            s = chk.cases.make_inputs(
                B, t, h, hv, k, v, dtype=torch.float32, device="cpu", seed=5, lines=B + 2,
                poison=True, shuffle=True,
            )  # fmt: skip
            ring_bytes_fn(s, B, hv, bv, sub, warps, stages, kc, spread=spread)()
            err, exact = check_ring_bytes(s, B, hv)
            ok = err < 1e-5 and exact
            bad, n = bad + (not ok), n + 1
            print(json.dumps({"tile": [bv, sub, warps, stages, kc], "spread": spread,
                              "err": err, "exact": exact}))  # fmt: skip
    print(f"ringio smoke: {n - bad} of {n} tiles ok")
    return bad == 0


def ring_bytes_part(batches, heads):
    """Check and time every RING_BYTES_TILES tile at each (B, HV), beside the shipped
    ring modes on the same input sets; returns the rows."""
    rows = []
    for hv in heads:
        for B in batches:
            sets = chk.cold_sets(B, hv, 300)
            shipped = {
                m: time_fns([chk.runner(m, s, B, hv, -5.0) for s in sets])
                for m in (chk.cases.FUSED_RING, chk.cases.UNFUSED_RING)
            }
            print(json.dumps({"HV": hv, "B": B, "shipped_cold_us": shipped}), flush=True)
            rows.append({"HV": hv, "B": B, "shipped": shipped})
            best = None
            for spread, tile in itertools.product((False, True), RING_BYTES_TILES):
                try:
                    probe = chk.make_set(B, hv, 3)
                    ring_bytes_fn(probe, B, hv, *tile, spread=spread)()
                    chk.sync()
                    err, exact = check_ring_bytes(probe, B, hv)
                    us = time_fns([ring_bytes_fn(s, B, hv, *tile, spread=spread) for s in sets])
                except Exception as e:  # a tile that does not compile or fit
                    print(f"HV={hv} B={B} tile={tile} spread={spread} failed: "
                          f"{type(e).__name__}", flush=True)  # fmt: skip
                    continue
                row = {"HV": hv, "B": B, "tile": tile, "spread": spread, "us": round(us, 3),
                       "err": err, "exact": exact}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
                if err < 1e-2 and exact and (best is None or us < best["us"]):
                    best = row
            print(json.dumps({"best": best}), flush=True)
            if best:
                for m, us in shipped.items():
                    print(f"HV={hv} B={B} {m}: {us:.2f} us cold = {us / best['us']:.3f} x the "
                          f"ringio floor ({best['us']:.2f} us, tile {best['tile']}, spread "
                          f"{best['spread']})")  # fmt: skip
            del sets
    return rows


def mode_bytes(s, B, hv, ring):
    """(bytes read, bytes written) by one verify call of B sequences on set s in the ring or
    the snapshot mode: the state rows of its slots, the T new input rows, the conv state
    lines, a and b read; o, the T conv windows and the ring entries (raw k, raw v, g, beta)
    or the T snapshots written. The per-channel parameters (conv weight and bias, A_log,
    dt_bias; a few KiB, shared by every call) and the B int32 indices are left out."""
    t, w1, dim = s["win_pool"].shape[1:]
    e = s["mixed"].element_size()
    _, h, _, k = s["rawk"].shape
    v = s["ssm"].shape[2]
    read = B * hv * v * k * 4 + B * t * dim * e + B * w1 * dim * e + B * t * hv * (k + 1) * e
    write = B * t * hv * v * e + B * t * w1 * dim * e
    if ring:
        write += B * t * (h * k * e + hv * v * e + hv * k * 4 + hv * 4)
    else:
        write += B * t * hv * v * k * 4
    return read, write


STREAM_TILES = tuple(itertools.product((1024, 2048, 4096, 8192), (4, 8)))  # (BLOCK, warps)


def stream_buffers(s, read, write):
    """The `stream` floor's fp32 source (read bytes, filled) and destination (write bytes)
    on set s's device, kept in s."""
    n_read, n_write = -(-read // 4), -(-write // 4)
    key = ("stream", n_read, n_write)  # one pair per byte count (each mode its own)
    if key not in s:
        dev = s["ssm"].device
        src = torch.arange(n_read, device=dev, dtype=torch.float32) % 251
        s[key] = (src, torch.full((n_write,), float("nan"), device=dev))
    return s[key]


def stream_fn(s, read, write, block, warps):
    """A zero-argument callable launching the `stream` floor on set s."""
    src, dst = stream_buffers(s, read, write)
    n_read, n_write = src.numel(), dst.numel()
    grid = (-(-max(n_read, n_write) // block),)
    return lambda: _stream_kernel[grid](src, dst, n_read, n_write, BLOCK=block, num_warps=warps)


def check_stream(s, read, write, block, warps):
    """Whether the `stream` floor's buffers hold `read` and `write` bytes (to the fp32 word)
    and it wrote src + 1 over the whole destination."""
    stream_fn(s, read, write, block, warps)()
    src, dst = stream_buffers(s, read, write)
    n = min(src.numel(), dst.numel())
    ok = src.numel() == -(-read // 4) and dst.numel() == -(-write // 4)
    ok = ok and torch.equal(dst[:n], src[:n] + 1) and bool((dst[n:] == 1).all())
    dst.fill_(float("nan"))
    return ok


def written_bytes(s, B, hv, ring):
    """Bytes the fused call in the ring or snapshot mode wrote on set s (NaN-poisoned
    outputs, fp32 inputs, interpreter): o's, and the elements of its poisoned buffers that
    are no longer NaN."""
    t, h, k, v = s["mixed"].shape[0] // B, s["rawk"].shape[1], s["rawk"].shape[3], s["ssm"].shape[2]
    mode = chk.cases.FUSED_RING if ring else chk.cases.FUSED
    o = chk.cases.make_call(chk.kda, mode, s, B, t, h, hv, k, v, -5.0, scale=k**-0.5)()
    names = ("win_pool", *chk.cases.RING_NAMES) if ring else ("win_pool", "inter_ssm")
    return o.numel() * o.element_size() + sum(
        int((~s[n].isnan()).sum()) * s[n].element_size() for n in names
    )


def stream_smoke():
    """Under Triton's interpreter: the `stream` floor writes src + 1 over its destination
    for reads longer and shorter than its writes, on buffers of each count's own size in
    one set, and `mode_bytes` counts exactly the bytes the fused kernel writes in each mode
    (fp32, tiny shape, poisoned outputs). Returns whether all held."""
    ok = True
    s = {"ssm": torch.zeros(1)}  # one set for both byte counts, as for the two modes
    for read, write in ((4 * 5000, 4 * 1200), (4 * 700, 4 * 3000)):
        for block, warps in ((1024, 4), (2048, 8)):
            good = check_stream(s, read, write, block, warps)
            print(json.dumps({"read": read, "write": write, "block": block, "ok": good}))
            ok &= good
    B, t, h, hv, k, v = 3, 2, 1, 2, 16, 16
    for ring in (True, False):
        s = chk.cases.make_inputs(
            B, t, h, hv, k, v, dtype=torch.float32, device="cpu", seed=9, lines=B + 2,
            poison=True, shuffle=True,
        )  # fmt: skip
        counted, wrote = mode_bytes(s, B, hv, ring)[1], written_bytes(s, B, hv, ring)
        print(json.dumps({"ring": ring, "mode_bytes_write": counted, "kernel_wrote": wrote}))
        ok &= counted == wrote
    print(f"stream smoke: {'ok' if ok else 'FAILED'}")
    return ok


def stream_part(batches, heads, rounds):
    """Per (HV, B) and mode (ring, snapshots): the mode's bytes (`mode_bytes`) streamed by
    `_stream_kernel` at each STREAM_TILES tile (checked first), beside the shipped fused and
    unfused calls of that mode on the same cold sets, safe gate; then `rounds` interleaved
    rounds of the shipped calls and the best tile. Returns the rows."""
    rows = []
    lb = chk.GATES["safe"]
    for hv in heads:
        for B in batches:
            sets = chk.cold_sets(B, hv, 300)
            for ring in (True, False):
                read, write = mode_bytes(sets[0], B, hv, ring)
                modes = (
                    (chk.cases.FUSED_RING, chk.cases.UNFUSED_RING) if ring
                    else (chk.cases.FUSED, chk.cases.UNFUSED)
                )  # fmt: skip
                tiles_us = {}
                for block, warps in STREAM_TILES:
                    if not check_stream(sets[0], read, write, block, warps):
                        print(f"HV={hv} B={B} stream tile {block}/{warps}: wrong output")
                        continue
                    tiles_us[(block, warps)] = time_fns(
                        [stream_fn(x, read, write, block, warps) for x in sets]
                    )
                best = min(tiles_us, key=tiles_us.get)
                got = {m: [] for m in (*modes, "stream")}
                for _r in range(rounds):
                    for m in modes:
                        got[m].append(time_fns([chk.runner(m, x, B, hv, lb) for x in sets]))
                    got["stream"].append(time_fns([stream_fn(x, read, write, *best) for x in sets]))
                med = {m: statistics.median(v) for m, v in got.items()}
                row = {
                    "HV": hv, "B": B, "ring": ring, "read_bytes": read, "write_bytes": write,
                    "tiles_us": {f"{b}/{w}": round(u, 3) for (b, w), u in tiles_us.items()},
                    "best_tile": list(best), "rounds_us": got, "median_us": med,
                    "GB_per_s": round((read + write) / med["stream"] / 1e3, 1),
                }  # fmt: skip
                rows.append(row)
                print(
                    f"HV={hv} B={B} {'ring' if ring else 'snapshots'}: read {read / 2**20:.2f} "
                    f"MiB, write {write / 2**20:.2f} MiB; stream floor {med['stream']:.2f} us "
                    f"(tile {best[0]}/{best[1]}, {row['GB_per_s']} GB/s); "
                    + ", ".join(
                        f"{m} {med[m]:.2f} us = {med[m] / med['stream']:.3f}x" for m in modes
                    ),
                    flush=True,
                )
            del sets
    return rows


def probe_errors(s, B, hv, ring, project):
    """Relative errors of a floor-probe call's o and saves on set s against its definition
    (g = a, beta = b, q, k and v the raw inputs; the delta step per step, or o_t = S0 q_t
    in the projected form; the ring holds the raw inputs)."""
    x = s["mixed"].float().view(B, T, -1)
    rep_h = lambda z: z.view(B, T, H, K).repeat_interleave(hv // H, dim=2)  # noqa: E731
    q, k = rep_h(x[..., : H * K]), rep_h(x[..., H * K : 2 * H * K])
    v = x[..., 2 * H * K :].view(B, T, hv, V)
    a, beta = s["a"].float().view(B, T, hv, K), s["b"].float().view(B, T, hv)
    S0 = S = s["ssm"][s["cache_indices"].long()]
    o = s["o_probe"].float().view(B, T, hv, V)
    errs = {}
    for t in range(T):
        S = S * a[:, t].exp()[:, :, None, :]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhvk,bhk->bhv", S, k[:, t]))
        S = S + u[..., None] * k[:, t, :, None, :]
        want = torch.einsum("bhvk,bhk->bhv", S0 if project else S, q[:, t])
        errs["o"] = max(errs.get("o", 0.0), chk.rel(o[:, t], want))
        if not ring:
            got = s["inter_ssm"][s["inter_indices"].long(), t]
            errs["snapshots"] = max(errs.get("snapshots", 0.0), chk.rel(got, S))
    if ring:
        slots = s["cache_indices"].long()
        errs["ring"] = max(
            chk.rel(s["rawv"][slots, :, :T], v.transpose(1, 2)),
            chk.rel(s["g"][slots, :, :T], a.transpose(1, 2)),
        )
    return errs


def forced_tile(tile):
    """The default tuning with the fused kernel's tile forced, written as
    `gpu_kda_snapshot_tiles` takes it (BLOCK_V/SUB_V/warps/stages/key chunk or "plain")."""
    return snap_tiles.forced(*snap_tiles.parse_tile(tile))


def with_probe(tn):
    return dataclasses.replace(tn, verify=dataclasses.replace(tn.verify, floor_probe=True))


def schedule_part(batches, heads, rounds, tiles=(), gate="safe"):
    """The shipped fused kernel beside its floor probe and the unfused pair, per (HV, B);
    with `tiles`, the snapshot mode alone at each forced tile, kernel and probe; returns
    the rows (see the module's docstring, `schedule`). gate: `gpu_check_kda.GATES`'s name."""
    rows = []
    lb = chk.GATES[gate]
    for hv in heads:
        for B in batches:
            tn = chk.BASE
            project = kt.project_flag(tn.verify, True, False, kt.table_batch(tn.verify, B, hv))
            checks = [(chk.cases.FUSED, "table", tn)]
            if tiles:
                checks += [(chk.cases.FUSED, t, forced_tile(t)) for t in tiles]
            else:
                checks.append((chk.cases.FUSED_RING, "table", tn))
            errs = {}
            for mode, tile, tuning in checks:
                s = chk.make_set(B, hv, 5)
                s["o_probe"] = chk.runner(mode, s, B, hv, lb, with_probe(tuning))()
                chk.sync()
                ring = mode == chk.cases.FUSED_RING
                errs[f"{mode} {tile}"] = probe_errors(s, B, hv, ring, project and ring)
            print(json.dumps({"HV": hv, "B": B, "probe_errors": errs}), flush=True)
            sets = chk.cold_sets(B, hv, 300)
            entries = {
                "fused": (chk.cases.FUSED, None),
                "fused probe": (chk.cases.FUSED, with_probe(tn)),
            }
            if tiles:
                for t in tiles:
                    entries[f"fused {t}"] = (chk.cases.FUSED, forced_tile(t))
                    entries[f"fused {t} probe"] = (chk.cases.FUSED, with_probe(forced_tile(t)))
                entries["unfused"] = (chk.cases.UNFUSED, None)
            else:
                entries.update({
                    "fused+ring": (chk.cases.FUSED_RING, None),
                    "fused+ring probe": (chk.cases.FUSED_RING, with_probe(tn)),
                    "unfused": (chk.cases.UNFUSED, None),
                    "unfused+ring": (chk.cases.UNFUSED_RING, None),
                })  # fmt: skip
            got = {n: {"seed": [], "cold": []} for n in entries}
            for _r in range(rounds):
                for name, (mode, tuning) in entries.items():
                    seed, cold = chk.time_mode(mode, sets, B, hv, lb, 40, tuning)
                    got[name]["seed"].append(round(seed, 3))
                    got[name]["cold"].append(round(cold, 3))
            med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in got.items()}
            row = {"HV": hv, "B": B, "gate": gate, "rounds": got, "median": med,
                   "probe_errors": errs}  # fmt: skip
            kernels = [n for n in entries if f"{n} probe" in entries]
            for mode in kernels:
                for k in ("seed", "cold"):
                    row[f"{mode} / probe {k}"] = round(med[mode][k] / med[f"{mode} probe"][k], 4)
            rows.append(row)
            print(
                f"{gate} HV={hv} B={B} cold (seed-style) us: "
                + ", ".join(f"{n} {m['cold']:.2f} ({m['seed']:.2f})" for n, m in med.items())
                + "; "
                + "; ".join(
                    f"{m} / probe {row[f'{m} / probe cold']:.3f} cold, "
                    f"{row[f'{m} / probe seed']:.3f} seed"
                    for m in kernels
                ),
                flush=True,
            )
            del sets
    return rows


def unfused_parts(s, B):
    """The unfused pair's two kernels, each alone (conv; recurrent on the raw inputs)."""
    dim = 2 * H * K + HV * V
    conv_state = s["conv_pool"].transpose(-1, -2)
    window = s["win_pool"].transpose(-1, -2)
    x3 = s["mixed"].reshape(B, T, dim).transpose(1, 2)
    q, k, v = s["mixed"].split([H * K, H * K, HV * V], dim=-1)
    ring = {f"replayssm_{n}": s[n] for n in ("rawv", "rawk", "g", "beta")}
    conv = lambda: causal_conv1d_update(
        x3, conv_state, s["w"], s["bias"], activation="silu",
        conv_state_indices=s["cache_indices"], intermediate_conv_window=window,
        intermediate_state_indices=s["inter_indices"],
    )  # fmt: skip

    def rec(ring_mode):
        return lambda: fused_sigmoid_gating_delta_rule_update(
            A_log=s["A_log"], a=s["a"], dt_bias=s["dt_bias"], softplus_beta=1.0,
            softplus_threshold=20.0, q=q.unflatten(-1, (H, K)).unsqueeze(0),
            k=k.unflatten(-1, (H, K)).unsqueeze(0), v=v.unflatten(-1, (HV, V)).unsqueeze(0),
            b=s["b"], initial_state_source=s["ssm"], initial_state_indices=s["cache_indices"],
            use_qk_l2norm_in_kernel=True, cu_seqlens=s["cu"], is_kda=True,
            disable_state_update=True,
            intermediate_states_buffer=None if ring_mode else s["inter_ssm"],
            intermediate_state_indices=None if ring_mode else s["inter_indices"], cache_steps=T,
            retrieve_parent_token=None, lower_bound=-5.0, cache_ring=ring_mode,
            **(ring if ring_mode else {n: None for n in ring}),
        )  # fmt: skip

    return {"conv alone": conv, "recurrent+ring alone": rec(True), "recurrent alone": rec(False)}


def sweep(B, snap, key, tile_iter, make_fn, sets):
    """Check and time each tile of one floor kernel; print a line per tile and the best."""
    rows, best = [], None
    for tile in tile_iter:
        try:
            err = check_tile(make_fn, B, snap, tile)
            us = time_fns([make_fn(s, B, snap, *tile) for s in sets])
        except Exception as e:  # a tile that does not compile or fit
            print(f"B={B} snap={snap} {key}={tile} failed: {type(e).__name__}", flush=True)
            continue
        row = {"B": B, "snap": snap, key: tile, "us": round(us, 3), "err": err}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if err < 1e-4 and (best is None or us < best["us"]):
            best = row
    print(json.dumps({"best": best}), flush=True)
    return rows


def compile_sm90():
    """Compile every floor kernel for an H200 on the CPU (the tool's kernels cannot rot
    unseen between GPU sessions); returns {kernel: registers}."""
    from tools.dev.compile_kda_sm90 import _Sm90Driver, resources

    triton.runtime.driver.set_active(_Sm90Driver())
    f32, bf16 = dict(dtype=torch.float32), dict(dtype=torch.bfloat16)
    ssm, idx = torch.empty(3, HV, V, K, **f32), torch.zeros(2, dtype=torch.int32)
    a, o = torch.empty(2 * T, HV * K, **bf16), torch.empty(2 * T, HV, V, **f32)
    snap = torch.empty(3, T, HV, V, K, **f32)
    st = (1, 1, 1, 1, 1, 1, 1, 1, 1)
    out = {}
    for tag, sn in (("ring", 0), ("snap", 1), ("full", 2)):
        c = _floor_kernel.warmup(
            ssm, idx, idx, a, o, snap, *st[:8], T=T, K=K, BLOCK_V=128, SUB_V=32, KC=32,
            STAGES=2, SNAP=sn > 0, FULL=sn == 2, num_warps=2, grid=(2, HV, 1),
        )  # fmt: skip
        out[f"floor {tag}"] = resources(c)["REG"]
        c = _persist_kernel.warmup(
            ssm, idx, idx, a, o, snap, *st, HV=HV, V=V, T=T, K=K, SUB_V=32, KC=32, STAGES=3,
            SNAP=sn > 0, FULL=sn == 2, num_warps=2, grid=(4,),
        )  # fmt: skip
        out[f"persist {tag}"] = resources(c)["REG"]
    s = chk.cases.make_inputs(2, T, H, HV, K, V, dtype=torch.bfloat16, device="cpu", seed=0)
    grid, args, kwargs = ring_bytes_launch(s, 2, HV, 128, 32, 2, 2, 32)
    out["ringio"] = resources(_ring_bytes_kernel.warmup(*args, **kwargs, grid=grid))["REG"]
    grid, args, kwargs = ring_bytes_launch(s, 2, HV, 64, 32, 2, 2, 32, spread=True)
    out["ringio spread"] = resources(_ring_bytes_kernel.warmup(*args, **kwargs, grid=grid))["REG"]
    for pdl in (False, True):
        c = _empty_kernel.warmup(o, PDL=pdl, launch_pdl=pdl, grid=(1,))
        out[f"empty pdl={pdl}"] = resources(c)["REG"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--part",
        choices=(
            "ring",
            "snap",
            "small",
            "persist",
            "full",
            "launch",
            "ringio",
            "schedule",
            "stream",
            "compile",
        ),
        required=True,
    )
    ap.add_argument("--batch", type=int, nargs="+", default=None)
    ap.add_argument("--hv", type=int, nargs="+", default=[8, 16], help="ringio: value heads")
    ap.add_argument("--rounds", type=int, default=3, help="schedule: interleaved rounds")
    ap.add_argument(
        "--tiles",
        nargs="*",
        default=(),
        help="schedule: fused tiles, BLOCK_V/SUB_V/warps/stages/KC or plain",
    )
    ap.add_argument("--gate", default="safe", choices=list(chk.GATES), help="schedule: the gate")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu-smoke", action="store_true", help="ringio, stream: interpreter check")
    args = ap.parse_args()
    if args.part == "compile":
        print(json.dumps(compile_sm90()))
        return
    if args.part == "schedule":
        rows = schedule_part(args.batch or (64,), args.hv, args.rounds, args.tiles, args.gate)
        if args.out:
            name = f"kda_floor_schedule_{args.gate}.json"
            with open(os.path.join(args.out, name), "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.part == "stream":
        if args.cpu_smoke:
            raise SystemExit(0 if stream_smoke() else 1)
        rows = stream_part(args.batch or (64,), args.hv, args.rounds)
        if args.out:
            with open(os.path.join(args.out, "kda_floor_stream.json"), "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.part == "ringio":
        if args.cpu_smoke:
            raise SystemExit(0 if ring_bytes_smoke() else 1)
        rows = ring_bytes_part(args.batch or (64,), args.hv)
        if args.out:
            with open(os.path.join(args.out, "kda_floor_ringio.json"), "w") as f:
                json.dump(rows, f, indent=1)
        return
    batches = args.batch or ((1, 16) if args.part == "small" else (16, 64))
    snaps = (False, True) if args.part == "small" else (args.part == "snap",)
    if args.part in ("persist", "full"):
        snaps = ()  # their own sweeps below
    rows = []
    if args.part == "launch":
        rows = launch_probe()
        batches = ()
    for B in batches:
        sets = chk.cold_sets(B, HV, 200)
        shipped = {m: time_fns([chk.runner(m, s, B, HV, -5.0) for s in sets]) for m in chk.MODES}
        print(json.dumps({"B": B, "shipped_cold_us": shipped}), flush=True)
        rows.append({"B": B, "shipped": shipped})
        if args.part == "small":
            parts = [unfused_parts(s, B) for s in sets]
            alone = {n: time_fns([p[n] for p in parts]) for n in parts[0]}
            print(json.dumps({"B": B, "alone_cold_us": alone}), flush=True)
            rows.append({"B": B, "alone": alone})
        for snap in (False, True) if args.part == "persist" else ():
            rows += sweep(B, snap, "persist", persist_tiles(snap), persist_fn, sets)
        for snap in snaps:
            rows += sweep(B, snap, "tile", tiles(args.part, B), floor_fn, sets)
        for snap in (1, 2) if args.part == "full" else ():
            rows += sweep(B, snap, "tile", FULL_GRID_TILES, floor_fn, sets)
            rows += sweep(B, snap, "persist", FULL_PERSIST_TILES, persist_fn, sets)
        del sets
    if args.out:
        with open(os.path.join(args.out, f"kda_floor_{args.part}.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
