#!/usr/bin/env python3
"""Split a commit range into N shards for parallel `asv run` on several runners.

The commit list is what asv itself benchmarks for a range: `git rev-list --first-parent
A..B` (newest first). Commit i of that list goes to shard i mod N, so every commit is in
exactly one shard, the split depends only on the range and N (every runner can compute its
own shard with no coordination), and each shard samples the whole range evenly: a
half-finished backfill still shows the shape of the history.

Usage:
    ci/shard.py --range A..B --shards 3 --index 0 --out shard.txt   # one shard, as a
                                                                    # HASHFILE for asv run
    ci/shard.py --range A..B --shards 3 --matrix                    # JSON list of indices
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def rev_list(range_spec: str, repo: str | Path = ".") -> list[str]:
    """Full hashes of the commits asv benchmarks for `range_spec`, newest first."""
    out = subprocess.run(
        ["git", "rev-list", "--first-parent", range_spec, "--"],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def split(commits: list[str], shards: int) -> list[list[str]]:
    """Deal `commits` round-robin into `shards` lists (some may be empty when N > len)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if len(set(commits)) != len(commits):
        raise ValueError("commits contains duplicates")
    return [commits[i::shards] for i in range(shards)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--range", required=True, dest="range_spec", help="git range, e.g. A..B")
    ap.add_argument("--shards", type=int, required=True, help="number of shards N >= 1")
    ap.add_argument("--index", type=int, help="which shard to print (0 <= index < N)")
    ap.add_argument("--matrix", action="store_true", help="print [0, ..., N-1] as JSON")
    ap.add_argument("--out", type=Path, help="write the shard's hashes here (one a line)")
    ap.add_argument("--repo", default=".", help="git repository (default: current dir)")
    args = ap.parse_args(argv)

    if args.shards < 1:
        ap.error("--shards must be >= 1")
    if args.matrix:
        print(json.dumps(list(range(args.shards))))
        return 0
    if args.index is None or not 0 <= args.index < args.shards:
        ap.error("--index must satisfy 0 <= index < shards")

    commits = rev_list(args.range_spec, args.repo)
    if not commits:
        print(f"shard: range {args.range_spec!r} has no commits", file=sys.stderr)
        return 1
    mine = split(commits, args.shards)[args.index]
    text = "".join(h + "\n" for h in mine)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    print(
        f"shard {args.index}/{args.shards}: {len(mine)} of {len(commits)} commits",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
