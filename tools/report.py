#!/usr/bin/env python3
"""Turn asv results into the seed benchmarks' outputs: CSV, plots and KDA tables.

    python tools/report.py --results results --out report [--machine NAME] [--commit HASH]

Reads asv's result files (`results/<machine>/<commit8>-<env>.json`, format version 2, and
`results/benchmarks.json` for parameter names) and writes into --out:

    nsa_forward.csv, nsa_backward.csv      per (preset, pattern, seq_len): kernel and
                                           reference ms, tokens/s, peak VRAM (GB), the
                                           kernel's eager ms and tokens/s, n/a reasons
    vram_vs_seqlen_{fwd,bwd}.png           peak VRAM vs seq_len, kernel vs reference,
    toks_vs_seqlen_{fwd,bwd}.png           tokens/s vs seq_len; reference OOM ceiling and
                                           the throughput crossover marked
    kda_verify.csv, kda_verify.md          per-call us (seed-style / cold) and VRAM per mode
    kda_block_v.csv, kda_block_v.md        the KDA_VERIFY_BLOCK_V sweep
    kda_bandwidth.csv, kda_bandwidth.md    cold bytes/time as % of the copy rate measured
                                           in the same run (nightly and smoke suites)
    summary.md                             machine, commits, OOM ceilings, crossovers, and
                                           the kernel's time growth over 4x the tokens

For every benchmark the newest result file (by date) of the machine that holds a value for
it is used (or, where none does, the newest that holds the benchmark at all); the machine
defaults to the one with the newest results. The dense reference's cost does not depend on
the index pattern, so a pattern without its own reference row borrows the other's.

A point with no value carries its reason (ci/na_reasons.py, shared with the site and the
gate): out of memory (a NaN that the machine's OOM log `<results>/<machine>/
na_reasons.jsonl` records), skipped by choice (any other NaN), failed (asv's null) or not
run (the combination is not in the results). CSV cells of such points are empty and the
`kernel_na` / `ref_na` / `na` columns hold the reason's code; tables, plots and summary.md
name it. The OOM ceiling is marked only where an OOM was recorded.
"""

import argparse
import ast
import csv
import itertools
import json
import math
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.na_reasons import NaReason, classify, describe, is_oom, load_oom, log_path  # noqa: E402

NSA = {"forward": "nsa.NsaForward", "backward": "nsa.NsaBackward"}
KDA_VERIFY, KDA_BLOCK_V, KDA_BANDWIDTH = "kda.KdaVerify", "kda.KdaBlockV", "kda.KdaBandwidth"
SHORT = {"forward": "fwd", "backward": "bwd"}
# Parameter names of the suite's classes, used when benchmarks.json is missing.
NSA_PARAMS = ["seq_len", "impl", "preset", "pattern"]
PARAM_NAMES = {
    NSA["forward"]: NSA_PARAMS,
    NSA["backward"]: NSA_PARAMS,
    KDA_VERIFY: ["batch", "mode", "gate", "heads"],
    KDA_BLOCK_V: ["block_v", "mode", "batch"],
    KDA_BANDWIDTH: ["batch", "mode", "gate", "heads"],
}


# ---------------------------------------------------------------- reading asv's files


def _value(text):
    """asv stores parameter values as their repr: "'triton'" -> 'triton', '4096' -> 4096."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _number(x):
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def load_results(results_dir, machine=None):
    """(machine, [result file dicts, newest first]) for one machine."""
    root = Path(results_dir)
    files = {}
    for path in sorted(root.glob("*/*.json")):
        if path.name == "machine.json":
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"report: skipping unreadable {path}: {exc}", file=sys.stderr)
            continue
        if not isinstance(data, dict) or "results" not in data:
            continue
        files.setdefault(path.parent.name, []).append(data)
    if not files:
        raise SystemExit(f"report: no asv result files under {root}")
    if machine is None:
        machine = max(files, key=lambda m: max(d.get("date", 0) for d in files[m]))
    if machine not in files:
        raise SystemExit(f"report: no results for machine {machine!r} (have {sorted(files)})")
    return machine, sorted(files[machine], key=lambda d: d.get("date", 0), reverse=True)


def param_names(results_dir):
    path = Path(results_dir) / "benchmarks.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v.get("param_names", []) for k, v in data.items() if isinstance(v, dict)}


def points(data, name, names):
    """{params as a sorted tuple of (name, value): (stored value, asv's param strings)} of one
    benchmark in one result file; {} when the file does not hold it."""
    entry = data.get("results", {}).get(name)
    if entry is None:
        return {}
    columns = data.get("result_columns", ["result", "params"])
    row = dict(zip(columns, entry, strict=False)) if isinstance(entry, list) else {}
    values, params = row.get("result"), row.get("params") or []
    combos = list(itertools.product(*params)) if params else [()]
    if not isinstance(values, list):
        values = [values] * len(combos)  # asv writes one null for "every point failed"
    keys = names or [f"p{i}" for i in range(len(params))]
    out = {}
    for combo, value in zip(combos, values, strict=False):
        key = tuple(zip(keys, (_value(v) for v in combo), strict=False))
        out[key] = (value, tuple(map(str, combo)))
    return out


class Results:
    """The newest values of each benchmark on one machine, with the reason of each n/a."""

    def __init__(self, results_dir, machine=None, commit=None, na_log=None):
        self.machine, files = load_results(results_dir, machine)
        if commit:
            files = [d for d in files if str(d.get("commit_hash", "")).startswith(commit)]
            if not files:
                raise SystemExit(f"report: no results for commit {commit} on {self.machine}")
        self.files, self.names, self.used = files, param_names(results_dir), {}
        self.oom = load_oom(na_log or log_path(results_dir, self.machine))

    def get(self, name):
        """{params repr: (params, value or None, NaReason or None)} from the newest file
        holding any value for `name` (else the newest holding `name` at all)."""
        names = self.names.get(name) or PARAM_NAMES.get(name.rsplit(".", 1)[0])
        found = [(d, points(d, name, names)) for d in self.files]
        found = [(d, pts) for d, pts in found if pts]
        if not found:
            return {}
        measured = [
            (d, pts) for d, pts in found if any(_number(v) is not None for v, _ in pts.values())
        ]
        data, pts = (measured or found)[0]
        commit = str(data.get("commit_hash", "?"))
        self.used[name] = commit[:8]
        out = {}
        for key, (value, raw) in pts.items():
            reason = classify(value, oom=is_oom(self.oom, commit, name, raw))
            number = _number(value) if reason is None else None
            out[repr(dict(key))] = (dict(key), number, reason)
        return out

    def rows(self, name):
        return list(self.get(name).values())


# ---------------------------------------------------------------- NSA tables and plots

# When the metrics of one point disagree, the point's reason is the most telling one.
_PRIORITY = [NaReason.OUT_OF_MEMORY, NaReason.FAILED, NaReason.SKIPPED, NaReason.NOT_RUN]
# `ms` is the graph-replay figure for the kernel (the gated one) and the plain per-call
# figure for the dense reference (never captured in a graph); `eager_ms` is the kernel's
# back-to-back eager figure, what the seed's own benchmark measures.
NSA_METRICS = {
    "ms": "track_time",
    "eager_ms": "track_time_eager",
    "tok_s": "track_tokens_per_s",
    "vram_gb": "track_peak_vram_bytes",
}
NSA_SCALE = {"ms": 1e3, "eager_ms": 1e3, "tok_s": 1.0, "vram_gb": 1e-9}


# CSV columns per side; the reference has no eager figure of its own (its `ms` is one).
NSA_COLUMNS = {
    "kernel": ["ms", "tok_s", "eager_ms", "eager_tok_s", "vram_gb"],
    "ref": ["ms", "tok_s", "vram_gb"],
}


def point_reason(reasons):
    """One point's reason from its metrics' reasons: None when any metric was measured."""
    if any(r is None for r in reasons) or not reasons:
        return None
    return min(reasons, key=_PRIORITY.index)


def nsa_table(res, cls):
    """Rows per (preset, pattern, seq_len): kernel and reference figures, and the reason
    (a NaReason code, "" when measured) of each side's missing point."""
    table, why = {}, {}
    for col, method in NSA_METRICS.items():
        for p, v, reason in res.rows(f"{cls}.{method}"):
            key = (p.get("preset"), p.get("pattern"), p.get("seq_len"))
            side = "kernel" if p.get("impl") == "triton" else "ref"
            table.setdefault(key, {})[f"{side}_{col}"] = None if v is None else v * NSA_SCALE[col]
            why.setdefault(key, {}).setdefault(side, {})[col] = reason
    # A metric with no entry at a point that has others was not run there.
    for key in table:
        for side in ("kernel", "ref"):
            per = why[key].setdefault(side, {})
            for col in NSA_METRICS:
                per.setdefault(col, NaReason.NOT_RUN)
    # The default suite records time only; tokens/s follows from it (every preset has B=1,
    # so a call processes seq_len tokens).
    for key, row in table.items():
        T = key[2]
        for side in ("kernel", "ref"):
            ms = row.get(f"{side}_ms")
            if row.get(f"{side}_tok_s") is None and ms and T:
                row[f"{side}_tok_s"] = T / (ms / 1e3)
                why[key][side]["tok_s"] = None
            eager = row.get(f"{side}_eager_ms")
            row[f"{side}_eager_tok_s"] = T / (eager / 1e3) if eager and T else None
    # The dense reference ignores the pattern: borrow another pattern's figures where this
    # one has none, and its reason where this pattern did not run the reference at all.
    for key, row in table.items():
        preset, pattern, T = key
        for other_key, other in table.items():
            if other_key[0] != preset or other_key[2] != T or other_key[1] == pattern:
                continue
            for col in NSA_METRICS:
                mine, theirs = why[key]["ref"], why[other_key]["ref"]
                if row.get(f"ref_{col}") is None and other.get(f"ref_{col}") is not None:
                    row[f"ref_{col}"], mine[col] = other[f"ref_{col}"], None
                elif mine[col] is NaReason.NOT_RUN and theirs[col] is not None:
                    mine[col] = theirs[col]
    rows = []
    for key, row in sorted(
        table.items(), key=lambda kv: tuple(map(str, kv[0][:2])) + (kv[0][2] or 0,)
    ):
        preset, pattern, T = key
        full = {"preset": preset, "pattern": pattern, "seq_len": T}
        for side in ("kernel", "ref"):
            for col in NSA_COLUMNS[side]:
                full[f"{side}_{col}"] = row.get(f"{side}_{col}")
        for side in ("kernel", "ref"):
            reason = point_reason([why[key][side][c] for c in ("ms", "vram_gb")])
            full[f"{side}_na"] = "" if reason is None else reason.value
        rows.append(full)
    return rows


def _reason(row, side):
    code = row.get(f"{side}_na") or ""
    return NaReason(code) if code else None


def oom_ceiling(rows):
    """Smallest seq_len where the reference's OOM was recorded and from which the
    reference has no measured point; None without a recorded OOM."""
    ceiling = None
    for r in sorted(rows, key=lambda r: r["seq_len"], reverse=True):
        reason = _reason(r, "ref")
        if reason is None:
            break
        if reason is NaReason.OUT_OF_MEMORY:
            ceiling = r["seq_len"]
    return ceiling


def na_summary(rows, side):
    """ "out of memory at seq_len 16384, 32768; not run at 65536" for one side's missing
    points, in NaReason order; "" when every point was measured."""
    by_reason = {}
    for r in sorted(rows, key=lambda r: r["seq_len"]):
        reason = _reason(r, side)
        if reason is not None:
            by_reason.setdefault(reason, []).append(str(r["seq_len"]))
    parts = [
        f"{reason.label} at seq_len {', '.join(by_reason[reason])}"
        for reason in NaReason
        if reason in by_reason
    ]
    return "; ".join(parts)


def scaling(rows, factor=4):
    """(T0, T1, ratio): the kernel's time at the largest measured seq_len T1 over its time at
    T1 / factor (linear growth gives `factor`); None without both points."""
    ms = {r["seq_len"]: r["kernel_ms"] for r in rows if r["kernel_ms"] is not None}
    if not ms or max(ms) // factor not in ms:
        return None
    t1 = max(ms)
    return t1 // factor, t1, ms[t1] / ms[t1 // factor]


def crossover(rows, kernel="kernel_tok_s"):
    """Smallest seq_len where the kernel's tokens/s (`kernel`: the graph-replay column, or
    "kernel_eager_tok_s") reaches the reference's (both measured)."""
    for r in sorted(rows, key=lambda r: r["seq_len"]):
        if r.get(kernel) is not None and r["ref_tok_s"] is not None:
            if r[kernel] >= r["ref_tok_s"]:
                return r["seq_len"]
    return None


def has_eager(rows):
    """Any kernel eager figure among the rows."""
    return any(r.get("kernel_eager_tok_s") is not None for r in rows)


def write_csv(path, rows, fields=None):
    fields = fields or (list(rows[0]) if rows else [])
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in fields})


def plot_nsa(out, direction, rows):
    """Two PNGs per direction; one panel per preset, kernel lines per pattern, reference
    dashed; the legend names the OOM ceiling, the crossover and every missing point's reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = sorted({r["preset"] for r in rows}, key=str)
    written = []
    for metric, ylabel, fname in (
        ("vram_gb", "peak VRAM (GB)", f"vram_vs_seqlen_{SHORT[direction]}.png"),
        ("tok_s", "throughput (tokens/s)", f"toks_vs_seqlen_{SHORT[direction]}.png"),
    ):
        fig, axes = plt.subplots(1, max(1, len(presets)), figsize=(7 * max(1, len(presets)), 5))
        axes = list(axes) if hasattr(axes, "__len__") else [axes]
        for ax, preset in zip(axes, presets, strict=False):
            prows = [r for r in rows if r["preset"] == preset]
            draw_panel(ax, prows, metric, ylabel, f"NSA selection {direction} - {preset}")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        written.append(fname)
    return written


def draw_panel(ax, prows, metric, ylabel, title):
    """One preset's panel: kernel lines per pattern, the reference dashed, the marks."""
    eager = metric == "tok_s" and has_eager(prows)
    for pattern in sorted({r["pattern"] for r in prows}, key=str):
        pr = sorted((r for r in prows if r["pattern"] == pattern), key=lambda r: r["seq_len"])
        if eager:  # the seed's figure first, the graph replay beside it
            _line(ax, pr, "kernel_eager_tok_s", f"kernel (Triton) eager, {pattern}", "o-")
            _line(ax, pr, "kernel_tok_s", f"kernel (Triton) graph replay, {pattern}", "^:")
        else:
            _line(ax, pr, f"kernel_{metric}", f"kernel (Triton), {pattern}", "o-")
    ref = {r["seq_len"]: r[f"ref_{metric}"] for r in prows}
    ref_rows = [{"seq_len": t, f"ref_{metric}": v} for t, v in sorted(ref.items())]
    _line(ax, ref_rows, f"ref_{metric}", "reference (dense O(T^2))", "s--")
    _marks(ax, prows, metric)
    ax.set_xscale("log", base=2)
    if metric == "vram_gb" and any(r[f"{s}_vram_gb"] for r in prows for s in ("kernel", "ref")):
        ax.set_yscale("log")
    ax.set_xlabel("seq_len")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8, loc="best")


def _line(ax, rows, key, label, style):
    pts = [(r["seq_len"], r[key]) for r in rows if r.get(key) is not None]
    if pts:
        ax.plot(*zip(*pts, strict=True), style, lw=2, label=label)


def _marks(ax, rows, metric):
    """Vertical lines at the recorded OOM ceiling and the crossover, and one legend entry
    per side listing its missing points by reason. Everything is named in the legend, which
    matplotlib keeps inside the axes, so no label runs over the axis titles."""
    eager = has_eager(rows)
    ceiling = oom_ceiling(rows)
    cross = crossover(rows, "kernel_eager_tok_s" if eager else "kernel_tok_s")
    if ceiling is not None:
        label = f"reference out of memory from seq_len {ceiling}"
        ax.axvline(ceiling, color="gray", ls="--", alpha=0.7, label=label)
    if cross is not None and metric == "tok_s":
        which = " (eager)" if eager else ""
        label = f"kernel wins{which} from seq_len {cross}"
        ax.axvline(cross, color="green", ls="--", alpha=0.7, label=label)
    one_per_len = {}
    for r in rows:
        one_per_len.setdefault(r["seq_len"], r)  # the reference's rows agree across patterns
    sides = [(f"kernel ({p})", "kernel", [r for r in rows if r["pattern"] == p])
             for p in sorted({r["pattern"] for r in rows}, key=str)]  # fmt: skip
    sides.append(("reference", "ref", list(one_per_len.values())))
    for who, side, side_rows in sides:
        text = na_summary(side_rows, side)
        if text:
            label = textwrap.fill(f"{who} n/a: {text}", width=50, subsequent_indent="  ")
            ax.plot([], [], " ", label=label)


# ---------------------------------------------------------------- KDA tables


def kda_rows(res, cls, keys, methods):
    """Rows keyed by `keys` with one column per method (us for times, MB for bytes, %
    as stored) and `na`: the reasons of the row's missing cells ("" when none)."""
    table, why = {}, {}
    for col, method in methods.items():
        for p, v, reason in res.rows(f"{cls}.{method}"):
            key = tuple(p.get(k) for k in keys)
            row = table.setdefault(key, dict(zip(keys, key, strict=True)))
            scale = 1e-6 if method.endswith("bytes") else 1.0 if "_pct_" in method else 1e6
            row[col] = None if v is None else v * scale
            why.setdefault(key, {})[col] = reason
    for key, row in table.items():
        for col in methods:
            if col not in row:
                row[col] = None
                why[key][col] = NaReason.NOT_RUN
        row["na"] = describe(why[key].values())
        row["_why"] = why[key]
    return [table[k] for k in sorted(table, key=lambda k: tuple(str(x).zfill(8) for x in k))]


def _mode_order(mode):
    order = ["unfused", "unfused+ring", "fused", "fused+ring"]
    return (order.index(mode), "") if mode in order else (len(order), str(mode))


def _fmt(x, digits=2, reason=None):
    """A figure, or the reason it is missing."""
    if x is None:
        return reason.label if reason is not None else "n/a"
    return f"{x:.{digits}f}"


def _cell(row, col, digits=2, suffix=""):
    x = row.get(col)
    return _fmt(x, digits, row.get("_why", {}).get(col)) + ("" if x is None else suffix)


def markdown_grid(rows, section_keys, row_key, col_key, cell):
    """One markdown table per section: rows x columns, cells from `cell(row)`."""
    lines = []
    sections = sorted({tuple(r[k] for k in section_keys) for r in rows}, key=str)
    for sec in sections:
        srows = [r for r in rows if tuple(r[k] for k in section_keys) == sec]
        cols = sorted({r[col_key] for r in srows}, key=_mode_order)
        lines += [
            "",
            "### " + ", ".join(f"{k}={v}" for k, v in zip(section_keys, sec, strict=True)),
            "",
        ]
        lines.append(f"| {row_key} | " + " | ".join(map(str, cols)) + " |")
        lines.append("| ---: | " + " | ".join("---:" for _ in cols) + " |")
        for rv in sorted({r[row_key] for r in srows}):
            cells = {r[col_key]: cell(r) for r in srows if r[row_key] == rv}
            lines.append(f"| {rv} | " + " | ".join(cells.get(c, "not run") for c in cols) + " |")
    return lines


def _csv_fields(rows):
    return [k for k in rows[0] if not k.startswith("_")]


def write_kda(out, res):
    written = []
    times = {"seed_us": "track_time", "cold_us": "track_time_cold"}
    cell = lambda r: f"{_cell(r, 'seed_us')} / {_cell(r, 'cold_us')}"
    keys = ["gate", "heads", "batch", "mode"]
    verify = kda_rows(res, KDA_VERIFY, keys, {**times, "peak_vram_mb": "track_peak_vram_bytes"})
    if verify:
        write_csv(out / "kda_verify.csv", verify, _csv_fields(verify))
        lines = ["# KDA chain-verify: us per call (seed-style / cold), CUDA-graph replays", ""]
        lines += markdown_grid(verify, ["gate", "heads"], "batch", "mode", cell)
        (out / "kda_verify.md").write_text("\n".join(lines) + "\n")
        written += ["kda_verify.csv", "kda_verify.md"]
    block_v = kda_rows(res, KDA_BLOCK_V, ["batch", "mode", "block_v"], times)
    if block_v:
        write_csv(out / "kda_block_v.csv", block_v, _csv_fields(block_v))
        lines = ["# KDA_VERIFY_BLOCK_V sweep: us per call (seed-style / cold)", ""]
        lines += markdown_grid(block_v, ["batch"], "block_v", "mode", cell)
        (out / "kda_block_v.md").write_text("\n".join(lines) + "\n")
        written += ["kda_block_v.csv", "kda_block_v.md"]
    bandwidth = kda_rows(res, KDA_BANDWIDTH, keys, {"pct_of_copy": "track_pct_of_copy_rate"})
    if bandwidth:
        write_csv(out / "kda_bandwidth.csv", bandwidth, _csv_fields(bandwidth))
        lines = ["# KDA chain-verify, cold: the spec's bytes per call / time, % of copy rate", ""]
        lines += markdown_grid(
            bandwidth,
            ["gate", "heads"],
            "batch",
            "mode",
            lambda r: _cell(r, "pct_of_copy", 1, "%"),
        )
        (out / "kda_bandwidth.md").write_text("\n".join(lines) + "\n")
        written += ["kda_bandwidth.csv", "kda_bandwidth.md"]
    return written


# ---------------------------------------------------------------- main


def nsa_summary(direction, preset, prows):
    """summary.md's lines for one NSA direction and preset."""
    ceiling, cross = oom_ceiling(prows), crossover(prows)
    eager_cross = crossover(prows, "kernel_eager_tok_s")
    by_len = {}
    for r in prows:
        by_len.setdefault(r["seq_len"], r)  # the reference's rows agree across patterns
    ref_na = na_summary(list(by_len.values()), "ref")
    oom = f"from seq_len {ceiling}" if ceiling is not None else "none recorded"
    cross_text = f"seq_len {cross}" if cross is not None else "(none measured)"
    lines = [
        f"- NSA {direction}, {preset}: reference OOM ceiling {oom}; kernel throughput "
        f"crossover at {cross_text}"
    ]
    if has_eager(prows):
        eager_text = f"seq_len {eager_cross}" if eager_cross is not None else "(none measured)"
        lines[0] += f" (graph replay), at {eager_text} (eager)"
    if ref_na:
        lines.append(f"  - reference n/a: {ref_na}")
    for pattern in sorted({r["pattern"] for r in prows}, key=str):
        pat_rows = [r for r in prows if r["pattern"] == pattern]
        kernel_na = na_summary(pat_rows, "kernel")
        if kernel_na:
            lines.append(f"  - {pattern}: kernel n/a: {kernel_na}")
        scale = scaling(pat_rows)
        if scale:
            lines.append(
                f"  - {pattern}: kernel time x{scale[2]:.2f} from seq_len {scale[0]} "
                f"to {scale[1]} (4x the tokens; linear = 4.00)"
            )
    return lines


def build(results_dir, out, machine=None, commit=None, na_log=None):
    """Write every output; returns the list of files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = Results(results_dir, machine, commit, na_log)
    written, summary = [], [f"# Benchmark report: machine {res.machine}", ""]
    for direction, cls in NSA.items():
        rows = nsa_table(res, cls)
        if not rows:
            summary.append(f"- NSA {direction}: no results")
            continue
        fname = f"nsa_{direction}.csv"
        write_csv(out / fname, rows)
        written += [fname] + plot_nsa(out, direction, rows)
        for preset in sorted({r["preset"] for r in rows}, key=str):
            summary += nsa_summary(direction, preset, [r for r in rows if r["preset"] == preset])
    written += write_kda(out, res)
    summary += ["", "Commits used per benchmark:", ""]
    summary += [f"- {name}: {commit}" for name, commit in sorted(res.used.items())]
    summary += ["", "Files: " + ", ".join(written)]
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    return written + ["summary.md"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="asv results directory")
    parser.add_argument("--out", default="report", help="output directory")
    parser.add_argument("--machine", help="machine name (default: the newest results')")
    parser.add_argument("--commit", help="commit hash prefix (default: newest per benchmark)")
    parser.add_argument(
        "--na-log",
        help="the OOM log (default: <results>/<machine>/na_reasons.jsonl, ci/na_reasons.py)",
    )
    args = parser.parse_args(argv)
    written = build(args.results, args.out, args.machine, args.commit, args.na_log)
    print(f"report: wrote {len(written)} files to {args.out}: " + ", ".join(written))
    print((Path(args.out) / "summary.md").read_text())


if __name__ == "__main__":
    main()
