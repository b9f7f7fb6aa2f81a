"""tools/site_vendor.py (every CDN library vendored, SRI right) and tools/site_extras.py (smoke
banner, no smoke regressions, the report page, the file:// note) on asv's own page template."""

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _asv_smoke as smoke
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "site_vendor.py"


def asv_www() -> Path:
    import asv

    return Path(asv.__file__).parent / "www"


@pytest.fixture
def site(tmp_path):
    smoke.require_site_libraries()
    for page in asv_www().glob("*.html"):
        shutil.copy(page, tmp_path / page.name)
    return tmp_path


def vendor(site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(site)], capture_output=True, text=True)


def test_every_library_is_local_with_matching_integrity(site):
    before = (site / "index.html").read_text()
    assert before.count("https://") >= 10  # the template really loads from CDNs
    res = vendor(site)
    assert res.returncode == 0, res.stderr
    html = (site / "index.html").read_text()
    tags = re.findall(r"<(?:script|link)\b[^>]*>", html)
    assert not [t for t in tags if "https://" in t or "http://" in t]
    vendored = re.findall(r'(?:src|href)="(vendor/[^"]+)" integrity="([^"]+)"', html)
    assert len(vendored) == 10
    for rel, integrity in vendored:
        digest = hashlib.sha384((site / rel).read_bytes()).digest()
        assert integrity == "sha384-" + base64.b64encode(digest).decode(), rel
    # Bootstrap's CSS finds its icon font next to it
    assert (site / "vendor/bootstrap/dist/fonts/glyphicons-halflings-regular.woff").exists()
    # the page's other content is untouched
    assert html.count("<script") == before.count("<script")
    # a second run finds nothing to do
    assert vendor(site).returncode == 0
    assert (site / "index.html").read_text() == html


def test_unknown_cdn_resource_is_an_error(site):
    page = site / "index.html"
    page.write_text(
        page.read_text().replace(
            "</head>", '<script src="https://cdn.example.invalid/new-lib.js"></script></head>'
        )
    )
    res = vendor(site)
    assert res.returncode == 1 and "unknown external resource" in res.stderr


def test_missing_site_is_an_error(tmp_path):
    res = vendor(tmp_path)
    assert res.returncode == 1 and "asv publish" in res.stderr


# ---------------------------------------------------------------- tools/site_extras.py

EXTRAS = ROOT / "tools" / "site_extras.py"
SMOKE_TEXT = (
    "Smoke mode: tiny sizes on the CPU through Triton's interpreter; "
    "these timings say nothing about GPU speed."
)
SMOKE_GRAPH = (
    "graphs/arch-x86_64/branch-main/machine-cpu-smoke/python-3.11/nsa.NsaForward.track_time.json"
)
GPU_GRAPH = "graphs/arch-x86_64/branch-main/machine-h200/python-3.11/nsa.NsaForward.track_time.json"


def run_extras(site: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(EXTRAS), str(site), *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def published(site: Path, machines: dict[str, str]) -> None:
    """What `asv publish` leaves that the tool reads: asv's pages, index.json, and one
    regression per machine in regressions.json and regressions.xml ({name: gpu})."""
    import datetime

    from asv import feed

    for page in asv_www().glob("*.html"):
        shutil.copy(page, site / page.name)
    entries = {m: {"machine": m, "gpu": gpu} for m, gpu in machines.items()}
    (site / "index.json").write_text(json.dumps({"machines": entries, "params": {}}))
    graphs = {"cpu-smoke": SMOKE_GRAPH, "h200": GPU_GRAPH}
    regs = [["nsa.NsaForward.track_time(40)", graphs[m], {}, 0, 2.0, 1.0, [[1, 2, 1.0, 2.0]]]
            for m in machines]  # fmt: skip
    (site / "regressions.json").write_text(json.dumps({"regressions": regs}))
    several = len(machines) > 1  # asv names the machine in a feed link only then
    when = datetime.datetime(2026, 1, 1)
    atom = [feed.FeedEntry(f"100.00% nsa.NsaForward.track_time ({m})", when,
                           link="index.html#nsa.NsaForward.track_time?" +
                           (f"machine={m}&" if several else "") + "commits=abc",
                           content="x", id_context=[m])
            for m in machines]  # fmt: skip
    feed.write_atom(str(site / "regressions.xml"), atom, "asv", "regressions", "x.asv")


@pytest.fixture
def report_dir(tmp_path):
    rep = tmp_path / "report-out"
    rep.mkdir()
    (rep / "summary.md").write_text(
        "# Benchmark report: machine cpu-smoke\n\n- NSA forward, tiny-seed: reference OOM "
        "ceiling none recorded\n  - reference n/a: not run at seq_len <40>\n"
    )
    (rep / "kda_verify.md").write_text(
        "# KDA\n\n| batch | fused |\n| ---: | ---: |\n| 1 | 2.00 |\n"
    )
    (rep / "nsa_forward.csv").write_text("seq_len\n40\n")
    (rep / "vram_vs_seqlen_fwd.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return rep


def feed_titles(site: Path) -> list[str]:
    import xml.etree.ElementTree as ET

    root = ET.parse(site / "regressions.xml").getroot()
    return [e.findtext("{http://www.w3.org/2005/Atom}title") for e in
            root.findall("{http://www.w3.org/2005/Atom}entry")]  # fmt: skip


def test_smoke_site_banner_report_and_no_regressions(site, report_dir):
    published(site, {"cpu-smoke": "none"})
    res = run_extras(site, "--report", str(report_dir))
    assert res.returncode == 0, res.stderr
    # the banner on every page, the report's too
    pages = [site / "index.html", site / "error.html", site / "report" / "index.html"]
    for page in pages:
        assert page.read_text().count(SMOKE_TEXT) == 1, page
    # smoke noise is no regression: page data and feed empty
    assert json.loads((site / "regressions.json").read_text())["regressions"] == []
    assert feed_titles(site) == []
    # the report: copied, linked from the index's navigation, with a page of its own
    index = (site / "index.html").read_text()
    nav = index[index.index('<nav id="nav"') : index.index("</nav>")]
    assert '<a href="report/index.html">Report</a>' in nav
    for name in ("summary.md", "kda_verify.md", "nsa_forward.csv", "vram_vs_seqlen_fwd.png"):
        assert (site / "report" / name).read_bytes() == (report_dir / name).read_bytes()
    report_page = (site / "report" / "index.html").read_text()
    assert '<img src="vram_vs_seqlen_fwd.png"' in report_page
    assert '<a href="nsa_forward.csv">' in report_page and 'href="../index.html"' in report_page
    assert "<td>2.00</td>" in report_page and "<th>batch</th>" in report_page
    assert "not run at seq_len &lt;40&gt;" in report_page  # escaped
    # opened from disk, asv's pages say how to serve them; the static report works as is
    for page in pages[:2]:
        text = page.read_text()
        assert "asv preview" in text and 'window.location.protocol !== "file:"' in text
    assert "attnbench-file-warning" not in report_page
    # a second run changes nothing
    before = {p: p.read_text() for p in pages}
    assert run_extras(site, "--report", str(report_dir)).returncode == 0
    assert {p: p.read_text() for p in pages} == before


def test_unvendored_site_says_it_needs_the_internet_until_vendored(site, report_dir):
    published(site, {"cpu-smoke": "none"})
    res = run_extras(site, "--report", str(report_dir))
    assert res.returncode == 0 and "not vendored" in res.stdout
    for page in ("index.html", "error.html"):
        assert 'id="attnbench-not-vendored"' in (site / page).read_text()
    # vendoring afterwards drops the note and keeps the rest; extras again changes nothing
    assert vendor(site).returncode == 0
    for page in ("index.html", "error.html"):
        text = (site / page).read_text()
        assert 'id="attnbench-not-vendored"' not in text and SMOKE_TEXT in text
    index = (site / "index.html").read_text()
    assert run_extras(site, "--report", str(report_dir)).returncode == 0
    assert (site / "index.html").read_text() == index


def test_mixed_site_keeps_gpu_regressions(site):
    published(site, {"cpu-smoke": "none", "h200": "NVIDIA H200"})
    res = run_extras(site)
    assert res.returncode == 0, res.stderr
    regs = json.loads((site / "regressions.json").read_text())["regressions"]
    assert [r[1] for r in regs] == [GPU_GRAPH]
    assert feed_titles(site) == ["100.00% nsa.NsaForward.track_time (h200)"]
    index = (site / "index.html").read_text()
    assert f"Machine cpu-smoke: {SMOKE_TEXT}" in index
    assert "report/index.html" not in index  # no report given, none linked


def test_gpu_site_has_no_banner_and_keeps_everything(site):
    published(site, {"h200": "NVIDIA H200"})
    regs = (site / "regressions.json").read_text()
    assert run_extras(site).returncode == 0
    assert (site / "regressions.json").read_text() == regs
    assert feed_titles(site) == ["100.00% nsa.NsaForward.track_time (h200)"]
    assert SMOKE_TEXT not in (site / "index.html").read_text()
    # a machine given as smoke on the command line is treated as one
    assert run_extras(site, "--smoke-machine", "h200").returncode == 0
    assert json.loads((site / "regressions.json").read_text())["regressions"] == []


def test_extras_without_a_site_is_an_error(tmp_path):
    res = run_extras(tmp_path)
    assert res.returncode == 1 and "asv publish" in res.stderr


def test_report_inside_the_site_copy_is_an_error(site, report_dir):
    published(site, {"cpu-smoke": "none"})
    shutil.copytree(report_dir, site / "report")
    res = run_extras(site, "--report", str(site / "report"))
    assert res.returncode == 1 and "rewritten" in res.stderr
    assert (site / "report" / "summary.md").exists()


def test_site_libraries_skip_without_npm_and_fail_with_it(monkeypatch, tmp_path):
    # A GPU host with no npm (and so no node_modules) skips the vendoring tests; a host with
    # npm but no node_modules has a broken set-up, which must not pass as a skip.
    monkeypatch.setattr(smoke, "ROOT", tmp_path)
    monkeypatch.setattr(smoke.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="no npm"):
        smoke.require_site_libraries()
    monkeypatch.setattr(smoke.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(pytest.fail.Exception, match="npm ci"):
        smoke.require_site_libraries()
    (tmp_path / "node_modules" / "jquery").mkdir(parents=True)
    smoke.require_site_libraries()
