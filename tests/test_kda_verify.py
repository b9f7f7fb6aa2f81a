"""KDA chain verify: the four modes against the reference, ring bytes, replay, tiles, decode.

Every call goes through `make_runner`, which calls the kernels with the same keywords and
tensor views as the benchmark (transposed conv pools, [1, B*T, H, K] q/k/v views). Output
buffers are NaN-poisoned first, so that missing writes and writes to rows or ring positions
that must stay untouched both show.
"""

from dataclasses import replace

import pytest
import torch

import kernels.kda as kda
import kernels.kda.fused_verify as fused_mod
import kernels.kda.recurrent as rec_mod
import kernels.kda.tuning as kt
from benchmarks import kda_cases as cases

# conv_args, fused_kwargs and recurrent_kwargs: the other KDA tests take them from here too.
from benchmarks.kda_cases import MODES, conv_args, fused_kwargs, recurrent_kwargs  # noqa: F401
from kernels.kda import causal_conv1d_update, fused_sigmoid_gating_delta_rule_update
from kernels.kda import reference as ref_mod

W, RING = cases.CONV_W, cases.RING_LEN
NAN = float("nan")


def tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 5e-3}.get(dtype, 1e-2)


def rel_err(got, ref):
    got, ref = got.float(), ref.float()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def same_bits(x, y):
    """Bitwise equality, NaN poison included."""
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    it = ints[x.element_size()]
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(it), y.view(it))


def make_inputs(B, T, H, HV, K, V, dtype, device, seed=0, pad=None, ring_len=RING):
    """kda_cases.make_inputs for the tests: every output buffer (snapshots and ring)
    NaN-poisoned, shuffled slot and line maps (two of them) over B + 2 rows, the
    generator on the CPU (the same values on every device), optional padding."""
    return cases.make_inputs(
        B, T, H, HV, K, V, dtype=dtype, device=device, seed=seed, lines=B + 2,
        ring_len=ring_len, poison=True, shuffle=True, pad=pad, generator_device="cpu",
    )  # fmt: skip


def validate_call_indices(inp):
    """The range and duplicate check of every index the calls of `make_runner` take."""
    cases.validate_call_indices(kda, inp)


def make_runner(mode, inp, B, T, H, HV, K, V, lower_bound=None, tuning=None):
    """The benchmark's call pattern for one mode (kda_cases.make_call; no index check, so
    tests can pass indices outside the pools); `tuning`: a KdaTuning or None."""
    return cases.make_call(
        kda, mode, inp, B, T, H, HV, K, V, lower_bound, validate=False, tuning=tuning
    )


def reference(inp, T, H, HV, K, V, lower_bound=None):
    return cases.reference_verify(ref_mod, inp, T, H, HV, K, V, lower_bound)


def _unused_rows_poisoned(buf, rows):
    keep = torch.ones(buf.shape[0], dtype=torch.bool)
    keep[rows] = False
    return bool(buf[keep.to(buf.device)].isnan().all())


def _valid(ref):
    return [n for n in range(len(ref["pad"])) if not ref["pad"][n]]


def check_o(o, ref, T, dtype):
    """o against the reference; zeros for padded sequences."""
    o = o.reshape(ref["o"].shape)
    assert rel_err(o, ref["o"]) < tol(dtype), "o"
    assert bool((o.reshape(-1, T, *o.shape[1:])[ref["pad"]] == 0).all()), "padded o rows"


def check_windows(inp, ref):
    """The conv windows of the sequences the reference does not pad, bitwise (raw-input
    copies); every other line of the pool still poisoned."""
    valid = _valid(ref)
    lines = [int(inp["inter_indices"][n]) for n in valid]
    win = inp["win_pool"].transpose(-1, -2)
    for n, line in zip(valid, lines, strict=True):
        assert same_bits(win[line], ref["windows"][n]), f"window of sequence {n}"
    assert _unused_rows_poisoned(win, lines), "windows of unused lines"


def check_verify(mode, inp, before, o, ref, T, dtype):
    """Everything one verify call must (and must not) have written."""
    check_o(o, ref, T, dtype)
    # Read-only state, bitwise.
    assert same_bits(inp["ssm"], before["ssm"]) and same_bits(inp["conv_pool"], before["conv_pool"])
    check_windows(inp, ref)
    check_saves(mode, inp, ref, T, dtype)


def check_saves(mode, inp, ref, T, dtype):
    """The snapshots or ring entries of the sequences the reference does not pad, the
    other buffer and every unused line or ring position still poisoned."""
    valid = _valid(ref)
    slots = [int(inp["cache_indices"][n]) for n in valid]
    lines = [int(inp["inter_indices"][n]) for n in valid]
    ring_names = ("rawk", "rawv", "g", "beta")
    if mode.endswith("+ring"):
        assert bool(inp["inter_ssm"].isnan().all()), "snapshots written in ring mode"
        for name in ring_names:
            buf = inp[name]
            for n, slot in zip(valid, slots, strict=True):
                assert rel_err(buf[slot][:, :T], ref[name][n]) < tol(dtype), f"ring {name} seq {n}"
                assert bool(buf[slot][:, T:].isnan().all()), f"ring {name}: positions >= T"
            assert _unused_rows_poisoned(buf, slots), f"ring {name}: unused slots"
    else:
        assert all(bool(inp[n].isnan().all()) for n in ring_names), "ring written in snapshot mode"
        for n, line in zip(valid, lines, strict=True):
            got = inp["inter_ssm"][line]
            assert rel_err(got, ref["states"][n]) < tol(dtype), f"snapshots of sequence {n}"
        assert _unused_rows_poisoned(inp["inter_ssm"], lines), "snapshots of unused lines"


def run_and_check(
    mode, B, T, H, HV, K, V, dtype, device, lower_bound=None, pad=None, seed=0, tuning=None
):
    inp = make_inputs(B, T, H, HV, K, V, dtype, device, seed=seed, pad=pad)
    validate_call_indices(inp)
    before = {n: inp[n].clone() for n in ("ssm", "conv_pool")}
    ref = reference(inp, T, H, HV, K, V, lower_bound)
    o = make_runner(mode, inp, B, T, H, HV, K, V, lower_bound, tuning)()
    assert o.dtype == dtype
    assert o.shape == ((B * T, HV, V) if mode.startswith("fused") else (1, B * T, HV, V))
    check_verify(mode, inp, before, o, ref, T, dtype)
    return inp, o


def test_cases_modes_and_buffers():
    """The builder's modes are the asv parameter strings, a free string is refused, and a
    mode's buffers hold only the saves it writes, from the same seeded draws."""
    assert cases.MODES == ("unfused", "unfused+ring", "fused", "fused+ring")
    for bad in ("fused-ring", "Fused", None):
        with pytest.raises(ValueError, match="mode"):
            cases.is_ring(bad)
    dims = (2, 3, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="mode"):
        cases.make_inputs(*dims, dtype=torch.float32, device="cpu", seed=1, mode="ring")
    snap, ring = (
        cases.make_inputs(*dims, dtype=torch.float32, device="cpu", seed=1, mode=m)
        for m in (cases.FUSED, cases.UNFUSED_RING)
    )
    assert "inter_ssm" in snap and not set(cases.RING_NAMES) & set(snap)
    assert "inter_ssm" not in ring and set(cases.RING_NAMES) <= set(ring)
    for n in ("mixed", "w", "a", "b", "A_log", "dt_bias", "conv_pool", "ssm"):
        assert same_bits(snap[n], ring[n]), n
    assert snap["ssm"].shape[0] == 3 and not snap["win_pool"].any()
    assert torch.equal(snap["cache_indices"], torch.arange(2, dtype=torch.int32))
    padded = cases.make_inputs(*dims, dtype=torch.float32, device="cpu", seed=1, pad=0)
    assert padded["cache_indices"].tolist() == [-1, 1]
    assert padded["inter_indices"].tolist() == [0, 1]
    test = make_inputs(*dims, torch.float32, "cpu", seed=1, pad=1)
    assert test["cache_indices"][1] == -1 and test["inter_ssm"].isnan().all()
    assert len(set(test["inter_indices"].tolist())) == 2


@pytest.fixture
def one_tile():
    """A tuning with one V tile per value head in the fused kernel (fewest programs under
    the interpreter)."""
    return kt.KdaTuning(verify=replace(kt.DEFAULT.verify, block_v=32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "B,T,H,HV,lower_bound,pad",
    [(3, 3, 2, 2, None, 1), (2, 4, 1, 2, -5.0, None)],
    ids=["HV=H-std-pad", "HV=2H-safe"],
)
def test_modes_vs_reference(mode, B, T, H, HV, lower_bound, pad, cpu_dtype, device, one_tile):
    run_and_check(mode, B, T, H, HV, 16, 16, cpu_dtype, device, lower_bound, pad, tuning=one_tile)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,HV", [(3, 8), (5, 8), (9, 8), (17, 8), (3, 16)])
def test_batches_off_the_grid_vs_reference(mode, B, HV, device):
    """Batches between the tables' rows (B = 3, 5; 9 and 17, just past the switch points of
    the ring modes' stack_sums) and, at twice the heads, where the fused kernel reads its
    tables at twice the batch (B = 3 at HV = 16 reads row 6): every mode against the
    reference with the default tuning, a padded sequence, fp32. (V = 16 clips the wide tiles
    here; the bf16 GPU test runs B = 3, 5, 9, 17, 33 and 48 at the seed's shape.)"""
    run_and_check(mode, B, 2, 1, HV, 16, 16, torch.float32, device, -5.0, pad=B // 2)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_ring_bytes_fused_equal_unfused(lower_bound, cpu_dtype, device):
    """fused+ring and unfused+ring fill the whole ring with identical bytes."""
    B, T, H, HV, K, V = 3, 2, 2, 4, 16, 16
    runs = {}
    for mode in ("unfused+ring", "fused+ring"):
        inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=7, pad=2)
        make_runner(mode, inp, B, T, H, HV, K, V, lower_bound)()
        runs[mode] = inp
    for name in ("rawv", "rawk", "g", "beta", "win_pool"):
        assert same_bits(runs["unfused+ring"][name], runs["fused+ring"][name]), name


def test_replay_matches_snapshots(cpu_dtype, device, one_tile):
    """Replaying the ring for every accepted length gives the snapshot of that step."""
    B, T, H, HV, K, V = 2, 4, 1, 2, 16, 16
    kw = dict(seed=3, tuning=one_tile)
    snap, _ = run_and_check("fused", B, T, H, HV, K, V, cpu_dtype, device, -5.0, **kw)
    ring, _ = run_and_check("fused+ring", B, T, H, HV, K, V, cpu_dtype, device, -5.0, **kw)
    ref = reference(ring, T, H, HV, K, V, -5.0)
    ci, lines = ring["cache_indices"], ring["inter_indices"].long()
    bufs = [ring[n] for n in ("rawk", "rawv", "g", "beta")]
    for acc in range(1, T + 1):
        before = [t.clone() for t in bufs + [ring["ssm"]]]
        new = ref_mod.replay(ring["ssm"], ci, *bufs, acc)
        assert all(same_bits(x, y) for x, y in zip(before, bufs + [ring["ssm"]], strict=True)), (
            "replay wrote"
        )
        assert rel_err(new, snap["inter_ssm"][lines, acc - 1]) < 1e-5
        # The reference replays its own ring in the same order: bit-equal to its snapshots.
        ref_ring = [
            ref[n].new_full((B + 2, *ref[n].shape[1:]), NAN) for n in ("rawk", "rawv", "g", "beta")
        ]
        for r, n in zip(ref_ring, ("rawk", "rawv", "g", "beta"), strict=True):
            r[ci.long()] = ref[n]
        assert torch.equal(
            ref_mod.replay(ring["ssm"], ci, *ref_ring, acc), ref["states"][:, acc - 1]
        )
    # Per-sequence accepted lengths.
    acc = torch.tensor([1, T], device=device)
    new = ref_mod.replay(ring["ssm"], ci, *bufs, acc, T=T)
    assert rel_err(new[0], snap["inter_ssm"][lines[0], 0]) < 1e-5
    assert rel_err(new[1], snap["inter_ssm"][lines[1], T - 1]) < 1e-5


def tuned(**fields):
    """A KdaTuning with `fields` replaced in both recurrence kernels' parts."""
    return kt.KdaTuning(
        verify=replace(kt.DEFAULT.verify, **fields),
        recurrent=replace(kt.DEFAULT.recurrent, **fields),
    )


def tile(bv, sub, nw, st, **fields):
    """A KdaTuning forcing one tile (BLOCK_V, SUB_V, warps, stages; None = the table's)."""
    return tuned(block_v=bv, sub_v=sub, num_warps=nw, stages=st, **fields)


@pytest.mark.parametrize("mode", MODES)
def test_block_v_choices_agree(mode, device):
    """Every tile (BLOCK_V, SUB_V, warps, stages) of the mode's recurrence kernel gives the
    same results: the ring and windows bitwise, o and snapshots to fp32 rounding. Two value
    heads share one q/k head, so the ownership of the shared ring entries is exercised with
    several V tiles and several sub-tiles per tile."""
    B, T, H, HV, K, V = 1, 2, 1, 2, 16, 16
    results = []
    tiles = (
        (None, None, None, None),
        (2, None, 1, None),
        (4, None, 2, None),
        (8, None, None, None),
        (16, None, 4, None),
        (32, None, None, None),
        (8, 2, 1, 2),
        (16, 4, None, 3),
        (16, 8, 2, 1),
        (8, 2, 1, None),  # four sub-tiles
    )
    for bv, sub, nw, st in tiles:
        tn = tile(bv, sub, nw, st)
        inp, o = run_and_check(mode, B, T, H, HV, K, V, torch.float32, device, seed=5, tuning=tn)
        results.append((o, inp))
    o0, inp0 = results[0]
    for o, inp in results[1:]:
        assert rel_err(o, o0) < 1e-6
        assert rel_err(inp["inter_ssm"].nan_to_num(), inp0["inter_ssm"].nan_to_num()) < 1e-6
        for name in ("rawk", "rawv", "g", "beta", "win_pool"):
            assert same_bits(inp[name], inp0[name]), name


def test_tile_table_and_knobs():
    """The default tile and key chunk width come from the table rows of the mode and batch;
    forced values win."""
    parts = (kt.DEFAULT.verify, kt.DEFAULT.recurrent)
    for tn in parts:
        for ring in (False, True):
            for max_b, kc in tn.tables(ring).key_chunks:
                B = 1000 if max_b is None else max_b
                assert kt.key_chunk(tn, ring, B, 128) == (kc or 128)
                assert kt.key_chunk(tn, ring, B, 16) == min(kc or 128, 16)
            for max_b, bv, sub, nw, st in tn.tables(ring).tiles:
                B = 1000 if max_b is None else max_b
                assert kt.pick_tile(tn, ring, B, 128, 128) == (bv, sub, nw, st)
                assert sub <= bv and bv % sub == 0
            for table in ("tiles", "key_chunks", "project", "norm_row", "stack_sums"):
                assert getattr(tn.tables(ring), table)[-1][0] is None, table
    rec = kt.DEFAULT.recurrent
    assert kt.key_chunk(rec, True, 16, 128) == 32
    assert kt.key_chunk(rec, True, 4, 128) == 128
    fused = replace(kt.DEFAULT.verify, key_chunk=8)
    assert kt.key_chunk(fused, False, 1, 128) == 8 and kt.key_chunk(fused, False, 1, 4) == 4
    assert kt.maxnreg_kwargs(kt.DEFAULT.verify) == {}
    assert kt.maxnreg_kwargs(replace(rec, maxnreg=200)) == {"maxnreg": 200}
    # A forced BLOCK_V alone walks its rows in one piece, clipped to V.
    f = kt.DEFAULT.verify
    assert kt.pick_tile(replace(f, block_v=64), False, 1, 16, 128) == (16, 16, 8, 1)
    assert kt.pick_tile(replace(f, block_v=32, sub_v=8), False, 1, 128, 128) == (32, 8, 1, 1)
    assert kt.pick_tile(replace(f, block_v=8, sub_v=32), False, 1, 128, 128)[:2] == (8, 8)
    assert kt.pick_tile(replace(rec, num_warps=2), False, 1, 128, 128)[2] == 2
    assert kt.pick_tile(replace(rec, stages=3), False, 1, 128, 128)[3] == 3
    # The compatibility override takes the place of block_v, named in its messages.
    assert kt.pick_tile(replace(f, block_v=64), False, 1, 128, 128, 8)[:2] == (8, 8)
    with pytest.raises(ValueError, match="KDA_VERIFY_BLOCK_V"):
        kt.pick_tile(f, False, 1, 128, 128, 12, "KDA_VERIFY_BLOCK_V")
    for fields, match in (
        ({"num_warps": 3}, "num_warps"),
        ({"sub_v": 6}, "sub_v"),
        ({"stages": 0}, "stages"),
        ({"block_v": 12}, "block_v"),
    ):
        with pytest.raises(ValueError, match=match):
            kt.pick_tile(replace(f, **fields), False, 1, 128, 128)
    # A tuning of the wrong kind is refused; a KdaTuning gives each wrapper its part.
    assert kt.resolve(kt.DEFAULT, kt.VerifyTuning, "verify") is kt.DEFAULT.verify
    assert kt.resolve(None, kt.ConvTuning, "conv") is kt.DEFAULT.conv
    with pytest.raises(TypeError, match="tuning"):
        kt.resolve(kt.DEFAULT.recurrent, kt.VerifyTuning, "verify")


@pytest.mark.parametrize(
    "field,value",
    [("norm_row", 1), ("block_v", 3), ("maxnreg", 16), ("maxnreg", 168.0)],
    ids=["norm-row-not-bool", "block-v-not-pow2", "maxnreg-too-small", "maxnreg-not-int"],
)
def test_fused_knob_rejects_bad_value(field, value, device):
    """A bad fused-kernel tuning value is refused, naming it, before anything is written."""
    inp = make_inputs(1, 2, 1, 1, 16, 16, torch.float32, device)
    tn = kt.KdaTuning(verify=replace(kt.DEFAULT.verify, **{field: value}))
    with pytest.raises(ValueError, match=field):
        make_runner("fused", inp, 1, 2, 1, 1, 16, 16, tuning=tn)()
    assert bool(inp["win_pool"].isnan().all())


@pytest.mark.parametrize("mode", MODES)
def test_register_cap_reaches_the_launch(mode, device, monkeypatch):
    """tuning.maxnreg is a launch option of the recurrence kernel; the default caps
    nothing. The kernels are replaced by recorders here: only the launch options are
    looked at."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs.get("maxnreg"))

    monkeypatch.setattr(fused_mod, "_fused_verify_kernel", Recorder())
    monkeypatch.setattr(rec_mod, "_recurrent_verify_kernel", Recorder())
    B, T, H, HV, K, V = 2, 2, 1, 1, 16, 16
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    make_runner(mode, inp, B, T, H, HV, K, V)()
    make_runner(mode, inp, B, T, H, HV, K, V, tuning=tuned(maxnreg=200))()
    assert launches == [None, 200]


def test_recurrent_maxnreg_knob(device):
    """The recurrent kernel's register cap: a bad value is refused, naming it, before the
    kernel runs; a valid one is a launch option only (results unchanged under the
    interpreter, which ignores it)."""
    B, T, H, HV, K, V = 2, 2, 1, 1, 16, 16
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    with pytest.raises(ValueError, match="maxnreg"):
        make_runner("unfused+ring", inp, B, T, H, HV, K, V, tuning=tuned(maxnreg=300))()
    assert bool(inp["rawv"].isnan().all())
    run_and_check(
        "unfused+ring", B, T, H, HV, K, V, torch.float32, device, tuning=tuned(maxnreg=168)
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kc", [4, 8, 32])
def test_key_chunks_vs_reference(mode, kc, cpu_dtype, device):
    """State tiles split into key chunks (key_chunk < K = 32; 32 is the plain tile):
    o, snapshots and ring against the reference, one-piece and sub-tiled V tiles, with a
    padded sequence."""
    for t in ((8, None, None, None), (16, 8, None, None)):
        tn = tile(*t, key_chunk=kc)
        run_and_check(mode, 3, 3, 1, 2, 32, 16, cpu_dtype, device, -5.0, pad=1, seed=13, tuning=tn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("project", [False, True])
def test_projected_form_vs_reference(mode, project, cpu_dtype, device):
    """Both forms of the steps (per-step updates, or every state product taken from the
    initial state: step._projection) in every mode: o, snapshots and ring against the
    reference, for T = 1 (no coupling term) and T = 5, a strong gate (safe, lower bound -5)
    and the standard one, one-piece and sub-tiled tiles, key chunks, a padded sequence."""
    for T, lb, t in ((1, None, (16, None, None, None)), (5, -5.0, (16, 8, None, None))):
        tn = tile(*t, project=project, key_chunk=8)
        run_and_check(mode, 3, T, 1, 2, 32, 16, cpu_dtype, device, lb, pad=1, seed=19, tuning=tn)


@pytest.mark.parametrize(
    "mode,project", [("fused", False), ("fused+ring", False), ("fused+ring", True)]
)
def test_floor_probe_keeps_the_bytes_and_the_steps(mode, project, device):
    """The floor probe (`VerifyTuning.floor_probe`: the fused launch with its per-step input
    arithmetic replaced by copies), against its own definition: g = a, beta = b and q, k,
    v the raw inputs of each step; o and the snapshots from the reference's delta step on
    those (per-step form) or o_t = S0 q_t (projected form: zero cross terms, and q, k as
    their own coefficients); the ring holds the raw inputs; the windows are the real
    call's, bit for bit; padded and unused lines untouched (NaN-poisoned)."""
    B, T, H, HV, K, V = 3, 4, 1, 2, 32, 16
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device, seed=31, pad=1)
    probe = kt.KdaTuning(
        verify=replace(kt.DEFAULT.verify, floor_probe=True, block_v=16, project=project)
    )
    o = make_runner(mode, inp, B, T, H, HV, K, V, -5.0, probe)()
    ref = reference(inp, T, H, HV, K, V, -5.0)
    check_windows(inp, ref)
    x = inp["mixed"].reshape(B, T, -1).float()
    xq, xk = (x[..., i * H * K : (i + 1) * H * K].reshape(B, T, H, K) for i in (0, 1))
    xv = x[..., 2 * H * K :].reshape(B, T, HV, V)
    a = inp["a"].reshape(B, T, HV, K).float()
    beta = inp["b"].reshape(B, T, HV).float()
    o = o.reshape(B, T, HV, V)
    valid = _valid(ref)
    assert bool((o[[n for n in range(B) if n not in valid]] == 0).all()), "padded o rows"
    for n in valid:
        slot, line = int(inp["cache_indices"][n]), int(inp["inter_indices"][n])
        S0 = S = inp["ssm"][slot]
        for t in range(T):
            q, k = (ref_mod._heads(z[n, t][None], H, HV)[0] for z in (xq, xk))
            S, o_t = ref_mod.delta_step(S, q, k, xv[n, t], a[n, t], beta[n, t])
            if project:
                o_t = (S0 * q[:, None, :]).sum(-1)
            assert rel_err(o[n, t], o_t) < 1e-5, f"o of sequence {n}, step {t}"
            if mode == "fused":
                assert rel_err(inp["inter_ssm"][line, t], S) < 1e-5, f"snapshot {n}, {t}"
        if mode == "fused+ring":
            got = {m: inp[m][slot][:, :T] for m in ("rawk", "rawv", "g", "beta")}
            assert torch.equal(got["rawk"], xk[n].transpose(0, 1)), "ring rawk"
            assert torch.equal(got["rawv"], xv[n].transpose(0, 1)), "ring rawv"
            assert torch.equal(got["g"], a[n].transpose(0, 1)), "ring g"
            assert torch.equal(got["beta"], beta[n].transpose(0, 1)), "ring beta"
    slots = [int(inp["cache_indices"][n]) for n in valid]
    lines = [int(inp["inter_indices"][n]) for n in valid]
    if mode == "fused":
        assert _unused_rows_poisoned(inp["inter_ssm"], lines), "snapshots of unused lines"
    else:
        assert bool(inp["inter_ssm"].isnan().all()), "snapshots written in ring mode"
        for m in ("rawk", "rawv", "g", "beta"):
            assert _unused_rows_poisoned(inp[m], slots), f"ring {m}: unused slots"
            assert bool(inp[m][slots][:, :, T:].isnan().all()), f"ring {m}: positions >= T"


def test_floor_probe_must_be_a_bool(device):
    inp = make_inputs(1, 2, 1, 2, 16, 16, torch.float32, device, seed=3)
    probe = kt.KdaTuning(verify=replace(kt.DEFAULT.verify, floor_probe=1))
    with pytest.raises(ValueError, match="floor_probe"):
        make_runner("fused", inp, 1, 2, 1, 2, 16, 16, None, probe)()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm_row", [False, True])
def test_norm_row_vs_reference(mode, norm_row, cpu_dtype, device):
    """Both ways of summing the q/k norms (tuning norm_row) in every mode, against the
    reference: T = 4 (o stored in one group of four steps) and T = 7 (a group and three
    single steps), one-piece and sub-tiled tiles, a padded sequence."""
    for T, lb, t in ((4, None, (16, None, None, None)), (7, -5.0, (16, 8, None, None))):
        tn = tile(*t, norm_row=norm_row)
        run_and_check(mode, 3, T, 1, 2, 32, 16, cpu_dtype, device, lb, pad=1, seed=29, tuning=tn)


def test_norm_row_knob(cpu_dtype, device):
    """The table's choice per mode and batch, and a bad norm_row refused (naming it)
    before anything is written."""
    f, r = kt.DEFAULT.verify, kt.DEFAULT.recurrent
    assert kt.norm_row_flag(f, False, 2) is True
    assert kt.norm_row_flag(f, False, 3) is False
    assert kt.norm_row_flag(r, False, 8) is False
    assert kt.norm_row_flag(r, False, 9) is True
    for mode in ("fused", "unfused+ring"):
        inp = make_inputs(2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=31)
        with pytest.raises(ValueError, match="norm_row"):
            make_runner(mode, inp, 2, 3, 1, 2, 16, 16, tuning=tuned(norm_row=1))()
        assert all(bool(inp[n].isnan().all()) for n in ("inter_ssm", "rawv", "rawk", "g", "beta"))


@pytest.mark.parametrize("mode", MODES)
def test_stack_sums_vs_reference(mode, cpu_dtype, device):
    """The prologue's reductions eight at a time (tuning stack_sums) in every mode, against
    the reference: the q/k norms (norm_row off) and, in the ring modes, the projected form's
    dot products. T = 4 (8 norms, 16 products: whole groups of eight) and T = 7 (14 norms,
    49 products: the last group of each part-filled), one-piece and sub-tiled tiles, a
    padded sequence."""
    project = True if mode.endswith("+ring") else None
    for T, lb, t in ((4, None, (16, None, None, None)), (7, -5.0, (16, 8, None, None))):
        tn = tile(*t, norm_row=False, stack_sums=True, project=project)
        run_and_check(mode, 3, T, 1, 2, 32, 16, cpu_dtype, device, lb, pad=1, seed=37, tuning=tn)


def test_stack_sums_knob(cpu_dtype, device):
    """The table's choice per mode and batch (on only where it measured faster), a forced
    value winning over the table, and a bad stack_sums refused (naming it) before anything
    is written."""
    f, r = kt.DEFAULT.verify, kt.DEFAULT.recurrent
    assert kt.stack_sums_flag(f, False, 4) is True
    assert kt.stack_sums_flag(f, False, 5) is False
    assert kt.stack_sums_flag(f, True, 8) is True
    assert kt.stack_sums_flag(f, True, 16) is False
    assert kt.stack_sums_flag(f, True, 17) is True
    assert kt.stack_sums_flag(r, False, 64) is False
    assert kt.stack_sums_flag(r, True, 8) is False
    assert kt.stack_sums_flag(r, True, 9) is True
    assert kt.stack_sums_flag(replace(r, stack_sums=True), False, 1) is True
    for mode in ("fused+ring", "unfused"):
        inp = make_inputs(2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=31)
        with pytest.raises(ValueError, match="stack_sums"):
            make_runner(mode, inp, 2, 3, 1, 2, 16, 16, tuning=tuned(stack_sums=1))()
        assert all(bool(inp[n].isnan().all()) for n in ("inter_ssm", "rawv", "rawk", "g", "beta"))


def test_project_knob(cpu_dtype, device):
    """A bad projection flag is refused, naming it, before anything is written; the final
    state of an ordinary decode call never takes the projected form (it would not form
    the state): forced on, the decode result is still right."""
    B, T, H, HV, K, V = 2, 3, 1, 2, 16, 16
    for mode in ("fused+ring", "unfused+ring"):
        inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=23)
        with pytest.raises(ValueError, match="project"):
            make_runner(mode, inp, B, T, H, HV, K, V, tuning=tuned(project=1))()
        assert all(bool(inp[n].isnan().all()) for n in ("rawv", "rawk", "g", "beta"))
    f, r = kt.DEFAULT.verify, kt.DEFAULT.recurrent
    assert kt.project_flag(replace(r, project=True), True, True, 64) is False
    assert kt.project_flag(r, False, False, 64) is False
    assert kt.project_flag(f, True, False, 64) is True
    assert kt.project_flag(f, True, False, 16) is False
    assert kt.project_flag(f, True, False, 4) is True
    assert kt.project_flag(r, True, False, 2) is False
    assert kt.project_flag(r, True, False, 17) is True
    for tn in (f, r):
        for ring in (False, True):
            for max_b, flag in tn.tables(ring).project:
                B = 1000 if max_b is None else max_b
                assert kt.project_flag(tn, ring, False, B) is flag


def test_key_chunk_knob(cpu_dtype, device):
    """The ring bytes do not depend on the key chunks, and a bad key_chunk is refused
    (naming it) before anything is written."""
    B, T, H, HV, K, V = 2, 3, 1, 2, 32, 16
    runs = {}
    for kc in (8, 32):
        inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=17)
        make_runner("fused+ring", inp, B, T, H, HV, K, V, tuning=tuned(key_chunk=kc))()
        runs[kc] = inp
    for name in ("rawv", "rawk", "g", "beta", "win_pool"):
        assert same_bits(runs[8][name], runs[32][name]), name
    for bad in (2, 12, 16.0, True):
        for mode in ("fused+ring", "unfused"):
            inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=17)
            with pytest.raises(ValueError, match="key_chunk"):
                make_runner(mode, inp, B, T, H, HV, K, V, tuning=tuned(key_chunk=bad))()
            # (unfused: the conv kernel ran first; the recurrence wrote nothing)
            saves = ("inter_ssm", "rawv", "rawk", "g", "beta")
            assert all(bool(inp[n].isnan().all()) for n in saves), mode
            assert bool(inp["win_pool"].isnan().all()) or mode == "unfused"


def test_snapshot_cache_modifier_knob(cpu_dtype, device):
    """A snapshot store cache modifier changes no result; a bad one is refused, naming the
    field, before anything is written."""
    tn = tuned(snapshot_cache_modifier=".cg")
    run_and_check("fused", 2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=5, tuning=tn)
    for mode in ("fused", "unfused"):
        inp = make_inputs(2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=5)
        with pytest.raises(ValueError, match="snapshot_cache_modifier"):
            make_runner(
                mode, inp, 2, 3, 1, 2, 16, 16, tuning=tuned(snapshot_cache_modifier=".ca")
            )()
        assert bool(inp["inter_ssm"].isnan().all())
        assert bool(inp["win_pool"].isnan().all()) or mode == "unfused"


@pytest.mark.parametrize("kc,T", [(32, 2), (8, 5)])
def test_disable_state_update_false(kc, T, cpu_dtype, device):
    """Ordinary decode: [B, T, H, K] layout, no save buffers, final state written back,
    from the plain and the key-chunked tile (K = 32)."""
    # project=True must not apply here (the final state is formed)
    tn = replace(kt.DEFAULT.recurrent, key_chunk=kc, block_v=16, project=True)
    B, H, HV, K, V = 2, 1, 2, 32, 16
    inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=11)
    ref = reference(inp, T, H, HV, K, V)
    dim = 2 * H * K + HV * V
    q, k, v = ref["conv_out"].split([H * K, H * K, HV * V], -1)
    before = inp["ssm"].clone()
    o = fused_sigmoid_gating_delta_rule_update(
        A_log=inp["A_log"],
        a=inp["a"],
        dt_bias=inp["dt_bias"],
        q=q.unflatten(-1, (H, K)),
        k=k.unflatten(-1, (H, K)),
        v=v.unflatten(-1, (HV, V)),
        b=inp["b"],
        initial_state_source=inp["ssm"],
        initial_state_indices=inp["cache_indices"],
        tuning=tn,
    )
    assert o.shape == (B, T, HV, V) and dim == q.shape[-1] * 2 + v.shape[-1]
    assert rel_err(o.reshape(B * T, HV, V), ref["o"]) < tol(cpu_dtype)
    slots = inp["cache_indices"].long()
    assert rel_err(inp["ssm"][slots], ref["final"]) < tol(cpu_dtype)
    keep = torch.ones(B + 2, dtype=torch.bool)
    keep[slots] = False
    assert same_bits(inp["ssm"][keep], before[keep])


@pytest.mark.parametrize("T", [1, 2, 5])
def test_conv_decode_rolls_state(T, cpu_dtype, device):
    """No window buffer: outputs plus the state rolled in place; padded lines untouched."""
    B, dim = 3, 300  # dim not a multiple of the channel block: exercises the mask
    g = torch.Generator().manual_seed(T)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=cpu_dtype)
    x = rnd(B, T, dim)
    state = rnd(B + 2, dim, W - 1)
    w, bias = rnd(dim, W), rnd(dim)
    idx = torch.tensor([4, -1, 0], dtype=torch.int32, device=device)
    before = state.clone()
    xin = x[:, 0] if T == 1 else x.transpose(1, 2)
    out = causal_conv1d_update(xin, state, w, bias, activation="silu", conv_state_indices=idx)
    assert out.shape == xin.shape and out.stride() == xin.stride()
    out = out.unsqueeze(-1) if T == 1 else out
    y, _, new_state = ref_mod.conv_steps(x, before[idx.long().clamp(min=0)], w, bias)
    for n, line in enumerate(idx.tolist()):
        if line < 0:
            assert bool((out[n] == 0).all())
            continue
        assert rel_err(out[n].transpose(0, 1), y[n]) < tol(cpu_dtype)
        assert same_bits(state[line], new_state[n])
    for line in (1, 2, 3):
        assert same_bits(state[line], before[line])


# ---------------------------------------------------------------------------------------
# bf16 at the benchmark's shape (GPU only)
# ---------------------------------------------------------------------------------------


def _assert_gpu_ring_bytes_equal(B, T, H, HV, K, V, lower_bound, tuning=None):
    """fused+ring and unfused+ring write the same ring bytes in bf16 on the GPU."""
    runs = {}
    for mode in ("unfused+ring", "fused+ring"):
        inp = make_inputs(B, T, H, HV, K, V, torch.bfloat16, "cuda", seed=7)
        make_runner(mode, inp, B, T, H, HV, K, V, lower_bound, tuning)()
        runs[mode] = inp
    for name in ("rawv", "rawk", "g", "beta"):
        assert same_bits(runs["unfused+ring"][name], runs["fused+ring"][name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3, 4, 5, 9, 17, 33, 48, 64])
@pytest.mark.parametrize("HV", [8, 16])
@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_gpu_bf16_seed_shape(B, HV, lower_bound):
    T, H, K, V = 4, 8, 128, 128
    for mode in MODES:
        run_and_check(
            mode, B, T, H, HV, K, V, torch.bfloat16, "cuda", lower_bound, pad=0 if B > 1 else None
        )
    _assert_gpu_ring_bytes_equal(B, T, H, HV, K, V, lower_bound)


@pytest.mark.gpu
@pytest.mark.parametrize("kc", [8, 32, 128])
def test_gpu_bf16_key_chunks(kc):
    """Other key chunk widths than the default in bf16 at the seed's shape (128 = the plain
    tile): every mode against the reference at B = 4 with a padded sequence, ring bytes
    equal between the fused and unfused kernels."""
    T, H, HV, K, V = 4, 8, 8, 128, 128
    tn = tuned(key_chunk=kc)
    for mode in MODES:
        run_and_check(mode, 4, T, H, HV, K, V, torch.bfloat16, "cuda", -5.0, pad=0, tuning=tn)
    _assert_gpu_ring_bytes_equal(4, T, H, HV, K, V, None, tn)


@pytest.mark.gpu
@pytest.mark.parametrize("stack_sums", [False, True])
def test_gpu_bf16_stack_sums(stack_sums):
    """Both ways of taking the prologue's reductions (tuning stack_sums) in bf16 at the
    seed's shape, norm_row off and the ring modes projected: every mode against the
    reference at B = 4 and 64, ring bytes equal between the fused and unfused kernels."""
    T, H, HV, K, V = 4, 8, 8, 128, 128
    for B in (4, 64):
        for mode in MODES:
            project = True if mode.endswith("+ring") else None
            tn = tuned(norm_row=False, stack_sums=stack_sums, project=project)
            run_and_check(mode, B, T, H, HV, K, V, torch.bfloat16, "cuda", -5.0, pad=0, tuning=tn)
    _assert_gpu_ring_bytes_equal(64, T, H, HV, K, V, None, tuned(stack_sums=stack_sums))


@pytest.mark.gpu
@pytest.mark.parametrize("norm_row", [False, True])
def test_gpu_bf16_norm_row(norm_row):
    """Both ways of summing the q/k norms (tuning norm_row) in bf16 at the seed's shape:
    every mode against the reference at B = 2 (the fused kernels' 2-warp tile) and B = 16
    (the recurrent kernel's) with a padded sequence, ring bytes equal between the fused
    and unfused kernels."""
    T, H, HV, K, V = 4, 8, 8, 128, 128
    tn = tuned(norm_row=norm_row)
    for B in (2, 16):
        for mode in MODES:
            run_and_check(mode, B, T, H, HV, K, V, torch.bfloat16, "cuda", -5.0, pad=0, tuning=tn)
        _assert_gpu_ring_bytes_equal(B, T, H, HV, K, V, None, tn)
