"""tools/report.py on hand-made asv result files: tables, n/a reasons, OOM ceiling,
crossover, plots."""

import csv
import importlib.util
import json
import math
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

    tok = lambda ts: [None if t is None else T / t for T, t in zip(SEQ, ts, strict=True)]
    return {
        "nsa.NsaForward.track_time": _entry(params, flat(kernel_s, ref_s)),
        "nsa.NsaForward.track_tokens_per_s": _entry(params, flat(tok(kernel_s), tok(ref_s))),
        "nsa.NsaForward.track_peak_vram_bytes": _entry(params, flat([1e8] * 4, ref_bytes)),
    }


def _write(results, machine, name, data):
    (results / machine).mkdir(parents=True, exist_ok=True)
    (results / machine / name).write_text(json.dumps(data))


NAN = float("nan")
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
    data["kda.KdaBandwidth.track_pct_of_copy_rate"] = _entry(kda_params, [5.0, 4.0, 70.0, 31.25])
    _write(res, "h200", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 2, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
    log = na_reasons.log_path(res, "h200")
    for method in ("track_time", "track_peak_vram_bytes"):
        na_reasons.record_oom(log, "a" * 40, f"nsa.NsaForward.{method}", ["2048", *REF_PARAMS])
    # An OOM of another commit is not this one's.
    na_reasons.record_oom(log, "b" * 40, "nsa.NsaForward.track_time", ["4096", *REF_PARAMS])
    # An older commit whose figures must not be used, and an unreadable file.
    old = _nsa_results([1.0] * 4, [1.0] * 4, [1.0] * 4)
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
    assert rows[2]["kernel_eager_ms"] == "" and "ref_eager_ms" not in rows[0]
    summary = (out / "summary.md").read_text()
    # graph replay: the kernel wins at 1024; eager: 2.56M tokens/s < the reference's 3.4M
    assert "crossover at seq_len 1024 (graph replay), at (none measured) (eager)" in summary
    rows = report.nsa_table(report.Results(results), report.NSA["forward"])
    fig, ax = plt.subplots()
    report.draw_panel(ax, rows, "tok_s", "throughput (tokens/s)", "t")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kernel (Triton) eager, recent" in labels
    assert "kernel (Triton) graph replay, recent" in labels
    assert not [t for t in labels if t.startswith("kernel wins")]  # no eager crossover
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
    # The bandwidth table keeps the stored percentages (no time scaling).
    bw = {(int(r["batch"]), r["mode"]): r for r in csv.DictReader(open(out / "kda_bandwidth.csv"))}
    assert float(bw[(64, "fused+ring")]["pct_of_copy"]) == 31.25
    assert "| 64 | 70.0% | 31.2% |" in (out / "kda_bandwidth.md").read_text()


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
        data = {"kda.KdaBandwidth.track_pct_of_copy_rate": _entry(params, [value])}
        _write(res, "h200", f"{commit * 8}-virtualenv-py3.12.json", {
            "commit_hash": commit * 40, "date": date, "result_columns": COLUMNS, "results": data,
        })  # fmt: skip
    rows = report.Results(res).rows("kda.KdaBandwidth.track_pct_of_copy_rate")
    assert [(v, r) for _, v, r in rows] == [(0.0, None)]
