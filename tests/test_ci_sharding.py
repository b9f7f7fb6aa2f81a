"""Sharded `asv run` + merge covers exactly what one serial run covers (CPU smoke mode).

This is the backfill workflow in miniature: a clone with three commits, `ci/shard.py`
splits the range over two shards, each shard runs `asv run` over its commits into its own
results directory (on a GPU host each would be a runner with its own GPU), and
`ci/merge_results.py` merges them. The merged (commit, benchmark, parameters) set must be
the serial run's. One fast benchmark keeps it short.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _asv_smoke as smoke  # noqa: E402

from ci import merge_results, shard  # noqa: E402

pytestmark = pytest.mark.slow
# asv matches -b against "name(params)" for parameterized benchmarks; the reference
# implementation is the one benchmark that is fast under the interpreter.
BENCH = r"^nsa\.NsaForward\.track_time\(.*'reference'"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    return smoke.scratch(tmp_path_factory, "sharding", 3)


def run_into(root: Path, repo: Path, results: str, range_spec: str) -> Path:
    conf = smoke.write_conf(repo, f"asv.{results}.json", results)
    smoke.asv("run", "--config", conf.name, "--machine", smoke.MACHINE, "-b", BENCH,
              "--show-stderr", range_spec, cwd=repo, home=root / "home")  # fmt: skip
    return repo / results


def test_two_shards_merged_equal_one_serial_run(clone):
    root, repo, hashes = clone
    rng = f"{hashes[0]}..{hashes[-1]}"
    commits = shard.rev_list(rng, repo)
    assert len(commits) == 2  # the range excludes its start, as git's does

    serial = run_into(root, repo, "results-serial", rng)

    shard_dirs = []
    for i, part in enumerate(shard.split(commits, 2)):
        hashfile = repo / f"shard-{i}.txt"
        hashfile.write_text("".join(h + "\n" for h in part))
        shard_dirs.append(run_into(root, repo, f"results-shard{i}", f"HASHFILE:{hashfile}"))

    merged = root / "merged"
    assert merge_results.main(["--out", str(merged), *map(str, shard_dirs)]) == 0

    want = smoke.result_pairs(serial)
    got = smoke.result_pairs(merged)
    assert want, "the serial run stored no results"
    assert {c for c, _, _ in want} == set(commits)
    assert got == want
    # each shard holds only its own commits; the union has every result file once
    for d, part in zip(shard_dirs, shard.split(commits, 2), strict=True):
        assert {c for c, _, _ in smoke.result_pairs(d)} == set(part)
    files = merge_results.scan(merged)
    assert sum(1 for rel in files if rel.startswith(f"{smoke.MACHINE}/")) == 2 + 1  # + machine
