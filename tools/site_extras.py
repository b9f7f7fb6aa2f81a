#!/usr/bin/env python3
"""What the project adds to a site written by `asv publish`: run it after every publish.

`asv publish` empties html/ and writes asv's pages again, so everything here is redone on
each run (and a second run on the same site changes nothing):

- The report (tools/report.py's CSV files, plots and tables) is copied into
  `<site>/report/`, with a page of its own, `report/index.html`, linked from the site's
  navigation bar. A report directory's subdirectories are reports too (scripts/main.sh
  writes the seed's view into `report/view/`): each gets a page of its own, and the report's
  page shows them first, with their plots, tables and CSV files, and links their pages.
- Smoke results (machine `cpu-smoke`, or any machine whose entry records no GPU) show no
  regressions: their entries leave `regressions.json` (the Regressions page) and
  `regressions.xml` (its feed). asv's `regressions_thresholds` match benchmark names only,
  never the machine, so this cannot be said in asv.conf.json.
- Every page of a site that holds smoke results carries a banner saying so.
- Every page says, when opened from disk (file://), to serve the site instead: asv's pages
  load their data with XMLHttpRequest, which browsers block for files.
- A site whose libraries are still loaded from CDNs (tools/site_vendor.py did not run: no
  npm) says that it needs the internet.

The injected markup sits between two HTML comments (MARK_BEGIN, MARK_END) right after
<body>, and is replaced as a whole on the next run.

Usage (after `asv publish`, tools/site_vendor.py and tools/report.py):
    python tools/site_extras.py html --report report [--smoke-machine cpu-smoke]
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

MARK_BEGIN, MARK_END = "<!-- attnbench-site-extras -->", "<!-- /attnbench-site-extras -->"
BLOCK = re.compile(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END) + r"\n?", re.DOTALL)
NAV_ITEM = re.compile(r'\s*<li id="attnbench-report-link">.*?</li>', re.DOTALL)
REGRESSIONS_ITEM = re.compile(r'(<li id="nav-li-regressions">.*?</li>)', re.DOTALL)
BODY = re.compile(r"<body[^>]*>\n?", re.IGNORECASE)
CDN = re.compile(r'<(?:script|link)\b[^>]*\b(?:src|href)="https?://', re.IGNORECASE)
ATOM = "http://www.w3.org/2005/Atom"
DEFAULT_SMOKE_MACHINES = ("cpu-smoke",)
REPORT_DIR = "report"

SMOKE_TEXT = (
    "Smoke mode: tiny sizes on the CPU through Triton's interpreter; "
    "these timings say nothing about GPU speed."
)
PREVIEW_URL = "http://127.0.0.1:8080"
FILE_TEXT = (
    "This page was opened from disk (file://), and browsers block the data files it loads "
    "from disk, so it cannot show its benchmarks. Serve the site instead: run "
    "<code>.venv/bin/asv preview</code> in the repository and open "
    f'<a href="{PREVIEW_URL}">{PREVIEW_URL}</a>.'
)
NOT_VENDORED_TEXT = (
    "This site loads its JavaScript libraries from public CDNs (it was built without npm, "
    "so tools/site_vendor.py could not vendor them): it needs the internet."
)
BANNER_STYLE = (
    "position: fixed; left: 0; right: 0; bottom: 0; z-index: 2000; margin: 0; "
    "padding: 4px 12px; background: #fcf8e3; border-top: 1px solid #c09853; color: #8a6d3b; "
    "font: bold 13px sans-serif; text-align: center"
)
# asv's side panels and lists reach the bottom of the window: keep them clear of the
# banners (one line each, fixed at the bottom).
BANNER_ROOM = (
    "<style>#summarylist-navigation, #summarylist-body, #graphdisplay-navigation "
    "{ bottom: 56px !important; } body { padding-bottom: 56px; }</style>"
)
FILE_STYLE = (
    "display: none; position: fixed; left: 10%; right: 10%; top: 80px; z-index: 3000; "
    "padding: 16px 20px; background: #f2dede; border: 2px solid #a94442; color: #a94442; "
    "font: 15px sans-serif; border-radius: 4px"
)
# Shown by the script below only under file:, so served pages never show it. It also hides
# the page's own content there: asv's graphs cannot load, and its error page (where it sends
# a reader whose libraries failed to load) asks for an internet connection, which is not
# what is missing. The smoke banner stays.
FILE_SCRIPT = """<script>
      (function () {
        if (window.location.protocol !== "file:") return;
        var keep = {"attnbench-file-warning": 1, "attnbench-smoke-banner": 1,
                    "attnbench-not-vendored": 1};
        document.getElementById("attnbench-file-warning").style.display = "block";
        function hideTheRest() {
          var children = document.body.children;
          for (var i = 0; i < children.length; i++) {
            if (!keep[children[i].id] && children[i].tagName !== "SCRIPT") {
              children[i].style.display = "none";
            }
          }
        }
        if (document.readyState === "loading") {
          document.addEventListener("DOMContentLoaded", hideTheRest);
        } else {
          hideTheRest();
        }
      })();
    </script>"""


# ---------------------------------------------------------------- which machines are smoke


def site_machines(site: Path) -> dict[str, dict]:
    """{machine name: its entry} from the site's index.json ({} without one)."""
    try:
        index = json.loads((site / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    machines = index.get("machines") or {}
    return machines if isinstance(machines, dict) else {}


def smoke_machines(machines: dict[str, dict], names=DEFAULT_SMOKE_MACHINES) -> set[str]:
    """The machines whose results are smoke: named so, or recording no GPU
    (tools/asv_machine.py writes gpu "none" where nvidia-smi finds none)."""
    return {m for m, entry in machines.items() if m in names or (entry or {}).get("gpu") == "none"}


# ---------------------------------------------------------------- regressions


def _path_part(machine: str) -> str:
    """The graph path component asv writes for a machine (asv.graph.Graph.get_file_path)."""
    try:
        from asv.util import sanitize_filename
    except ImportError:  # without asv: names of letters, digits, '-' and '_' map to themselves
        return f"machine-{machine}"
    return sanitize_filename(f"machine-{machine}")


def drop_smoke_regressions(site: Path, smoke: set[str], all_machines: set[str]) -> int:
    """Remove smoke machines' entries from regressions.json and regressions.xml; returns
    how many regressions.json entries went."""
    if not smoke:
        return 0
    dropped = 0
    parts = {_path_part(m) for m in smoke}
    path = site / "regressions.json"
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        kept = [
            r for r in data.get("regressions", []) if not parts & set(str(r[1]).split("/"))
        ]  # entry: [name, graph path, graph params, index, last, best, jumps]
        dropped = len(data.get("regressions", [])) - len(kept)
        data["regressions"] = kept
        path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
    _drop_feed_entries(site / "regressions.xml", smoke, only_smoke=all_machines <= smoke)
    return dropped


def _drop_feed_entries(path: Path, smoke: set[str], only_smoke: bool) -> None:
    """The feed's entries link to `index.html#bench?params`; asv puts `machine` in those
    params only when the site has several machines. A smoke-only site loses every entry."""
    if not path.is_file():
        return
    ET.register_namespace("", ATOM)
    tree = ET.parse(path)
    root = tree.getroot()
    for entry in root.findall(f"{{{ATOM}}}entry"):
        link = entry.find(f"{{{ATOM}}}link")
        href = link.get("href", "") if link is not None else ""
        query = parse_qs(urlsplit(href.replace("#", "/", 1)).query)
        if only_smoke or set(query.get("machine", [])) & smoke:
            root.remove(entry)
    tree.write(path, encoding="utf-8", xml_declaration=True)


# ---------------------------------------------------------------- the report page


def _inline(text: str) -> str:
    """Escape, then `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def markdown_to_html(text: str) -> str:
    """The markdown tools/report.py writes: headings, bullet lists (two-space nesting),
    pipe tables and plain paragraphs."""
    out, table, items = [], [], []

    def flush():
        if table:
            head, *body = table
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head))
            out.append("</tr></thead><tbody>")
            for row in body:
                out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>")
            out.append("</tbody></table>")
            table.clear()
        if items:
            out.append("<ul>")
            out.extend(f'<li class="level{depth}">{_inline(t)}</li>' for depth, t in items)
            out.append("</ul>")
            items.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            if items:
                flush()
            cells = [c.strip() for c in stripped[1:-1].split("|")]
            if not all(c and set(c) <= set("-: ") for c in cells):
                table.append(cells)
            continue
        if table:
            flush()
        m = re.match(r"( *)- (.*)", line)
        if m:
            items.append((len(m.group(1)) // 2, m.group(2)))
            continue
        flush()
        h = re.match(r"(#{1,4}) (.*)", stripped)
        if h:
            level = len(h.group(1)) + 1  # the page's own title is the h1
            out.append(f"<h{level}>{_inline(h.group(2))}</h{level}>")
        elif stripped:
            out.append(f"<p>{_inline(stripped)}</p>")
    flush()
    return "\n".join(out)


REPORT_CSS = """
body { font: 14px sans-serif; margin: 20px 24px 60px; color: #333; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; }
figure { margin: 12px 0 24px; }
li.level1 { margin-left: 24px; }
"""


def report_parts(files: list[str], read, prefix: str = "") -> list[str]:
    """One report directory's markup: summary, plots, tables and the CSV files, in that
    order. `files` are names in the directory, `read(name)` returns a text file's text and
    `prefix` leads every link and picture's path (a subdirectory's: "view/")."""
    names = sorted(files)
    parts = []
    if "summary.md" in names:
        parts.append(markdown_to_html(read("summary.md")))
    for name in (n for n in names if n.endswith(".png")):
        src = html.escape(prefix + name)
        parts.append(f'<figure><a href="{src}"><img src="{src}" alt="{src}"></a>')
        parts.append(f"<figcaption>{src}</figcaption></figure>")
    for name in (n for n in names if n.endswith(".md") and n != "summary.md"):
        anchor = html.escape(prefix + name)
        parts.append(f'<section id="{anchor}">{markdown_to_html(read(name))}</section>')
    csvs = [n for n in names if n.endswith(".csv")]
    if csvs:
        parts.append("<h3>CSV files</h3>" if prefix else "<h2>CSV files</h2>")
        parts.append("<ul>")
        for n in csvs:
            parts.append(f'<li><a href="{html.escape(prefix + n)}">{html.escape(n)}</a></li>')
        parts.append("</ul>")
    return parts


def report_page(files: list[str], read, subreports=(), up: str = "../index.html") -> str:
    """The report's page: each subreport first (`subreports`: (directory name, its files,
    its read) triples), with a link to its own page, then this directory's own summary,
    plots, tables and CSV files. `files` are names in the report directory; `read(name)`
    returns a text file's text; `up` is the site's index, relative to the page."""
    parts = [
        f'<p><a href="{html.escape(up)}">&larr; benchmark site</a></p>',
        "<h1>Benchmark report</h1>",
        "<p>Written by <code>tools/report.py</code> from the same asv results as the site.</p>",
    ]
    for name, sub_files, sub_read in subreports:
        link = html.escape(f"{name}/index.html")
        parts.append(f'<section id="report-{html.escape(name)}" class="subreport">')
        parts.append(f'<p>Its own page: <a href="{link}">{link}</a></p>')
        parts += report_parts(sub_files, sub_read, f"{name}/")
        parts.append("</section>")
    parts += report_parts(files, read)
    body = "\n".join(parts)
    return (
        '<!doctype html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>Benchmark report</title>\n<style>{REPORT_CSS}</style>\n</head>\n<body>\n"
        f"{body}\n</body>\n</html>\n"
    )


def _report_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != "index.html")


def _reader(directory: Path):
    return lambda n: (directory / n).read_text(encoding="utf-8")


def publish_report(site: Path, report: Path) -> list[Path]:
    """Copy the report's files into site/report/ (replacing an older copy) and write its
    page, and one page per subdirectory that holds files (a subreport); returns the pages,
    the report's first."""
    dest = site / REPORT_DIR
    if dest.resolve() == report.resolve() or dest.resolve() in report.resolve().parents:
        raise ValueError(f"the report {report} is inside {dest}, which is rewritten")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(report, dest)
    subs = [d for d in sorted(dest.iterdir()) if d.is_dir() and _report_files(d)]
    page = dest / "index.html"
    subreports = [(d.name, _report_files(d), _reader(d)) for d in subs]
    page.write_text(report_page(_report_files(dest), _reader(dest), subreports), "utf-8")
    pages = [page]
    for d in subs:
        sub_page = d / "index.html"
        text = report_page(_report_files(d), _reader(d), up="../../index.html")
        sub_page.write_text(text, encoding="utf-8")
        pages.append(sub_page)
    return pages


# ---------------------------------------------------------------- the injected markup


def banner_html(smoke: set[str], all_machines: set[str]) -> str:
    """The smoke banner ("" when no machine is smoke)."""
    if not smoke:
        return ""
    text = SMOKE_TEXT
    if not all_machines <= smoke:
        text = f"Machine {', '.join(sorted(smoke))}: {text}"
    text = html.escape(text, quote=False)
    return f'<div id="attnbench-smoke-banner" style="{BANNER_STYLE}">{text}</div>'


def extras_block(banner: str, file_warning: bool, not_vendored: bool) -> str:
    """The markup inserted after <body> (between MARK_BEGIN and MARK_END)."""
    parts = [MARK_BEGIN]
    if file_warning:
        parts.append(f'<div id="attnbench-file-warning" style="{FILE_STYLE}">{FILE_TEXT}</div>')
        parts.append(FILE_SCRIPT)
    if not_vendored:
        style = BANNER_STYLE.replace("bottom: 0", "bottom: 26px")
        text = html.escape(NOT_VENDORED_TEXT, quote=False)
        parts.append(f'<div id="attnbench-not-vendored" style="{style}">{text}</div>')
    if banner or not_vendored:
        parts.append(BANNER_ROOM)
    if banner:
        parts.append(banner)
    parts.append(MARK_END)
    return "\n".join(parts) + "\n"


def inject(text: str, block: str, report_link: bool) -> str:
    """A page with the old block (and report link) replaced by the new ones."""
    text = BLOCK.sub("", text)
    text = NAV_ITEM.sub("", text)
    if report_link:
        link = f'<li id="attnbench-report-link"><a href="{REPORT_DIR}/index.html">Report</a></li>'
        text = REGRESSIONS_ITEM.sub(lambda m: m.group(1) + "\n\t" + link, text, count=1)
    m = BODY.search(text)
    if m is None:
        raise ValueError("no <body> tag")
    return text[: m.end()] + block + text[m.end() :]


def extras_site(site: Path, report: Path | None = None, names=DEFAULT_SMOKE_MACHINES) -> dict:
    """Apply everything to the site; returns what was done (for the log line)."""
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"{site}/index.html is missing: run `asv publish` first")
    machines = site_machines(site)
    smoke = smoke_machines(machines, names)
    done = {"smoke": sorted(smoke), "dropped_regressions": 0, "report": False, "pages": 0}
    done["dropped_regressions"] = drop_smoke_regressions(site, smoke, set(machines))
    if report is not None and report.is_dir():
        done["report"] = True
        block = extras_block(banner_html(smoke, set(machines)), False, False)
        for page in publish_report(site, report):
            text = page.read_text(encoding="utf-8")
            page.write_text(inject(text, block, False), encoding="utf-8")
    elif (site / REPORT_DIR).exists():
        shutil.rmtree(site / REPORT_DIR)  # a stale copy of an older report
    banner = banner_html(smoke, set(machines))
    # index.html decides for every page: error.html, where a page that cannot load its
    # libraries sends the reader, has none of its own.
    not_vendored = bool(CDN.search((site / "index.html").read_text(encoding="utf-8")))
    done["vendored"] = not not_vendored
    for page in sorted(site.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        block = extras_block(banner, True, not_vendored)
        new = inject(text, block, done["report"] and page.name == "index.html")
        if new != text:
            page.write_text(new, encoding="utf-8")
        done["pages"] += 1
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="the directory `asv publish` wrote (html_dir)")
    ap.add_argument("--report", type=Path, help="tools/report.py's output directory")
    ap.add_argument(
        "--smoke-machine",
        action="append",
        help="a machine whose results are smoke (repeatable; default: cpu-smoke)",
    )
    args = ap.parse_args(argv)
    names = tuple(args.smoke_machine or DEFAULT_SMOKE_MACHINES)
    if args.report is not None and not args.report.is_dir():
        print(f"site_extras: no report in {args.report}: the site links none", file=sys.stderr)
    try:
        done = extras_site(args.site, args.report, names)
    except (FileNotFoundError, ValueError) as exc:
        print(f"site_extras: error: {exc}", file=sys.stderr)
        return 1
    smoke = ", ".join(done["smoke"]) or "none"
    report = f"{args.site}/{REPORT_DIR}/index.html" if done["report"] else "none"
    if not done["vendored"]:
        print("site_extras: the site is not vendored (no npm?): its pages say they need the "
              "internet; run `npm ci` and tools/site_vendor.py to serve it offline")  # fmt: skip
    print(
        f"site_extras: {done['pages']} page(s); smoke machines: {smoke} "
        f"({done['dropped_regressions']} regression(s) dropped); report page: {report}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
