"""tools/report.py on hand-made asv result files: tables, n/a reasons, OOM ceiling,
crossover, plots, and the figures it derives from the stored times and ceilings."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ci import na_reasons  # noqa: E402

spec = importlib.util.spec_from_file_location("report", ROOT / "tools" / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

SEQ = [512, 1024, 2048, 4096]
COLUMNS = ["result", "params", "version", "started_at", "duration"]


def _entry(params, values):
    return [values, [[repr(v) for v in axis] for axis in params], "1", 0, 1.0]


def _nsa_results(kernel_s, ref_s, ref_bytes):
    """NsaForward figures for the seed preset, recent pattern: kernel and reference."""
    params = [SEQ, ["triton", "reference"], ["seed"], ["recent"]]

    # asv orders values as itertools.product(*params): seq_len outermost, impl next.
    def flat(kernel, ref):
        return [x for pair in zip(kernel, ref, strict=True) for x in pair]

    return {
        "nsa.NsaForward.track_time": _entry(params, flat(kernel_s, ref_s)),
        "nsa.NsaForward.track_peak_vram_bytes": _entry(params, flat([1e8] * 4, ref_bytes)),
    }


def _write(results, machine, name, data):
    (results / machine).mkdir(parents=True, exist_ok=True)
    (results / machine / name).write_text(json.dumps(data))


NAN = float("nan")
MATMUL_TFLOPS, COPY_GB_PER_S = 500.0, 4000.0  # the ceilings stored for commit a
REF_PARAMS = ["'reference'", "'seed'", "'recent'"]


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "results"
    kernel = [1e-4, 2e-4, 4e-4, 8e-4]
    # Kernel wins from 1024; the reference runs out of memory at 2048 (recorded in the OOM
    # log) and is skipped at 4096 (NaN with no log line).
    ref = [5e-5, 3e-4, NAN, NAN]
    data = _nsa_results(kernel, ref, [2e8, 8e8, NAN, NAN])
    kda_params = [[1, 64], ["unfused", "fused+ring"], ["safe"], ["H8-HV8"]]
    data["kda.KdaVerify.track_time"] = _entry(kda_params, [2e-5, 1e-5, 9e-5, 3e-5])
    data["kda.KdaVerify.track_time_cold"] = _entry(kda_params, [3e-5, 1.5e-5, 2e-4, None])
    data["ceilings.Matmul.track_bf16_tflops"] = [MATMUL_TFLOPS, [], "1", 0, 1.0]
    data["ceilings.CopyRate.track_copy_gb_per_s"] = [COPY_GB_PER_S, [], "1", 0, 1.0]
    _write(res, "h200", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 2, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    log = na_reasons.log_path(res, "h200")
    for method in ("track_time", "track_peak_vram_bytes"):
        na_reasons.record_oom(log, "a" * 40, f"nsa.NsaForward.{method}", ["2048", *REF_PARAMS])
    # An OOM of another commit is not this one's.
    na_reasons.record_oom(log, "b" * 40, "nsa.NsaForward.track_time", ["4096", *REF_PARAMS])
    # An older commit whose figures (ceilings included, under the names they had before
    # benchmarks/ceilings.py) must not be used, and an unreadable file.
    old = _nsa_results([1.0] * 4, [1.0] * 4, [1.0] * 4)
    old["common.Matmul.track_bf16_tflops"] = [1.0, [], "1", 0, 1.0]
    old["common.CopyRate.track_copy_gb_per_s"] = [1.0, [], "1", 0, 1.0]
    _write(res, "h200", "bbbbbbbb-virtualenv-py3.12.json", {
        "commit_hash": "b" * 40, "date": 1, "result_columns": COLUMNS, "results": old,
    })  # fmt: skip
    _write(res, "h200", "cccccccc-broken.json", {"no": "results"})
    (res / "h200" / "dddddddd-truncated.json").write_text("{")
    _write(res, "h200", "machine.json", {"machine": "h200"})
    return res


def test_nsa_table_ceiling_and_crossover(results, tmp_path):
    out = tmp_path / "out"
    written = report.build(results, out)
    rows = list(csv.DictReader(open(out / "nsa_forward.csv")))
    assert [int(r["seq_len"]) for r in rows] == SEQ
    assert math.isclose(float(rows[0]["kernel_ms"]), 0.1)
    assert math.isclose(float(rows[1]["ref_vram_gb"]), 0.8)
    assert [r["ref_na"] for r in rows] == ["", "", "out-of-memory", "skipped"]
    assert [r["kernel_na"] for r in rows] == [""] * 4
    assert rows[2]["ref_ms"] == "" and rows[3]["ref_tok_s"] == ""  # n/a, not zero
    summary = (out / "summary.md").read_text()
    assert "reference OOM ceiling from seq_len 2048" in summary
    assert "out of memory at seq_len 2048; skipped by choice at seq_len 4096" in summary
    assert "crossover at seq_len 1024" in summary
    assert "aaaaaaaa" in summary and "bbbbbbbb" not in summary
    assert "recent: kernel time x4.00 from seq_len 1024 to 4096" in summary
    for name in ("vram_vs_seqlen_fwd.png", "toks_vs_seqlen_fwd.png", "kda_verify.md"):
        assert name in written and (out / name).stat().st_size > 0


def test_nan_without_an_oom_record_is_a_skip(results, tmp_path):
    na_reasons.log_path(results, "h200").unlink()
    report.build(results, tmp_path / "out")
    rows = list(csv.DictReader(open(tmp_path / "out" / "nsa_forward.csv")))
    assert [r["ref_na"] for r in rows] == ["", "", "skipped", "skipped"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "OOM ceiling none recorded" in summary and "out of memory" not in summary
    assert "skipped by choice at seq_len 2048, 4096" in summary


def test_default_suite_reference_not_run_and_failures(tmp_path):
    """The default suite has no reference points at all: "not run", never "out of memory";
    asv's null (a failed process) is "failed"."""
    res = tmp_path / "results"
    params = [[4096, 32768], ["triton"], ["seed"], ["recent"]]
    data = {
        "nsa.NsaForward.track_time": _entry(params, [1e-3, None]),
        "nsa.NsaForward.track_peak_vram_bytes": _entry(params, [1e8, None]),
    }
    _write(res, "gpu", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 1, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    out = tmp_path / "out"
    report.build(res, out)
    rows = list(csv.DictReader(open(out / "nsa_forward.csv")))
    assert [(r["kernel_na"], r["ref_na"]) for r in rows] == [("", "not-run"), ("failed", "not-run")]
    summary = (out / "summary.md").read_text()
    assert "out of memory" not in summary and "OOM ceiling none recorded" in summary
    assert "reference n/a: not run at seq_len 4096, 32768" in summary
    assert "recent: kernel n/a: failed at seq_len 32768" in summary


def test_plot_marks_only_a_recorded_oom_inside_the_axes(results):
    """The OOM line is drawn only where an OOM was recorded; every mark is named in the
    legend, which stays inside the axes and off the axis titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report.Results(results)
    rows = report.nsa_table(res, report.NSA["forward"])
    for metric in ("vram_gb", "tok_s"):
        fig, ax = plt.subplots(figsize=(7, 5))
        report.draw_panel(ax, rows, metric, "peak VRAM (GB)", "NSA selection forward - seed")
        fig.tight_layout()
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "reference out of memory from seq_len 2048" in labels
        assert any("skipped by choice at seq_len 4096" in t for t in labels)
        assert ("kernel wins from seq_len 1024" in labels) == (metric == "tok_s")
        assert [line.get_xdata()[0] for line in ax.lines if line.get_label().startswith(
            "reference out of memory")] == [2048]  # fmt: skip
        r = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(r)
        axes_box = ax.get_window_extent(r)
        assert axes_box.x0 <= legend.x0 and legend.x1 <= axes_box.x1
        assert axes_box.y0 <= legend.y0 and legend.y1 <= axes_box.y1
        for title in (ax.xaxis.label, ax.yaxis.label, ax.title):
            assert not legend.overlaps(title.get_window_extent(r)), title.get_text()
        plt.close(fig)
    # Without the log, no OOM line at all.
    na_reasons.log_path(results, "h200").unlink()
    rows = report.nsa_table(report.Results(results), report.NSA["forward"])
    fig, ax = plt.subplots()
    report.draw_panel(ax, rows, "vram_gb", "peak VRAM (GB)", "t")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [t for t in labels if "out of memory" in t]
    plt.close(fig)


def test_eager_figure_beside_the_graph_replay(results, tmp_path):
    """The kernel's eager per-call time (the seed's figure) is tabled and plotted beside
    the graph replay, and the crossover is stated for both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = results / "h200" / "aaaaaaaa-virtualenv-py3.12.json"
    data = json.loads(path.read_text())
    params = [[512, 1024], ["triton"], ["seed"], ["recent"]]
    data["results"]["nsa.NsaForward.track_time_eager"] = _entry(params, [2e-4, 4e-4])
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    report.build(results, out)
    rows = list(csv.DictReader(open(out / "nsa_forward.csv")))
    assert math.isclose(float(rows[1]["kernel_eager_ms"]), 0.4)
    assert math.isclose(float(rows[1]["kernel_eager_tok_s"]), 1024 / 4e-4)
    assert rows[2]["kernel_eager_ms"] == ""
    assert rows[0]["ref_eager_ms"] == "" and rows[0]["ref_eager_tok_s"] == ""  # none stored
    summary = (out / "summary.md").read_text()
    # graph replay: the kernel wins at 1024; eager: 2.56M tokens/s < the reference's 3.4M
    assert "crossover at seq_len 1024 (graph replay), at (none measured) (eager)" in summary
    rows = report.nsa_table(report.Results(results), report.NSA["forward"])
    fig, ax = plt.subplots()
    report.draw_panel(ax, rows, "tok_s", "throughput (tokens/s)", "t")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kernel (Triton) eager, recent" in labels
    assert "kernel (Triton) graph replay, recent" in labels
    assert not [t for t in labels if t.startswith("kernel wins (eager)")]  # none eager
    assert "kernel wins (graph replay) from seq_len 1024" in labels
    plt.close(fig)


def test_kda_table_in_microseconds(results, tmp_path):
    out = tmp_path / "out"
    report.build(results, out)
    rows = {(int(r["batch"]), r["mode"]): r for r in csv.DictReader(open(out / "kda_verify.csv"))}
    assert math.isclose(float(rows[(64, "unfused")]["cold_us"]), 200.0)
    # asv's null is a failure; peak VRAM is in no result file: not run.
    assert rows[(64, "fused+ring")]["cold_us"] == ""
    assert rows[(64, "fused+ring")]["na"] == "failed, not run"
    assert rows[(1, "unfused")]["na"] == "not run"
    md = (out / "kda_verify.md").read_text()
    assert "| batch | unfused | fused+ring |" in md
    assert "| 64 | 90.00 / 200.00 | 30.00 / failed |" in md
    assert "always run the fused kernel" in md  # which form ran: no shape is routed


def test_helpers_on_edge_cases():
    base = {"kernel_tok_s": None, "ref_tok_s": None}
    assert report.oom_ceiling([{"seq_len": 1, "ref_na": ""}]) is None
    assert report.oom_ceiling([{"seq_len": 1, "ref_na": "not-run"}]) is None
    oom_then_measured = [{"seq_len": 1, "ref_na": "out-of-memory"}, {"seq_len": 2, "ref_na": ""}]
    assert report.oom_ceiling(oom_then_measured) is None  # an OOM below a measured point
    assert report.crossover([{"seq_len": 1, **base}]) is None
    assert report._value("'triton'") == "triton" and report._value("4096") == 4096
    assert report._number(float("nan")) is None and report._number(2) == 2.0


def test_na_reasons_encoding(tmp_path):
    R = na_reasons.NaReason
    assert na_reasons.classify(1.5) is None and na_reasons.classify(0) is None
    assert na_reasons.classify(None) is R.FAILED
    assert na_reasons.classify(NAN) is R.SKIPPED
    assert na_reasons.classify(NAN, oom=True) is R.OUT_OF_MEMORY
    assert na_reasons.classify(1.5, present=False) is R.NOT_RUN
    assert na_reasons.classify(True) is R.SKIPPED  # a bool is not a figure
    assert {r.label for r in R} == {"out of memory", "failed", "skipped by choice", "not run"}
    assert na_reasons.describe([None, R.NOT_RUN, R.OUT_OF_MEMORY, R.NOT_RUN]) == (
        "out of memory, not run"
    )
    log = tmp_path / "m" / "na_reasons.jsonl"
    assert na_reasons.load_oom(log) == set()
    na_reasons.record_oom(log, "c" * 40, "nsa.NsaForward.track_time", ["512", "'reference'"])
    with open(log, "a") as fh:  # a line cut short, and a line of another reason
        fh.write('{"commit": "d"\n{"commit": "e", "benchmark": "x", "params": [], "reason": "x"}\n')
    oom = na_reasons.load_oom(log)
    assert oom == {("c" * 40, "nsa.NsaForward.track_time", ("512", "'reference'"))}
    assert na_reasons.is_oom(oom, "cccccccc", "nsa.NsaForward.track_time", ["512", "'reference'"])
    assert not na_reasons.is_oom(oom, "ccc", "nsa.NsaForward.track_time", ["512", "'reference'"])
    assert not na_reasons.is_oom(
        oom, "c" * 40, "nsa.NsaForward.track_time", ["1024", "'reference'"]
    )


def test_unknown_machine_is_an_error(results, tmp_path):
    with pytest.raises(SystemExit, match="no results for machine"):
        report.build(results, tmp_path / "out", machine="nope")


def test_a_zero_is_a_value(tmp_path):
    """A file whose only figures are 0.0 is the newest with values (0 is not n/a)."""
    res = tmp_path / "results"
    params = [[1], ["fused"], ["safe"], ["H8-HV8"]]
    for commit, date, value in (("a", 2, 0.0), ("b", 1, 5.0)):
        data = {"kda.KdaVerify.track_time_cold": _entry(params, [value])}
        _write(res, "h200", f"{commit * 8}-virtualenv-py3.12.json", {
            "commit_hash": commit * 40, "date": date, "result_columns": COLUMNS, "results": data,
        })  # fmt: skip
    rows = report.Results(res).rows("kda.KdaVerify.track_time_cold")
    assert [(v, r) for _, v, r in rows] == [(0.0, None)]


# ---------------------------------------------------------------- derived figures

# The FLOP count of one call (4 * B * Hq * T * S * block_size * D, times 2.5 for the
# backward): the seed preset's forward at T = 512 and the paper preset's backward at 1024.
SEED_FWD_512_FLOP = 4 * 1 * 16 * 512 * 16 * 64 * 64
PAPER_BWD_1024_FLOP = 4 * 1 * 64 * 1024 * 16 * 64 * 64 * 2.5


def test_nsa_derived_figures_from_the_stored_times(results, tmp_path):
    """tokens/s = B*T / time, TFLOP/s = FLOP / time / 1e12, % of the Matmul ceiling of the
    same commit, for the kernel (graph replay) and the reference, in the CSV and summary."""
    assert SEED_FWD_512_FLOP == 2_147_483_648 == report.nsa_flops("seed", 512, "forward")
    assert PAPER_BWD_1024_FLOP == 42_949_672_960 == report.nsa_flops("paper", 1024, "backward")
    out = tmp_path / "out"
    report.build(results, out)
    rows = {int(r["seq_len"]): r for r in csv.DictReader(open(out / "nsa_forward.csv"))}
    r = rows[512]  # kernel 1e-4 s, reference 5e-5 s
    assert math.isclose(float(r["kernel_tok_s"]), 5.12e6, rel_tol=1e-12)
    assert math.isclose(float(r["kernel_tflops"]), 21.47483648, rel_tol=1e-12)
    assert math.isclose(float(r["kernel_pct_of_matmul"]), 4.294967296, rel_tol=1e-12)
    assert math.isclose(float(r["ref_tok_s"]), 1.024e7, rel_tol=1e-12)
    assert math.isclose(float(r["ref_tflops"]), 42.94967296, rel_tol=1e-12)
    assert math.isclose(float(r["ref_pct_of_matmul"]), 8.589934592, rel_tol=1e-12)
    assert float(r["matmul_tflops"]) == MATMUL_TFLOPS  # commit a's, not commit b's 1.0
    # At 4096 (kernel 8e-4 s): 4096 / 8e-4 tokens/s and 4 * 16 * 4096 * 16 * 64 * 64 FLOP.
    r = rows[4096]
    assert math.isclose(float(r["kernel_tok_s"]), 5.12e6, rel_tol=1e-12)
    assert math.isclose(float(r["kernel_tflops"]), 21.47483648, rel_tol=1e-12)
    assert r["ref_tflops"] == "" and r["ref_pct_of_matmul"] == "" and r["ref_na"] == "skipped"
    summary = (out / "summary.md").read_text()
    assert (
        "recent: kernel at seq_len 4096: 5.12e+06 tokens/s, 21.5 TFLOP/s, 4.3% of the matmul "
        "rate (500 TFLOP/s)"
    ) in summary
    assert "- ceilings.Matmul.track_bf16_tflops: aaaaaaaa" in summary
    assert "common.Matmul" not in summary  # commit b's ceiling is not used


def test_backward_flops_and_a_ceiling_of_another_commit(tmp_path):
    """The backward credits 2.5x the forward's work; a Matmul ceiling stored only for
    another commit is not used: % of matmul is n/a (not run), TFLOP/s stays."""
    res = tmp_path / "results"
    params = [[1024], ["triton"], ["paper"], ["random"]]
    new = {"nsa.NsaBackward.track_time": _entry(params, [2e-3])}
    old = {"common.Matmul.track_bf16_tflops": [700.0, [], "1", 0, 1.0]}
    for commit, date, data in (("a", 2, new), ("b", 1, old)):
        _write(res, "h200", f"{commit * 8}-virtualenv-py3.12.json", {
            "commit_hash": commit * 40, "date": date, "result_columns": COLUMNS, "results": data,
        })  # fmt: skip
    out = tmp_path / "out"
    report.build(res, out)
    (r,) = csv.DictReader(open(out / "nsa_backward.csv"))
    assert math.isclose(float(r["kernel_tflops"]), 21.47483648, rel_tol=1e-12)
    assert math.isclose(float(r["kernel_tok_s"]), 512_000.0, rel_tol=1e-12)
    assert r["kernel_pct_of_matmul"] == "" and r["matmul_tflops"] == ""
    assert r["kernel_na"] == ""  # the kernel's time was measured
    summary = (out / "summary.md").read_text()
    assert "% of the matmul rate n/a (no Matmul ceiling stored for this commit)" in summary
    rows = report.nsa_table(report.Results(res), report.NSA["backward"])
    assert rows[0]["kernel_pct_of_matmul"] is None


def test_kda_bandwidth_from_the_cold_time_and_the_copy_rate(results, tmp_path):
    """% of copy rate = 100 * the spec's bytes per call / cold time / the CopyRate of the
    same commit (4000 GB/s): B = 64 unfused moves 64 * 2754624 bytes in 200 us."""
    assert report.kda_verify_bytes(1, "H8-HV8", "unfused") == 2_754_624
    assert report.kda_verify_bytes(1, "H8-HV8", "fused+ring") == 690_368
    out = tmp_path / "out"
    report.build(results, out)
    bw = {(int(r["batch"]), r["mode"]): r for r in csv.DictReader(open(out / "kda_bandwidth.csv"))}
    r = bw[(64, "unfused")]
    assert int(r["bytes"]) == 64 * 2_754_624
    assert math.isclose(float(r["gb_per_s"]), 881.47968, rel_tol=1e-12)
    assert math.isclose(float(r["pct_of_copy"]), 22.036992, rel_tol=1e-12)
    assert float(r["copy_gb_per_s"]) == COPY_GB_PER_S
    r = bw[(1, "fused+ring")]  # 690368 bytes in 15 us
    assert math.isclose(float(r["pct_of_copy"]), 100 * 690_368 / 15e-6 / 4e12, rel_tol=1e-12)
    assert bw[(64, "fused+ring")]["pct_of_copy"] == "" and bw[(64, "fused+ring")]["na"] == "failed"
    md = (out / "kda_bandwidth.md").read_text()
    assert "Copy rate of the same commit (CopyRate): 4000 GB/s." in md
    assert "| 64 | 22.0% | failed |" in md


def _ceiling_results(tmp_path, ceilings):
    """One commit's results: an NSA forward time (seed preset, T = 512, 1e-4 s: 21.47...
    TFLOP/s), a KDA cold time (B = 1, fused+ring: 690368 bytes in 15 us) and `ceilings`
    ({benchmark name: value})."""
    res = tmp_path / "results"
    data = _nsa_results([1e-4] * 4, [NAN] * 4, [1e8] * 4)
    kda_params = [[1], ["fused+ring"], ["safe"], ["H8-HV8"]]
    data["kda.KdaVerify.track_time_cold"] = _entry(kda_params, [15e-6])
    data.update({name: [value, [], "1", 0, 1.0] for name, value in ceilings.items()})
    _write(res, "h200", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 1, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    return res


@pytest.mark.parametrize(
    "stored, matmul, copy",
    [
        # Results stored before the move: the ceilings under their benchmarks/common.py names.
        ({"common.Matmul.track_bf16_tflops": 400.0,
          "common.CopyRate.track_copy_gb_per_s": 2000.0}, 400.0, 2000.0),
        # The current names only.
        ({"ceilings.Matmul.track_bf16_tflops": 500.0,
          "ceilings.CopyRate.track_copy_gb_per_s": 4000.0}, 500.0, 4000.0),
        # Both names in the same commit: the current one wins.
        ({"common.Matmul.track_bf16_tflops": 400.0,
          "common.CopyRate.track_copy_gb_per_s": 2000.0,
          "ceilings.Matmul.track_bf16_tflops": 500.0,
          "ceilings.CopyRate.track_copy_gb_per_s": 4000.0}, 500.0, 4000.0),
    ],
)  # fmt: skip
def test_ceilings_are_read_under_their_current_and_former_names(tmp_path, stored, matmul, copy):
    """The ceilings moved from benchmarks/common.py to benchmarks/ceilings.py, so their asv
    names changed: the report reads a commit's ceiling under either name, the current one
    first, for the % of the matmul rate (NSA) and of the copy rate (KDA)."""
    res = _ceiling_results(tmp_path, stored)
    r = report.Results(res)
    assert r.ceiling(report.MATMUL, "nsa.NsaForward.track_time") == (matmul, None)
    assert r.ceiling(report.COPY_RATE, "kda.KdaVerify.track_time_cold") == (copy, None)
    out = tmp_path / "out"
    report.build(res, out)
    rows = {int(x["seq_len"]): x for x in csv.DictReader(open(out / "nsa_forward.csv"))}
    assert float(rows[512]["matmul_tflops"]) == matmul
    pct = 100 * 21.47483648 / matmul
    assert math.isclose(float(rows[512]["kernel_pct_of_matmul"]), pct, rel_tol=1e-12)
    (bw,) = csv.DictReader(open(out / "kda_bandwidth.csv"))
    assert float(bw["copy_gb_per_s"]) == copy
    pct = 100 * 690_368 / 15e-6 / (copy * 1e9)
    assert math.isclose(float(bw["pct_of_copy"]), pct, rel_tol=1e-12)
    used = "ceilings" if "ceilings.Matmul.track_bf16_tflops" in stored else "common"
    summary = (out / "summary.md").read_text()
    assert f"- {used}.Matmul.track_bf16_tflops: aaaaaaaa" in summary
    assert f"- {used}.CopyRate.track_copy_gb_per_s: aaaaaaaa" in summary
    if used == "ceilings":  # the former names, stored beside, are not read
        assert "common.Matmul" not in summary and "common.CopyRate" not in summary


def test_ceilings_under_neither_name_are_not_run(tmp_path):
    """A commit with no ceiling under any name: the percentages are n/a, "not run"."""
    r = report.Results(_ceiling_results(tmp_path, {}))
    not_run = (None, na_reasons.NaReason.NOT_RUN)
    assert r.ceiling(report.MATMUL, "nsa.NsaForward.track_time") == not_run
    assert r.ceiling(report.COPY_RATE, "kda.KdaVerify.track_time_cold") == not_run


def test_kda_fused_over_unfused_ratios(tmp_path):
    """The per-call table by batch in the four modes, with fused / unfused and
    fused+ring / unfused+ring (seed-style / cold) in the markdown and their own CSV."""
    res = tmp_path / "results"
    modes = ["unfused", "unfused+ring", "fused", "fused+ring"]
    params = [[1, 16], modes, ["safe"], ["H8-HV8"]]
    seed = [20e-6, 16e-6, 10e-6, 4e-6, 40e-6, 32e-6, 30e-6, 40e-6]
    cold = [40e-6, 32e-6, 30e-6, 8e-6, 80e-6, 64e-6, None, 16e-6]
    data = {
        "kda.KdaVerify.track_time": _entry(params, seed),
        "kda.KdaVerify.track_time_cold": _entry(params, cold),
    }
    _write(res, "h200", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 1, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    out = tmp_path / "out"
    written = report.build(res, out)
    assert "kda_verify_ratio.csv" in written
    md = (out / "kda_verify.md").read_text()
    assert (
        "| batch | unfused | unfused+ring | fused | fused+ring | fused / unfused "
        "| fused+ring / unfused+ring |"
    ) in md
    assert (
        "| 1 | 20.00 / 40.00 | 16.00 / 32.00 | 10.00 / 30.00 | 4.00 / 8.00 "
        "| 0.50 / 0.75 | 0.25 / 0.25 |"
    ) in md
    assert (
        "| 16 | 40.00 / 80.00 | 32.00 / 64.00 | 30.00 / failed | 40.00 / 16.00 "
        "| 0.75 / failed | 1.25 / 0.25 |"
    ) in md
    rows = {int(r["batch"]): r for r in csv.DictReader(open(out / "kda_verify_ratio.csv"))}
    cols = [f"{t}_{name}" for name, _, _ in report.KDA_RATIOS for t in ("seed", "cold")]
    assert cols == [
        "seed_fused_over_unfused",
        "cold_fused_over_unfused",
        "seed_fused_ring_over_unfused_ring",
        "cold_fused_ring_over_unfused_ring",
    ]
    got = {b: [rows[b][k] for k in cols] for b in rows}
    assert [float(x) for x in got[1]] == pytest.approx([0.5, 0.75, 0.25, 0.25], rel=1e-12)
    assert got[16][1] == "" and rows[16]["na"] == "failed"
    assert [float(got[16][i]) for i in (0, 2, 3)] == pytest.approx([0.75, 1.25, 0.25], rel=1e-12)
    # A table without the unfused modes says the ratios were not run.
    by_mode = {"fused": {"seed_us": 1.0, "_why": {}}}
    assert report._ratio(by_mode, "fused", "unfused", "seed_us") == (
        None,
        na_reasons.NaReason.NOT_RUN,
    )


def test_shapes_agree_with_the_suite():
    """The report's shapes and byte count are the suite's: NSA presets in this process,
    the KDA verify's bytes in smoke (this process) and GPU mode (a fresh one)."""
    from benchmarks import kda, nsa

    for name, p in nsa.PRESETS.items():
        shape = report.NSA_SHAPES[name]
        assert (shape.B, shape.Hq, shape.D, shape.block_size, shape.S) == (
            p.B, p.Hq, p.D, p.block_size, p.S
        ), name  # fmt: skip
    assert kda.SMOKE and set(kda.HEADS) == report.KDA_SMOKE_HEADS
    for B in (1, 3):
        for mode in kda.MODES:
            assert report.kda_verify_bytes(B, "H1-HV2", mode) == kda.verify_bytes(B, 1, 2, mode)
    code = (
        "import json; from benchmarks import kda\n"
        "print(json.dumps([kda.verify_bytes(B, 8, hv, m) for B in (1, 3) for hv in (8, 16)"
        " for m in kda.MODES]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBENCH_", "TRITON_"))}
    env["ATTNBENCH_SMOKE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         capture_output=True, env=env).stdout  # fmt: skip
    gpu = json.loads(out.splitlines()[-1])
    ours = [report.kda_verify_bytes(B, f"H8-HV{hv}", m) for B in (1, 3) for hv in (8, 16)
            for m in ["unfused", "unfused+ring", "fused", "fused+ring"]]  # fmt: skip
    assert ours == gpu


# ---------------------------------------------------------------- the view suite (seed's view)

VIEW_SEQ = [512, 1024, 2048, 4096]
VIEW_PATTERNS = ["recent", "random"]


def _view_results(tmp_path, oom=True):
    """Result files as the view suite writes them (scripts/main.sh, ATTNBENCH_SUITE=view):
    the kernel's graph figure on both patterns; eager and peak VRAM for the kernel on both
    patterns and for the reference on "recent" only (the -b selection leaves the reference's
    "random" points out, and asv stores NaN there). The reference runs out of memory at
    4096 (logged when `oom`)."""
    res = tmp_path / "results"
    graph = {512: 1e-4, 1024: 1e-4, 2048: 2e-4, 4096: 4e-4}
    eager = {512: 2e-4, 1024: 3e-4, 2048: 5e-4, 4096: 9e-4}
    ref_eager = {512: 5e-5, 1024: 2e-4, 2048: 8e-4, 4096: NAN}
    ref_bytes = {512: 2e8, 1024: 8e8, 2048: 3.2e9, 4096: NAN}

    def values(kernel, ref):
        out = []  # asv's order: itertools.product(seq_len, impl, preset, pattern)
        for T in VIEW_SEQ:
            for impl in ("triton", "reference"):
                for pattern in VIEW_PATTERNS:
                    if impl == "triton":
                        out.append(kernel[T])
                    else:
                        out.append(ref[T] if pattern == "recent" else NAN)
        return out

    full = [VIEW_SEQ, ["triton", "reference"], ["seed"], VIEW_PATTERNS]
    kernel_only = [VIEW_SEQ, ["triton"], ["seed"], VIEW_PATTERNS]
    data = {}
    for cls in ("nsa.NsaForward", "nsa.NsaBackward"):
        data[f"{cls}.track_time"] = _entry(kernel_only, [graph[T] for T in VIEW_SEQ for _ in "ab"])
        data[f"{cls}.track_time_eager"] = _entry(full, values(eager, ref_eager))
        data[f"{cls}.track_peak_vram_bytes"] = _entry(full, values({T: 1e8 for T in VIEW_SEQ},
                                                                   ref_bytes))  # fmt: skip
    _write(res, "gpu-view", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 1, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    if oom:
        log = na_reasons.log_path(res, "gpu-view")
        for cls in ("nsa.NsaForward", "nsa.NsaBackward"):
            for method in ("track_time_eager", "track_peak_vram_bytes"):
                params = ["4096", "'reference'", "'seed'", "'recent'"]
                na_reasons.record_oom(log, "a" * 40, f"{cls}.{method}", params)
    return res


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_view_throughput_is_drawn_from_the_eager_figure(tmp_path):
    """Tokens/s of the view: the kernel's and the reference's eager figures (what the seed
    measures) are the tabled and drawn lines, the crossover is the eager one, and the graph
    replay is drawn beside it with its own crossover."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = _view_results(tmp_path)
    out = tmp_path / "out"
    report.build(res, out, title="The seed's view at HEAD")
    rows = list(csv.DictReader(open(out / "nsa_forward.csv")))
    recent = {int(r["seq_len"]): r for r in rows if r["pattern"] == "recent"}
    assert math.isclose(float(recent[512]["ref_eager_ms"]), 0.05)
    assert math.isclose(float(recent[512]["ref_eager_tok_s"]), 512 / 5e-5)
    assert math.isclose(float(recent[2048]["kernel_eager_tok_s"]), 2048 / 5e-4)
    assert recent[512]["ref_ms"] == ""  # the view times the reference eagerly only
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# The seed's view at HEAD: machine gpu-view")
    # graph replay: the kernel wins from 1024; eager (the seed's figure): from 2048
    assert "crossover at seq_len 1024 (graph replay), at seq_len 2048 (eager)" in summary
    table = report.nsa_table(report.Results(res), report.NSA["forward"])
    assert report.crossover(table, "kernel_eager_tok_s") == 2048
    assert report.crossover(table) == 1024
    fig, ax = plt.subplots()
    report.draw_panel(ax, table, "tok_s", "throughput (tokens/s)", "t")
    labels = _legend(ax)
    for label in ("kernel (Triton) eager, recent", "kernel (Triton) graph replay, recent",
                  "reference (dense O(T^2)) eager", "kernel wins (eager) from seq_len 2048",
                  "kernel wins (graph replay) from seq_len 1024"):  # fmt: skip
        assert label in labels, labels
    lines = {line.get_label(): line for line in ax.lines}
    eager_line = lines["kernel (Triton) eager, recent"]
    assert list(eager_line.get_xdata()) == VIEW_SEQ
    assert eager_line.get_ydata()[0] == pytest.approx(512 / 2e-4)
    graph_line = lines["kernel (Triton) graph replay, recent"]
    assert graph_line.get_ydata()[0] == pytest.approx(512 / 1e-4)
    assert graph_line.get_linestyle() != eager_line.get_linestyle()  # a second line style
    ref_line = lines["reference (dense O(T^2)) eager"]
    assert list(ref_line.get_xdata()) == [512, 1024, 2048]  # none where it ran out of memory
    assert ref_line.get_ydata()[1] == pytest.approx(1024 / 2e-4)
    assert "reference (dense O(T^2)), track_time" not in labels  # nothing stored to draw
    plt.close(fig)


def test_view_reference_row_is_lent_to_the_other_pattern(tmp_path):
    """The view runs the reference on one pattern: the other pattern's rows borrow its
    figures, and its out-of-memory reason (not the "skipped" NaN the selection left)."""
    rows = report.nsa_table(report.Results(_view_results(tmp_path)), report.NSA["backward"])
    random = {r["seq_len"]: r for r in rows if r["pattern"] == "random"}
    assert random[1024]["ref_eager_ms"] == pytest.approx(0.2)
    assert random[1024]["ref_vram_gb"] == pytest.approx(0.8)
    assert [random[T]["ref_na"] for T in VIEW_SEQ] == ["", "", "", "out-of-memory"]
    assert [random[T]["kernel_na"] for T in VIEW_SEQ] == [""] * 4


def test_view_oom_ceiling_only_where_recorded(tmp_path):
    """Peak VRAM vs seq_len is log-log, kernel vs reference; the reference's OOM ceiling is
    marked where the OOM log holds it, and without the log the same NaNs are "skipped"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for oom in (True, False):
        res = _view_results(tmp_path / str(oom), oom=oom)
        out = tmp_path / f"out-{oom}"
        report.build(res, out)
        summary = (out / "summary.md").read_text()
        table = report.nsa_table(report.Results(res), report.NSA["forward"])
        fig, ax = plt.subplots()
        report.draw_panel(ax, table, "vram_gb", "peak VRAM (GB)", "t")
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        labels = _legend(ax)
        assert "reference (dense O(T^2))" in labels and "kernel (Triton), recent" in labels
        marks = [line.get_xdata()[0] for line in ax.lines
                 if line.get_label().startswith("reference out of memory")]  # fmt: skip
        if oom:
            assert marks == [4096]
            assert "reference OOM ceiling from seq_len 4096" in summary
            assert "reference n/a: out of memory at seq_len 4096" in summary
        else:
            assert marks == [] and not [t for t in labels if "out of memory" in t]
            assert "OOM ceiling none recorded" in summary and "out of memory" not in summary
            assert "reference n/a: skipped by choice at seq_len 4096" in summary
        plt.close(fig)


def test_view_report_on_the_site_report_page(tmp_path):
    """scripts/main.sh writes the view into report/view/; tools/site_extras.py shows its
    pictures and tables on the report page, links them, and gives it a page of its own."""
    spec = importlib.util.spec_from_file_location("site_extras", ROOT / "tools/site_extras.py")
    extras = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extras)
    res = _view_results(tmp_path)
    report_dir = tmp_path / "report"
    report.build(res, report_dir, machine="gpu-view")  # stands in for the default report
    report.build(res, report_dir / "view", machine="gpu-view", title="The seed's view at HEAD")
    site = tmp_path / "html"
    site.mkdir()
    main_page, view_page = extras.publish_report(site, report_dir)
    assert view_page == site / "report" / "view" / "index.html"
    text = main_page.read_text()
    assert "The seed&#x27;s view at HEAD: machine gpu-view" in text
    assert '<a href="view/toks_vs_seqlen_fwd.png"><img src="view/toks_vs_seqlen_fwd.png"' in text
    assert '<img src="view/vram_vs_seqlen_bwd.png"' in text
    assert '<a href="view/nsa_forward.csv">' in text and '<a href="view/index.html">' in text
    assert text.index("view/toks_vs_seqlen_fwd.png") < text.index('src="toks_vs_seqlen_fwd.png"')
    sub = view_page.read_text()
    assert '<img src="vram_vs_seqlen_fwd.png"' in sub and 'href="../../index.html"' in sub
    assert (site / "report" / "view" / "toks_vs_seqlen_bwd.png").stat().st_size > 0


def test_crossover_text_says_when_smaller_seq_lens_were_not_measured():
    """The nightly times eager calls on the gated grid alone (4096 and up here): a kernel
    already ahead there crossed at or below it, not at it. The graph figure, measured from
    512, keeps its exact crossover; a kernel never ahead reads as none."""

    def row(n, graph, eager):
        return {"seq_len": n, "kernel_tok_s": graph, "kernel_eager_tok_s": eager,
                "ref_tok_s": 10.0, "ref_eager_tok_s": None, "kernel_ms": None, "kernel_na": "",
                "ref_na": ""}  # fmt: skip

    rows = [row(512, 5.0, None), row(1024, 20.0, None), row(4096, 40.0, 30.0),
            row(32768, 50.0, 60.0)]  # fmt: skip
    assert report.crossover_text(rows) == "seq_len 1024"
    assert (
        report.crossover_text(rows, "kernel_eager_tok_s") == "seq_len <= 4096 (the first measured)"
    )
    rows[0]["kernel_tok_s"] = 11.0
    assert report.crossover_text(rows) == "seq_len 512"  # the smallest seq_len: exact
    rows[2]["kernel_eager_tok_s"] = 5.0
    assert report.crossover_text(rows, "kernel_eager_tok_s") == "seq_len 32768"
    for r in rows:
        r["kernel_tok_s"] = 1.0
    assert report.crossover_text(rows) == "(none measured)"
    summary = "\n".join(
        report.nsa_summary(
            "forward", "seed", [dict(r, pattern="recent", preset="seed") for r in rows]
        )
    )
    assert "at seq_len 32768 (eager)" in summary
