"""ci/merge_results.py: union of asv results directories, refusing conflicting duplicates."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import merge_results  # noqa: E402


def write(root: Path, rel: str, value) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def shard_dir(root: Path, commits: list[str], machine: str = "h200") -> Path:
    write(root, "benchmarks.json", {"bench.time_x": {"version": "1"}, "version": 2})
    write(root, f"{machine}/machine.json", {"machine": machine, "version": 1})
    for c in commits:
        write(root, f"{machine}/{c}-virtualenv-py3.11.json", {"commit_hash": c, "result": [1]})
    return root


def test_merge_is_the_union(tmp_path):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa", "cccccccc"])
    b = shard_dir(tmp_path / "b", ["bbbbbbbb"])
    c = shard_dir(tmp_path / "c", ["dddddddd"], machine="h100")
    out = tmp_path / "out"
    assert merge_results.main(["--out", str(out), str(a), str(b), str(c)]) == 0
    got = sorted(merge_results.scan(out))
    assert got == [
        "benchmarks.json",
        "h100/dddddddd-virtualenv-py3.11.json",
        "h100/machine.json",
        "h200/aaaaaaaa-virtualenv-py3.11.json",
        "h200/bbbbbbbb-virtualenv-py3.11.json",
        "h200/cccccccc-virtualenv-py3.11.json",
        "h200/machine.json",
    ]
    # merging again changes nothing; a reformatted but equal file is not a conflict
    (b / "h200/bbbbbbbb-virtualenv-py3.11.json").write_text(
        json.dumps({"result": [1], "commit_hash": "bbbbbbbb"}, indent=2)
    )
    assert merge_results.plan_merge(out, [a, b, c]).copy == {}


def test_conflicting_result_refused_and_nothing_written(tmp_path, capsys):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa"])
    b = shard_dir(tmp_path / "b", ["aaaaaaaa", "bbbbbbbb"])
    write(b, "h200/aaaaaaaa-virtualenv-py3.11.json", {"commit_hash": "aaaaaaaa", "result": [2]})
    out = tmp_path / "out"
    assert merge_results.main(["--out", str(out), str(a), str(b)]) == 1
    assert "h200/aaaaaaaa-virtualenv-py3.11.json" in capsys.readouterr().err
    assert not out.exists()
    plan = merge_results.plan_merge(out, [a, b])
    with pytest.raises(ValueError, match="conflicting"):
        merge_results.apply(plan, out)


def test_metadata_conflict_strict_unless_replaced(tmp_path):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa"])
    b = shard_dir(tmp_path / "b", ["bbbbbbbb"])
    write(b, "benchmarks.json", {"bench.time_x": {"version": "2"}, "version": 2})
    out = tmp_path / "out"
    assert merge_results.plan_merge(out, [a, b]).conflicts == ["benchmarks.json"]
    assert merge_results.main(["--replace-metadata", "--out", str(out), str(a), str(b)]) == 0
    assert json.loads((out / "benchmarks.json").read_text())["bench.time_x"]["version"] == "2"


def test_missing_source_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        merge_results.plan_merge(tmp_path / "out", [tmp_path / "nope"])
