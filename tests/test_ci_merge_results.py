"""ci/merge_results.py: union of asv results directories, refusing conflicting duplicates."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_ci_results_check import result_json  # noqa: E402

from ci import merge_results, na_reasons  # noqa: E402


def write(root: Path, rel: str, value) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def shard_dir(root: Path, commits: list[str], machine: str = "h200") -> Path:
    write(root, "benchmarks.json", {"bench.time_x": {"version": "1"}, "version": 2})
    write(root, f"{machine}/machine.json", {"machine": machine, "version": 1})
    for c in commits:
        write(root, f"{machine}/{c}-virtualenv-py3.11.json", result_json(machine, c * 5))
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
        json.dumps(result_json("h200", "bbbbbbbb" * 5), indent=2)
    )
    assert merge_results.plan_merge(out, [a, b, c]).copy == {}


def test_conflicting_result_refused_and_nothing_written(tmp_path, capsys):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa"])
    b = shard_dir(tmp_path / "b", ["aaaaaaaa", "bbbbbbbb"])
    write(b, "h200/aaaaaaaa-virtualenv-py3.11.json", result_json("h200", "a" * 40, (3.0, 4.0)))
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


def test_bad_files_are_never_merged_and_the_good_ones_are(tmp_path, capsys):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa", "cccccccc"])
    b = shard_dir(tmp_path / "b", ["bbbbbbbb"])
    cut = a / "h200/cccccccc-virtualenv-py3.11.json"
    cut.write_text(cut.read_text()[:200])  # truncated, as a killed asv leaves it
    wrong = b / "h200/bbbbbbbb-virtualenv-py3.11.json"
    wrong.write_text(json.dumps(result_json("h100", "b" * 40)))  # another machine's numbers
    out = tmp_path / "out"
    assert merge_results.main(["--out", str(out), str(a), str(b)]) == 1
    err = capsys.readouterr().out
    assert "refused" in err and "cccccccc" in err and "machine name is not 'h200'" in err
    assert sorted(merge_results.scan(out)) == [
        "benchmarks.json", "h200/aaaaaaaa-virtualenv-py3.11.json", "h200/machine.json",
    ]  # fmt: skip


def test_oom_logs_merge_as_the_union_of_their_lines(tmp_path):
    a = shard_dir(tmp_path / "a", ["aaaaaaaa"])
    b = shard_dir(tmp_path / "b", ["bbbbbbbb"])
    log_a, log_b = na_reasons.log_path(a, "h200"), na_reasons.log_path(b, "h200")
    na_reasons.record_oom(log_a, "a" * 40, "nsa.NsaForward.track_time", ["1"])
    na_reasons.record_oom(log_b, "a" * 40, "nsa.NsaForward.track_time", ["1"])  # the same line
    na_reasons.record_oom(log_b, "b" * 40, "nsa.NsaForward.track_time", ["2"])
    out = tmp_path / "out"
    assert merge_results.main(["--out", str(out), str(a), str(b)]) == 0
    got = na_reasons.load_oom(na_reasons.log_path(out, "h200"))
    assert {c[0] for c in got} == {"a" * 40, "b" * 40}
    assert len(na_reasons.log_path(out, "h200").read_text().splitlines()) == 2
    # a later run's log grows the merged one; nothing is a conflict
    na_reasons.record_oom(log_a, "c" * 40, "nsa.NsaForward.track_time", ["3"])
    assert merge_results.main(["--out", str(out), str(a)]) == 0
    assert len(na_reasons.log_path(out, "h200").read_text().splitlines()) == 3


def test_no_temporary_file_is_left_and_writes_are_renames(tmp_path, monkeypatch):
    """Each file is written beside its target and renamed over it: a crash mid-copy
    leaves the old file (or none), never half of one."""
    from ci import fileio

    a = shard_dir(tmp_path / "a", ["aaaaaaaa"])
    out = tmp_path / "out"
    calls = []
    real = fileio.os.replace
    monkeypatch.setattr(fileio.os, "replace", lambda s, d: (calls.append((s, d)), real(s, d)))
    assert merge_results.main(["--out", str(out), str(a)]) == 0
    assert len(calls) == 3 and all(Path(s).parent == Path(d).parent for s, d in calls)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]

    def boom(s, d):
        raise OSError("disk full")

    monkeypatch.setattr(fileio.os, "replace", boom)
    target = out / "h200/aaaaaaaa-virtualenv-py3.11.json"
    before = target.read_bytes()
    with pytest.raises(OSError, match="disk full"):
        fileio.write_text_atomic(target, "{")
    assert target.read_bytes() == before and not list(out.rglob("*.tmp"))
