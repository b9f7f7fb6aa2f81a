"""KDA tuning: the `tuning=` argument and the one module-level override, KDA_VERIFY_BLOCK_V.

The kernels are replaced by recorders: only the launch configuration is looked at.
"""

import importlib
from dataclasses import FrozenInstanceError, replace

import pytest
import torch
from test_kda_verify import make_inputs, make_runner

import kernels.kda.conv as conv_mod
import kernels.kda.fused_verify as fused_mod
import kernels.kda.recurrent as rec_mod
import kernels.kda.tuning as kt

B, T, H, HV, K, V = 1, 2, 1, 1, 16, 128


@pytest.fixture
def launches(monkeypatch):
    """{kernel name: [launch keywords, ...]} of every launch of the three KDA kernels."""
    seen = {"fused": [], "recurrent": [], "conv": []}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen[self.name].append(dict(kwargs, grid=grid))

    monkeypatch.setattr(fused_mod, "_fused_verify_kernel", Recorder("fused"))
    monkeypatch.setattr(rec_mod, "_recurrent_verify_kernel", Recorder("recurrent"))
    monkeypatch.setattr(conv_mod, "_causal_conv1d_update_kernel", Recorder("conv"))
    return seen


def fused_block_v(launches, device, tuning=None):
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    make_runner("fused", inp, B, T, H, HV, K, V, tuning=tuning)()
    return launches["fused"][-1]["BLOCK_V"]


def test_module_block_v_is_honoured_at_call_time(launches, device, monkeypatch):
    """Setting fused_verify.KDA_VERIFY_BLOCK_V changes the BLOCK_V of the next fused launch
    (over `tuning` too); an invalid value raises a ValueError naming it; None restores the
    default tile."""
    default = kt.table_row(kt.DEFAULT.verify.snapshot.tiles, B)[1]
    assert fused_block_v(launches, device) == default
    for bv in (8, 32):
        assert bv != default
        monkeypatch.setattr(fused_mod, "KDA_VERIFY_BLOCK_V", bv)
        assert fused_block_v(launches, device) == bv
        assert launches["fused"][-1]["grid"] == (B, HV, V // bv)
    tn = kt.KdaTuning(verify=replace(kt.DEFAULT.verify, block_v=16))
    assert fused_block_v(launches, device, tn) == 32
    for bad in (12, 0, 8.0, "8"):
        monkeypatch.setattr(fused_mod, "KDA_VERIFY_BLOCK_V", bad)
        with pytest.raises(ValueError, match="KDA_VERIFY_BLOCK_V"):
            fused_block_v(launches, device)
    monkeypatch.setattr(fused_mod, "KDA_VERIFY_BLOCK_V", None)
    assert fused_block_v(launches, device) == default
    assert fused_block_v(launches, device, tn) == 16


@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_tuning_reaches_every_launch(mode, launches, device):
    """A KdaTuning hands each wrapper its part: tile, warps, key chunks, norms, snapshot
    stores, register cap and the conv's channel block all reach the launches."""
    fields = dict(block_v=16, sub_v=8, num_warps=2, stages=2, key_chunk=8, norm_row=True)
    fields.update(snapshot_cache_modifier=".cg", maxnreg=200, project=False)
    tn = kt.KdaTuning(
        verify=replace(kt.DEFAULT.verify, **fields),
        recurrent=replace(kt.DEFAULT.recurrent, **fields),
        conv=kt.ConvTuning(block_d=64, num_warps=2),
    )
    inp = make_inputs(B, T, H, HV, K, V, torch.float32, device)
    make_runner(mode, inp, B, T, H, HV, K, V, tuning=tn)()
    (kw,) = launches["fused" if mode == "fused" else "recurrent"]
    got = {k: kw[k] for k in ("BLOCK_V", "SUB_V", "STAGES", "KC", "NORM_ROW", "SNAP_CM")}
    assert got == dict(BLOCK_V=16, SUB_V=8, STAGES=2, KC=8, NORM_ROW=True, SNAP_CM=".cg")
    assert (kw["num_warps"], kw["maxnreg"], kw["PROJECT"]) == (2, 200, False)
    if mode != "fused":
        (conv,) = launches["conv"]
        assert (conv["BLOCK_D"], conv["num_warps"]) == (64, 2)


def test_default_tuning_is_frozen():
    """DEFAULT cannot be changed in place: a variant is made with dataclasses.replace."""
    with pytest.raises(FrozenInstanceError):
        kt.DEFAULT.verify.block_v = 8
    assert replace(kt.DEFAULT.verify, block_v=8).block_v == 8
    assert kt.DEFAULT.verify.block_v is None


@pytest.mark.parametrize(
    "module,name,field",
    [
        ("fused_verify", "KDA_VERIFY_SUB_V", "sub_v"),
        ("fused_verify", "KDA_VERIFY_NUM_WARPS", "num_warps"),
        ("recurrent", "RECURRENT_BLOCK_V", "block_v"),
        ("conv", "BLOCK_D", "block_d"),
    ],
)
def test_setting_a_removed_knob_raises_naming_its_tuning_field(module, name, field):
    """A script that still sets a knob `tuning=` replaced must not run a sweep that changes
    nothing: the assignment raises, naming the field to pass instead, and the module keeps
    no such attribute."""
    mod = importlib.import_module(f"kernels.kda.{module}")
    with pytest.raises(AttributeError, match=rf"{name} is no longer read.*tuning=.*{field}="):
        setattr(mod, name, 4)
    assert not hasattr(mod, name)


def test_table_batch_scales_the_batch_by_the_heads():
    """table_heads=None reads the tables at the batch; a number scales it by HV / heads
    (at least 1); a bad value is refused naming the field. The fused kernel's default reads
    its tables at the tuned shape's program count (HV = 8), the recurrent kernel's at the
    batch."""
    assert kt.table_batch(kt.DEFAULT.recurrent, 4, 16) == 4
    assert [kt.table_batch(kt.DEFAULT.verify, 4, hv) for hv in (4, 8, 16)] == [2, 4, 8]
    tn = replace(kt.DEFAULT.verify, table_heads=8)
    got = [kt.table_batch(tn, b, hv) for b, hv in ((4, 16), (4, 8), (1, 4), (3, 16))]
    assert got == [8, 4, 1, 6]
    for bad in (0, -8, 8.0, True):
        with pytest.raises(ValueError, match="table_heads"):
            kt.table_batch(replace(tn, table_heads=bad), 4, 16)


@pytest.mark.parametrize(
    ("mode", "kernel", "part"),
    [("fused", "fused", "verify"), ("unfused", "recurrent", "recurrent")],
)
def test_table_heads_reads_every_table_at_the_scaled_batch(mode, kernel, part, launches, device):
    """With table_heads set, a call at B sequences and HV heads launches what the default
    launches at batch B * HV / table_heads: tile, warps, stages, key chunk and flags."""
    Hq, nb = 2, 3  # HV = 4 Hq below: the scaled batch (12) sits in another tile row than 3
    heads = 2

    def launch(batch, tuning=None):
        inp = make_inputs(batch, T, Hq, 4 * Hq, K, V, torch.float32, device)
        make_runner(mode, inp, batch, T, Hq, 4 * Hq, K, V, tuning=tuning)()
        return {k: v for k, v in launches[kernel][-1].items() if k != "grid"}

    base = getattr(kt.DEFAULT, part)
    tn = kt.KdaTuning(**{part: replace(base, table_heads=heads)})
    scaled = launch(nb, tn)
    assert scaled == launch(nb * 4 * Hq // heads)
    assert scaled != launch(nb)
