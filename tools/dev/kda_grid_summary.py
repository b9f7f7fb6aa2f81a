"""Fused vs unfused KDA verify over the grid, from several fresh processes of gpu_check_kda.

    python -m tools.dev.kda_grid_summary DIR1/kda_check.json DIR2/kda_check.json ... [--bar 1.005]

Each input is one process's `tools/gpu_check_kda.py --out DIR` result. For every head shape
(HV), gate and batch, and for both pairs (fused vs unfused, fused+ring vs unfused+ring), it
takes each mode's median over the processes (seed-style and cold figures apart) and prints
the ratio fused / unfused, marking with `!` each ratio above --bar: the points where the
fused entry point loses to the unfused pair, which is what the issue's bar ("fused <=
unfused x 1.005, each side the median of >= 3 fresh-process medians") is read against.
A point that some process did not time shows `-`. The processes must share one tuning
(`--table-heads`, recorded in each result): a mix is refused.
"""

import argparse
import json
import statistics
from pathlib import Path

PAIRS = (("fused", "unfused"), ("fused+ring", "unfused+ring"))
FIGURES = ("seed_us", "cold_us")


def medians(results):
    """{(HV, gate, B, mode, figure): median over the processes that timed it}."""
    samples = {}
    for result in results:
        for t in result["timings"]:
            for fig in FIGURES:
                key = (t["HV"], t["gate"], t["B"], t["mode"], fig)
                samples.setdefault(key, []).append(t[fig])
    return {k: (statistics.median(v), len(v)) for k, v in samples.items()}


def rows(results, bar):
    """[(HV, gate, B, {(pair, figure): (ratio or None, fused us, unfused us, n)}), ...] in
    grid order, and the list of (HV, gate, B, pair, figure) points above `bar`."""
    med = medians(results)
    points = sorted({(hv, g, b) for hv, g, b, _, _ in med})
    out, losing = [], []
    for hv, g, b in points:
        cells = {}
        for fused, unfused in PAIRS:
            for fig in FIGURES:
                f, u = med.get((hv, g, b, fused, fig)), med.get((hv, g, b, unfused, fig))
                if f is None or u is None:
                    cells[(fused, fig)] = (None, None, None, 0)
                    continue
                ratio = f[0] / u[0]
                cells[(fused, fig)] = (ratio, f[0], u[0], min(f[1], u[1]))
                if ratio > bar:
                    losing.append((hv, g, b, fused, fig))
        out.append((hv, g, b, cells))
    return out, losing


def table(results, bar):
    """The markdown table and the summary line."""
    body, losing = rows(results, bar)
    cols = [(p[0], fig) for p in PAIRS for fig in FIGURES]
    names = {"seed_us": "seed", "cold_us": "cold"}
    lines = [
        "| HV | gate | B | " + " | ".join(f"{m} / unfused, {names[f]}" for m, f in cols) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |",
    ]
    for hv, g, b, cells in body:
        shown = []
        for col in cols:
            ratio, f, u, n = cells[col]
            if ratio is None:
                shown.append("-")
            else:
                mark = " !" if ratio > bar else ""
                shown.append(f"{ratio:.3f}{mark} ({f:.2f} / {u:.2f} us, n={n})")
        lines.append(f"| {hv} | {g} | {b} | " + " | ".join(shown) + " |")
    n = len(body) * len(cols)
    lines.append(f"\n{len(losing)} of {n} ratios above {bar} ({len(results)} processes)")
    return "\n".join(lines), losing


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path, help="kda_check.json files")
    ap.add_argument("--bar", type=float, default=1.005, help="fused / unfused above this loses")
    args = ap.parse_args(argv)
    results = [json.loads(p.read_text()) for p in args.results]
    heads = {r.get("table_heads") for r in results}
    if len(heads) > 1:
        ap.error(
            f"the results mix tunings (table_heads {sorted(heads, key=str)}): summarise each apart"
        )
    print(f"table_heads: {heads.pop()}")
    text, _ = table(results, args.bar)
    print(text)


if __name__ == "__main__":
    main()
