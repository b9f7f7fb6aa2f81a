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


def test_benchmark_shards_of_one_commit_add_up(clone):
    """scripts/main.sh's ATTNBENCH_BENCH: shards of the suite run over one commit, each with
    its own -b and asv's --skip-existing, into one results directory. The second shard must
    keep the first one's results, and a shard run again must measure nothing new."""
    root, repo, hashes = clone
    conf = smoke.write_conf(repo, "asv.results-bench-shards.json", "results-bench-shards")
    first = r"^nsa\.NsaForward\.track_time\(.*'reference'"
    second = r"^nsa\.NsaForward\.track_peak_vram_bytes\(.*'reference'"

    def run(bench):
        return smoke.asv("run", "--config", conf.name, "--machine", smoke.MACHINE, "-b", bench,
                         "--skip-existing", "--record-samples", "--show-stderr",
                         f"{hashes[-1]}^!", cwd=repo, home=root / "home")  # fmt: skip

    run(first)
    after_first = smoke.result_pairs(repo / "results-bench-shards")
    run(second)
    got = smoke.result_pairs(repo / "results-bench-shards")
    names = {name for _, name, _ in got}
    assert names == {"nsa.NsaForward.track_time", "nsa.NsaForward.track_peak_vram_bytes"}, got
    assert after_first < got and {c for c, _, _ in got} == {hashes[-1]}
    before = stored_values(repo / "results-bench-shards")
    run(first)  # already measured: skipped, so its stored timing is not replaced
    assert stored_values(repo / "results-bench-shards") == before


def stored_values(results_dir):
    """{(benchmark, commit): stored values} of every result file under results_dir."""
    from asv.results import iter_results

    return {
        (key, res.commit_hash): res.get_result_value(key, res.get_result_params(key))
        for res in iter_results(str(results_dir))
        for key in res.get_all_result_keys()
    }
