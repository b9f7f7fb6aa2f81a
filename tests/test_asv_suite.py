"""The asv suite end to end, in smoke mode, on a temporary copy of the repository
(`_asv_repo`): `asv run HEAD^!` (c3) records a value for every benchmark method; `asv
publish` lists every benchmark; tools/report.py writes its files. (`asv check` runs in
test_asv_common.py, in this interpreter; the gate and the view step are test_asv_gate.py's.)
"""

import json
import subprocess
import sys

import pytest
from _asv_repo import ROOT, asv, benchmark_names, make_repo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory)


@pytest.fixture(scope="module")
def smoke_run(repo):
    asv(repo, "run", "HEAD^!", "--machine", "cpu-smoke", "--record-samples", "-e")
    return repo


def test_run_records_every_benchmark_method(smoke_run):
    names = benchmark_names(smoke_run)
    expected = {
        "ceilings.Matmul.track_bf16_tflops",
        "ceilings.CopyRate.track_copy_gb_per_s",
        "nsa.NsaForward.track_time",
        "nsa.NsaForward.track_peak_vram_bytes",
        "nsa.NsaForward.track_time_eager",
        "nsa.NsaForward.track_time_host",
        "nsa.NsaBackward.track_time",
        "nsa.NsaBackward.track_time_eager",
        "nsa.NsaBackward.track_time_host",
        "nsa.NsaBackward.track_peak_vram_bytes",
        "nsa.NsaSeedBackward.track_time",
        "nsa.NsaSeedBackward.track_time_eager",
        "nsa.NsaSeedBackward.track_time_host",
        "nsa.NsaAutograd.track_time_eager",
        "nsa.NsaAutograd.track_time_host",
        "kda.KdaVerify.track_time",
        "kda.KdaVerify.track_time_cold",
        "kda.KdaVerify.track_peak_vram_bytes",
        "kda.KdaBlockV.track_time",
        "kda.KdaBlockV.track_time_cold",
    }
    assert expected <= set(names)
    # benchmarks/common.py holds no benchmark (the ceilings are benchmarks/ceilings.py's).
    assert not [n for n in names if n.startswith("common.")]
    (path,) = (smoke_run["path"] / "results/cpu-smoke").glob(f"{smoke_run['c3'][:8]}-*.json")
    data = json.loads(path.read_text())
    assert data["params"]["machine"] == "cpu-smoke" and data["params"]["gpu"] == "none"
    for name in names:
        values = data["results"][name][0]
        values = values if isinstance(values, list) else [values]
        assert any(v is not None for v in values), f"{name} has no value"


def test_publish_lists_every_benchmark(smoke_run):
    asv(smoke_run, "publish")
    index = json.loads((smoke_run["path"] / "html/index.json").read_text())
    assert set(benchmark_names(smoke_run)) <= set(index["benchmarks"])
    assert (smoke_run["path"] / "html/index.html").is_file()


def test_report_writes_csv_and_plots(smoke_run, tmp_path):
    out = tmp_path / "report"
    subprocess.run(
        [sys.executable, str(ROOT / "tools/report.py"), "--results",
         str(smoke_run["path"] / "results"), "--out", str(out), "--machine", "cpu-smoke"],
        check=True,
    )  # fmt: skip
    csvs = ["nsa_forward.csv", "nsa_backward.csv", "kda_verify.csv", "kda_block_v.csv"]
    for name in csvs + ["kda_verify.md", "vram_vs_seqlen_fwd.png", "toks_vs_seqlen_bwd.png"]:
        assert (out / name).stat().st_size > 0, name
    assert "40" in (out / "nsa_forward.csv").read_text()  # the smoke seq_len
