"""tools/site_vendor.py on asv's own page template: every CDN library vendored, SRI right."""

import base64
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "site_vendor.py"


def asv_www() -> Path:
    import asv

    return Path(asv.__file__).parent / "www"


@pytest.fixture
def site(tmp_path):
    if not (ROOT / "node_modules" / "jquery").is_dir():
        pytest.fail("node_modules is missing: run `bash scripts/ci_tools.sh` (npm ci)")
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
