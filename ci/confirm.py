#!/usr/bin/env python3
"""Second stage of the GPU PR gate: judge every suspect of `asv continuous`, or say which not.

Stage 1 is `asv continuous BASE HEAD --factor F1 -a rounds=2 --interleave-rounds`. Its
factor has to stay above what a point's median moves between fresh processes (on the H200
up to about 0.5% per process for the noisiest point, docs/measurement.md), so a 1% slowdown
there is not always flagged, and a flag close to F1 may be noise. This stage reads both
commits' stored results and sorts the timing points (`time_*`, `track_time*`):

- **beyond doubt**: stage 1 flagged it slower, its median ratio head/base is at least
  `--sure` (1.03) and the 99% intervals of the two medians do not overlap. The flag
  stands; no time is spent on it.
- **suspects**: every other timing point that stage 1 flagged, and every timing point whose
  ratio lies beyond `--suspect` either way (every timing point when it is 1). The slower
  ones (stage-1 flags, then slower by ratio) are re-run in that order; the faster ones are
  listed as faster, not re-run (a faster point is no regression, and re-timing it would
  spend the time cap of a change that speeds many points up), unless `--retime-faster`
  (or `--suspect 1`) puts them after the slower ones, by distance. Re-runs go in batches
  of at most `--batch`: `--rounds` more fresh processes per side, base and head
  alternating (`asv run --append-samples -a rounds=R --interleave-rounds`), so that their
  medians rest on 2 + R processes; `asv compare --factor F2` on the pooled samples then
  judges them. The spread of a median over N processes shrinks about as 1 / sqrt(N), which
  is what lets F2 sit below F1 without more false flags.
- A batch is started only while the time spent re-running stays within `--time-cap`
  seconds (a batch's size shrinks to the points that fit at the pace measured so far).
  The suspects left when the cap is reached are **unjudged**: they are listed, and one on
  the slower side (a ratio above 1, or a stage-1 flag) fails the gate. None is dropped. A
  suspect whose stored samples did not grow on both sides (a re-run that recorded nothing)
  counts as unjudged too: its compare row would rest on stage 1's samples alone.

The host-paced figures (`track_time_eager`, `track_time_host`, in every class: the names
matching HOST_FIGURE) move more between processes than the graph-replay `track_time`: host
work only ever gets slower under interference, and on the H200 it comes whole-process (one
process in three to five reads 1.5-2x its neighbours at every point, docs/measurement.md).
A median over a few processes then moves with how many slow ones a side drew. So a host
figure is judged by its own estimator and factor: the `--host-quantile` (0.1) quantile of a
side's pooled samples, the code's own cost under the least interference, and the ratio of
the two sides' quantiles against `--host-factor`. Graph figures keep `--factor`, `--sure`
and stage 1's factor. For a host figure the stage-1 ratio is that estimator's over stage
1's samples; its flag is never beyond doubt (in an A/A try on an H100 both of a side's two
stage-1 processes were slow ones: 1.38, with disjoint intervals); a stage-1 flag (asv's,
by medians at the graph factor) whose estimator lies within the suspect band is cleared on
it ("rejudged"), one beyond it is re-run like any suspect (with `--rounds 0`, one whose
estimator is below `--host-factor` is rejudged); after the re-runs the pooled samples'
estimator decides (confirm-host.txt). Its ratios are read in units of its own factor: a
host figure is a suspect when its log-ratio, divided by log(host) / log(factor), lies
beyond `--suspect`, and the suspects are ordered by that scaled distance, so noise within
the host factor neither crowds out the graph suspects nor fills the time cap. A host
figure that stage 1 flagged faster is judged by the same estimator: within the suspect band
it is cleared (rejudged, no longer listed as faster; a slow base process makes such flags
as often as a slow head process makes slower ones), beyond it it is listed, not re-run,
like any faster point.

Besides the timings, a number that vanished fails the gate: a point the base measured and
the head did not (out of memory, failed, skipped by the benchmark's choice, not run: the
reasons of ci/na_reasons.py, the OOM log beside the results), and a head where no point has
a number at all (a runner whose GPU does not work, a build that broke everything).

The verdict (the exit code, as `asv continuous`'s): 2 when stage 1 had a failing benchmark
(nothing is re-run then) or a re-run suspect failed or vanished from the compare; 1 when
the head lost numbers, has none, or a flag beyond doubt, a confirmed suspect, a non-timing
flag of stage 1 (it is not re-run: its flag stands) or an unjudged slower suspect remains;
else 0. A stage-1 flag that stage 2 clears passes: that is a false flag avoided. With
`--rounds 0` nothing is re-run: stage 1's flags stand, the n/a rules still apply.

    python -m ci.confirm --machine h200 --base SHA --head SHA \
        --continuous-log gate/continuous.log --continuous-code 1 --rounds 6 \
        --suspect 1.005 --factor 1.006 --out gate [--host-factor 1.08] [--host-quantile 0.1] \
        [--sure 1.03] [--batch 8] \
        [--time-cap 1800] [--asv ".venv/bin/asv"] [--stage1-compare gate/compare.txt] \
        [--config asv.conf.json] [--results results] [--run-args "--launch-method spawn"]

Writes to --out: suspects.json (the plan: every suspect, the flags beyond doubt, every
point's stage-1 ratio; after the re-runs, which suspects were judged and which not),
confirm-run.log, confirm-compare.txt (asv compare of every point at --factor after the
re-runs: the judged suspects' rows from pooled samples; confirm-host.txt the judged host
figures' rows, by their estimator), final-compare.txt (stage 2's rows
for the judged suspects, stage 1's for the rest, from --stage1-compare if given, else
from the continuous log: what the gate decided on) and confirm.json (the verdict, why,
and every list the PR comment shows). Prints the exit code's reason.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ci import na_reasons
from ci.asv_results import stored_points, stored_samples
from ci.fileio import write_text_atomic
from ci.render_comment import Row, parse

# Defaults of the rules above; the workflow passes its own (gpu-pr-gate.yml's env).
SURE_RATIO = 1.03
TIME_CAP_S = 1800.0
BATCH = 8
# The host-paced timing figures: back-to-back eager calls timed by device events, and host
# time per call. Both carry the host's jitter, which a graph replay does not.
HOST_FIGURE = re.compile(r"\.track_time_(eager|host)\b")
# Which quantile of a side's pooled samples stands for a host figure. Interference only adds
# host time, so the low tail is the code's own cost; 0.1 rather than the minimum, so that no
# single sample decides, and low enough to stay among the fast processes while up to about a
# quarter of a side's processes are slow ones.
HOST_QUANTILE = 0.1


def flagged(rows):
    """(slower, failed) point names of parsed compare rows."""
    return [r.name for r in rows if r.mark == "+"], [r.name for r in rows if r.mark == "!"]


def is_timing(name):
    """Whether a point is a timing (`time_*`, any `track_time*`): only timings are noisy
    enough to need a second look; a peak-VRAM figure is the same in every process."""
    return Row("", "", "", "", name).kind == "time"


def is_host_figure(name):
    """Whether a point is a host-paced timing (HOST_FIGURE), judged at the host factor."""
    return HOST_FIGURE.search(name) is not None


def factor_for(name, factor, host_factor=None):
    """The factor that judges a point: host_factor for a host figure (when given), else
    factor."""
    return host_factor if host_factor is not None and is_host_figure(name) else factor


def low_quantile(samples, q):
    """The q-quantile (0 <= q <= 1) of `samples`, linear between order statistics."""
    s = sorted(samples)
    if not s:
        raise ValueError("no samples")
    x = q * (len(s) - 1)
    i = int(x)
    return s[i] if i + 1 >= len(s) else s[i] + (x - i) * (s[i + 1] - s[i])


def host_ratios(base_samples, head_samples, q=HOST_QUANTILE):
    """{host figure: low_quantile(head) / low_quantile(base)} of the host figures both sides
    hold samples of ({point: samples} each, as ci.asv_results.stored_samples gives)."""
    out = {}
    for n, sb in base_samples.items():
        sh = head_samples.get(n)
        if is_host_figure(n) and sb and sh:
            qb = low_quantile(sb, q)
            if qb > 0:
                out[n] = low_quantile(sh, q) / qb
    return out


def host_rows(names, base_samples, head_samples, host_factor, q=HOST_QUANTILE):
    """Compare rows of the host figures `names`, judged by their estimator: before/after the
    sides' q-quantiles, the mark "+" at a ratio of at least host_factor, "-" at most its
    inverse. A point without samples on both sides gets no row (it counts as lost)."""
    from asv.util import human_time

    rows = []
    for n in names:
        sb, sh = base_samples.get(n), head_samples.get(n)
        if not sb or not sh:
            continue
        qb, qh = low_quantile(sb, q), low_quantile(sh, q)
        r = qh / qb if qb > 0 else math.inf
        mark = "+" if r >= host_factor else "-" if r <= 1.0 / host_factor else ""
        rows.append(Row(mark, human_time(qb), human_time(qh), f"{r:.3f}", n))
    return rows


def measured(point):
    """The point's value when it is a number (None when missing, n/a or failed)."""
    v = None if point is None else point.value
    return v if na_reasons.is_measured(v) else None


def ratios_of(base, head):
    """{point: median ratio head/base} of the points both sides measured (Points)."""
    out = {}
    for n, b in base.items():
        vb, vh = measured(b), measured(head.get(n))
        if vb is not None and vh is not None and vb > 0:
            out[n] = vh / vb
    return out


def beyond_doubt(base_point, head_point, sure):
    """A slowdown no re-run could clear: ratio >= `sure` and the head's 99% interval lies
    wholly above the base's (False when either interval is missing)."""
    vb, vh = measured(base_point), measured(head_point)
    if vb is None or vh is None or vb <= 0 or vh / vb < sure:
        return False
    if base_point.ci is None or head_point.ci is None:
        return False
    return head_point.ci[0] > base_point.ci[1]


@dataclass
class Plan:
    """What stage 2 does with stage 1's points.

    sure: timing flags beyond doubt (kept, not re-run); suspects: timing points to re-run,
    in order (the faster ones last); faster: the suspects on the faster side; kept: stage-1
    flags that are not re-run for another reason (not timings, or stage 2 is off);
    rejudged: host-figure flags, slower or faster, that stage 1's own estimator clears
    (within the suspect band or, stage 2 off, within the host factor); ratios: every
    point's stage-1 ratio (the medians', the host estimator's for a host figure).
    """

    sure: list[str] = field(default_factory=list)
    suspects: list[str] = field(default_factory=list)
    faster: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    rejudged: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)


def plan_stage2(
    base, head, slower, suspect, sure=SURE_RATIO, rerun=True, factor=None, host_factor=None,
    host_ratio=None, faster=(),
):  # fmt: skip
    """The Plan for stage 1's flags `slower` (names) over stored Points `base`/`head`.

    suspect: the ratio beyond which (either way) a timing point is re-run, >= 1 (1: every
    timing point); sure: the ratio of a flag beyond doubt; rerun False: stage 2 is off
    (stage 1's flags are all kept, no suspect, a host figure's below host_factor aside).
    host_factor: the factor of the host figures (None: they are judged as the others);
    it needs factor, stage 2's factor for the others, with 1 < factor <= host_factor. A
    host figure's flag is then never beyond doubt (it is re-run), and its log-ratio counts
    in units of log(host_factor) / log(factor) for `suspect` and the order.
    host_ratio: {host figure: its estimator's ratio} (host_ratios()), which replaces the
    medians' ratio of those points; with it, a host flag whose ratio lies within the scaled
    suspect band is cleared on it (rejudged), not re-run.
    faster: stage 1's faster flags (names). A host figure among them is rejudged the same
    way: stage 1 flags by medians, which one slow base process moves as much as one slow
    head process does, so a faster flag that the host estimator puts within its band is
    noise, and listing it as an improvement would mislead as much as a false slowdown."""
    if suspect < 1.0:
        raise ValueError(f"--suspect must be >= 1, got {suspect}")
    if host_factor is not None and (factor is None or not 1.0 < factor <= host_factor):
        raise ValueError(
            f"--host-factor needs 1 < --factor <= --host-factor, got {factor}, {host_factor}"
        )
    scale = 1.0 if host_factor is None else math.log(host_factor) / math.log(factor)

    def hosted(n):
        """Whether the point is judged as a host figure."""
        return host_factor is not None and is_host_figure(n)

    def unit(n):
        """What one unit of log-ratio weighs for this point (its factor's, over factor's)."""
        return scale if is_host_figure(n) else 1.0

    ratio = ratios_of(base, head)
    if host_factor is not None and host_ratio:
        ratio.update({n: r for n, r in host_ratio.items() if n in ratio and is_host_figure(n)})
    flags = list(dict.fromkeys(slower))
    down_flags = [n for n in dict.fromkeys(faster) if n not in flags]
    if not rerun:
        below = [
            n for n in flags if host_factor is not None and is_host_figure(n)
            and n in ratio and ratio[n] < host_factor
        ]  # fmt: skip
        below += [
            n for n in down_flags if host_factor is not None and is_host_figure(n)
            and n in ratio and ratio[n] > 1.0 / host_factor
        ]  # fmt: skip
        kept = [n for n in flags if n not in below]
        return Plan(kept=kept, rejudged=below, ratios=ratio)
    plan = Plan(ratios=ratio)
    plan.kept = [n for n in flags if not is_timing(n)]
    timing_flags = [n for n in flags if is_timing(n)]
    # A host figure's stage-1 flag is never beyond doubt: both of a side's two processes can
    # be slow ones, with tight intervals each, so its sure-looking flags are re-run.
    plan.sure = [
        n for n in timing_flags
        if not hosted(n) and beyond_doubt(base.get(n), head.get(n), sure)
    ]  # fmt: skip
    dist = {n: abs(math.log(r)) / unit(n) for n, r in ratio.items()}
    if host_factor is not None and host_ratio:
        plan.rejudged = [
            n for n in timing_flags + down_flags if n not in plan.sure and hosted(n)
            and n in host_ratio and dist[n] <= math.log(suspect)
        ]  # fmt: skip
    doubtful = [n for n in timing_flags if n not in plan.sure + plan.rejudged]
    doubtful.sort(key=lambda n: -math.log(ratio[n]) / unit(n) if n in ratio else -math.inf)
    # --suspect 1: every timing point (a test of the plumbing), else those strictly beyond.
    far = [n for n in ratio if is_timing(n) and n not in flags
           and (suspect == 1.0 or dist[n] > math.log(suspect))]  # fmt: skip
    up = sorted((n for n in far if ratio[n] >= 1.0), key=lambda n: -dist[n])
    down = sorted((n for n in far if ratio[n] < 1.0), key=lambda n: -dist[n])
    plan.suspects = doubtful + up + down
    plan.faster = down
    return plan


def lost_numbers(base, head, oom_log, head_commit):
    """[(name, NaReason, base value)] of the points the base measured and the head did not,
    in name order; the reason from ci.na_reasons (OOM only where the log records one)."""
    out = []
    for name in sorted(base):
        vb = measured(base[name])
        if vb is None or measured(head.get(name)) is not None:
            continue
        hp = head.get(name)
        oom = hp is not None and na_reasons.is_oom(oom_log, head_commit, hp.benchmark, hp.params)
        reason = na_reasons.classify(None if hp is None else hp.value, hp is not None, oom)
        out.append((name, reason, vb))
    return out


def head_has_no_number(head):
    """True when no point of the head holds a number (no result file counts as none)."""
    return not any(measured(p) is not None for p in head.values())


def retime(suspects, batch, time_cap, run_batch, clock=time.monotonic):
    """Re-run `suspects` in order, in batches, within `time_cap` seconds.

    run_batch(names) re-times one batch. A batch holds at most `batch` points and, once
    the pace (seconds per point so far) is known, no more than fit in the time left; none
    starts after the cap. Returns (judged, unjudged, seconds spent)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    start, judged, todo, pace = clock(), [], list(suspects), None
    while todo:
        left = time_cap - (clock() - start)
        n = min(batch, len(todo))
        if pace is not None and pace > 0:
            n = min(n, int(left // pace))
        if left <= 0 or n < 1:
            break
        chunk, todo = todo[:n], todo[n:]
        run_batch(chunk)
        judged += chunk
        pace = (clock() - start) / len(judged)
    return judged, todo, clock() - start


def bench_regex(names):
    """An asv -b regex that selects exactly these points (asv matches each parameter
    combination's `name(params)` string)."""
    return "|".join(re.escape(n) + "$" for n in names)


@dataclass
class Verdict:
    """The gate's decision and every list the comment shows."""

    code: int
    reason: str
    confirmed: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    unjudged_slower: list[str] = field(default_factory=list)
    unjudged_faster: list[str] = field(default_factory=list)


def decide(stage1_code, plan, judged, unjudged, stage1_slower, rows, lost=(), no_number=False):
    """The Verdict from stage 2's compare rows over the judged suspects.

    stage1_code: asv continuous's exit code (2 when it printed a failure); plan: the Plan;
    judged/unjudged: the suspects re-run and those the time cap left; stage1_slower: stage
    1's slower flags; rows: the parsed compare after the re-runs; lost: lost_numbers();
    no_number: head_has_no_number()."""
    by_name = {r.name: r for r in rows}
    v = Verdict(0, "")
    v.confirmed = [n for n in judged if n in by_name and by_name[n].mark == "+"]
    failed = [n for n in judged if n in by_name and by_name[n].mark == "!"]
    missing = [n for n in judged if n not in by_name]
    v.cleared = [n for n in stage1_slower if n in judged and n not in v.confirmed + failed]
    v.cleared += [n for n in plan.rejudged if n not in v.cleared]
    up = set(stage1_slower) | {n for n in unjudged if plan.ratios.get(n, math.inf) >= 1.0}
    v.unjudged_slower = [n for n in unjudged if n in up]
    v.unjudged_faster = [n for n in unjudged if n not in up]

    why = []
    if no_number:
        why.append("the head has no number at all (every point n/a)")
    if lost:
        by_reason = {}
        for _, reason, _ in lost:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        detail = ", ".join(f"{r.label}: {k}" for r, k in by_reason.items())
        why.append(f"{len(lost)} point(s) the base measured have no number at the head ({detail})")
    if plan.sure:
        why.append(f"{len(plan.sure)} stage-1 flag(s) beyond doubt, kept without a re-run")
    if v.confirmed:
        why.append(f"{len(v.confirmed)} suspect(s) confirmed slower")
    if plan.kept:
        why.append(f"{len(plan.kept)} stage-1 flag(s) not re-run, kept")
    if v.unjudged_slower:
        why.append(
            f"{len(v.unjudged_slower)} slower suspect(s) not judged within the time cap "
            "(or their re-run recorded nothing)"
        )

    if stage1_code == 2:
        v.code, lead = 2, "stage 1 had a failing benchmark"
    elif failed or missing:
        v.code, lead = 2, f"stage 2 failed or lost {len(failed) + len(missing)} point(s)"
    elif why:
        v.code, lead = 1, ""
    elif stage1_code not in (0, 1):
        v.code, lead = stage1_code, f"stage 1 exited {stage1_code}"
    elif stage1_code == 1 and not stage1_slower:
        v.code, lead = 1, "stage 1 exited 1 with no point flagged"
    else:
        v.code, lead = (
            0,
            (
                f"no suspect confirmed ({len(v.cleared)} stage-1 flag(s) cleared, "
                f"{len(judged)} suspect(s) judged)"
            ),
        )
    v.reason = "; ".join([lead] * bool(lead) + why)
    if v.unjudged_faster:
        v.reason += f"; {len(v.unjudged_faster)} faster suspect(s) not judged (no regression)"
    return v


def not_retimed(judged, before, after, rows):
    """The judged suspects whose stored samples did not grow on both sides (a re-run that
    recorded nothing: its compare row would be stage 1's samples at the lower factor), a
    failure row ("!") excepted. before/after: {commit: {point: samples}}."""
    failed = {r.name for r in rows if r.mark == "!"}
    return [
        n for n in judged if n not in failed
        and any(len(after[c].get(n, ())) <= len(before[c].get(n, ())) for c in before)
    ]  # fmt: skip


def merged_table(stage1, again, judged, rejudged=()):
    """One compare table: stage 2's row for a judged suspect (pooled samples, its factor),
    stage 1's row for every other point (its factor), in stage 1's order; judged suspects
    stage 1's table did not show come last. A rejudged point (a host figure's stage-1 flag
    that its own estimator clears) keeps stage 1's row without its slower or faster mark."""
    second = {r.name: r for r in again}
    rows = [
        second.get(r.name, r) if r.name in judged
        else replace(r, mark="") if r.name in rejudged and r.mark in ("+", "-") else r
        for r in stage1
    ]  # fmt: skip
    shown = {r.name for r in stage1}
    rows += [second[n] for n in sorted(judged) if n not in shown and n in second]
    head = "| Change | Before | After | Ratio | Benchmark (Parameter) |\n|---|---|---|---|---|\n"
    return head + "".join("| " + " | ".join(r.cells()[:4] + [r.name]) + " |\n" for r in rows)


def judged_at(judged, rejudged, args):
    """{point: the words for the factor that judged it} of the points stage 2 judged with a
    factor of its own (the judged suspects, the rejudged host flags); the comment shows
    them, and "stage 1" for the rest."""
    out = {}
    est = f"{args.host_quantile:g} quantile"
    for n in judged:
        f = factor_for(n, args.factor, args.host_factor)
        host = args.host_factor is not None and is_host_figure(n)
        out[n] = f"{f:g} (host factor, pooled {est})" if host else f"{f:g} (pooled)"
    for n in rejudged:
        out[n] = f"{args.host_factor:g} (host factor, stage 1's {est})"
    return out


def run_asv(cmd, log_path, mode="w"):
    """Run one asv command, its output both printed and written to log_path; returns its
    exit code."""
    with open(log_path, mode) as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        return proc.wait()


def write_json(path, data):
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def main(argv=None, clock=time.monotonic):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--continuous-log", type=Path, required=True)
    ap.add_argument("--continuous-code", type=int, required=True)
    ap.add_argument(
        "--stage1-compare", type=Path, help="stage 1's `asv compare` of every point (for the table)"
    )
    ap.add_argument("--rounds", type=int, required=True, help="more processes per side; 0: off")
    ap.add_argument("--suspect", type=float, required=True, help="ratio that makes a suspect")
    ap.add_argument("--factor", type=float, required=True, help="stage 2's asv --factor")
    ap.add_argument(
        "--host-factor", type=float, default=None,
        help="stage 2's factor for the host figures (track_time_eager/_host); default --factor",
    )  # fmt: skip
    ap.add_argument(
        "--host-quantile", type=float, default=HOST_QUANTILE,
        help="the quantile of a side's pooled samples that stands for a host figure",
    )  # fmt: skip
    ap.add_argument(
        "--sure", type=float, default=SURE_RATIO,
        help="ratio of a stage-1 flag beyond doubt (with disjoint intervals)",
    )  # fmt: skip
    ap.add_argument(
        "--batch", "--max", dest="batch", type=int, default=BATCH,
        help="most suspects re-run in one asv run (all are re-run, batch by batch)",
    )  # fmt: skip
    ap.add_argument(
        "--time-cap", type=float, default=TIME_CAP_S,
        help="seconds of re-runs; suspects left past it are listed, unjudged",
    )  # fmt: skip
    ap.add_argument(
        "--retime-faster", action="store_true",
        help="also re-run the faster suspects, after the slower ones (default: listed only)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--asv", default="asv", help="the asv command (shell words)")
    ap.add_argument("--config", default=None, help="asv --config")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--run-args", default="", help="more `asv run` arguments (shell words)")
    args = ap.parse_args(argv)
    if args.rounds < 0 or args.batch < 1 or args.time_cap < 0:
        ap.error("--rounds and --time-cap must be >= 0, --batch >= 1")
    if not 0.0 <= args.host_quantile <= 1.0:
        ap.error("--host-quantile must lie in [0, 1]")
    if args.suspect > args.factor:
        ap.error("--suspect must not exceed --factor (a point inside it could then be flagged "
                 "from stage 1's samples alone)")  # fmt: skip
    if args.host_factor is not None and not 1.0 < args.factor <= args.host_factor:
        ap.error("--host-factor needs 1 < --factor <= --host-factor (the host figures are the "
                 "noisier ones)")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)

    stage1 = parse(args.continuous_log.read_text())
    slower, failed = flagged(stage1)
    faster1 = [r.name for r in stage1 if r.mark == "-"]
    code1 = 2 if failed else args.continuous_code
    base = stored_points(args.results, args.machine, args.base)
    head = stored_points(args.results, args.machine, args.head)
    oom_log = na_reasons.load_oom(na_reasons.log_path(args.results, args.machine))
    lost = lost_numbers(base, head, oom_log, args.head)
    no_number = head_has_no_number(head)
    sides = (args.base, args.head)
    before = {c: stored_samples(args.results, args.machine, c) for c in sides}
    plan = plan_stage2(
        base, head, slower, args.suspect, args.sure, rerun=args.rounds > 0,
        factor=args.factor, host_factor=args.host_factor,
        host_ratio=host_ratios(*(before[c] for c in sides), args.host_quantile), faster=faster1,
    )  # fmt: skip
    if code1 == 2:
        plan.suspects = []  # a failure is final: nothing is re-run
    # --suspect 1 re-runs every timing point (a test of the plumbing), faster ones too.
    retime_faster = args.retime_faster or args.suspect == 1.0
    to_run = [n for n in plan.suspects if retime_faster or n not in plan.faster]
    chosen = {
        "suspects": plan.suspects, "planned": to_run, "faster": plan.faster,
        "sure": plan.sure,
        "left_out": plan.kept, "rejudged": plan.rejudged, "stage1_slower": slower,
        "stage1_ratios": plan.ratios,
    }  # fmt: skip
    write_json(args.out / "suspects.json", chosen)

    asv = shlex.split(args.asv)
    conf = ["--config", args.config] if args.config else []
    hashes = args.out / "confirm-hashes.txt"
    run_log = args.out / "confirm-run.log"

    def run_batch(names):
        write_text_atomic(hashes, f"{args.base}\n{args.head}\n")
        run = [
            *asv, "run", *conf, "--machine", args.machine, "--append-samples",
            "-a", f"rounds={args.rounds}", "--interleave-rounds", "--show-stderr",
            "-b", bench_regex(names), *shlex.split(args.run_args), f"HASHFILE:{hashes}",
        ]  # fmt: skip
        run_asv(run, run_log, mode="a")

    judged, unjudged, spent = retime(to_run, args.batch, args.time_cap, run_batch, clock)
    unjudged += [n for n in plan.suspects if n not in to_run]
    rows, lost_rerun = [], []

    if judged:
        compare = [
            *asv, "compare", *conf, "--machine", args.machine, "--factor", str(args.factor),
            args.base, args.head,
        ]  # fmt: skip
        res = subprocess.run(compare, capture_output=True, text=True)
        write_text_atomic(args.out / "confirm-compare.txt", res.stdout)
        rows = parse(res.stdout)
        after = {c: stored_samples(args.results, args.machine, c) for c in sides}
        failed = {r.name for r in rows if r.mark == "!"}
        hosts = [
            n for n in judged
            if args.host_factor is not None and is_host_figure(n) and n not in failed
        ]  # fmt: skip
        if hosts:
            # the host figures' rows from their estimator over the pooled samples
            mine = host_rows(hosts, *(after[c] for c in sides), args.host_factor,
                             args.host_quantile)  # fmt: skip
            table = merged_table([], mine, {r.name for r in mine})
            write_text_atomic(args.out / "confirm-host.txt", table)
            rows = [r for r in rows if r.name not in hosts] + mine
        lost_rerun = not_retimed(judged, before, after, rows)
        judged = [n for n in judged if n not in lost_rerun]
        unjudged = [n for n in plan.suspects if n in set(unjudged) | set(lost_rerun)]
    shown = parse(args.stage1_compare.read_text()) if args.stage1_compare else stage1
    write_text_atomic(
        args.out / "final-compare.txt", merged_table(shown, rows, set(judged), set(plan.rejudged))
    )
    v = decide(code1, plan, judged, unjudged, slower, rows, lost, no_number)
    chosen.update(suspects=judged, unjudged=unjudged, left_out=unjudged + plan.kept)
    write_json(args.out / "suspects.json", chosen)
    verdict = {
        "exit_code": v.code, "reason": v.reason, "stage1_code": code1, "suspects": judged,
        "sure": plan.sure, "confirmed": v.confirmed, "cleared": v.cleared, "kept": plan.kept,
        "unjudged_slower": v.unjudged_slower, "unjudged_faster": v.unjudged_faster,
        "lost": [{"name": n, "reason": r.value, "label": r.label, "base": b} for n, r, b in lost],
        "not_retimed": lost_rerun, "head_has_no_number": no_number, "time_cap_s": args.time_cap,
        "stage2_s": round(spent, 1), "rejudged": plan.rejudged, "factor": args.factor,
        "host_factor": args.host_factor, "host_quantile": args.host_quantile,
        "judged_at": judged_at(judged, plan.rejudged, args),
    }  # fmt: skip
    write_json(args.out / "confirm.json", verdict)
    print(f"confirm: exit {v.code}: {v.reason}")
    return v.code


if __name__ == "__main__":
    sys.exit(main())
