#!/usr/bin/env python3
"""Make a site written by `asv publish` work offline: vendor its JavaScript/CSS libraries.

asv 0.6.6's index.html loads jQuery, flot (+ time, selection, categories), flot-orderbars,
stupidtable, blueimp-md5 and Bootstrap from public CDNs; with no internet the page shows
only "airspeed velocity error". This copies the same libraries from the npm packages that
package.json pins (installed by `npm ci`) into `<site>/vendor/`, points the <script> and
<link> tags at them, and recomputes each tag's `integrity` (SRI) hash from the copied file:
npm's flot ships unminified files, so the CDN's hashes would not match.

The site then makes no third-party requests, which also suits runners and viewers behind a
firewall. Any CDN reference this script does not know (a newer asv) is an error rather than
a silently half-offline site. Running it again on a vendored site changes nothing. A page
that tools/site_extras.py marked as needing the internet loses that note here.

Usage:
    python tools/site_vendor.py html [--node-modules node_modules]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import sys
from pathlib import Path

# CDN URL prefix (version included) -> npm file, relative to node_modules.
LIBRARIES = {
    "https://code.jquery.com/jquery-3.3.1.min.js": "jquery/dist/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": "flot/jquery.flot.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": (
        "flot/jquery.flot.time.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": (
        "flot/jquery.flot.selection.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": (
        "flot/jquery.flot.categories.js"
    ),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": (
        "flot-orderbars/js/jquery.flot.orderBars.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": (
        "stupid-table-plugin/stupidtable.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": (
        "blueimp-md5/js/md5.min.js"
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": (
        "bootstrap/dist/js/bootstrap.min.js"
    ),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": (
        "bootstrap/dist/css/bootstrap.min.css"
    ),
}
# Files a vendored file refers to by a relative URL (Bootstrap's CSS loads its icon font).
COMPANIONS = {"bootstrap/dist/css/bootstrap.min.css": ["bootstrap/dist/fonts"]}

TAG = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
URL_ATTR = re.compile(r'\b(src|href)="(https?://[^"]+)"')
INTEGRITY = re.compile(r'\s*\bintegrity="[^"]*"')
# tools/site_extras.py's note on a page that still loads from CDNs (one line).
NOT_VENDORED_NOTE = re.compile(r'<div id="attnbench-not-vendored"[^\n]*</div>\n?')


def sri(path: Path) -> str:
    """The Subresource Integrity value of a file (sha384, as the CDNs use)."""
    digest = hashlib.sha384(path.read_bytes()).digest()
    return "sha384-" + base64.b64encode(digest).decode()


def copy_library(npm_file: str, node_modules: Path, site: Path) -> Path:
    """Copy one npm file (and its companions) under site/vendor/; returns the copy."""
    src = node_modules / npm_file
    if not src.is_file():
        raise FileNotFoundError(f"{src} is missing: run `npm ci` (package.json pins it)")
    dest = site / "vendor" / npm_file
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    for folder in COMPANIONS.get(npm_file, []):
        shutil.copytree(node_modules / folder, site / "vendor" / folder, dirs_exist_ok=True)
    return dest


def rewrite_tag(tag: str, node_modules: Path, site: Path) -> str:
    """One <script>/<link> tag with its CDN URL replaced by the vendored copy."""
    m = URL_ATTR.search(tag)
    if m is None:
        return tag
    url = m.group(2)
    if url not in LIBRARIES:
        raise ValueError(f"unknown external resource {url}: add it to LIBRARIES")
    copy = copy_library(LIBRARIES[url], node_modules, site)
    local = copy.relative_to(site).as_posix()
    tag = tag.replace(m.group(0), f'{m.group(1)}="{local}"')
    tag = INTEGRITY.sub("", tag)
    return tag.replace(f'="{local}"', f'="{local}" integrity="{sri(copy)}"', 1)


def vendor_site(site: Path, node_modules: Path) -> list[Path]:
    """Rewrite every HTML page of the site; returns the pages changed."""
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"{site}/index.html is missing: run `asv publish` first")
    changed = []
    for page in sorted(site.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        new = TAG.sub(lambda m: rewrite_tag(m.group(0), node_modules, site), text)
        new = NOT_VENDORED_NOTE.sub("", new)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="the directory `asv publish` wrote (html_dir)")
    ap.add_argument(
        "--node-modules",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "node_modules",
        help="where `npm ci` installed the libraries (default: the repo's node_modules)",
    )
    args = ap.parse_args(argv)
    try:
        changed = vendor_site(args.site, args.node_modules)
    except (FileNotFoundError, ValueError) as exc:
        print(f"site_vendor: error: {exc}", file=sys.stderr)
        return 1
    print(f"site_vendor: {len(changed)} page(s) rewritten to load libraries from vendor/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
