"""KDA chain verify: the four modes against the reference, ring bytes, replay, tiles, decode.

Every call goes through `make_runner`, which calls the kernels with the same keywords and
tensor views as the benchmark (transposed conv pools, [1, B*T, H, K] q/k/v views). Output
buffers are NaN-poisoned first, so that missing writes and writes to rows or ring positions
that must stay untouched both show.
"""

import pytest
import torch

import kernels.kda as kda
import kernels.kda.common as common
import kernels.kda.fused_verify as fused_mod
import kernels.kda.recurrent as rec_mod
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


def make_runner(mode, inp, B, T, H, HV, K, V, lower_bound=None):
    """The benchmark's call pattern for one mode (kda_cases.make_call; no index check, so
    tests can pass indices outside the pools)."""
    return cases.make_call(kda, mode, inp, B, T, H, HV, K, V, lower_bound, validate=False)


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


def run_and_check(mode, B, T, H, HV, K, V, dtype, device, lower_bound=None, pad=None, seed=0):
    inp = make_inputs(B, T, H, HV, K, V, dtype, device, seed=seed, pad=pad)
    validate_call_indices(inp)
    before = {n: inp[n].clone() for n in ("ssm", "conv_pool")}
    ref = reference(inp, T, H, HV, K, V, lower_bound)
    o = make_runner(mode, inp, B, T, H, HV, K, V, lower_bound)()
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
def one_tile(monkeypatch):
    """Force one V tile per value head (fewest programs under the interpreter)."""
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_BLOCK_V", 32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "B,T,H,HV,lower_bound,pad",
    [(3, 3, 2, 2, None, 1), (2, 4, 1, 2, -5.0, None)],
    ids=["HV=H-std-pad", "HV=2H-safe"],
)
def test_modes_vs_reference(mode, B, T, H, HV, lower_bound, pad, cpu_dtype, device, one_tile):
    run_and_check(mode, B, T, H, HV, 16, 16, cpu_dtype, device, lower_bound, pad)


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
    snap, _ = run_and_check("fused", B, T, H, HV, K, V, cpu_dtype, device, -5.0, seed=3)
    ring, _ = run_and_check("fused+ring", B, T, H, HV, K, V, cpu_dtype, device, -5.0, seed=3)
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


def _set_tile(monkeypatch, bv, sub, nw, st, state_first=None, ahead=False, prefetch=False):
    for mod, prefix in ((fused_mod, "KDA_VERIFY_"), (rec_mod, "RECURRENT_")):
        for name, value in (("BLOCK_V", bv), ("SUB_V", sub), ("NUM_WARPS", nw), ("STAGES", st)):
            monkeypatch.setattr(mod, prefix + name, value)
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_STATE_FIRST", state_first)
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_FIRST_AHEAD", ahead)
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_PREFETCH", prefetch)


@pytest.mark.parametrize("mode", MODES)
def test_block_v_choices_agree(mode, device, monkeypatch):
    """Every tile (BLOCK_V, SUB_V, warps, stages; for the fused kernel every work order:
    state first, or the first sub-tile's loads ahead of the loop) of the mode's recurrence
    kernel gives the same results: the ring and windows bitwise, o and snapshots to fp32
    rounding. Two value heads share one q/k head, so the ownership of the shared ring
    entries is exercised with several V tiles and several sub-tiles per tile."""
    B, T, H, HV, K, V = 1, 2, 1, 2, 16, 16
    results = []
    tiles = (
        (None, None, None, None, None),
        (2, None, 1, None, True),
        (4, None, 2, None, False),
        (8, None, None, None, True),
        (16, None, 4, None, False),
        (32, None, None, None, None),
        (8, 2, 1, 2, None),
        (16, 4, None, 3, True),
        (16, 8, 2, 1, False),
        (8, 2, 1, 2, "ahead"),
        (16, 8, 2, 1, "ahead"),
        (16, None, None, None, "ahead"),  # one piece: the loop has no second sub-tile
        (8, 2, 1, None, "prefetch"),  # four sub-tiles, each loaded during the one before
        (16, 8, 2, None, "prefetch"),
        (16, None, None, None, "prefetch"),
    )
    for bv, sub, nw, st, first in tiles:
        if first == "ahead":
            _set_tile(monkeypatch, bv, sub, nw, st, False, ahead=True)
        elif first == "prefetch":
            _set_tile(monkeypatch, bv, sub, nw, st, False, ahead=False, prefetch=True)
        else:
            _set_tile(monkeypatch, bv, sub, nw, st, first)
        inp, o = run_and_check(mode, B, T, H, HV, K, V, torch.float32, device, seed=5)
        results.append((o, inp))
    o0, inp0 = results[0]
    for o, inp in results[1:]:
        assert rel_err(o, o0) < 1e-6
        assert rel_err(inp["inter_ssm"].nan_to_num(), inp0["inter_ssm"].nan_to_num()) < 1e-6
        for name in ("rawk", "rawv", "g", "beta", "win_pool"):
            assert same_bits(inp[name], inp0[name]), name


def test_tile_table_and_knobs(monkeypatch):
    """The default tile and key chunk width come from the table rows of the mode and batch;
    forced values win."""
    for mode, rows in common.KEY_CHUNK_TABLE.items():
        for max_b, kc in rows:
            B = 1000 if max_b is None else max_b
            assert common.key_chunk(mode, B, 128) == (kc or 128)
            assert common.key_chunk(mode, B, 16) == min(kc or 128, 16)
    assert common.key_chunk("unfused+ring", 16, 128) == 32
    assert common.key_chunk("unfused+ring", 4, 128) == 128
    monkeypatch.setattr(common, "STATE_KEY_CHUNK", 8)
    assert common.key_chunk("fused", 1, 128) == 8 and common.key_chunk("fused", 1, 4) == 4
    for mode, rows in common.BLOCK_V_TABLE.items():
        for max_b, bv, sub, nw, st in rows:
            B = 1000 if max_b is None else max_b
            assert common.pick_tile(mode, {}, B, 128, 128) == (bv, sub, nw, st)
            assert sub <= bv and bv % sub == 0
    # Register caps of the table's tiles: by batch, never with a forced tile knob.
    for mode, rows in common.MAXNREG_TABLE.items():
        assert rows[-1][0] is None
        for max_b, cap in rows:
            B = 1000 if max_b is None else max_b
            assert common.table_maxnreg(mode, {}, B) == cap
            assert cap is None or 24 <= cap <= 255
    caps = {**common.MAXNREG_TABLE, "fused+ring": ((16, None), (32, 128), (None, 168))}
    monkeypatch.setattr(common, "MAXNREG_TABLE", caps)
    assert common.table_maxnreg("fused+ring", {}, 32) == 128
    assert common.table_maxnreg("fused+ring", {}, 33) == 168
    assert common.table_maxnreg("fused+ring", {}, 16) is None
    for knob in ("BLOCK_V", "SUB_V", "NUM_WARPS"):
        assert common.table_maxnreg("fused+ring", {knob: 4, "STAGES": None}, 32) is None
    assert common.maxnreg_kwargs("X", None, 128) == {"maxnreg": 128}
    assert common.maxnreg_kwargs("X", 200, 128) == {"maxnreg": 200}
    assert common.maxnreg_kwargs("X", None, None) == {}
    # A forced BLOCK_V alone walks its rows in one piece, clipped to V.
    assert common.pick_tile("fused", {"BLOCK_V": 64}, 1, 16, 128) == (16, 16, 8, 1)
    assert common.pick_tile("fused", {"BLOCK_V": 32, "SUB_V": 8}, 1, 128, 128) == (32, 8, 1, 1)
    assert common.pick_tile("fused", {"BLOCK_V": 8, "SUB_V": 32}, 1, 128, 128)[:2] == (8, 8)
    assert common.pick_tile("unfused", {"NUM_WARPS": 2}, 1, 128, 128)[2] == 2
    assert common.pick_tile("unfused", {"STAGES": 3}, 1, 128, 128)[3] == 3
    for knobs, match in (
        ({"NUM_WARPS": 3, "prefix": "X_"}, "X_NUM_WARPS"),
        ({"SUB_V": 6, "prefix": "X_"}, "X_SUB_V"),
        ({"STAGES": 0, "prefix": "X_"}, "X_STAGES"),
        ({"BLOCK_V": 12, "prefix": "X_"}, "X_BLOCK_V"),
    ):
        with pytest.raises(ValueError, match=match):
            common.pick_tile("fused", knobs, 1, 128, 128)


@pytest.mark.parametrize(
    "knob,value",
    [
        ("KDA_VERIFY_STATE_FIRST", 1),
        ("KDA_VERIFY_FIRST_AHEAD", None),
        ("KDA_VERIFY_PREFETCH", 1),
        ("KDA_VERIFY_BLOCK_V", 3),
        ("KDA_VERIFY_MAXNREG", 16),
        ("KDA_VERIFY_MAXNREG", 168.0),
    ],
    ids=[
        "state-first-not-bool",
        "first-ahead-not-bool",
        "prefetch-not-bool",
        "block-v-not-pow2",
        "maxnreg-too-small",
        "maxnreg-not-int",
    ],
)
def test_fused_knob_rejects_bad_value(knob, value, device, monkeypatch):
    """A bad fused-kernel knob is refused, naming it, before anything is written."""
    inp = make_inputs(1, 2, 1, 1, 16, 16, torch.float32, device)
    monkeypatch.setattr(fused_mod, knob, value)
    with pytest.raises(ValueError, match=knob):
        make_runner("fused", inp, 1, 2, 1, 1, 16, 16)()
    assert bool(inp["win_pool"].isnan().all())


@pytest.mark.parametrize(
    "mode,B,want",
    [("fused+ring", 16, None), ("fused+ring", 32, 128), ("fused+ring", 48, 168),
     ("fused+ring", 64, None), ("unfused+ring", 32, 144), ("fused", 32, None)],
)  # fmt: skip
def test_table_register_cap_reaches_the_launch(mode, B, want, device, monkeypatch):
    """A register cap of the table (common.MAXNREG_TABLE, here a test table: the shipped
    one caps nothing now) is a launch option of the recurrence kernel at the batches it
    covers, the module knob overrides it, and a forced tile drops it. The kernels are
    replaced by recorders here: only the launch options are looked at."""
    caps = {
        "fused": ((None, None),),
        "fused+ring": ((16, None), (32, 128), (48, 168), (None, None)),
        "unfused": ((None, None),),
        "unfused+ring": ((16, None), (None, 144)),
    }
    monkeypatch.setattr(common, "MAXNREG_TABLE", caps)
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs.get("maxnreg"))

    monkeypatch.setattr(fused_mod, "_fused_verify_kernel", Recorder())
    monkeypatch.setattr(rec_mod, "_recurrent_verify_kernel", Recorder())
    T, H, HV, K, V = 2, 1, 1, 16, 16
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    make_runner(mode, inp, B, T, H, HV, K, V)()
    assert launches == [want]
    knob = ("KDA_VERIFY_" if mode.startswith("fused") else "RECURRENT_") + "MAXNREG"
    mod = fused_mod if mode.startswith("fused") else rec_mod
    monkeypatch.setattr(mod, knob, 200)
    make_runner(mode, inp, B, T, H, HV, K, V)()
    assert launches[-1] == 200
    monkeypatch.setattr(mod, knob, None)
    monkeypatch.setattr(mod, knob.replace("MAXNREG", "BLOCK_V"), 8)
    make_runner(mode, inp, B, T, H, HV, K, V)()
    assert launches[-1] is None


def test_recurrent_maxnreg_knob(device, monkeypatch):
    """The recurrent kernel's register cap: a bad value is refused, naming it, before the
    kernel runs; a valid one is a launch option only (results unchanged under the
    interpreter, which ignores it; its effect on the GPU is in docs/perf/kda.md)."""
    B, T, H, HV, K, V = 2, 2, 1, 1, 16, 16
    monkeypatch.setattr(rec_mod, "RECURRENT_MAXNREG", 300)
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    with pytest.raises(ValueError, match="RECURRENT_MAXNREG"):
        make_runner("unfused+ring", inp, B, T, H, HV, K, V)()
    assert bool(inp["rawv"].isnan().all())
    monkeypatch.setattr(rec_mod, "RECURRENT_MAXNREG", 168)
    run_and_check("unfused+ring", B, T, H, HV, K, V, torch.float32, device)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kc", [4, 8, 32])
def test_key_chunks_vs_reference(mode, kc, cpu_dtype, device, monkeypatch):
    """State tiles split into key chunks (STATE_KEY_CHUNK < K = 32; 32 is the plain tile):
    o, snapshots and ring against the reference, one-piece and sub-tiled V tiles, with a
    padded sequence."""
    monkeypatch.setattr(common, "STATE_KEY_CHUNK", kc)
    for tile in ((8, None, None, None), (16, 8, None, None)):
        _set_tile(monkeypatch, *tile)
        run_and_check(mode, 3, 3, 1, 2, 32, 16, cpu_dtype, device, -5.0, pad=1, seed=13)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("project", [False, True])
def test_projected_form_vs_reference(mode, project, cpu_dtype, device, monkeypatch):
    """Both forms of the steps (per-step updates, or every state product taken from the
    initial state: common._projection) in every mode: o, snapshots and ring against the
    reference, for T = 1 (no coupling term) and T = 5, a strong gate (safe, lower bound -5)
    and the standard one, one-piece and sub-tiled tiles, key chunks, a padded sequence."""
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_PROJECT", project)
    monkeypatch.setattr(rec_mod, "RECURRENT_PROJECT", project)
    monkeypatch.setattr(common, "STATE_KEY_CHUNK", 8)
    for T, lb, tile in ((1, None, (16, None, None, None)), (5, -5.0, (16, 8, None, None))):
        _set_tile(monkeypatch, *tile)
        run_and_check(mode, 3, T, 1, 2, 32, 16, cpu_dtype, device, lb, pad=1, seed=19)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("norm_row", [False, True])
def test_norm_row_vs_reference(mode, norm_row, cpu_dtype, device, monkeypatch):
    """Both ways of summing the q/k norms (common.NORM_ROW) in every mode, against the
    reference: T = 4 (o stored in one group of four steps) and T = 7 (a group and three
    single steps), one-piece and sub-tiled tiles, a padded sequence."""
    monkeypatch.setattr(common, "NORM_ROW", norm_row)
    for T, lb, tile in ((4, None, (16, None, None, None)), (7, -5.0, (16, 8, None, None))):
        _set_tile(monkeypatch, *tile)
        run_and_check(mode, 3, T, 1, 2, 32, 16, cpu_dtype, device, lb, pad=1, seed=29)


def test_norm_row_knob(cpu_dtype, device, monkeypatch):
    """The table's choice per mode and batch, and a bad NORM_ROW refused (naming it)
    before anything is written."""
    assert common.norm_row_flag("fused", 2) is True
    assert common.norm_row_flag("fused", 3) is False
    assert common.norm_row_flag("unfused", 8) is False
    assert common.norm_row_flag("unfused", 9) is True
    for mode, rows in common.NORM_ROW_TABLE.items():
        assert rows[-1][0] is None, mode
    monkeypatch.setattr(common, "NORM_ROW", 1)
    for mode in ("fused", "unfused+ring"):
        inp = make_inputs(2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=31)
        with pytest.raises(ValueError, match="NORM_ROW"):
            make_runner(mode, inp, 2, 3, 1, 2, 16, 16)()
        assert all(bool(inp[n].isnan().all()) for n in ("inter_ssm", "rawv", "rawk", "g", "beta"))


def test_project_knob(cpu_dtype, device, monkeypatch):
    """A bad projection knob is refused, naming it, before anything is written; the final
    state of an ordinary decode call never takes the projected form (it would not form
    the state): forced on, the decode result is still right."""
    B, T, H, HV, K, V = 2, 3, 1, 2, 16, 16
    for mod, name, mode in (
        (fused_mod, "KDA_VERIFY_PROJECT", "fused+ring"),
        (rec_mod, "RECURRENT_PROJECT", "unfused+ring"),
    ):
        monkeypatch.setattr(mod, name, 1)
        inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=23)
        with pytest.raises(ValueError, match=name):
            make_runner(mode, inp, B, T, H, HV, K, V)()
        assert all(bool(inp[n].isnan().all()) for n in ("rawv", "rawk", "g", "beta"))
        monkeypatch.setattr(mod, name, None)
    assert common.project_flag("unfused+ring", True, "X", True, 64) is False
    assert common.project_flag("unfused", None, "X", False, 64) is False
    assert common.project_flag("fused+ring", None, "X", False, 64) is True
    assert common.project_flag("fused+ring", None, "X", False, 16) is False
    assert common.project_flag("fused+ring", None, "X", False, 4) is True
    assert common.project_flag("unfused+ring", None, "X", False, 2) is False
    assert common.project_flag("unfused+ring", None, "X", False, 17) is True
    for mode, rows in common.PROJECT_TABLE.items():
        assert rows[-1][0] is None
        for max_b, flag in rows:
            B = 1000 if max_b is None else max_b
            assert common.project_flag(mode, None, "X", False, B) is flag


def test_key_chunk_knob(cpu_dtype, device, monkeypatch):
    """The ring bytes do not depend on the key chunks, and a bad STATE_KEY_CHUNK is
    refused (naming it) before anything is written."""
    B, T, H, HV, K, V = 2, 3, 1, 2, 32, 16
    runs = {}
    for kc in (8, 32):
        monkeypatch.setattr(common, "STATE_KEY_CHUNK", kc)
        inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=17)
        make_runner("fused+ring", inp, B, T, H, HV, K, V)()
        runs[kc] = inp
    for name in ("rawv", "rawk", "g", "beta", "win_pool"):
        assert same_bits(runs[8][name], runs[32][name]), name
    for bad in (2, 12, 16.0, True):
        monkeypatch.setattr(common, "STATE_KEY_CHUNK", bad)
        for mode in ("fused+ring", "unfused"):
            inp = make_inputs(B, T, H, HV, K, V, cpu_dtype, device, seed=17)
            with pytest.raises(ValueError, match="STATE_KEY_CHUNK"):
                make_runner(mode, inp, B, T, H, HV, K, V)()
            # (unfused: the conv kernel ran first; the recurrence wrote nothing)
            saves = ("inter_ssm", "rawv", "rawk", "g", "beta")
            assert all(bool(inp[n].isnan().all()) for n in saves), mode
            assert bool(inp["win_pool"].isnan().all()) or mode == "unfused"


def test_snapshot_cache_modifier_knob(cpu_dtype, device, monkeypatch):
    """A snapshot store cache modifier changes no result; a bad one is refused, naming the
    knob, before anything is written."""
    monkeypatch.setattr(common, "SNAPSHOT_CACHE_MODIFIER", ".cs")
    run_and_check("fused", 2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=5)
    monkeypatch.setattr(common, "SNAPSHOT_CACHE_MODIFIER", ".ca")
    for mode in ("fused", "unfused"):
        inp = make_inputs(2, 3, 1, 2, 16, 16, cpu_dtype, device, seed=5)
        with pytest.raises(ValueError, match="SNAPSHOT_CACHE_MODIFIER"):
            make_runner(mode, inp, 2, 3, 1, 2, 16, 16)()
        assert bool(inp["inter_ssm"].isnan().all())
        assert bool(inp["win_pool"].isnan().all()) or mode == "unfused"


@pytest.mark.parametrize("kc,T", [(32, 2), (8, 5)])
def test_disable_state_update_false(kc, T, cpu_dtype, device, monkeypatch):
    """Ordinary decode: [B, T, H, K] layout, no save buffers, final state written back,
    from the plain and the key-chunked tile (K = 32)."""
    monkeypatch.setattr(common, "STATE_KEY_CHUNK", kc)
    monkeypatch.setattr(rec_mod, "RECURRENT_BLOCK_V", 16)
    monkeypatch.setattr(rec_mod, "RECURRENT_PROJECT", True)  # must not apply here
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


def _assert_gpu_ring_bytes_equal(B, T, H, HV, K, V, lower_bound):
    """fused+ring and unfused+ring write the same ring bytes in bf16 on the GPU."""
    runs = {}
    for mode in ("unfused+ring", "fused+ring"):
        inp = make_inputs(B, T, H, HV, K, V, torch.bfloat16, "cuda", seed=7)
        make_runner(mode, inp, B, T, H, HV, K, V, lower_bound)()
        runs[mode] = inp
    for name in ("rawv", "rawk", "g", "beta"):
        assert same_bits(runs["unfused+ring"][name], runs["fused+ring"][name]), name


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 4, 64])
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
def test_gpu_bf16_key_chunks(kc, monkeypatch):
    """Other key chunk widths than the default in bf16 at the seed's shape (128 = the plain
    tile): every mode against the reference at B = 4 with a padded sequence, ring bytes
    equal between the fused and unfused kernels."""
    T, H, HV, K, V = 4, 8, 8, 128, 128
    monkeypatch.setattr(common, "STATE_KEY_CHUNK", kc)
    for mode in MODES:
        run_and_check(mode, 4, T, H, HV, K, V, torch.bfloat16, "cuda", -5.0, pad=0)
    _assert_gpu_ring_bytes_equal(4, T, H, HV, K, V, None)


@pytest.mark.gpu
@pytest.mark.parametrize("norm_row", [False, True])
def test_gpu_bf16_norm_row(norm_row, monkeypatch):
    """Both ways of summing the q/k norms (common.NORM_ROW) in bf16 at the seed's shape:
    every mode against the reference at B = 2 (the fused kernels' 2-warp tile) and B = 16
    (the recurrent kernel's) with a padded sequence, ring bytes equal between the fused
    and unfused kernels."""
    T, H, HV, K, V = 4, 8, 8, 128, 128
    monkeypatch.setattr(common, "NORM_ROW", norm_row)
    for B in (2, 16):
        for mode in MODES:
            run_and_check(mode, B, T, H, HV, K, V, torch.bfloat16, "cuda", -5.0, pad=0)
        _assert_gpu_ring_bytes_equal(B, T, H, HV, K, V, None)
