"""The host A/B of `gpu_nsa_host` as one table: every process of each side, and per side the
fastest process and the median.

    python3 -m tools.dev.nsa_host_ab DIR [--sides new old] [--figure host_us]

DIR holds one folder per fresh process, named SIDE_ROUND (`new_1`, `old_1`, `new_2`, ...),
each with the `host.json` that `gpu_nsa_host --out` writes. Runs on any machine (it reads
JSON only). Why per process and the fastest one: on the GPU hosts the same code reads up to
2x apart between processes (interference comes whole-process, `docs/measurement.md`), so a
side's fastest process is its code's cost under the least interference, and the spread is
shown rather than averaged away. The issue's host bars (forward <= 80 us, backward with lse
given <= 150 us) are marked per side: met when every process of that side is under the
bar.
"""

import argparse
import json
import pathlib
import re
import statistics

BARS_US = {"forward": 80.0, "backward": 150.0}  # the host bars per call (issue: NSA per-call)


def load(root, sides):
    """{side: [rows of each process's host.json, in round order]} for the SIDE_ROUND
    folders under root whose SIDE is one of `sides`."""
    runs = {}
    for path in sorted(pathlib.Path(root).glob("*/host.json")):
        m = re.fullmatch(r"(.+)_(\d+)", path.parent.name)
        if m is None or m.group(1) not in sides:
            continue
        runs.setdefault(m.group(1), []).append((int(m.group(2)), json.loads(path.read_text())))
    return {side: [rows for _, rows in sorted(found)] for side, found in runs.items()}


def table(runs, sides, figure="host_us"):
    """Markdown rows: T, pattern, call, then per side its processes, fastest and median,
    then fastest(first side) / fastest(second side)."""
    points = {}
    for side in sides:
        for rows in runs.get(side, []):
            for row in rows:
                if figure not in row or "T" not in row:
                    continue
                key = (row["T"], row["pattern"], row["call"])
                points.setdefault(key, {s: [] for s in sides})[side].append(row[figure])
    head = ["T", "pattern", "call"]
    for side in sides:
        head += [f"{side} (each process)", f"{side} fastest", f"{side} median"]
    if len(sides) == 2:
        head.append(f"fastest {sides[0]} / {sides[1]}")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (T, pattern, call), got in sorted(points.items()):
        cells = [str(T), pattern, call]
        for side in sides:
            xs = got[side]
            if not xs:
                cells += ["-", "-", "-"]
                continue
            bar = BARS_US.get(call)
            mark = " (bar met)" if bar is not None and max(xs) <= bar else ""
            cells += [", ".join(f"{x:.1f}" for x in xs), f"{min(xs):.1f}{mark}",
                      f"{statistics.median(xs):.1f}"]  # fmt: skip
        if len(sides) == 2:
            a, b = got[sides[0]], got[sides[1]]
            cells.append(f"{min(a) / min(b):.2f}" if a and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sides", nargs="+", default=["new", "old"])
    ap.add_argument("--figure", default="host_us", choices=["host_us", "eager_us", "graph_us"])
    a = ap.parse_args(argv)
    runs = load(a.dir, a.sides)
    missing = [s for s in a.sides if s not in runs]
    if missing:
        raise SystemExit(f"no SIDE_ROUND/host.json folders for {', '.join(missing)} in {a.dir}")
    print(", ".join(f"{s}: {len(runs[s])} processes" for s in a.sides))
    print(table(runs, a.sides, a.figure))


if __name__ == "__main__":
    main()
