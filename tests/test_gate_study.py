"""tools/dev/gate_study.py and tools/dev/gpu_gate_study.sh: the slow-down patches, the tables, one
smoke run.

The patches must apply to the current kernel sources, compile, and leave every byte the
kernels write unchanged (under the interpreter here), while the extra work is really wired
to a store: with the never-passed flag forced on, that store changes the output. The CV,
A/A and detection tables are checked on synthetic inputs and on real `asv continuous`
output; the shell entry point runs its noise stage end to end in smoke mode.
"""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _asv_smoke as smoke  # noqa: E402

from tools.dev import gate_study as gs  # noqa: E402

NEVER, FORCED = "0.0,  # gate_never", "1.0,  # gate_never"
# Real `asv continuous` output (smoke mode, NSA forward with 3000 extra steps, factor 1.01).
CONTINUOUS_OUT = """\
· Running 2 total benchmarks (2 commits * 1 environments * 1 benchmarks)
[100.00%] ··· nsa.NsaForward.track_time                                       ok

| Change   | Before [8f32d545] <gate-base>   | After [5df96ed9] <gate-slow-nsa-3000>   |   Ratio | Benchmark (Parameter)                                          |
|----------|---------------------------------|-----------------------------------------|---------|----------------------------------------------------------------|
| +        | 254±4ms                         | 1.03±0s                                 |    4.05 | nsa.NsaForward.track_time(40, 'triton', 'tiny-seed', 'random') |
| -        | 2.00±0.01ms                     | 1.00±0.01ms                             |    0.50 | kda.KdaVerify.track_time(1, 'fused', 'safe', 'H1-HV2') |

SOME BENCHMARKS HAVE CHANGED SIGNIFICANTLY.
PERFORMANCE DECREASED.
"""  # noqa: E501


def source(kernel):
    return (ROOT / gs.KERNELS[kernel].path).read_text()


@pytest.mark.parametrize("kernel", list(gs.KERNELS))
def test_patch_applies_to_current_source_and_only_adds_lines(kernel):
    k = gs.KERNELS[kernel]
    text = gs.patch_source(source(kernel), k.hunks, 37)
    compile(text, k.path, "exec")
    if k.kind == "host":  # work in the wrapper: a spin of 37 us, or 37 more launches
        assert gs.HOST_MARK in text and ("37 * 1e-6" in text or "range(37)" in text)
    else:
        assert NEVER in text
    if k.kind == "host":
        pass
    elif kernel.endswith("_loop"):  # the amount is an argument of the one compiled kernel
        assert "37.0,  # gate_steps" in text and re.search(r"while \w+ < .*gate_steps", text)
    else:
        assert "EXTRA=37," in text and "range(EXTRA)" in text
    original = source(kernel).splitlines()
    added = text.splitlines()
    it = iter(added)
    assert all(line in it for line in original), "the patch removed or reordered lines"
    assert len(added) - len(original) == sum(len(h.text.splitlines()) for h in k.hunks)


@pytest.mark.parametrize("kernel", list(gs.KERNELS))
def test_patch_refuses_a_missing_or_repeated_anchor(kernel):
    k = gs.KERNELS[kernel]
    line = re.compile(rf"^( *){re.escape(k.hunks[0].anchor)}$", re.M)
    assert len(line.findall(source(kernel))) == 1
    with pytest.raises(ValueError, match="found 0 times"):
        gs.patch_source(line.sub(r"\1renamed,", source(kernel)), k.hunks, 1)
    with pytest.raises(ValueError, match="found 2 times"):
        gs.patch_source(line.sub(r"\g<0>\n\g<0>", source(kernel)), k.hunks, 1)


def load(kernel, extra, tmp_path, forced=False):
    text = gs.patch_source(source(kernel), gs.KERNELS[kernel].hunks, extra)
    tag = f"t{extra}{'f' if forced else ''}"
    return gs.load_source(kernel, tag, text.replace(NEVER, FORCED) if forced else text, tmp_path)


def nsa_case(device, Hq=4):
    """Small NSA inputs (one kv head, T=40, block 16, S=3) and a forward through a module:
    (q, k, v, do, idx, block size, forward(mod) -> (o, lse))."""
    from kernels import nsa

    B, Hkv, T, D, bs, S = 1, 1, 40, 32, 16, 3
    gen = torch.Generator(device=device).manual_seed(3)
    q, k, v, do = (
        torch.randn(B, h, T, D, generator=gen, device=device) for h in (Hq, Hkv, Hkv, Hq)
    )
    idx = nsa.make_block_idx_random(B, Hkv, T, bs, S, device, 5)

    def forward(mod):
        return mod.selection_forward_triton(q, k, v, idx, bs, return_lse=True)

    return q, k, v, do, idx, bs, forward


@pytest.mark.parametrize("kernel", ["nsa", "nsa_loop"])
def test_patched_nsa_forward_writes_the_same_bytes(kernel, tmp_path, device):
    from kernels import nsa

    *_, run = nsa_case(device)
    o_ref, lse_ref = run(nsa.forward)
    o, lse = run(load(kernel, 3, tmp_path))
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    # The flag forced on: the extra result lands in lse, and it depends on EXTRA.
    o3, lse3 = run(load(kernel, 3, tmp_path, forced=True))
    o0, lse0 = run(load(kernel, 0, tmp_path, forced=True))
    assert torch.equal(o3, o_ref)
    assert not torch.equal(lse3, lse_ref) and not torch.equal(lse3, lse0)


def test_paper_only_patch_runs_its_steps_at_the_paper_group_only(tmp_path, device):
    """nsa_paper_loop: the same bytes at G=4 and G=16; with the store forced on, what it
    stores depends on the amount at G=16 (the steps ran) and not at G=4 (they did not)."""
    from kernels import nsa

    for Hq, ran in ((4, False), (16, True)):
        *_, run = nsa_case(device, Hq)
        o_ref, lse_ref = run(nsa.forward)
        o, lse = run(load("nsa_paper_loop", 3, tmp_path))
        assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
        _, lse3 = run(load("nsa_paper_loop", 3, tmp_path, forced=True))
        _, lse0 = run(load("nsa_paper_loop", 0, tmp_path, forced=True))
        assert not torch.equal(lse3, lse_ref)
        assert torch.equal(lse3, lse0) != ran, Hq


def test_patched_nsa_backward_writes_the_same_bytes(tmp_path, device):
    """nsa_bwd_loop: dq, dk and dv bit for bit; forced, the extra result lands in dv."""
    from kernels import nsa

    q, k, v, do, idx, bs, forward = nsa_case(device)
    o, lse = forward(nsa.forward)

    def run(mod):
        return mod.selection_backward_triton(q, k, v, idx, bs, do, o, lse)

    ref = run(nsa.backward)
    for got, want in zip(run(load("nsa_bwd_loop", 3, tmp_path)), ref, strict=True):
        assert torch.equal(got, want)
    dq, dk, dv = run(load("nsa_bwd_loop", 3, tmp_path, forced=True))
    assert torch.equal(dq, ref[0]) and torch.equal(dk, ref[1]) and not torch.equal(dv, ref[2])


def test_host_patches_leave_the_results_and_add_host_work(tmp_path, device):
    """nsa_host spins on the host clock for EXTRA us (a counting clock stands in for the
    module's `time`); nsa_launch adds EXTRA launches of its kernel, whose store lands in
    lse only when forced."""
    from kernels import nsa

    *_, run = nsa_case(device)
    o_ref, lse_ref = run(nsa.forward)
    mod = load("nsa_host", 37, tmp_path)
    reads = []

    def clock():
        reads.append(1)
        return len(reads) * 1e-6

    mod.time = SimpleNamespace(perf_counter=clock)
    o, lse = run(mod)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    assert 37 <= len(reads) <= 39  # the end time, then one read per microsecond

    mod = load("nsa_launch", 3, tmp_path)
    o, lse = run(mod)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    launches = []
    real = mod._gate_extra_kernel

    class Count:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    mod._gate_extra_kernel = Count()
    run(mod)
    assert launches == [(1,)] * 3
    _, lse = run(load("nsa_launch", 3, tmp_path, forced=True))
    assert lse.flatten()[0] == 0 and not torch.equal(lse, lse_ref)


@pytest.mark.parametrize("kernel", ["kda", "kda_ahead", "kda_loop"])
def test_patched_kda_fused_verify_writes_the_same_bytes(kernel, tmp_path):
    """Every KDA slow-down patch (after the stores; ahead of the state accesses, the amount
    compiled in or a runtime argument)."""
    import kernels.kda as kkda
    from benchmarks import kda as bkda

    B, H, HV = 1, 1, 2

    def run(fn):
        x = bkda.make_inputs(B, H, HV, "fused+ring", seed=4)
        o = bkda.make_call(
            SimpleNamespace(module=kkda, fused_kda_conv_gating_verify=fn),
            "fused+ring",
            x,
            B,
            H,
            HV,
            -5.0,
        )()
        return o, x

    o_ref, x_ref = run(kkda.fused_kda_conv_gating_verify)
    o, x = run(load(kernel, 3, tmp_path).fused_kda_conv_gating_verify)
    assert torch.equal(o, o_ref)
    for name, t in x_ref.items():  # ring, windows and states: every buffer, bit for bit
        assert torch.equal(x[name], t), name
    o_forced, _ = run(load(kernel, 3, tmp_path, forced=True).fused_kda_conv_gating_verify)
    assert not torch.equal(o_forced, o_ref)


def test_patched_kda_unfused_recurrent_writes_the_same_bytes(tmp_path):
    """kda_unfused_loop: every buffer of the unfused ring mode bit for bit; forced, o
    changes."""
    import kernels.kda as kkda
    from benchmarks import kda as bkda

    B, H, HV = 1, 1, 2

    def run(fn):
        x = bkda.make_inputs(B, H, HV, "unfused+ring", seed=4)
        api = SimpleNamespace(
            module=kkda, causal_conv1d_update=kkda.causal_conv1d_update,
            fused_sigmoid_gating_delta_rule_update=fn,
        )  # fmt: skip
        return bkda.make_call(api, "unfused+ring", x, B, H, HV, -5.0)(), x

    o_ref, x_ref = run(kkda.fused_sigmoid_gating_delta_rule_update)
    o, x = run(load("kda_unfused_loop", 3, tmp_path).fused_sigmoid_gating_delta_rule_update)
    assert torch.equal(o, o_ref)
    for name, t in x_ref.items():
        assert torch.equal(x[name], t), name
    forced = load("kda_unfused_loop", 3, tmp_path, forced=True)
    o_forced, _ = run(forced.fused_sigmoid_gating_delta_rule_update)
    assert not torch.equal(o_forced, o_ref)


def test_regex_selects_the_kernels_points():
    nsa, kda = gs.KERNELS["nsa"].regex, gs.KERNELS["kda"].regex
    assert re.search(nsa, "nsa.NsaForward.track_time(32768, 'triton', 'seed', 'recent')")
    assert not re.search(nsa, "nsa.NsaForward.track_time(4096, 'reference', 'seed', 'recent')")
    assert not re.search(nsa, "nsa.NsaBackward.track_time(4096, 'triton', 'seed', 'recent')")
    assert re.search(kda, "kda.KdaVerify.track_time_cold(64, 'fused+ring', 'safe', 'H8-HV8')")
    assert re.search(kda, "kda.KdaVerify.track_time(1, 'fused', 'safe', 'H8-HV8')")
    assert not re.search(kda, "kda.KdaVerify.track_time(1, 'unfused+ring', 'safe', 'H8-HV8')")
    assert not re.search(kda, "kda.KdaVerify.track_peak_vram_bytes(1, 'fused', 'safe', 'H8-HV8')")
    bwd, unfused = gs.KERNELS["nsa_bwd_loop"].regex, gs.KERNELS["kda_unfused_loop"].regex
    assert re.search(bwd, "nsa.NsaBackward.track_time(4096, 'triton', 'seed', 'recent')")
    assert not re.search(bwd, "nsa.NsaForward.track_time(4096, 'triton', 'seed', 'recent')")
    assert re.search(unfused, "kda.KdaVerify.track_time(1, 'unfused+ring', 'safe', 'H8-HV8')")
    assert not re.search(unfused, "kda.KdaVerify.track_time(1, 'fused', 'safe', 'H8-HV8')")
    host = gs.KERNELS["nsa_host"].regex
    for method in ("track_time", "track_time_eager", "track_time_host"):
        assert re.search(host, f"nsa.NsaForward.{method}(4096, 'triton', 'seed', 'recent')")
    both = gs.regex_of(["nsa_loop", "kda_loop"])
    assert re.search(both, "nsa.NsaForward.track_time(32768, 'triton', 'seed', 'recent')")
    assert re.search(both, "kda.KdaVerify.track_time(1, 'fused', 'safe', 'H8-HV8')")
    assert not re.search(both, "nsa.NsaBackward.track_time(4096, 'triton', 'seed', 'recent')")
    assert gs.regex_of(["nsa"]) == nsa


def test_measure_point_alternates_the_order_of_the_variants():
    """Calibration times the variants A B C, C B A, A B C, ... so that a drift over the
    call (clocks, temperature) does not always fall on the same variant."""
    seen = []

    class Bench:
        def setup(self, *params):
            self.api = SimpleNamespace(fused_kda_conv_gating_verify="base")

        def call(self, seed):
            return lambda: torch.zeros(3)

        def track_time(self, *params):
            seen.append(self.api.fused_kda_conv_gating_verify)
            return {"samples": [1.0 + 0.1 * len(seen)]}

        def track_time_cold(self, *params):
            return {"samples": [1.0]}

    mods = {e: SimpleNamespace(fused_kda_conv_gating_verify=f"+{e}") for e in (5, 9)}
    times = gs.measure_point("kda_loop", Bench, (1,), {0: None, **mods}, reps=3)
    assert seen == ["base", "+5", "+9", "+9", "+5", "base", "base", "+5", "+9"]
    assert set(times["track_time"]) == {0, 5, 9}


def test_noise_statistics():
    samples = [1.0, 1.1, 0.9, 2.0, 2.2, 1.8, 3.0, 3.0, 3.0, 9.0]  # 3 processes of 3, a tail
    chunks = gs.split_processes(samples, 3)
    assert chunks == [samples[0:3], samples[3:6], samples[6:9]]
    s = gs.cv_stats(chunks)
    assert s["n"] == 3 and s["medians_s"] == [1.0, 2.0, 3.0] and s["median_s"] == 2.0
    assert s["cv_pct"] == pytest.approx(50.0) and s["range_pct"] == pytest.approx(100.0)
    table = gs.noise_table({"a(1)": samples, "b(1)": [1.0, 2.0]}, 3)
    assert list(table) == ["a(1)"]  # b has no complete process
    assert gs.rounds_done({"a": samples, "b": samples[:6]}, 3) == 2
    assert gs.rounds_done({}, 3) == 0
    md = gs.noise_markdown(table)
    # halves: processes 1 and 3 (medians 1 and 3) against process 2 (2)
    assert s["halves_median_ratio"] == pytest.approx(1.0) and s["halves_fastest_ratio"] == 2.0
    assert "| `a(1)` | 3 | 2000.000 ms | 50.00 | 100.00 | 1.000, 2.000 |" in md
    assert gs.halves([1.0])[0] != gs.halves([1.0])[0]  # NaN: one process is no A/A


def test_halves_by_the_fastest_process_ignore_slow_processes():
    """Two of a side's three processes running twice as slow double the halves' median
    ratio; the fastest-process ratio stays at the code's own cost."""
    meds = [100.0, 200.0, 99.0, 210.0, 100.5, 100.0]
    by_median, by_fastest = gs.halves(meds)
    assert by_median == pytest.approx(2.0)
    assert by_fastest == pytest.approx(100.0 / 99.0)


def test_estimators_one_rare_process_moves_the_pooled_quantile_only():
    """A/A where one of the base's four processes runs fast (a rare mode of the host): the
    gate's pooled 0.1 quantile follows it, the per-process candidates do not; a head slower
    by 10% in every process moves every estimator by 10%. Only host-paced points (and
    complete processes) are compared."""
    per = 5

    def proc(level, spread=(1.00, 1.02, 1.04, 1.06, 1.08)):
        return [level * x for x in spread]

    typical = proc(500.0) + proc(505.0) + proc(498.0) + proc(502.0)
    base = {
        "nsa.A.track_time_host(1)": proc(380.0) + proc(500.0) + proc(505.0) + proc(498.0),
        "nsa.A.track_time_host(2)": typical,
        "nsa.A.track_time(1)": typical,  # a graph figure: not compared
        "nsa.A.track_time_eager(1)": typical[:3],  # no complete process
    }
    head = {
        "nsa.A.track_time_host(1)": typical,
        "nsa.A.track_time_host(2)": [1.1 * x for x in typical],
        "nsa.A.track_time(1)": typical,
        "nsa.A.track_time_eager(1)": typical,
    }
    table = gs.estimator_ratios(base, head, per)
    assert list(table) == ["nsa.A.track_time_host(1)", "nsa.A.track_time_host(2)"]
    rare, shifted = table["nsa.A.track_time_host(1)"], table["nsa.A.track_time_host(2)"]
    assert rare["n"] == (4, 4)
    assert rare["pooled_q"] > 1.2  # the fast base process decides the pooled quantile
    for e in ("median_process_q", "second_process_q", "median_process_median"):
        assert rare[e] == pytest.approx(1.0, abs=0.01), e
    for e in gs.ESTIMATORS:
        assert shifted[e] == pytest.approx(1.1), e
    one = gs.side_estimates(proc(100.0), per)
    assert one["n"] == 1 and one["second_process_q"] == one["median_process_q"]
    assert gs.side_estimates([1.0] * (per - 1), per) is None
    md = gs.estimators_markdown(table)
    assert "| `nsa.A.track_time_host(2)` | 4 / 4 | 1.1000 | 1.1000 | 1.1000 | 1.1000 |" in md
    assert md.splitlines()[-1].startswith("| range | | ")
    assert "No point" in gs.estimators_markdown({})


def test_estimators_command_reads_stored_results(monkeypatch, capsys):
    """`gate_study.py estimators`: both commits' stored samples, the suite's samples per
    process unless given, the table printed."""
    stored = {"b": {"x.track_time_host(1)": [1.0, 1.0]}, "h": {"x.track_time_host(1)": [2.0, 2.0]}}
    monkeypatch.setattr(gs, "stored_samples", lambda results, machine, c: stored[c])
    gs.main(["estimators", "--results", "r", "--machine", "m", "--base", "b", "--head", "h",
             "--per-process", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert "| `x.track_time_host(1)` | 1 / 1 | 2.0000 | 2.0000 | 2.0000 | 2.0000 |" in out


def test_choose_amounts_interpolates_and_extrapolates():
    curve = {64: 0.5, 128: 1.5, 256: 3.0, 512: 6.0, 1024: 12.0}
    assert gs.choose_amounts(curve, (1, 2, 5, 10, 20)) == {
        1: 96,
        2: 171,
        5: 427,
        10: 853,
        20: 1707,
    }
    # A noisy, non-monotone curve is made non-decreasing first; amounts are at least 1.
    assert gs.choose_amounts({1: 2.0, 2: 1.0, 4: 4.0}, (1.5, 3.0)) == {1.5: 1, 3.0: 3}
    assert gs.choose_amounts({8: 0.0}, (1,)) == {1: 8}  # nothing measurable: the largest


def test_slowdowns():
    assert gs.slowdowns({0: 2.0, 5: 2.02, 9: 2.2}) == pytest.approx({5: 1.0, 9: 10.0})


def test_parse_continuous_and_record():
    rows = gs.parse(CONTINUOUS_OUT)  # the PR comment's parser, ci.render_comment.parse
    assert [(r.mark, r.ratio) for r in rows] == [("+", "4.05"), ("-", "0.50")]
    nsa_point = "nsa.NsaForward.track_time(40, 'triton', 'tiny-seed', 'random')"
    assert rows[0].name == nsa_point
    base = {nsa_point: 0.254, "other(1)": 1.0, "only_base(1)": 1.0}
    head = {nsa_point: 1.03, "other(1)": 1.01}
    rec = gs.record_try("detect", CONTINUOUS_OUT, 1, base, head, kernel="nsa", extra=3000)
    assert rec["worse"] == [nsa_point] and len(rec["better"]) == 1 and rec["rc"] == 1
    assert rec["ratios"] == pytest.approx({nsa_point: 1.03 / 0.254, "other(1)": 1.01})
    assert rec["kernel"] == "nsa" and rec["extra"] == 3000
    assert gs.parse("BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n") == []
    # With the second stage: a flag it rejudged (a host figure's, cleared on its estimator
    # without a re-run) counts as no flag, either way; stage 1's lists keep it.
    kda_point = rows[1].name
    confirm = {"suspects": [], "compare": "", "rc": 0, "rejudged": [nsa_point, kda_point]}
    rec = gs.record_try("aa", CONTINUOUS_OUT, 1, base, head, confirm=confirm)
    assert rec["worse"] == [] and rec["better"] == [] and rec["rc"] == 0
    assert rec["stage1_worse"] == [nsa_point] and rec["stage1_better"] == [kda_point]


def test_matching():
    recs = [{"kernel": "nsa", "extra": 1, "try_": 1}, {"kernel": "kda", "extra": 1, "try_": 2}]
    assert gs.matching(recs, kernel="kda") == recs[1:]
    assert gs.matching(recs, kernel=None, extra=1) == recs
    assert gs.matching(recs, kernel="nsa", try_=2) == []


def calibration():
    return {
        "kernel": "nsa",
        "reference": "p(1)",
        "targets": {"1": 10, "2": 20},
        "extras": [10, 20],
        "ladder_pct": {"10": 0.9, "20": 2.1},
        "points": {
            "p(1)": {"base_s": 1e-3, "slowdown_pct": {"10": 0.8, "20": 2.1}},
            "p(2)": {"base_s": 2e-3, "slowdown_pct": {"10": 0.1, "20": 0.3}},
        },
    }


def detect_records():
    def rec(extra, t, worse):
        r = {"p(1)": 1.0 + extra / 1000, "p(2)": 1.0}
        return {
            "kind": "detect",
            "kernel": "nsa",
            "extra": extra,
            "try_": t,
            "rc": int(bool(worse)),
            "worse": worse,
            "better": [],
            "ratios": r,
            "wall_s": 5,
        }

    return [rec(10, 1, ["p(1)"]), rec(10, 2, []), rec(20, 1, ["p(1)"]), rec(20, 2, ["p(1)"])]


def test_detection_table():
    table = gs.detection_table(detect_records(), calibration())
    p1, p2 = table["p(1)"], table["p(2)"]
    assert p1["amounts"]["10"]["flagged"] == 1 and p1["amounts"]["10"]["tries"] == 2
    assert p1["amounts"]["20"]["ratios"] == [1.02, 1.02]
    assert p1["smallest_pct"] == 2.1  # +0.8% was flagged in one try of two only
    assert p2["smallest_pct"] is None
    md = gs.detection_markdown("nsa", table, calibration())
    assert "+2.1%: 2/2 (1.020, 1.020)" in md and "| never |" in md and "*" not in md
    # A try with the second stage: the points it re-ran carry a star on their ratio.
    recs = detect_records()
    recs[3]["suspects"] = ["p(1)"]
    md = gs.detection_markdown("nsa", gs.detection_table(recs, calibration()), calibration())
    assert "+2.1%: 2/2 (1.020, 1.020*)" in md and "(*: re-run by the second stage" in md


def test_summary_from_a_study_directory(tmp_path):
    (tmp_path / "noise.json").write_text(json.dumps(gs.noise_table({"a(1)": [1e-5] * 20}, 10)))
    aa = {
        "kind": "aa",
        "rc": 0,
        "worse": [],
        "better": ["b(2)"],
        "ratios": {"b(2)": 0.93},
        "wall_s": 100,
    }
    (tmp_path / "aa.jsonl").write_text(json.dumps(aa) + "\n")
    (tmp_path / "calibration-nsa.json").write_text(json.dumps(calibration()))
    (tmp_path / "detect.jsonl").write_text("".join(json.dumps(r) + "\n" for r in detect_records()))
    md = gs.summary_markdown(tmp_path, "1.05")
    assert "| `a(1)` | 2 | 10.0 us | 0.00 | 0.00 |" in md
    assert "A/A: 1 tries, 1 flags over 1 point comparisons." in md
    assert "## Detection: nsa.NsaForward" in md and "| `p(2)` |" in md
    assert "Detection: kda" not in md  # no calibration for it


def test_scratch_repository_and_slow_commit(tmp_path):
    repo = tmp_path / "repo"
    base, aa = gs.make_clone(repo, tmp_path / "env")
    assert gs.git(repo, "diff", "--name-only", base, aa) == "docs/gate-study-aa.md"
    assert gs.make_clone(repo, tmp_path / "env") == (base, aa)  # reused
    conf = json.loads((repo / "noise.conf.json").read_text())
    assert conf["results_dir"] == "results-noise" and conf["env_dir"] == str(tmp_path / "env")
    head = gs.slow_commit(repo, "kda", 11)
    assert gs.slow_commit(repo, "kda", 11) == head
    path = gs.KERNELS["kda"].path
    assert gs.git(repo, "diff", "--name-only", base, head) == path
    want = gs.patch_source(source("kda"), gs.KERNELS["kda"].hunks, 11)
    assert gs.git(repo, "show", f"{head}:{path}") + "\n" == want
    assert (repo / path).read_text() == source("kda")  # the working tree is untouched
    assert gs.git(repo, "status", "--porcelain", "--untracked-files=no") == ""
    # Two kernel families in one commit, each file patched with its own amount.
    both = gs.slow_commit(repo, "nsa_loop", 5, "kda_loop", 7)
    paths = {gs.KERNELS[k].path: (k, e) for k, e in (("nsa_loop", 5), ("kda_loop", 7))}
    assert set(gs.git(repo, "diff", "--name-only", base, both).split()) == set(paths)
    for p, (k, e) in paths.items():
        want = gs.patch_source(source(k), gs.KERNELS[k].hunks, e)
        assert gs.git(repo, "show", f"{both}:{p}") + "\n" == want
    with pytest.raises(ValueError, match="one per patched file"):
        gs.slow_commit(repo, "nsa_loop", 5, "nsa_host", 7)  # both patch forward.py


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["nsa_loop", "kda_loop", "nsa_bwd_loop", "nsa_host"])
def test_calibrate_in_smoke_mode(kernel, tmp_path):
    """`calibrate` of the detect stage's default patches on the smoke suite (CPU): the
    kernel's first gated point (`--first 1`: each costs seconds under the interpreter) is
    set up, rebound to the patched kernel, checked bit for bit against the original and
    timed."""
    out = tmp_path / "cal.json"
    env = dict(os.environ, ATTNBENCH_SMOKE="1", TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    res = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "dev" / "gate_study.py"), "calibrate", kernel,
         "--out", str(out), "--extras", "3", "--reps", "1", "--first", "1"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    cal = json.loads(out.read_text())
    if not gs._bench_module().SMOKE:
        pytest.skip("this process sees the GPU grid, the calibration ran the smoke grid")
    _, points = gs.gated_points(kernel)
    methods = gs.KERNELS[kernel].methods
    assert cal["extras"] == [3] and len(cal["points"]) == len(methods) and points
    for row in cal["points"].values():
        assert row["base_s"] > 0 and set(row["slowdown_pct"]) == {"3"}


REFERENCE_POINT = r"nsa\.NsaForward\.track_time\(.*'reference'"


def host_python_without_asv(tmp_path):
    """(HOST_PY, ASV_HOST_TOOLS) shaped like the GPU host's: its python cannot import asv
    (a stand-in package behind every PYTHONPATH entry, ahead of site-packages, refuses),
    asv_host_env.sh's tools directory can, so only a command that keeps PYTHONPATH finds it."""
    import asv

    shadow, tools = tmp_path / "no-asv", tmp_path / "hosttools"
    (shadow / "asv").mkdir(parents=True)
    (shadow / "asv" / "__init__.py").write_text("raise ImportError('asv: not on this path')\n")
    tools.mkdir()
    (tools / "asv").symlink_to(Path(asv.__file__).parent)
    wrapper = tmp_path / "host-python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{shadow}" exec {smoke.VPY} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper), str(tools)


def run_study_smoke(tmp_path, host_py=None, **knobs):
    """tools/dev/gpu_gate_study.sh in smoke mode with these knobs; returns (log, out, study)."""
    reason = smoke.available()
    if reason:
        pytest.skip(reason)
    home, out, study = tmp_path / "home", tmp_path / "out", tmp_path / "study"
    smoke.register_machine(home)
    env = dict(
        smoke.env(home),
        HOST_PY=host_py or str(smoke.VPY),
        MACHINE=smoke.MACHINE,
        OUT=str(out),
        STUDY=str(study),
        ASV_ENV_DIR=str(smoke.SHARED_ENV_DIR),
        WHEELHOUSE=str(tmp_path / "none"),
        **knobs,
    )
    res = subprocess.run(
        ["bash", str(ROOT / "tools" / "dev" / "gpu_gate_study.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert sorted(os.listdir(out)) == ["gate_study.log", "study.tar.gz", "summary.md"]
    return log, out, study


def test_noise_stage_end_to_end_in_smoke_mode(tmp_path):
    """tools/dev/gpu_gate_study.sh, noise stage, 2 processes of the fast reference benchmark,
    pinned to one core (CPU_AFFINITY: asv's --cpu-affinity)."""
    log, out, study = run_study_smoke(
        tmp_path, STAGES="noise", NOISE_N="2", NOISE_BENCH=REFERENCE_POINT, CPU_AFFINITY="0"
    )
    noise = json.loads((study / "noise.json").read_text())
    ((name, stats),) = noise.items()
    assert name == "nsa.NsaForward.track_time(40, 'reference', 'tiny-seed', 'random')"
    assert stats["n"] == 2 and len(stats["medians_s"]) == 2
    assert "noise round 2: exit 0" in log and "noise round 3" not in log
    assert "## Noise" in (out / "summary.md").read_text()


def test_aa_with_the_second_stage_end_to_end_in_smoke_mode(tmp_path):
    """tools/dev/gpu_gate_study.sh, one A/A try with CONFIRM_ROUNDS=1: ci.confirm re-runs its
    suspect (every point, --suspect 1) one more process per side, appended to the stored
    samples, and the record holds the two-stage verdict with stage 1's beside it. The host
    python is the GPU host's kind: asv only through asv_host_env.sh's PYTHONPATH.
    CONFIRM_SURE out of reach: a tiny CPU timing on a loaded machine can read 3x slower in
    stage 1, and a flag beyond doubt would skip the re-run this test is about."""
    host_py, tools = host_python_without_asv(tmp_path)
    log, out, study = run_study_smoke(
        tmp_path, host_py, STAGES="aa", AA_TRIES="1", AA_BENCH=REFERENCE_POINT, FACTOR="3",
        CONFIRM_ROUNDS="1", CONFIRM_SUSPECT="1", CONFIRM_FACTOR="3", CONFIRM_SURE="1e9",
        ASV_HOST_TOOLS=tools,
    )  # fmt: skip
    (rec,) = gs.read_jsonl(study / "aa.jsonl")
    name = "nsa.NsaForward.track_time(40, 'reference', 'tiny-seed', 'random')"
    assert rec["suspects"] == [name] and rec["rc"] == 0 and "stage1_worse" in rec, rec
    assert set(rec["stage1_ratios"]) == {name} and rec["stage1_ratios"][name] > 0
    assert "confirm: exit 0" in log
    per_process = gs.default_per_process()
    for commit in (rec["base"], rec["head"]):
        samples = gs.stored_samples(study / "repo" / "results-gate", smoke.MACHINE, commit)
        assert len(samples[name]) == 3 * per_process  # two rounds of stage 1, one of stage 2
    # The estimators' table of the try (no host-paced point in this one).
    assert "No point" in (study / "logs" / "aa-1-estimators.md").read_text()
    # The returned archive carries those results, each commit's file as stored.
    with tarfile.open(out / "study.tar.gz") as tar:
        names = tar.getnames()
    for commit in (rec["base"], rec["head"]):
        assert any(
            n.startswith("./results/results-gate/") and f"/{commit[:8]}-" in n for n in names
        ), names


def test_detect_takes_an_earlier_calibration(tmp_path):
    """CALIBRATION_FROM: the detect stage copies an earlier call's calibration instead of
    calibrating (DETECT_TRIES=0: no asv run, only the amounts it would test); an amount it
    lacks is added, uncalibrated."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "calibration-nsa_loop.json").write_text(json.dumps(sweep_calibration()))
    log, _, study = run_study_smoke(
        tmp_path, STAGES="detect", DETECT_KERNELS="nsa_loop", DETECT_TRIES="0",
        CALIBRATION_FROM=str(earlier), DETECT_EXTRAS_NSA_LOOP="20 30",
    )  # fmt: skip
    assert "calibration from" in log and "EXTRA amounts 20 30 (" in log, log[-3000:]
    assert "amounts 30 not in the calibration: uncalibrated" in log
    assert "calibrate nsa_loop" not in log
    cal = json.loads((study / "calibration-nsa_loop.json").read_text())
    assert cal["extras"] == [10, 20, 30] and cal["uncalibrated"] == [30]
    assert cal["points"]["big(1)"]["slowdown_pct"] == {"10": 1.0, "20": 3.0, "30": None}


def test_uncalibrated_amounts_show_asv_ratios_alone():
    cal, added = gs.add_uncalibrated(calibration(), [20, 40])
    assert added == [40] and cal["extras"] == [10, 20, 40] and cal["uncalibrated"] == [40]
    assert calibration()["extras"] == [10, 20]  # the input is not changed
    recs = detect_records()
    recs += [dict(r, extra=40, ratios={"p(1)": 1.04, "p(2)": 1.03}, worse=["p(1)", "p(2)"])
             for r in recs[:2]]  # fmt: skip
    table = gs.detection_table(recs, cal)
    # p(2) was flagged in both tries of the uncalibrated amount only: no calibrated smallest.
    assert table["p(2)"]["amounts"]["40"]["flagged"] == 2 and table["p(2)"]["smallest_pct"] is None
    assert table["p(1)"]["smallest_pct"] == 2.1
    md = gs.detection_markdown("nsa", table, cal)
    assert "n/c: 2/2 (1.040, 1.040)" in md and "n/c: an amount the calibration did not time" in md
    assert gs.smallest_always_flagged(table["p(2)"]) is None
    groups, skipped, _ = gs.sweep_points(cal)
    assert skipped == [] and groups[">= 100 us"] == ["p(1)", "p(2)"]
    assert gs.add_uncalibrated(cal, [10, 40]) == (cal, [])


# ---------------------------------------------------------------------------------------
# Several study directories and the post-hoc factor sweep (run factor 1.01)


def try_record(kind, ratios, worse=(), better=(), extra=None, try_=None):
    return {
        "kind": kind,
        "kernel": "nsa" if kind == "detect" else None,
        "extra": extra,
        "try_": try_,
        "rc": int(bool(worse)),
        "worse": list(worse),
        "better": list(better),
        "ratios": ratios,
        "wall_s": 5,
    }


def sweep_calibration():
    """Two points of >= 100 us (one exactly on the bound), one of 10-100 us, one under 10 us
    and one the patch never slowed."""

    def point(base_s, pct10, pct20):
        return {"base_s": base_s, "slowdown_pct": {"10": pct10, "20": pct20}}

    return {
        "kernel": "nsa",
        "reference": "big(1)",
        "targets": {"1": 10, "3": 20},
        "extras": [10, 20],
        "points": {
            "big(1)": point(2e-4, 1.0, 3.0),
            "big(2)": point(1e-4, 2.0, 4.0),
            "mid(1)": point(5e-5, 0.5, 2.5),
            "tiny(1)": point(5e-6, 9.0, 9.0),
            "flat(1)": point(1e-3, -0.5, 0.0),
        },
    }


def sweep_detect(try_):
    """Two tries' detect records; mid(1) at +20 steps has ratio 1.02 in try 1, 1.03 in try 2."""
    flagged = ["big(1)", "big(2)"]
    low = {"big(1)": 1.012, "big(2)": 1.025, "mid(1)": 1.004, "flat(1)": 1.0, "tiny(1)": 1.0}
    high = {"big(1)": 1.035, "big(2)": 1.045, "mid(1)": 1.01 + 0.01 * try_, "tiny(1)": 1.0}
    return [
        try_record("detect", low, flagged, extra=10, try_=try_),
        try_record("detect", high, [*flagged, "mid(1)"], extra=20, try_=try_),
    ]


def test_aa_table_shows_stage_1_beside_the_second_stage():
    one = try_record("aa", {"w(1)": 1.004, "b(1)": 0.999})
    two = try_record("aa", {"w(1)": 1.001, "b(1)": 0.9967})
    two.update(stage1_worse=[], stage1_better=["b(1)"], stage1_ratios={"w(1)": 1.0, "b(1)": 0.97})
    assert "stage 1" not in gs.aa_markdown([one])
    md = gs.aa_markdown([one, two])
    row1, row2 = (ln for ln in md.splitlines() if ln.startswith(("| 1 |", "| 2 |")))
    assert row2.endswith("0 worse, 1 better (`b(1)`); 0.9700 `b(1)` |"), row2
    assert row2.count("|") == row1.count("|") and "| 0 " in row2  # no flag after stage 2
    assert "2 tries, 0 flags over 4 point comparisons" in md


def test_kept_flags_drop_a_flag_whose_ratio_is_not_beyond_the_factor():
    rec = try_record("aa", {"w(1)": 1.02, "b(1)": 0.985, "x(1)": 1.2}, ["w(1)", "gone(1)"])
    rec["better"] = ["b(1)"]
    everything = {"w(1)": "worse", "gone(1)": "worse", "b(1)": "better"}
    assert gs.kept_flags(rec) == everything  # the run's own flags; x(1) was never flagged
    assert gs.kept_flags(rec, 1.01) == everything
    # 1/1.02 = 0.9804 < 0.985: the better flag goes; 1.02 is not above 1.02: so does w(1).
    # A flag without a ratio (newly failing) stays at every factor.
    assert gs.kept_flags(rec, 1.02) == {"gone(1)": "worse"}
    assert gs.aa_flags_at([rec], 1.015) == [
        (1, "b(1)", "better", 0.985),
        (1, "gone(1)", "worse", None),
        (1, "w(1)", "worse", 1.02),
    ]


def test_detection_table_at_a_larger_factor():
    cal, recs = sweep_calibration(), sweep_detect(1) + sweep_detect(2)
    at_run = gs.detection_table(recs, cal)
    assert at_run == gs.detection_table(recs, cal, 1.01)
    assert at_run["big(1)"]["smallest_pct"] == 1.0
    # +1.0% was flagged at ratio 1.012: not at 1.02, where +3.0% (ratio 1.035) is the smallest.
    at_102 = gs.detection_table(recs, cal, 1.02)
    assert at_102["big(1)"]["amounts"]["10"]["flagged"] == 0
    assert at_102["big(1)"]["smallest_pct"] == 3.0
    assert at_102["mid(1)"]["amounts"]["20"]["flagged"] == 1  # ratio 1.02 in try 1: dropped


def test_sweep_groups_points_by_base_time():
    groups, skipped, below = gs.sweep_points(sweep_calibration())
    assert groups == {">= 100 us": ["big(1)", "big(2)"], "10-100 us": ["mid(1)"]}
    assert skipped == ["flat(1)"] and below == ["tiny(1)"]
    # A threshold skips points whose slowdowns all stay at or under it.
    assert gs.sweep_points(sweep_calibration(), 3.5)[1] == ["big(1)", "mid(1)", "flat(1)"]
    table = gs.detection_table(sweep_detect(1) + sweep_detect(2), sweep_calibration(), 1.04)
    assert gs.group_cell(table, groups[">= 100 us"]) == "never (1 of 2 points)"  # big(1)
    assert gs.group_cell(table, ["big(2)"]) == "+4.0% (asv 1.045)"
    assert gs.group_cell(table, []) == "-"
    # Amounts that did not slow a point do not count, even when flagged in every try.
    assert gs.smallest_always_flagged(table["flat(1)"]) is None


def test_summary_merges_study_directories_and_sweeps_factors(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()

    def write(path, records):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    write(a / "aa.jsonl", [try_record("aa", {"b(1)": 0.985}, better=["b(1)"])])
    write(b / "aa.jsonl", [try_record("aa", {"w(1)": 1.015, "x(1)": 1.0}, ["w(1)"])])
    write(a / "detect.jsonl", sweep_detect(1))
    write(b / "detect.jsonl", sweep_detect(2))
    (b / "calibration-nsa.json").write_text(json.dumps(sweep_calibration()))

    md = gs.summary_markdown([a, b], "1.01", factors=(1.005, 1.01, 1.02))
    assert "A/A: 2 tries, 2 flags over 3 point comparisons." in md
    assert "| `big(1)` | +1.0%: 2/2 (1.012, 1.012) |" in md  # tries from both directories
    sweep = md[md.index("## Factor sweep (post hoc)") :]
    assert "Skipped factor(s) 1.005: below the run's 1.01" in sweep
    assert "| factor | A/A false positives | `nsa` >= 100 us | `nsa` 10-100 us |" in sweep
    rows = [
        "| 1.01 | 2 / 3 comparisons (2 tries) | +2.0% (asv 1.025) | +2.5% (asv 1.025) |",
        "| 1.02 | 0 / 3 comparisons (2 tries) | +3.0% (asv 1.035) | never (1 of 1 points) |",
        "- 1.01: `b(1)` (try 1, better, ratio 0.9850), `w(1)` (try 2, worse, ratio 1.0150)",
    ]
    assert all(row in sweep for row in rows), sweep
    assert "- 1.02: none" in sweep and "- 1.02: `mid(1)`" in sweep
    assert "1 under 10 us (in no column); 1 skipped" in sweep and "`flat(1)`" in sweep
    assert "Factor sweep" not in gs.summary_markdown(a, "1.01")  # none without --factors

    gs.main(["summary", str(a), str(b), "--factor", "1.01", "--factors", "1.02"])
    assert "| 1.02 | 0 / 3 comparisons (2 tries) |" in capsys.readouterr().out
