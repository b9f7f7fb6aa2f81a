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
existing history whose suite description is older).

Usage:
    python -m ci.merge_results --out results shard-0/results shard-1/results
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

METADATA = frozenset({"machine.json", "benchmarks.json"})


def scan(root: Path) -> dict[str, Path]:
    """Every regular file under `root`, keyed by its POSIX path relative to `root`."""
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


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
    """What a merge into `dest` would do: files to copy, and conflicting paths."""

    copy: dict[str, Path] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    def result_files(self) -> list[str]:
        """Paths of per-commit result files that the merge adds (metadata excluded)."""
        return sorted(r for r in self.copy if Path(r).name not in METADATA)


def plan_merge(dest: Path, sources: list[Path], replace_metadata: bool = False) -> Plan:
    """Compare `sources` (in order) with each other and with what `dest` already holds."""
    plan = Plan()
    chosen: dict[str, Path] = dict(scan(dest))
    for src in sources:
        if not src.is_dir():
            raise FileNotFoundError(f"results directory {src} does not exist")
        for rel, path in scan(src).items():
            old = chosen.get(rel)
            if old is None:
                chosen[rel] = plan.copy[rel] = path
            elif same_content(old, path):
                continue
            elif replace_metadata and Path(rel).name in METADATA:
                chosen[rel] = plan.copy[rel] = path
            else:
                plan.conflicts.append(rel)
    plan.conflicts = sorted(set(plan.conflicts))
    return plan


def apply(plan: Plan, dest: Path) -> None:
    """Copy the planned files into `dest`; refuses a plan with conflicts."""
    if plan.conflicts:
        raise ValueError(f"refusing to merge: {len(plan.conflicts)} conflicting file(s)")
    for rel, src in plan.copy.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)


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
    if plan.conflicts:
        print("merge_results: conflicting files (same path, different content):", file=sys.stderr)
        for rel in plan.conflicts:
            print(f"  {rel}", file=sys.stderr)
        return 1
    apply(plan, args.out)
    print(
        f"merge_results: {len(plan.result_files())} result file(s) added, "
        f"{len(plan.copy)} file(s) written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
