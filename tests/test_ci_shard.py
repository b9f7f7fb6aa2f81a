"""ci/shard.py: a commit range split into N shards, deterministically, each commit once."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import shard  # noqa: E402


def make_repo(path: Path, n_commits: int) -> list[str]:
    """A repository with `n_commits` commits on a line; returns their hashes, oldest first."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    hashes = []
    for i in range(n_commits):
        (path / "f.txt").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(path), "add", "f.txt"], check=True)
        subprocess.run(
            ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t",
             "commit", "-q", "-m", f"c{i}"],
            check=True,
        )  # fmt: skip
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        hashes.append(head.stdout.strip())
    return hashes


@pytest.mark.parametrize("n_commits,shards", [(7, 3), (4, 4), (2, 5), (1, 1)])
def test_split_covers_every_commit_once(n_commits, shards):
    commits = [f"{i:040x}" for i in range(n_commits)]
    parts = shard.split(commits, shards)
    assert len(parts) == shards
    flat = [c for p in parts for c in p]
    assert sorted(flat) == sorted(commits)
    assert len(flat) == len(set(flat))
    # balanced: sizes differ by at most one
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert parts == shard.split(list(commits), shards)


def test_split_rejects_bad_input():
    with pytest.raises(ValueError, match="shards"):
        shard.split(["a"], 0)
    with pytest.raises(ValueError, match="duplicates"):
        shard.split(["a", "a"], 2)


def test_cli_shards_of_a_real_range(tmp_path, capsys):
    hashes = make_repo(tmp_path / "repo", 6)
    rng = f"{hashes[0]}..{hashes[-1]}"  # five commits: the first is excluded, as in git
    assert shard.rev_list(rng, tmp_path / "repo") == hashes[:0:-1]
    got = []
    for i in range(2):
        out = tmp_path / f"shard-{i}.txt"
        assert shard.main(["--range", rng, "--shards", "2", "--index", str(i),
                           "--repo", str(tmp_path / "repo"), "--out", str(out)]) == 0  # fmt: skip
        got.append(out.read_text().split())
    assert sorted(got[0] + got[1]) == sorted(hashes[1:])
    assert not set(got[0]) & set(got[1])
    assert shard.main(["--range", rng, "--shards", "3", "--matrix"]) == 0
    assert capsys.readouterr().out.strip() == "[0, 1, 2]"


def test_cli_rejects_bad_index_and_empty_range(tmp_path):
    hashes = make_repo(tmp_path / "repo", 2)
    with pytest.raises(SystemExit):
        shard.main(["--range", "A..B", "--shards", "2", "--index", "2"])
    empty = f"{hashes[-1]}..{hashes[-1]}"
    args = ["--range", empty, "--shards", "2", "--index", "0", "--repo", str(tmp_path / "repo")]
    assert shard.main(args) == 1
