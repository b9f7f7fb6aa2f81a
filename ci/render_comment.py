#!/usr/bin/env python3
"""Turn `asv compare` output into the markdown of the PR gate's comment.

`asv compare BASE HEAD` prints one or more GitHub-style tables whose rows are

    | Change | Before [hash] | After [hash] | Ratio | Benchmark (Parameter) |

where Change is `+` (significantly worse), `-` (significantly better), `!` (newly failing),
`*` (fixed), `x` (not comparable: the benchmark's version changed) or blank, and a Ratio
with a leading `~` is beyond the factor but not statistically significant. This script
parses those rows, sorts them into time and VRAM tables (by the benchmark method's name:
`time_*` and `track_time*` are time; a name mentioning `mem`/`vram` is memory; anything else
is listed apart),
and writes a comment that starts with a hidden marker, by which the workflow finds and
edits its earlier comment instead of adding a new one per push.

A gate artifact directory holds `compare.txt` (the compare output) and `meta.json` (base,
head, machine, factor and the exit status of `asv continuous`); one comment covers every
GPU type's directory.

Usage:
    python -m ci.render_comment meta gate/ --base B --head H --machine h200 \
        --factor 1.015 --exit-code 1
    python -m ci.render_comment render gate-*/ --run-url URL --out comment.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repo root holds the `ci` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.fileio import write_text_atomic  # noqa: E402
from ci.na_reasons import compare_note  # noqa: E402

MARKER = "<!-- attnbench-gpu-gate -->"
# GitHub refuses comments longer than 65536 characters; leave room for the footer.
MAX_CHARS = 60000
COMPARE, META = "compare.txt", "meta.json"
CONFIRM = "confirm.json"  # ci.confirm's verdict, when the gate's second stage ran
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MARKS = {
    "+": "slower",
    "!": "failed",
    "-": "faster",
    "*": "fixed",
    "x": "not comparable",
    "": "unchanged",
}


@dataclass(frozen=True)
class Row:
    """One benchmark of the compare table."""

    mark: str
    before: str
    after: str
    ratio: str
    name: str

    @property
    def method(self) -> str:
        """The benchmark method's name, e.g. `time_forward` of `mod.Class.time_forward(1, 2)`."""
        return self.name.split("(", 1)[0].rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """`time` for `time_*` and every `track_time*` (whatever follows: `_cold`, `_eager`,
        `_host`, ...), `vram` for other memory figures (`*mem*`, `*vram*`), else `other`."""
        method = self.method.lower()
        if method.startswith(("time_", "track_time")):
            return "time"
        if "mem" in method or "vram" in method:
            return "vram"
        return "other"

    def cells(self) -> list[str]:
        return [self.mark, self.before, self.after, self.ratio, f"`{self.name}`"]


def parse(text: str) -> list[Row]:
    """Rows of every compare table in `text` (header and rule lines are skipped)."""
    rows = []
    for line in ANSI.sub("", text).splitlines():
        line = line.strip()
        if not line.startswith("|") or not line.endswith("|"):
            continue
        cells = [c.strip() for c in line[1:-1].split("|")]
        is_rule = all(c and set(c) <= set("-:") for c in cells)
        if len(cells) != 5 or cells[0] == "Change" or is_rule:
            continue
        if cells[0] not in MARKS:
            raise ValueError(f"unknown change mark {cells[0]!r} in line: {line}")
        rows.append(Row(*cells))
    return rows


def table(rows: list[Row], before: str, after: str, judged_at: dict | None = None) -> str:
    """A markdown table of rows; with judged_at ({point: words}, confirm.json's), a last
    column says which factor judged each point ("stage 1" for a point not in it)."""
    head = ["", f"Before ({before})", f"After ({after})", "Ratio", "Benchmark (parameters)"]
    head += ["Judged at"] * (judged_at is not None)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = r.cells() + ([] if judged_at is None else [judged_at.get(r.name, "stage 1")])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(exit_code: int | None, counts: dict[str, int], confirm: dict | None = None) -> str:
    """The headline: the gate's own exit code decides, the counts and the second stage's
    verdict (confirm.json) say why."""
    confirm = confirm or {}
    if exit_code == 2 or (exit_code is None and counts["failed"]):
        return ":x: **Benchmark failures** (asv exit 2): the gate fails."
    if exit_code == 1 or (exit_code is None and counts["slower"]):
        if confirm.get("head_has_no_number"):
            return (":x: **No numbers at the head**: every point is n/a (a GPU that does not "
                    "work, or a build that broke every benchmark): the gate fails.")  # fmt: skip
        slow = counts["slower"] or confirm.get("confirmed") or confirm.get("sure")
        if confirm.get("lost") and not slow:
            return ":x: **Numbers lost**: points the base measured have none at the head."
        if confirm.get("unjudged_slower") and not slow:
            return ":x: **Suspects not judged** within the time cap: the gate fails."
        return ":x: **Significant slowdown** (asv exit 1): the gate fails."
    if exit_code not in (0, None):
        return f":x: **The benchmark run failed** (exit {exit_code}): see the job log."
    return ":white_check_mark: **No significant regression.**"


def names_list(names: list[str]) -> str:
    """Point names as a markdown list, every one of them."""
    return "\n".join(f"- `{n}`" for n in names)


def render_section(
    text: str,
    base: str,
    head: str,
    machine: str,
    factor: str,
    exit_code: int | None = None,
    confirm: dict | None = None,
    details: bool = True,
) -> str:
    """The comment's part for one GPU type: verdict, summary, regression and kind tables.

    confirm: the gate's second stage (`ci.confirm`'s confirm.json), when it ran: which
    points it re-timed and why the verdict is what it is, so a stage-1 flag that is gone,
    or a point flagged below the first factor, is explained; the points whose number the
    head lost (with the reason, ci/na_reasons.py's words) and the suspects the time cap
    left unjudged, every one. details False leaves out the per-kind tables of every point
    (for a comment that would be too long); the regressions are always listed whole. When
    confirm holds `judged_at`, every table says which factor judged each point: stage 2's,
    the host figures' own (`track_time_eager`, `track_time_host`), or stage 1's."""
    rows = parse(text)
    judged_at = (confirm or {}).get("judged_at")
    counts = {label: sum(r.mark == m for r in rows) for m, label in MARKS.items()}
    summary = ", ".join(f"{n} {label}" for label, n in counts.items() if n) or "no benchmarks"
    out = [
        f"### GPU benchmark gate on `{machine}`: `{base}` → `{head}`",
        "",
        verdict(exit_code, counts, confirm),
        "",
        f"{summary} (factor {factor}; `+` slower, `-` faster, `!` newly failing, "
        "`*` fixed, `x` version changed, `~` beyond the factor but not significant).",
    ]
    note = compare_note(c for r in rows for c in (r.before, r.after))
    if note:
        out += ["", f"Cells without a value: {note} (ci/na_reasons.py)."]
    if confirm is not None:
        suspects = confirm.get("suspects") or []
        names = ", ".join(f"`{n}`" for n in suspects)
        what = f"re-timed {len(suspects)} point(s) ({names})" if suspects else "re-timed nothing"
        out += ["", f"Second stage: {what}; {confirm.get('reason', 'no reason recorded')}."]
        sure = confirm.get("sure") or []
        if sure:
            out += ["", f"Flagged beyond doubt by stage 1 (ratio and disjoint intervals), not "
                        f"re-run: {len(sure)} point(s), in the table below."]  # fmt: skip
        host = confirm.get("host_factor")
        if host is not None:
            out += ["", f"Factors: the host-paced figures (`track_time_eager`, "
                        f"`track_time_host`) are judged at {host:g}, the other timings at "
                        f"{confirm.get('factor', '?')} after their re-runs; the column "
                        "*Judged at* names the factor of each point (*stage 1*: the first "
                        "stage's factor, above)."]  # fmt: skip
    lost = (confirm or {}).get("lost") or []
    if lost:
        lines = ["| Benchmark (parameters) | Before | After |", "|---|---|---|"]
        lines += [f"| `{d['name']}` | {d.get('base', '')} | n/a: {d['label']} |" for d in lost]
        out += ["", f"#### Numbers lost: {len(lost)} point(s) measured at `{base}`, none at "
                    f"`{head}`", "", "\n".join(lines)]  # fmt: skip
    unjudged = (confirm or {}).get("unjudged_slower") or []
    if unjudged:
        cap = (confirm or {}).get("time_cap_s")
        out += ["", f"#### Not judged: {len(unjudged)} slower suspect(s) left when the "
                    f"second stage reached its time cap ({cap} s), or whose re-run recorded "
                    "nothing; the gate fails", "", names_list(unjudged)]  # fmt: skip
    faster = (confirm or {}).get("unjudged_faster") or []
    if faster:
        out += ["", f"Not judged either (faster at stage 1, no regression): {len(faster)} "
                    "point(s).", "", names_list(faster)]  # fmt: skip
    notable = [r for r in rows if r.mark in ("+", "!")]
    if notable:
        out += ["", f"#### Regressions and failures: {len(notable)} point(s)", "",
                table(notable, base, head, judged_at)]  # fmt: skip
    better = [r for r in rows if r.mark in ("-", "*")]
    if better:
        out += ["", "#### Improvements", "", table(better, base, head, judged_at)]
    if not details:
        out += ["", "*(the tables of every point are left out here for length: see the "
                    "artifact's compare.txt)*"]  # fmt: skip
        return "\n".join(out)
    for kind, title in (("time", "Time"), ("vram", "Peak VRAM"), ("other", "Other")):
        group = [r for r in rows if r.kind == kind]
        if group:
            out += [
                "",
                f"<details><summary>{title}: {len(group)} benchmark(s)</summary>",
                "",
                table(group, base, head, judged_at),
                "",
                "</details>",
            ]
    return "\n".join(out)


def render(sections: list[str], run_url: str | None = None) -> str:
    """The whole comment: the hidden marker, then one section per GPU type."""
    body = "\n\n".join([MARKER, *sections]) if sections else MARKER + "\nNo gate results."
    if len(body) > MAX_CHARS:
        body = body[:MAX_CHARS].rsplit("\n", 1)[0] + "\n\n*(truncated: see the artifact)*"
    if run_url:
        body += f"\n\n[Job log and results artifact]({run_url})"
    return body + "\n"


def write_meta(out_dir: Path, **meta) -> Path:
    """Store the gate's parameters beside its compare output (the artifact's meta.json)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / META
    write_text_atomic(path, json.dumps(meta, indent=2) + "\n")
    return path


def render_dirs(dirs: list[Path], run_url: str | None = None) -> str:
    """Render gate artifact directories (each: compare.txt + meta.json, and confirm.json
    when the second stage ran), sorted by machine. When the whole comment would be too
    long, the per-kind tables of every point go first; the regressions, the lost numbers
    and the unjudged suspects stay."""
    loaded = [(json.loads((d / META).read_text()), d) for d in dirs]

    def sections(details):
        return [
            render_section(
                (d / COMPARE).read_text() if (d / COMPARE).exists() else "",
                meta["base"],
                meta["head"],
                meta["machine"],
                meta["factor"],
                meta.get("exit_code"),
                json.loads((d / CONFIRM).read_text()) if (d / CONFIRM).exists() else None,
                details=details,
            )
            for meta, d in sorted(loaded, key=lambda item: item[0]["machine"])
        ]

    full = sections(True)
    if len("\n\n".join([MARKER, *full])) > MAX_CHARS:
        full = sections(False)
    return render(full, run_url)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    meta = sub.add_parser("meta", help="write meta.json into a gate artifact directory")
    meta.add_argument("dir", type=Path)
    meta.add_argument("--base", required=True, help="base revision label")
    meta.add_argument("--head", required=True, help="head revision label")
    meta.add_argument("--machine", required=True, help="asv machine name (GPU type)")
    meta.add_argument("--factor", required=True, help="the gate's --factor")
    meta.add_argument("--exit-code", type=int, required=True, help="`asv continuous` status")
    rend = sub.add_parser("render", help="render gate artifact directories into markdown")
    rend.add_argument("dirs", nargs="+", type=Path, help="directories with compare.txt, meta.json")
    rend.add_argument("--run-url", help="link to the workflow run")
    rend.add_argument("--out", type=Path, help="write here instead of stdout")
    args = ap.parse_args(argv)

    if args.action == "meta":
        write_meta(
            args.dir,
            base=args.base,
            head=args.head,
            machine=args.machine,
            factor=args.factor,
            exit_code=args.exit_code,
        )
        return 0
    body = render_dirs(args.dirs, args.run_url)
    if args.out:
        args.out.write_text(body)
    else:
        sys.stdout.write(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
