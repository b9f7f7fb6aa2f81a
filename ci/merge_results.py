#!/usr/bin/env python3
"""Merge several asv results directories into one, refusing conflicting duplicates.

An asv results directory holds one file per (machine, commit, environment):
`<machine>/<hash8>-<env>.json`, plus `<machine>/machine.json` and a top-level
`benchmarks.json` (the suite's description). Shards of a backfill and runners of different
GPU types write disjoint result files, so merging is the union of the files. A path present
in several inputs must hold the same JSON in each; otherwise two runs claim different
numbers for the same commit and nothing is written.

Metadata (`machine.json`, `benchmarks.json`) follows the same rule by default; with
`replace_metadata` the last input's copy wins (used when new results are added to an
existing history whose suite description is older). The OOM log (`<machine>/
na_reasons.jsonl`, ci/na_reasons.py) only ever grows: its copies merge as the union of
their lines, in order.

Every input file is checked first (ci/results_check.py: asv's own loader, the machine and
commit its path names): a bad file is never merged. It is named on stderr, and the merge
of the good files goes on; the exit status is then 1. Files are written atomically.

Usage:
    python -m ci.merge_results --out results shard-0/results shard-1/results
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repo root holds the `ci` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.fileio import copy_atomic, write_bytes_atomic  # noqa: E402
from ci.na_reasons import LOG_NAME  # noqa: E402
from ci.results_check import check_file, scan  # noqa: E402

METADATA = frozenset({"machine.json", "benchmarks.json"})


def union_lines(*texts: bytes) -> bytes:
    """The distinct lines of every text, first seen first (an OOM log's merge)."""
    seen = dict.fromkeys(
        line for t in texts for line in t.decode("utf-8", "replace").splitlines() if line.strip()
    )
    return "".join(f"{line}\n" for line in seen).encode()


def same_content(a: Path, b: Path) -> bool:
    """Equal bytes, or equal JSON values (formatting differences do not count)."""
    da, db = a.read_bytes(), b.read_bytes()
    if da == db:
        return True
    try:
        return json.loads(da) == json.loads(db)
    except ValueError:
        return False


@dataclass
class Plan:
    """What a merge into `dest` would do: files to copy, merged OOM logs to write,
    conflicting paths, and the input files refused as bad ({path: why})."""

    copy: dict[str, Path] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    write: dict[str, bytes] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def result_files(self) -> list[str]:
        """Paths of per-commit result files that the merge adds (metadata excluded)."""
        skip = METADATA | {LOG_NAME}
        return sorted(r for r in self.copy if Path(r).name not in skip)


def plan_merge(dest: Path, sources: list[Path], replace_metadata: bool = False) -> Plan:
    """Compare `sources` (in order) with each other and with what `dest` already holds.

    Each source file is checked (ci.results_check.check_file); a bad one goes to
    `rejected`, is never copied, and takes no part in the comparison."""
    plan = Plan()
    chosen: dict[str, Path] = dict(scan(dest))
    logs: dict[str, bytes] = {}
    for src in sources:
        if not src.is_dir():
            raise FileNotFoundError(f"results directory {src} does not exist")
        for rel, path in scan(src).items():
            why = check_file(path, rel)
            if why:
                plan.rejected[f"{src}/{rel}"] = why
                continue
            old = chosen.get(rel)
            if Path(rel).name == LOG_NAME:
                first = logs.get(rel, old.read_bytes() if old else b"")
                logs[rel] = union_lines(first, path.read_bytes())
                if old is None or logs[rel] != old.read_bytes():
                    plan.write[rel] = logs[rel]
                continue
            if old is None:
                chosen[rel] = plan.copy[rel] = path
            elif same_content(old, path):
                continue
            elif replace_metadata and Path(rel).name in METADATA:
                chosen[rel] = plan.copy[rel] = path
            else:
                plan.conflicts.append(rel)
    plan.conflicts = sorted(set(plan.conflicts))
    for rel in plan.conflicts:
        plan.copy.pop(rel, None)
    return plan


def apply(plan: Plan, dest: Path, partial: bool = False) -> None:
    """Write the planned files into `dest`, each atomically; refuses a plan with
    conflicts unless `partial` (then only the conflicting paths are left alone)."""
    if plan.conflicts and not partial:
        raise ValueError(f"refusing to merge: {len(plan.conflicts)} conflicting file(s)")
    for rel, src in plan.copy.items():
        copy_atomic(src, dest / rel)
    for rel, data in plan.write.items():
        write_bytes_atomic(dest / rel, data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path, help="results directories to merge")
    ap.add_argument("--out", type=Path, required=True, help="merged results directory")
    ap.add_argument(
        "--replace-metadata",
        action="store_true",
        help="let later copies of machine.json/benchmarks.json replace earlier ones",
    )
    args = ap.parse_args(argv)

    plan = plan_merge(args.out, args.sources, args.replace_metadata)
    for path, why in plan.rejected.items():
        print(f"::error::merge_results: refused {path}: {why}")
    if plan.conflicts:
        print("merge_results: conflicting files (same path, different content):", file=sys.stderr)
        for rel in plan.conflicts:
            print(f"  {rel}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    apply(plan, args.out)
    print(
        f"merge_results: {len(plan.result_files())} result file(s) added, "
        f"{len(plan.copy) + len(plan.write)} file(s) written to {args.out}, "
        f"{len(plan.rejected)} bad file(s) refused"
    )
    return 1 if plan.rejected else 0


if __name__ == "__main__":
    sys.exit(main())
