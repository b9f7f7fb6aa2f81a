"""tools/report.py on hand-made asv result files: tables, OOM ceiling, crossover, plots."""

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def results(tmp_path):
    res = tmp_path / "results"
    kernel = [1e-4, 2e-4, 4e-4, 8e-4]
    ref = [5e-5, 3e-4, None, None]  # kernel wins from 1024; reference OOM from 2048
    data = _nsa_results(kernel, ref, [2e8, 8e8, None, None])
    kda_params = [[1, 64], ["unfused", "fused+ring"], ["safe"], ["H8-HV8"]]
    data["kda.KdaVerify.track_time"] = _entry(kda_params, [2e-5, 1e-5, 9e-5, 3e-5])
    data["kda.KdaVerify.track_time_cold"] = _entry(kda_params, [3e-5, 1.5e-5, 2e-4, 5e-5])
    data["kda.KdaBandwidth.track_pct_of_copy_rate"] = _entry(kda_params, [5.0, 4.0, 70.0, 31.25])
    _write(res, "h200", "aaaaaaaa-virtualenv-py3.12.json", {
        "commit_hash": "a" * 40, "date": 2, "result_columns": COLUMNS, "results": data,
    })  # fmt: skip
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
    assert [r["ref_na"] for r in rows] == ["0", "0", "1", "1"]
    assert rows[2]["ref_ms"] == ""  # n/a, not zero
    summary = (out / "summary.md").read_text()
    assert "seq_len 2048" in summary and "crossover at seq_len 1024" in summary
    assert "aaaaaaaa" in summary and "bbbbbbbb" not in summary
    assert "recent: kernel time x4.00 from seq_len 1024 to 4096" in summary
    for name in ("vram_vs_seqlen_fwd.png", "toks_vs_seqlen_fwd.png", "kda_verify.md"):
        assert name in written and (out / name).stat().st_size > 0


def test_kda_table_in_microseconds(results, tmp_path):
    out = tmp_path / "out"
    report.build(results, out)
    rows = {(int(r["batch"]), r["mode"]): r for r in csv.DictReader(open(out / "kda_verify.csv"))}
    assert math.isclose(float(rows[(64, "fused+ring")]["cold_us"]), 50.0)
    md = (out / "kda_verify.md").read_text()
    assert "| batch | unfused | fused+ring |" in md
    assert "| 64 | 90.00 / 200.00 | 30.00 / 50.00 |" in md
    # The bandwidth table keeps the stored percentages (no time scaling).
    bw = {(int(r["batch"]), r["mode"]): r for r in csv.DictReader(open(out / "kda_bandwidth.csv"))}
    assert float(bw[(64, "fused+ring")]["pct_of_copy"]) == 31.25
    assert "| 64 | 70.0% | 31.2% |" in (out / "kda_bandwidth.md").read_text()


def test_helpers_on_edge_cases():
    base = {"kernel_tok_s": None, "ref_tok_s": None}
    assert report.oom_ceiling([{"seq_len": 1, "ref_na": 0}]) is None
    assert report.crossover([{"seq_len": 1, **base}]) is None
    assert report._value("'triton'") == "triton" and report._value("4096") == 4096
    assert report._number(float("nan")) is None and report._number(2) == 2.0


def test_unknown_machine_is_an_error(results, tmp_path):
    with pytest.raises(SystemExit, match="no results for machine"):
        report.build(results, tmp_path / "out", machine="nope")
