#!/usr/bin/env python3
"""Turn asv results into the seed benchmarks' outputs: CSV, plots and KDA tables.

    python tools/report.py --results results --out report [--machine NAME] [--commit HASH]
                           [--title TEXT]

Reads asv's result files (`results/<machine>/<commit8>-<env>.json`, format version 2, and
`results/benchmarks.json` for parameter names) and writes into --out:

    nsa_forward.csv, nsa_backward.csv      per (preset, pattern, seq_len): kernel and
                                           reference ms, tokens/s, TFLOP/s, % of the matmul
                                           rate, peak VRAM (GB), eager ms and tokens/s,
                                           n/a reasons
    vram_vs_seqlen_{fwd,bwd}.png           peak VRAM vs seq_len (log-log), kernel vs
                                           reference, the recorded OOM ceiling marked
    toks_vs_seqlen_{fwd,bwd}.png           tokens/s vs seq_len: the eager figure where it
                                           exists (what the seed measures), the graph
                                           replay beside it; the crossovers marked
    kda_verify.csv, kda_verify.md          per-call us (seed-style / cold) and VRAM per mode;
                                           the table adds fused / unfused time ratios
    kda_verify_ratio.csv                   those ratios per (gate, heads, batch)
    kda_block_v.csv, kda_block_v.md        the KDA_VERIFY_BLOCK_V sweep
    kda_bandwidth.csv, kda_bandwidth.md    the KDA spec's bytes per call over the cold time,
                                           as % of the copy rate of the same commit
    summary.md                             machine, commits, ceilings, OOM ceilings,
                                           crossovers, throughput at the largest seq_len
                                           and the kernel's time growth over 4x the tokens

Derived figures are computed here from the stored times, never timed by benchmarks of their
own (docs/benchmarks.md, "Derived figures"); a time is asv's stored value of the point, the
median of its samples:

    tokens/s        B * seq_len / time                                 (NSA, track_time)
    TFLOP/s         nsa_flops(preset, seq_len, direction) / time / 1e12
    % of matmul     100 * TFLOP/s / ceilings.Matmul.track_bf16_tflops
    % of copy rate  100 * kda_verify_bytes(batch, heads, mode) / cold time
                    / (ceilings.CopyRate.track_copy_gb_per_s * 1e9)    (KDA, track_time_cold)

A ceiling (Matmul, CopyRate) is taken from the result files of the same machine and commit
as the times it divides; where that commit has none, the percentage is n/a with the
ceiling's reason (usually "not run": the default suite measures no ceiling). Results stored
before the ceilings had a module of their own name them `common.Matmul.*` and
`common.CopyRate.*`: those names are read too, the current one first (FORMER_NAMES).

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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.na_reasons import NaReason, classify, describe, is_oom, load_oom, log_path  # noqa: E402

NSA = {"forward": "nsa.NsaForward", "backward": "nsa.NsaBackward"}
KDA_VERIFY, KDA_BLOCK_V = "kda.KdaVerify", "kda.KdaBlockV"
MATMUL = "ceilings.Matmul.track_bf16_tflops"
COPY_RATE = "ceilings.CopyRate.track_copy_gb_per_s"
# The names the ceilings had while benchmarks/common.py defined them: older result files
# hold these only, and a ceiling is looked up under its current name first.
FORMER_NAMES = {
    MATMUL: ("common.Matmul.track_bf16_tflops",),
    COPY_RATE: ("common.CopyRate.track_copy_gb_per_s",),
}
SHORT = {"forward": "fwd", "backward": "bwd"}
# Parameter names of the suite's classes, used when benchmarks.json is missing.
NSA_PARAMS = ["seq_len", "impl", "preset", "pattern"]
PARAM_NAMES = {
    NSA["forward"]: NSA_PARAMS,
    NSA["backward"]: NSA_PARAMS,
    KDA_VERIFY: ["batch", "mode", "gate", "heads"],
    KDA_BLOCK_V: ["block_v", "mode", "batch"],
}


# ---------------------------------------------------------------- the work behind the rates


@dataclass(frozen=True)
class NsaShape:
    """One NSA preset's shape (benchmarks/nsa.py's PRESETS; tests/test_report.py checks
    that both agree): batch B, query heads Hq, head dim D, block size, S selected blocks."""

    B: int
    Hq: int
    D: int
    block_size: int
    S: int


NSA_SHAPES = {
    "seed": NsaShape(B=1, Hq=16, D=64, block_size=64, S=16),
    "paper": NsaShape(B=1, Hq=64, D=64, block_size=64, S=16),
    "tiny-seed": NsaShape(B=1, Hq=4, D=32, block_size=16, S=3),
    "tiny-paper": NsaShape(B=1, Hq=16, D=32, block_size=16, S=3),
}
# Work of one call relative to the forward's: the backward's dQ, dK, dV and the recomputed
# scores make 2.5 times the forward's matmul work.
NSA_FLOPS_FACTOR = {"forward": 1.0, "backward": 2.5}


def nsa_tokens(preset, seq_len):
    """Tokens one call processes: B * seq_len (None for an unknown preset)."""
    shape = NSA_SHAPES.get(preset)
    return None if shape is None or not seq_len else shape.B * seq_len


def nsa_flops(preset, seq_len, direction):
    """Useful work of one call (FLOP): QK^T and PV over S * block_size selected keys per
    query, 4 * B * Hq * T * S * block_size * D for the forward, NSA_FLOPS_FACTOR times that
    per direction. The dense reference is credited with the same work, so its TFLOP/s
    compares like for like. None for an unknown preset."""
    p = NSA_SHAPES.get(preset)
    if p is None or not seq_len:
        return None
    return 4 * p.B * p.Hq * seq_len * p.S * p.block_size * p.D * NSA_FLOPS_FACTOR[direction]


@dataclass(frozen=True)
class KdaShape:
    """The KDA verify's fixed sizes (benchmarks/kda.py): T draft tokens, head dim K = V,
    conv width W, bytes per activation element (bf16 on a GPU, fp32 in smoke)."""

    T: int
    K: int
    W: int
    elt: int


KDA_GPU_SHAPE = KdaShape(T=4, K=128, W=4, elt=2)
KDA_SMOKE_SHAPE = KdaShape(T=2, K=16, W=4, elt=4)
# The suite names its smoke head shapes apart from the GPU's, so the heads value says which
# sizes a point ran at.
KDA_SMOKE_HEADS = {"H1-HV2"}


def parse_heads(heads):
    """'H8-HV16' -> (8, 16); None when `heads` is not of that form."""
    try:
        h, hv = str(heads).split("-")
        return int(h[1:]), int(hv[2:])
    except ValueError:
        return None


def kda_verify_bytes(batch, heads, mode):
    """Bytes one verify must move at least (the KDA spec's count, benchmarks/kda.py's
    verify_bytes): read the fp32 state once, write T snapshots of it (or the ring entries);
    read mixed_qkv, a, b and the conv state; write the conv windows and o. None for a heads
    value of another form."""
    hh = parse_heads(heads)
    if hh is None or not batch:
        return None
    (H, HV), s = hh, KDA_SMOKE_SHAPE if heads in KDA_SMOKE_HEADS else KDA_GPU_SHAPE
    K = V = s.K
    dim = 2 * H * K + HV * V
    state = HV * V * K * 4
    if str(mode).endswith("+ring"):
        saves = s.T * (H * K * s.elt + HV * V * s.elt + HV * K * 4 + HV * 4)
    else:
        saves = s.T * state
    reads = s.T * dim * s.elt + s.T * HV * K * s.elt + s.T * HV * s.elt + (s.W - 1) * dim * s.elt
    writes = s.T * dim * (s.W - 1) * s.elt + s.T * HV * V * s.elt
    return batch * (state + saves + reads + writes)


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
        self.commits = {}  # benchmark name -> the full hash of the commit its values are from
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
        self.commits[name] = commit
        out = {}
        for key, (value, raw) in pts.items():
            reason = classify(value, oom=is_oom(self.oom, commit, name, raw))
            number = _number(value) if reason is None else None
            out[repr(dict(key))] = (dict(key), number, reason)
        return out

    def rows(self, name):
        return list(self.get(name).values())

    def ceiling(self, name, of):
        """(value, NaReason or None) of the parameterless benchmark `name` (a device
        ceiling) in the result files of the commit that benchmark `of`'s values are from
        (Results.get), this machine; (None, NOT_RUN) when that commit has none.

        `name` is looked up first, then its FORMER_NAMES in order: the first with a value
        wins (so the current name where both hold one); with no value under any, the
        reason is the first name's that the commit holds."""
        commit = self.commits.get(of)
        if commit is None:
            self.get(of)
            commit = self.commits.get(of)
        found = None
        for alias in (name, *FORMER_NAMES.get(name, ())):
            for data in self.files:
                if commit is None or str(data.get("commit_hash", "")) != commit:
                    continue
                pts = points(data, alias, [])
                if not pts:
                    continue
                value, raw = next(iter(pts.values()))
                reason = classify(value, oom=is_oom(self.oom, commit, alias, raw))
                if reason is None:
                    self.used[alias] = commit[:8]
                    return _number(value), None
                found = found or reason
        return None, found or NaReason.NOT_RUN


# ---------------------------------------------------------------- NSA tables and plots

# When the metrics of one point disagree, the point's reason is the most telling one.
_PRIORITY = [NaReason.OUT_OF_MEMORY, NaReason.FAILED, NaReason.SKIPPED, NaReason.NOT_RUN]
# `ms` is the graph-replay figure for the kernel (the gated one) and the plain per-call
# figure for the dense reference (never captured in a graph); `eager_ms` is the back-to-back
# eager figure, what the seed's own benchmark measures (the kernel's on the gated grid; the
# view suite's, kernel and reference, on its whole grid).
NSA_METRICS = {
    "ms": "track_time",
    "eager_ms": "track_time_eager",
    "vram_gb": "track_peak_vram_bytes",
}
NSA_SCALE = {"ms": 1e3, "eager_ms": 1e3, "vram_gb": 1e-9}
# Columns derived from `ms` (docs/benchmarks.md, "Derived figures"): tokens/s, TFLOP/s and
# % of the matmul rate of the same commit.
NSA_DERIVED = ["tok_s", "tflops", "pct_of_matmul"]


# CSV columns per side.
NSA_COLUMNS = {
    side: ["ms", "tok_s", "tflops", "pct_of_matmul", "eager_ms", "eager_tok_s", "vram_gb"]
    for side in ("kernel", "ref")
}


def point_reason(reasons):
    """One point's reason from its metrics' reasons: None when any metric was measured."""
    if any(r is None for r in reasons) or not reasons:
        return None
    return min(reasons, key=_PRIORITY.index)


def nsa_table(res, cls, direction=None):
    """Rows per (preset, pattern, seq_len): kernel and reference figures, the derived ones
    (tokens/s, TFLOP/s, % of the matmul rate: `derive_nsa`), the matmul ceiling used, and
    the reason (a NaReason code, "" when measured) of each side's missing point.
    `direction` ("forward" or "backward") sets the FLOP count; default: the one `cls` is."""
    direction = direction or next((d for d, c in NSA.items() if c == cls), "forward")
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
    # The dense reference ignores the pattern: borrow another pattern's figures where this
    # one has none, and its reason where this pattern's says nothing of the reference's cost:
    # not run, or skipped, which is also what asv stores for a point an `asv run -b`
    # selection leaves out (the view suite runs the reference on one pattern only).
    for key, row in table.items():
        preset, pattern, T = key
        for other_key, other in table.items():
            if other_key[0] != preset or other_key[2] != T or other_key[1] == pattern:
                continue
            for col in NSA_METRICS:
                mine, theirs = why[key]["ref"], why[other_key]["ref"]
                if row.get(f"ref_{col}") is None and other.get(f"ref_{col}") is not None:
                    row[f"ref_{col}"], mine[col] = other[f"ref_{col}"], None
                elif _says_more(theirs[col], mine[col]):
                    mine[col] = theirs[col]
    matmul, matmul_why = res.ceiling(MATMUL, f"{cls}.track_time")
    for key, row in table.items():
        preset, _, T = key
        derive_nsa(row, why[key], preset, T, direction, matmul, matmul_why)
    rows = []
    for key, row in sorted(
        table.items(), key=lambda kv: tuple(map(str, kv[0][:2])) + (kv[0][2] or 0,)
    ):
        preset, pattern, T = key
        full = {"preset": preset, "pattern": pattern, "seq_len": T}
        for side in ("kernel", "ref"):
            for col in NSA_COLUMNS[side]:
                full[f"{side}_{col}"] = row.get(f"{side}_{col}")
        full["matmul_tflops"] = matmul
        for side in ("kernel", "ref"):
            # The gated figures decide (the eager one runs on part of the grid only).
            reason = point_reason([why[key][side][c] for c in ("ms", "vram_gb")])
            full[f"{side}_na"] = "" if reason is None else reason.value
        rows.append(full)
    return rows


def _says_more(theirs, mine):
    """Another pattern's reason `theirs` replaces the reference's `mine` at the same point:
    `mine` is not run or skipped, and `theirs` is a more telling reason (_PRIORITY)."""
    if theirs is None or mine not in (NaReason.NOT_RUN, NaReason.SKIPPED):
        return False
    return _PRIORITY.index(theirs) < _PRIORITY.index(mine)


def derive_nsa(row, why, preset, T, direction, matmul, matmul_why):
    """Fill one row's derived columns in place from its `{side}_ms` (graph replay for the
    kernel, per call for the reference) and `kernel_eager_ms`: tokens/s = B*T / time,
    TFLOP/s = nsa_flops / time / 1e12, % of matmul = 100 * TFLOP/s / `matmul` (TFLOP/s, the
    ceiling of the same commit, None when it has none). `why[side][col]` gets each derived
    cell's reason: the time's, or for the percentage the ceiling's (`matmul_why`)."""
    tokens, flops = nsa_tokens(preset, T), nsa_flops(preset, T, direction)
    for side in ("kernel", "ref"):
        ms, per = row.get(f"{side}_ms"), why[side]
        seconds = ms / 1e3 if ms else None
        tok = tokens / seconds if seconds and tokens else None
        tflops = flops / seconds / 1e12 if seconds and flops else None
        pct = 100.0 * tflops / matmul if tflops is not None and matmul else None
        row[f"{side}_tok_s"], row[f"{side}_tflops"], row[f"{side}_pct_of_matmul"] = tok, tflops, pct
        for col in NSA_DERIVED:
            per[col] = per["ms"]
        if per["ms"] is None and pct is None:
            per["pct_of_matmul"] = matmul_why or NaReason.NOT_RUN
        eager = row.get(f"{side}_eager_ms")
        row[f"{side}_eager_tok_s"] = tokens / (eager / 1e3) if eager and tokens else None


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


def reference_tok_s(row, eager):
    """The reference's tokens/s a kernel figure is compared with: its eager figure for the
    kernel's eager one (`eager`), its `track_time` figure for the graph replay, each falling
    back on the other. The reference is never captured in a graph: both of its figures time
    back-to-back calls between CUDA events, so either is its per-call cost."""
    first, second = ("ref_eager_tok_s", "ref_tok_s") if eager else ("ref_tok_s", "ref_eager_tok_s")
    return row.get(first) if row.get(first) is not None else row.get(second)


def crossover(rows, kernel="kernel_tok_s"):
    """Smallest seq_len where the kernel's tokens/s (`kernel`: the graph-replay column, or
    "kernel_eager_tok_s") reaches the reference's (`reference_tok_s`; both measured)."""
    eager = kernel == "kernel_eager_tok_s"
    for r in sorted(rows, key=lambda r: r["seq_len"]):
        ref = reference_tok_s(r, eager)
        if r.get(kernel) is not None and ref is not None and r[kernel] >= ref:
            return r["seq_len"]
    return None


def crossover_text(rows, kernel="kernel_tok_s"):
    """The crossover in words: "seq_len N", or "seq_len <= N (the first measured)" where the
    kernel is already ahead at the smallest seq_len measured on both sides and smaller ones
    ran for neither (the nightly times eager calls on the gated grid alone), or "(none
    measured)"."""
    cross = crossover(rows, kernel)
    if cross is None:
        return "(none measured)"
    eager = kernel == "kernel_eager_tok_s"
    both = [r["seq_len"] for r in rows
            if r.get(kernel) is not None and reference_tok_s(r, eager) is not None]  # fmt: skip
    if cross == min(both) and cross > min(r["seq_len"] for r in rows):
        return f"seq_len <= {cross} (the first measured)"
    return f"seq_len {cross}"


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
    # The reference: one line per figure (its rows agree across patterns). For tokens/s the
    # eager figure where it exists, dashed, and its track_time beside it, dotted.
    ref_lines = [(f"ref_{metric}", "reference (dense O(T^2))", "s--")]
    if metric == "tok_s" and any(r.get("ref_eager_tok_s") is not None for r in prows):
        ref_lines = [("ref_eager_tok_s", "reference (dense O(T^2)) eager", "s--"),
                     ("ref_tok_s", "reference (dense O(T^2)), track_time", "x:")]  # fmt: skip
    for key, label, style in ref_lines:
        ref = {}
        for r in prows:
            if r.get(key) is not None:
                ref.setdefault(r["seq_len"], r[key])
        _line(ax, [{"seq_len": t, key: v} for t, v in sorted(ref.items())], key, label, style)
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
    col = "kernel_eager_tok_s" if eager else "kernel_tok_s"
    cross = crossover(rows, col)
    if ceiling is not None:
        label = f"reference out of memory from seq_len {ceiling}"
        ax.axvline(ceiling, color="gray", ls="--", alpha=0.7, label=label)
    if cross is not None and metric == "tok_s":
        which = " (eager)" if eager else ""
        label = f"kernel wins{which} from {crossover_text(rows, col)}"
        ax.axvline(cross, color="green", ls="--", alpha=0.7, label=label)
    graph_cross = crossover(rows) if eager else None
    if graph_cross is not None and metric == "tok_s":
        label = f"kernel wins (graph replay) from {crossover_text(rows)}"
        ax.axvline(graph_cross, color="green", ls=":", alpha=0.7, label=label)
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
    """Rows keyed by `keys` with one column per method (us for times, MB for bytes) and
    `na`: the reasons of the row's missing cells ("" when none)."""
    table, why = {}, {}
    for col, method in methods.items():
        for p, v, reason in res.rows(f"{cls}.{method}"):
            key = tuple(p.get(k) for k in keys)
            row = table.setdefault(key, dict(zip(keys, key, strict=True)))
            scale = 1e-6 if method.endswith("bytes") else 1e6
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


def markdown_grid(rows, section_keys, row_key, col_key, cell, extra=()):
    """One markdown table per section: rows x columns, cells from `cell(row)`; `extra`:
    (header, fn) pairs of further columns, fn(the table row's rows by column value) -> text."""
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
        heads = [*map(str, cols), *(h for h, _ in extra)]
        lines.append(f"| {row_key} | " + " | ".join(heads) + " |")
        lines.append("| ---: | " + " | ".join("---:" for _ in heads) + " |")
        for rv in sorted({r[row_key] for r in srows}):
            by_col = {r[col_key]: r for r in srows if r[row_key] == rv}
            cells = [cell(by_col[c]) if c in by_col else "not run" for c in cols]
            cells += [fn(by_col) for _, fn in extra]
            lines.append(f"| {rv} | " + " | ".join(cells) + " |")
    return lines


# The fused/unfused comparisons of the KDA table: (column, numerator mode, denominator mode).
KDA_RATIOS = [
    ("fused_over_unfused", "fused", "unfused"),
    ("fused_ring_over_unfused_ring", "fused+ring", "unfused+ring"),
]


def _ratio(by_mode, num, den, col):
    """(by_mode[num][col] / by_mode[den][col], None) or (None, the reason of the missing
    figure: the numerator's first, NOT_RUN for a mode not in the table)."""
    figures = []
    for mode in (num, den):
        row = by_mode.get(mode)
        if row is None:
            return None, NaReason.NOT_RUN
        if row.get(col) is None:
            return None, row.get("_why", {}).get(col) or NaReason.NOT_RUN
        figures.append(row[col])
    return (figures[0] / figures[1], None) if figures[1] else (None, NaReason.SKIPPED)


def kda_ratio_rows(verify):
    """Per (gate, heads, batch): fused / unfused and fused+ring / unfused+ring per-call
    time, seed-style and cold (below 1: the fused kernel is faster), and `na`, the reasons
    of the missing ratios."""
    groups = {}
    for r in verify:
        groups.setdefault((r["gate"], r["heads"], r["batch"]), {})[r["mode"]] = r
    out = []
    for (gate, heads, batch), by_mode in groups.items():
        row, why = {"gate": gate, "heads": heads, "batch": batch}, {}
        for name, num, den in KDA_RATIOS:
            for timing in ("seed", "cold"):
                col = f"{timing}_{name}"
                row[col], why[col] = _ratio(by_mode, num, den, f"{timing}_us")
        row["na"], row["_why"] = describe(why.values()), why
        out.append(row)
    return out


def _ratio_cell(by_mode, num, den):
    """ "seed / cold" ratio text of one table row (the reason where a ratio is missing)."""
    parts = []
    for timing in ("seed", "cold"):
        x, why = _ratio(by_mode, num, den, f"{timing}_us")
        parts.append(_fmt(x, 2, why))
    return " / ".join(parts)


def kda_bandwidth_rows(res, verify):
    """The KDA spec's bytes per call (kda_verify_bytes) over the stored cold time, as % of
    ceilings.CopyRate's copy rate of the same commit as KdaVerify.track_time_cold."""
    copy_gbps, copy_why = res.ceiling(COPY_RATE, f"{KDA_VERIFY}.track_time_cold")
    out = []
    for r in verify:
        nbytes = kda_verify_bytes(r["batch"], r["heads"], r["mode"])
        cold = r.get("cold_us")
        gbps = nbytes / (cold * 1e-6) / 1e9 if cold and nbytes else None
        pct = 100.0 * gbps / copy_gbps if gbps is not None and copy_gbps else None
        why = r["_why"].get("cold_us")
        if why is None and pct is None:
            why = copy_why or NaReason.NOT_RUN
        row = {k: r[k] for k in ("gate", "heads", "batch", "mode")}
        row.update(bytes=nbytes, cold_us=cold, gb_per_s=gbps, copy_gb_per_s=copy_gbps)
        row.update(pct_of_copy=pct, na=describe([why]), _why={"pct_of_copy": why})
        out.append(row)
    return out


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
        ratios = kda_ratio_rows(verify)
        write_csv(out / "kda_verify_ratio.csv", ratios, _csv_fields(ratios))
        lines = [
            "# KDA chain-verify: us per call (seed-style / cold), CUDA-graph replays",
            "",
            "The last two columns: fused / unfused and fused+ring / unfused+ring per-call "
            "time (seed-style / cold); below 1 the fused kernel is faster. The fused modes "
            "always run the fused kernel (`fused_kda_conv_gating_verify` does not route any "
            "shape to the unfused pair), so no ratio is a tie by construction.",
        ]
        extra = [
            ("fused / unfused", lambda m: _ratio_cell(m, "fused", "unfused")),
            ("fused+ring / unfused+ring", lambda m: _ratio_cell(m, "fused+ring", "unfused+ring")),
        ]
        lines += markdown_grid(verify, ["gate", "heads"], "batch", "mode", cell, extra)
        (out / "kda_verify.md").write_text("\n".join(lines) + "\n")
        written += ["kda_verify.csv", "kda_verify_ratio.csv", "kda_verify.md"]
    block_v = kda_rows(res, KDA_BLOCK_V, ["batch", "mode", "block_v"], times)
    if block_v:
        write_csv(out / "kda_block_v.csv", block_v, _csv_fields(block_v))
        lines = ["# KDA_VERIFY_BLOCK_V sweep: us per call (seed-style / cold)", ""]
        lines += markdown_grid(block_v, ["batch"], "block_v", "mode", cell)
        (out / "kda_block_v.md").write_text("\n".join(lines) + "\n")
        written += ["kda_block_v.csv", "kda_block_v.md"]
    bandwidth = kda_bandwidth_rows(res, verify)
    if bandwidth:
        write_csv(out / "kda_bandwidth.csv", bandwidth, _csv_fields(bandwidth))
        copy = bandwidth[0]["copy_gb_per_s"]
        rate = f"{copy:.0f} GB/s" if copy else "n/a"
        lines = [
            "# KDA chain-verify, cold: the spec's bytes per call / time, % of copy rate",
            "",
            f"Copy rate of the same commit (CopyRate): {rate}.",
        ]
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
    ceiling = oom_ceiling(prows)
    by_len = {}
    for r in prows:
        by_len.setdefault(r["seq_len"], r)  # the reference's rows agree across patterns
    ref_na = na_summary(list(by_len.values()), "ref")
    oom = f"from seq_len {ceiling}" if ceiling is not None else "none recorded"
    cross_text = crossover_text(prows)
    lines = [
        f"- NSA {direction}, {preset}: reference OOM ceiling {oom}; kernel throughput "
        f"crossover at {cross_text}"
    ]
    if has_eager(prows):
        eager_text = crossover_text(prows, "kernel_eager_tok_s")
        lines[0] += f" (graph replay), at {eager_text} (eager)"
    if ref_na:
        lines.append(f"  - reference n/a: {ref_na}")
    for pattern in sorted({r["pattern"] for r in prows}, key=str):
        pat_rows = [r for r in prows if r["pattern"] == pattern]
        kernel_na = na_summary(pat_rows, "kernel")
        if kernel_na:
            lines.append(f"  - {pattern}: kernel n/a: {kernel_na}")
        rate = throughput_line(pat_rows)
        if rate:
            lines.append(f"  - {pattern}: {rate}")
        scale = scaling(pat_rows)
        if scale:
            lines.append(
                f"  - {pattern}: kernel time x{scale[2]:.2f} from seq_len {scale[0]} "
                f"to {scale[1]} (4x the tokens; linear = 4.00)"
            )
    return lines


def throughput_line(rows):
    """The kernel's derived figures at its largest measured seq_len, as one line of text:
    "kernel at seq_len 32768: 1.23e+07 tokens/s, 45.6 TFLOP/s, 6.6% of the matmul rate
    (690 TFLOP/s)"; "" without a measured point."""
    measured = [r for r in rows if r.get("kernel_tok_s") is not None]
    if not measured:
        return ""
    r = max(measured, key=lambda r: r["seq_len"])
    text = f"kernel at seq_len {r['seq_len']}: {r['kernel_tok_s']:.3g} tokens/s"
    if r.get("kernel_tflops") is not None:
        text += f", {r['kernel_tflops']:.3g} TFLOP/s"
    if r.get("kernel_pct_of_matmul") is not None:
        text += f", {r['kernel_pct_of_matmul']:.1f}% of the matmul rate"
        text += f" ({r['matmul_tflops']:.0f} TFLOP/s)"
    else:
        text += ", % of the matmul rate n/a (no Matmul ceiling stored for this commit)"
    return text


def build(results_dir, out, machine=None, commit=None, na_log=None, title=None):
    """Write every output; returns the list of files written. `title`: summary.md's heading
    (default "Benchmark report"), followed by the machine's name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = Results(results_dir, machine, commit, na_log)
    written, summary = [], [f"# {title or 'Benchmark report'}: machine {res.machine}", ""]
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
    parser.add_argument("--title", help="summary.md's heading (default: Benchmark report)")
    args = parser.parse_args(argv)
    written = build(args.results, args.out, args.machine, args.commit, args.na_log, args.title)
    print(f"report: wrote {len(written)} files to {args.out}: " + ", ".join(written))
    print((Path(args.out) / "summary.md").read_text())


if __name__ == "__main__":
    main()
