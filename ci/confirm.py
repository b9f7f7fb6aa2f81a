#!/usr/bin/env python3
"""Second stage of the GPU PR gate: re-time the suspects of `asv continuous` with more processes.

Stage 1 is `asv continuous BASE HEAD --factor F1 -a rounds=2 --interleave-rounds`. Its
factor has to stay above what a point's median moves between fresh processes (on the H200
up to about 0.5% per process for the noisiest point, docs/measurement.md), so a 1% slowdown
there is not always flagged. Stage 2 takes the *suspects*, timings only: every timing point
that stage 1 flagged as slower, and every other whose median ratio head/base lies beyond a
smaller factor (`--suspect`) either way; at most `--max` of them (flagged first, then by
distance from 1). Only those are run again, `--rounds` more fresh processes per side, base
and head alternating (`asv run --append-samples -a rounds=R --interleave-rounds`), so that
their medians rest on 2 + R processes; then `asv compare --factor F2` on the pooled samples
decides. The spread of a median over N processes shrinks about as 1 / sqrt(N), which is what
lets F2 sit below F1 without more false flags.

The verdict (the exit code, as `asv continuous`'s): 2 when stage 1 had a failing benchmark
(nothing is re-run then); otherwise 1 when stage 2 flags a suspect as slower or failing, or
a point stage 1 flagged was left out (by `--max`, or not a timing); else 0. A point stage 1
flagged that stage 2 clears passes: that is a false flag avoided.

    python -m ci.confirm --machine h200 --base SHA --head SHA \
        --continuous-log gate/continuous.log --continuous-code 1 --rounds 6 \
        --suspect 1.005 --factor 1.006 --max 8 --out gate [--asv ".venv/bin/asv"] \
        [--stage1-compare gate/compare.txt] \
        [--config asv.conf.json] [--results results] [--run-args "--launch-method spawn"]

Writes to --out: suspects.json (with every point's stage-1 ratio), confirm-run.log,
confirm-compare.txt (asv compare of every point at --factor after the re-runs: the
suspects' rows from pooled samples),
final-compare.txt (stage 2's rows for the suspects, stage 1's for the rest, from
--stage1-compare if given, else from the continuous log: what the gate decided on) and
confirm.json (the verdict and why). Prints the exit code's reason.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ci.asv_results import stored_values
from ci.render_comment import Row, parse


def flagged(rows):
    """(slower, failed) point names of parsed compare rows."""
    return [r.name for r in rows if r.mark == "+"], [r.name for r in rows if r.mark == "!"]


def is_timing(name):
    """Whether a point is a timing (`time_*`, `track_time*`): only timings are noisy enough
    to need a second look; a peak-VRAM figure is the same in every process."""
    return Row("", "", "", "", name).kind == "time"


def ratios_of(base, head):
    """{point: median ratio head/base} of the points both sides hold."""
    return {n: head[n] / base[n] for n in base if n in head and base[n] > 0}


def pick_suspects(base, head, slower, suspect, limit):
    """(suspects, left out): the timing points of `slower` first, then the timing points
    whose ratio head/base lies beyond `suspect` either way (every timing point when
    `suspect` is 1), by distance from 1; at most `limit` suspects. Left out: the rest of
    those, and the points of `slower` that are not timings (stage 1's flag stands for
    them). `base` and `head` map point names to medians."""
    if suspect < 1.0:
        raise ValueError(f"--suspect must be >= 1, got {suspect}")
    ratio = ratios_of(base, head)
    dist = {n: abs(math.log(r)) for n, r in ratio.items()}
    # --suspect 1: every point (a test of the plumbing), else those strictly beyond it.
    far = [n for n in ratio if n not in slower and (suspect == 1.0 or dist[n] > math.log(suspect))]
    far.sort(key=lambda n: -dist[n])
    ranked = [n for n in dict.fromkeys(slower) if is_timing(n)] + [n for n in far if is_timing(n)]
    return ranked[:limit], ranked[limit:] + [n for n in dict.fromkeys(slower) if not is_timing(n)]


def bench_regex(names):
    """An asv -b regex that selects exactly these points (asv matches each parameter
    combination's `name(params)` string)."""
    return "|".join(re.escape(n) + "$" for n in names)


def decide(stage1_code, suspects, left_out, stage1_slower, rows):
    """(exit code, reason) from stage 2's compare rows over the suspects."""
    if stage1_code == 2:
        return 2, "stage 1 had a failing benchmark"
    if not suspects:
        return stage1_code, "no suspects: stage 1's verdict stands"
    by_name = {r.name: r for r in rows}
    missing = [n for n in suspects if n not in by_name]
    failed = [n for n in suspects if n in by_name and by_name[n].mark == "!"]
    slower = [n for n in suspects if n in by_name and by_name[n].mark == "+"]
    kept = [n for n in left_out if n in stage1_slower]
    if failed or missing:
        return 2, f"stage 2 failed or lost {len(failed) + len(missing)} point(s)"
    if slower or kept:
        return 1, (
            f"{len(slower)} suspect(s) confirmed slower; {len(kept)} stage-1 flag(s) not "
            "re-run, kept"
        )
    cleared = [n for n in stage1_slower if n in suspects]
    return 0, f"no suspect confirmed ({len(cleared)} stage-1 flag(s) cleared)"


def merged_table(stage1, again, suspects):
    """One compare table: stage 2's row for a suspect (pooled samples, its factor), stage
    1's row for every other point (its factor), in stage 1's order; suspects stage 1's
    table did not show come last."""
    second = {r.name: r for r in again}
    rows = [second.get(r.name, r) if r.name in suspects else r for r in stage1]
    shown = {r.name for r in stage1}
    rows += [second[n] for n in sorted(suspects) if n not in shown and n in second]
    head = "| Change | Before | After | Ratio | Benchmark (Parameter) |\n|---|---|---|---|---|\n"
    return head + "".join("| " + " | ".join(r.cells()[:4] + [r.name]) + " |\n" for r in rows)


def run_asv(cmd, log_path):
    """Run one asv command, its output both printed and written to log_path; returns its
    exit code."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        return proc.wait()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--continuous-log", type=Path, required=True)
    ap.add_argument("--continuous-code", type=int, required=True)
    ap.add_argument(
        "--stage1-compare", type=Path, help="stage 1's `asv compare` of every point (for the table)"
    )
    ap.add_argument("--rounds", type=int, required=True, help="more processes per side")
    ap.add_argument("--suspect", type=float, required=True, help="ratio that makes a suspect")
    ap.add_argument("--factor", type=float, required=True, help="stage 2's asv --factor")
    ap.add_argument("--max", type=int, default=8, help="most suspects re-run")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--asv", default="asv", help="the asv command (shell words)")
    ap.add_argument("--config", default=None, help="asv --config")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--run-args", default="", help="more `asv run` arguments (shell words)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.max < 1:
        ap.error("--rounds and --max must be >= 1")
    if args.suspect > args.factor:
        ap.error("--suspect must not exceed --factor (a point inside it could then be flagged "
                 "from stage 1's samples alone)")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)

    stage1 = parse(args.continuous_log.read_text())
    slower, failed = flagged(stage1)
    code1 = 2 if failed else args.continuous_code
    base = stored_values(args.results, args.machine, args.base)
    head = stored_values(args.results, args.machine, args.head)
    suspects, left_out = pick_suspects(base, head, slower, args.suspect, args.max)
    chosen = {"suspects": suspects, "left_out": left_out, "stage1_slower": slower}
    chosen["stage1_ratios"] = ratios_of(base, head)
    (args.out / "suspects.json").write_text(json.dumps(chosen, indent=1))
    rows = []
    if code1 != 2 and suspects:
        asv = shlex.split(args.asv)
        conf = ["--config", args.config] if args.config else []
        hashes = args.out / "confirm-hashes.txt"
        hashes.write_text(f"{args.base}\n{args.head}\n")
        run = [
            *asv, "run", *conf, "--machine", args.machine, "--append-samples",
            "-a", f"rounds={args.rounds}", "--interleave-rounds", "--show-stderr",
            "-b", bench_regex(suspects), *shlex.split(args.run_args), f"HASHFILE:{hashes}",
        ]  # fmt: skip
        run_asv(run, args.out / "confirm-run.log")
        compare = [
            *asv, "compare", *conf, "--machine", args.machine, "--factor", str(args.factor),
            args.base, args.head,
        ]  # fmt: skip
        res = subprocess.run(compare, capture_output=True, text=True)
        (args.out / "confirm-compare.txt").write_text(res.stdout)
        rows = parse(res.stdout)
        shown = parse(args.stage1_compare.read_text()) if args.stage1_compare else stage1
        (args.out / "final-compare.txt").write_text(merged_table(shown, rows, set(suspects)))
    code, reason = decide(code1, suspects, left_out, slower, rows)
    verdict = {"exit_code": code, "reason": reason, "stage1_code": code1, "suspects": suspects}
    (args.out / "confirm.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"confirm: exit {code}: {reason}")
    return code


if __name__ == "__main__":
    sys.exit(main())
