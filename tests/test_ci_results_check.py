"""ci/results_check.py: asv's loader, path vs content, the all-n/a rule, collect."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import results_check  # noqa: E402

ENV = "virtualenv-py3.11"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a",
           "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number", "stats_repeat",
           "samples", "profile"]  # fmt: skip


def result_json(machine: str, commit: str, values=(1.0, 2.0), env: str = ENV) -> dict:
    """One asv 0.6.6 result file as Results.save writes it: one benchmark with a parameter
    of len(values) values; NaN for a point with no value, None for a failed one."""
    vals = list(values)
    row = [vals, [[repr(f"p{i}") for i in range(len(vals))]], "1", None, None,
           [v * 0.99 if v == v and v is not None else None for v in vals],
           [v * 1.01 if v == v and v is not None else None for v in vals]]  # fmt: skip
    return {
        "commit_hash": commit, "env_name": env, "date": 1700000000000,
        "params": {"machine": machine, "python": "3.11"}, "python": "3.11",
        "requirements": {}, "env_vars": {}, "result_columns": COLUMNS,
        "results": {"nsa.NsaForward.track_time": row}, "durations": {}, "version": 2,
    }  # fmt: skip


def write_results(root: Path, commits, machine="h200", values=(1.0, 2.0)) -> list[str]:
    """A results directory with benchmarks.json, machine.json and one file per commit;
    returns the result files' relative paths."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "benchmarks.json").write_text(json.dumps({"version": 2}))
    (root / machine).mkdir(exist_ok=True)
    (root / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    rels = []
    for c in commits:
        rel = f"{machine}/{c[:8]}-{ENV}.json"
        (root / rel).write_text(json.dumps(result_json(machine, c, values)))
        rels.append(rel)
    return rels


C1, C2 = "a1" * 20, "b2" * 20


def test_a_good_tree_passes_and_loads_with_asv(tmp_path):
    rels = write_results(tmp_path, [C1, C2])
    assert results_check.check_tree(tmp_path) == {}
    from asv.results import iter_results

    assert {r.commit_hash for r in iter_results(str(tmp_path))} == {C1, C2}
    assert rels == [f"h200/{C1[:8]}-{ENV}.json", f"h200/{C2[:8]}-{ENV}.json"]


@pytest.mark.parametrize(
    "mutate,words",
    [
        (lambda p: p.write_text(p.read_text()[:-40]), "asv cannot load it"),  # truncated
        (lambda p: p.write_text(""), "asv cannot load it"),
        (lambda p: p.write_text("[1, 2]"), "asv cannot load it"),
        (lambda p: p.write_text(json.dumps({"commit_hash": C1, "result": [1]})), "cannot load"),
        (lambda p: p.write_text(json.dumps(result_json("h100", C1))), "machine name is not"),
        (lambda p: p.write_text(json.dumps(result_json("h200", C2))), "belong in b2b2b2b2-"),
        (lambda p: p.write_text(json.dumps(result_json("h200", C1, env="conda-py3.10"))),
         "belong in a1a1a1a1-conda-py3.10.json"),
        (lambda p: p.write_text(json.dumps({**result_json("h200", C1), "version": 1})),
         "old file format"),
    ],
)  # fmt: skip
def test_bad_result_files_are_named_with_the_reason(tmp_path, mutate, words):
    (rel,) = write_results(tmp_path, [C1])
    mutate(tmp_path / rel)
    bad = results_check.check_tree(tmp_path)
    assert list(bad) == [rel] and words in bad[rel], bad


def test_bad_metadata_and_stray_files(tmp_path):
    write_results(tmp_path, [C1])
    (tmp_path / "h200" / "machine.json").write_text(json.dumps({"machine": "x", "version": 1}))
    (tmp_path / "benchmarks.json").write_text('{"version": 2, "nsa.')
    (tmp_path / "h200" / "notes.txt").write_text("x")
    (tmp_path / "h200" / "na_reasons.jsonl").write_text('{"a": 1}\n{"cut')  # a cut line is fine
    bad = results_check.check_tree(tmp_path)
    assert set(bad) == {"h200/machine.json", "benchmarks.json", "h200/notes.txt"}
    assert "names machine 'x', its folder is 'h200'" in bad["h200/machine.json"]


def git(*args, cwd):
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    """A repository with a commit before the kernels and one with them."""
    r = tmp_path / "repo"
    r.mkdir()
    git("init", "-q", cwd=r)
    (r / "README").write_text("x")
    git("add", "-A", cwd=r)
    git("commit", "-qm", "before", cwd=r)
    old = git("rev-parse", "HEAD", cwd=r)
    (r / "src" / "kernels").mkdir(parents=True)
    (r / "src" / "kernels" / "k.py").write_text("x = 1\n")
    git("add", "-A", cwd=r)
    git("commit", "-qm", "kernels", cwd=r)
    return r, old, git("rev-parse", "HEAD", cwd=r)


def test_predates_kernels(repo):
    r, old, new = repo
    assert results_check.predates_kernels(old, r)
    assert not results_check.predates_kernels(new, r)
    assert not results_check.predates_kernels("c" * 40, r)  # unknown: nothing says it predates


def test_collect_refuses_bad_and_all_na_files_and_keeps_the_good(repo, tmp_path):
    r, old, new = repo
    res, out = tmp_path / "results", tmp_path / "out"
    nan = math.nan
    write_results(res, [new], values=(nan, None))  # the kernels' commit, no number: refused
    write_results(res, [old], values=(nan, nan))  # before the kernels: stored
    good = "c3" * 20
    write_results(res, [good])
    broken = write_results(res, ["d4" * 20])[0]
    (res / broken).write_text((res / broken).read_text()[:100])
    refused = results_check.collect(res, "h200", out, repo=r)
    assert set(refused) == {f"h200/{new[:8]}-{ENV}.json", broken}
    assert "no point has a number" in refused[f"h200/{new[:8]}-{ENV}.json"]
    assert sorted(results_check.scan(out)) == sorted(
        ["h200/machine.json", f"h200/{old[:8]}-{ENV}.json", f"h200/{good[:8]}-{ENV}.json"]
    )
    # a file pulled from the history unchanged is not judged by the all-n/a rule again
    known = tmp_path / "pulled.txt"
    rel = f"h200/{new[:8]}-{ENV}.json"
    known.write_text(f"{results_check.sha256(res / rel)}  {rel}\n")
    args = ["collect", "--results", str(res), "--machine", "h200", "--out", str(tmp_path / "o2"),
            "--known", str(known), "--repo", str(r), "--benchmarks-json"]  # fmt: skip
    assert results_check.main(args) == 1  # the truncated file is still refused
    got = results_check.scan(tmp_path / "o2")
    assert rel in got and "benchmarks.json" in got and broken not in got


def test_manifest_and_check_commands(tmp_path, capsys):
    write_results(tmp_path / "r", [C1])
    assert results_check.main(["check", str(tmp_path / "r")]) == 0
    man = tmp_path / "m.txt"
    assert (
        results_check.main(["manifest", "--results", str(tmp_path / "r"), "--out", str(man)]) == 0
    )
    assert len(results_check.read_manifest(man)) == 3
    (tmp_path / "r" / "benchmarks.json").write_text("{")
    assert results_check.main(["check", str(tmp_path / "r")]) == 1
    assert "benchmarks.json" in capsys.readouterr().out
