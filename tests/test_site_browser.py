"""The published site in headless Chromium: offline, no console errors, graphs with points.

A throwaway clone with two commits is benchmarked in smoke mode (one NSA and one KDA
benchmark, cheap under the interpreter), `asv publish` writes the site,
`tools/site_vendor.py` vendors its libraries, `tools/report.py` writes the report and
`tools/site_extras.py` adds it to the site (with the smoke banner, as the main job does).
The site is served on 127.0.0.1 and opened with Playwright driving the system's Chromium
(Debian's package; scripts/ci_tools.sh installs it). Every request to anything but the
local server is recorded and aborted: the site must need none."""

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _asv_smoke as smoke  # noqa: E402

pytestmark = pytest.mark.slow
NSA = "nsa.NsaForward.track_peak_vram_bytes"  # two series in smoke mode: impl
KDA = "kda.KdaVerify.track_peak_vram_bytes"
# asv matches -b against "name(params)" for parameterized benchmarks; KDA: one mode only.
SELECT = ["-b", rf"^{re.escape(NSA)}\(", "-b", rf"^{re.escape(KDA)}\(.*'unfused',"]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
# Points plotted by flot in the main graph, counted per series (null y = no point).
POINTS_JS = """() => {
    const plot = $('#main-graph').data('plot');
    if (!plot) return null;
    return plot.getData().map(s => s.data.filter(p => p && p[1] !== null).length);
}"""


def chromium() -> str | None:
    for candidate in (os.environ.get("ATTNBENCH_CHROMIUM"), "chromium", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    smoke.require_site_libraries()  # vendoring needs them; without it the page needs a CDN
    root, repo, hashes = smoke.scratch(tmp_path_factory, "site", 2)
    home = root / "home"
    conf = smoke.write_conf(repo, "asv.site.json", "results").name
    for commit in hashes:
        args = ["--machine", smoke.MACHINE, "--show-stderr", *SELECT, f"{commit}^!"]
        smoke.asv("run", "--config", conf, *args, cwd=repo, home=home)
    # The site lists every benchmark in benchmarks.json and fetches its summary graph;
    # keep only the two that ran, as if the suite had just these.
    described = repo / "results" / "benchmarks.json"
    suite = json.loads(described.read_text())
    described.write_text(json.dumps({k: v for k, v in suite.items() if k in (NSA, KDA, "version")}))
    smoke.asv("publish", "--config", conf, cwd=repo, home=home)
    tools = smoke.ROOT / "tools"
    subprocess.run([sys.executable, str(tools / "site_vendor.py"), str(repo / "html")], check=True)
    report = [sys.executable, str(tools / "report.py"), "--results", str(repo / "results"),
              "--out", str(repo / "report"), "--machine", smoke.MACHINE]  # fmt: skip
    subprocess.run(report, check=True, capture_output=True)
    extras = [sys.executable, str(tools / "site_extras.py"), str(repo / "html"),
              "--report", str(repo / "report")]  # fmt: skip
    subprocess.run(extras, check=True, capture_output=True)
    return repo / "html"


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    exe = chromium()
    if exe is None:
        pytest.skip("no Chromium: scripts/ci_tools.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A page that records console errors and aborts (and records) any external request."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.errors, pg.external = [], []
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def route(r):
        if r.request.url.startswith(server + "/"):
            r.continue_()
        else:
            pg.external.append(r.request.url)
            r.abort()

    pg.route("**/*", route)
    yield pg
    ctx.close()


def open_graph(page, server, name, query=""):
    page.goto(f"{server}/index.html#{name}{query}")
    page.wait_for_function(f"({POINTS_JS})() !== null", timeout=30000)
    return page.evaluate(POINTS_JS)


def test_vendored_page_references_no_cdn(site):
    html = (site / "index.html").read_text()
    assert "cdn" not in html.lower() and "code.jquery.com" not in html
    assert (site / "vendor" / "flot" / "jquery.flot.js").exists()


def test_index_loads_offline_without_errors(page, server):
    page.goto(f"{server}/index.html")
    page.wait_for_selector(".benchmark-container", timeout=30000)
    names = page.eval_on_selector_all(".benchmark-container", "els => els.map(e => e.href)")
    assert any(NSA in n for n in names) and any(KDA in n for n in names)
    assert "airspeed velocity error" not in page.content()
    assert page.errors == [] and page.external == []


def test_nsa_and_kda_graphs_show_points(page, server):
    assert open_graph(page, server, NSA) == [2, 2]  # impl: triton, reference; 2 commits each
    # one series per parameter combination; those with mode `unfused` were run (both
    # commits), the others stay empty
    kda = open_graph(page, server, KDA)
    assert 2 in kda and set(kda) <= {0, 2}
    assert page.errors == [] and page.external == []


def test_parameter_switch_changes_the_graph(page, server):
    assert len(open_graph(page, server, NSA)) == 2
    # Deselect impl=reference in the left panel: one series (triton) remains. (The panel's
    # "reference point" button has an id; parameter buttons have none.)
    page.locator("a.btn:not([id])", has_text="reference").click()
    page.wait_for_function(f"({POINTS_JS})().length === 1", timeout=30000)
    assert "p-impl='triton'" in unquote(page.url)
    assert page.evaluate(POINTS_JS) == [2]
    assert page.errors == [] and page.external == []


def test_regressions_page_loads(page, server):
    page.goto(f"{server}/index.html#/regressions")
    page.wait_for_function("$('#regressions-body').children().length > 0", timeout=30000)
    assert page.locator("#regressions-body").is_visible()
    assert page.errors == [] and page.external == []


SMOKE_TEXT = "Smoke mode: tiny sizes on the CPU through Triton's interpreter"
BANNER = "#attnbench-smoke-banner"


def test_smoke_banner_on_every_view(page, server):
    views = {
        "": "$('.benchmark-container:visible').length > 0",
        "#/regressions": "$('#regressions-body').children().length > 0",
        f"#{NSA}": f"({POINTS_JS})() !== null",
    }
    for view, shown in views.items():
        page.goto(f"{server}/index.html{view}")
        page.wait_for_function(shown, timeout=30000)
        banner = page.locator(BANNER)
        assert banner.is_visible() and SMOKE_TEXT in banner.inner_text(), view
        box = banner.bounding_box()
        assert box["height"] > 0 and box["y"] + box["height"] <= page.viewport_size["height"]
    assert page.errors == [] and page.external == []


def test_report_page_linked_from_the_index(page, server, site):
    page.goto(f"{server}/index.html")
    page.wait_for_selector(".benchmark-container", timeout=30000)
    page.locator("#nav a", has_text="Report").click()
    page.wait_for_url(f"{server}/report/index.html")
    page.wait_for_load_state("load")
    assert "Benchmark report: machine cpu-smoke" in page.content()
    assert SMOKE_TEXT in page.locator(BANNER).inner_text()
    # the report's plots are there and decode
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.naturalWidth])")
    assert any("vram_vs_seqlen_fwd.png" in src for src, _ in images)
    assert images and all(width > 0 for _, width in images)
    assert (site / "report" / "nsa_forward.csv").is_file()
    assert page.errors == [] and page.external == []


def test_no_smoke_regressions(page, server, site):
    assert json.loads((site / "regressions.json").read_text())["regressions"] == []
    page.goto(f"{server}/index.html#/regressions")
    page.wait_for_function("$('#regressions-body').children().length > 0", timeout=30000)
    assert page.locator("#regressions-body table tbody tr").count() == 0
    assert page.errors == [] and page.external == []


def test_page_opened_from_disk_says_to_serve_it(browser, site):
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.goto((site / "index.html").as_uri())
    warning = pg.locator("#attnbench-file-warning")
    warning.wait_for(state="visible", timeout=30000)
    text = warning.inner_text()
    assert ".venv/bin/asv preview" in text and "http://127.0.0.1:8080" in text
    # asv's own page (its error page asks for an internet connection) is hidden; the
    # smoke banner stays
    pg.wait_for_load_state("load")
    visible = pg.evaluate("() => document.body.innerText")
    assert "internet connection" not in visible and "Benchmark grid" not in visible
    assert SMOKE_TEXT in visible
    ctx.close()


def test_served_page_has_no_file_warning(page, server):
    page.goto(f"{server}/index.html")
    page.wait_for_selector(".benchmark-container", timeout=30000)
    assert not page.locator("#attnbench-file-warning").is_visible()
