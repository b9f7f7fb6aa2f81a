#!/usr/bin/env python3
"""Check asv result files before they leave a runner or enter the results history.

A results directory holds `benchmarks.json`, and per machine `<machine>/machine.json`,
`<machine>/<hash8>-<env>.json` (one per commit and environment) and the OOM log
`<machine>/na_reasons.jsonl` (ci/na_reasons.py). A file is fit to store when:

- a result file loads with asv's own loader (`asv.results.Results.load`, asv 0.6.6) with
  its folder as the machine name, every benchmark's values, stats and samples can be read
  back, and its name is the one asv gives that commit and environment
  (`asv.results.get_filename`): the machine and the commit match the path;
- `machine.json` loads as asv's machine file and names its own folder; `benchmarks.json`
  loads as asv's suite description (both top-level JSON objects of the right version);
- the OOM log is UTF-8 text (its lines are read one by one; a cut line is skipped).

Anything else under a results directory is refused. asv writes its JSON in place, so a
process killed mid-write leaves a truncated file: that is what this catches.

The history jobs also refuse a result file in which no point has a number (a runner whose
GPU failed, a build that broke every benchmark), unless its commit predates the kernels (the
commit has no `src/kernels`): such a commit has nothing to measure.

    python -m ci.results_check check results/                 # exit 1 on any bad file
    python -m ci.results_check manifest --results results --out pulled.txt
    python -m ci.results_check collect --results results --machine h200 --out out \\
        [--known pulled.txt] [--benchmarks-json] [--repo .]

`collect` copies the machine's files that pass into `--out` (atomically), the files that
`--known` lists unchanged (pulled from the history) without the all-n/a rule, and exits 1,
naming each refused file and why, when it refused any: the good ones are still collected.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repo root holds the `ci` package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.fileio import copy_atomic, write_text_atomic  # noqa: E402
from ci.na_reasons import LOG_NAME, is_measured  # noqa: E402

BENCHMARKS, MACHINE = "benchmarks.json", "machine.json"
# Where the kernels live: a commit without this path predates them.
KERNELS_PATH = "src/kernels"


def _load_result(path: Path, machine: str):
    from asv.results import Results

    res = Results.load(str(path), machine_name=machine)
    for key in res.get_all_result_keys():
        params = res.get_result_params(key)
        n = len(list(itertools.product(*params))) if params else 1
        for got in (res.get_result_value(key, params), res.get_result_stats(key, params),
                    res.get_result_samples(key, params)):  # fmt: skip
            if len(got) != n:
                raise ValueError(f"{key}: {len(got)} values for {n} parameter combinations")
    return res


def check_file(path: str | Path, rel: str) -> str | None:
    """Why the file at `path` cannot be stored at `rel` (its POSIX path relative to the
    results directory); None when it can."""
    from asv import util
    from asv.benchmarks import Benchmarks
    from asv.machine import Machine
    from asv.results import get_filename

    path, parts = Path(path), rel.split("/")
    name = parts[-1]
    try:
        if parts == [BENCHMARKS]:
            data = util.load_json(str(path), api_version=Benchmarks.api_version)
            return None if isinstance(data, dict) else "not asv's benchmarks.json (no object)"
        if len(parts) != 2:
            return "not a file of an asv results directory"
        machine = parts[0]
        if name == MACHINE:
            data = util.load_json(str(path), api_version=Machine.api_version)
            if not isinstance(data, dict) or data.get("machine") != machine:
                got = data.get("machine") if isinstance(data, dict) else None
                return f"machine.json names machine {got!r}, its folder is {machine!r}"
            return None
        if name == LOG_NAME:
            path.read_bytes().decode("utf-8")
            return None
        if not name.endswith(".json"):
            return "not a file of an asv results directory"
        res = _load_result(path, machine)
        commit = res.commit_hash
        if not isinstance(commit, str) or len(commit) < 8:
            return f"commit_hash {commit!r} is not a commit"
        want = os.path.basename(get_filename(machine, commit, res.env_name))
        if want != name:
            return f"its commit {commit[:8]} and environment {res.env_name!r} belong in {want}"
        return None
    except (util.UserError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"asv cannot load it: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def no_number(path: str | Path, machine: str) -> bool:
    """True when the result file holds no measured value at all (every point NaN, failed,
    or no benchmark)."""
    res = _load_result(Path(path), machine)
    for key in res.get_all_result_keys():
        for v in res.get_result_value(key, res.get_result_params(key)):
            if is_measured(v):
                return False
    return True


def commit_of(path: str | Path, machine: str) -> str:
    """The full commit hash a result file was measured at."""
    return _load_result(Path(path), machine).commit_hash


def predates_kernels(commit: str, repo: str | Path = ".") -> bool:
    """True when `commit` exists in `repo` and has no `src/kernels` (nothing to measure);
    False when it has them, or when the commit is unknown (then nothing says it predates)."""

    def ok(obj):
        return subprocess.run(["git", "cat-file", "-e", obj], cwd=repo,
                              capture_output=True).returncode == 0  # fmt: skip

    return ok(f"{commit}^{{commit}}") and not ok(f"{commit}:{KERNELS_PATH}")


def scan(root: Path) -> dict[str, Path]:
    """Every regular file under `root`, keyed by its POSIX path relative to `root`."""
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def check_tree(root: Path) -> dict[str, str]:
    """{relative path: why} of every file under `root` that check_file refuses."""
    out = {}
    for rel, path in scan(root).items():
        why = check_file(path, rel)
        if why:
            out[rel] = why
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(root: Path) -> str:
    """`<sha256>  <relative path>` of every file under `root`, one a line."""
    return "".join(f"{sha256(p)}  {rel}\n" for rel, p in scan(root).items())


def read_manifest(path: Path | None) -> dict[str, str]:
    if path is None or not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        if rel:
            out[rel] = digest
    return out


def collect(results: Path, machine: str, out: Path, known: dict[str, str] | None = None,
            benchmarks_json: bool = False, repo: str | Path = ".") -> dict[str, str]:  # fmt: skip
    """Copy the machine's storable files (and benchmarks.json on request) from `results`
    into `out`; returns {relative path: why} of the files refused. A result file that
    `known` lists with the same digest (pulled from the history) skips the all-n/a rule."""
    known = known or {}
    refused = {}
    files = {rel: p for rel, p in scan(results).items() if rel.startswith(f"{machine}/")}
    if benchmarks_json and (results / BENCHMARKS).is_file():
        files[BENCHMARKS] = results / BENCHMARKS
    for rel, path in sorted(files.items()):
        why = check_file(path, rel)
        is_result = rel.endswith(".json") and Path(rel).name not in (MACHINE, BENCHMARKS)
        if why is None and is_result and known.get(rel) != sha256(path):
            if no_number(path, machine):
                commit = commit_of(path, machine)
                if not predates_kernels(commit, repo):
                    why = (f"no point has a number at {commit[:8]}, a commit with "
                           f"{KERNELS_PATH} (a GPU or build that did not work)")  # fmt: skip
        if why:
            refused[rel] = why
            continue
        copy_atomic(path, out / rel)
    return refused


def report(refused: dict[str, str], what: str) -> None:
    for rel, why in refused.items():
        print(f"::error::results_check: {what} {rel}: {why}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    chk = sub.add_parser("check", help="check every file of results directories")
    chk.add_argument("dirs", nargs="+", type=Path)
    man = sub.add_parser("manifest", help="digests of a results directory's files")
    man.add_argument("--results", type=Path, required=True)
    man.add_argument("--out", type=Path, required=True)
    col = sub.add_parser("collect", help="copy one machine's storable files")
    col.add_argument("--results", type=Path, required=True)
    col.add_argument("--machine", required=True)
    col.add_argument("--out", type=Path, required=True)
    col.add_argument("--known", type=Path, help="manifest of the files pulled from the history")
    col.add_argument("--benchmarks-json", action="store_true", help="collect benchmarks.json")
    col.add_argument("--repo", default=".", help="git repository of the measured commits")
    args = ap.parse_args(argv)

    if args.action == "check":
        bad = {f"{d}/{rel}": why for d in args.dirs for rel, why in check_tree(d).items()}
        report(bad, "bad file")
        print(f"results_check: {len(bad)} bad file(s)")
        return 1 if bad else 0
    if args.action == "manifest":
        write_text_atomic(args.out, manifest(args.results))
        return 0
    refused = collect(args.results, args.machine, args.out, read_manifest(args.known),
                      args.benchmarks_json, args.repo)  # fmt: skip
    report(refused, "refused")
    kept = len(scan(args.out))
    print(f"results_check: collected {kept} file(s) into {args.out}, refused {len(refused)}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
