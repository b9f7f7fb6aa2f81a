"""`tools/dev/asv_process_cost.py`: a point run as asv runs it (forked child, setup_cache's
result passed first), and its A/B of checkouts in fresh processes with placement spacers."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tools.dev import asv_process_cost as apc

ROOT = Path(__file__).resolve().parents[1]
POINT = "kda.KdaVerify.track_time(1, 'unfused', 'safe', 'H1-HV2')"  # a smoke-grid point


def test_a_child_runs_the_point_with_its_cache_and_records_the_figure(tmp_path):
    """One child of a class with a setup_cache (the smoke suite, interpreter): the method gets
    the cache as asv passes it, the spacer is allocated, and the record carries the median."""
    times = tmp_path / "t.jsonl"
    env = dict(os.environ, ATTNBENCH_SMOKE="1", PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    cmd = [
        sys.executable, "-m", "tools.dev.asv_process_cost", "--no-profile", "--repeat", "1",
        "--spacer", "2", "--json", str(times), "--tag", "x", "--out", str(tmp_path), POINT,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in times.read_text().splitlines()]
    assert record["tag"] == "x" and record["point"] == POINT and record["spacer_mib"] == 2
    assert record["figure"] > 0


def test_figure_is_the_median_of_a_timings_samples_else_the_value():
    assert apc.figure({"samples": [3.0, 1.0, 2.0], "number": 1}) == 2.0
    assert apc.figure(12345) == 12345.0


def test_each_round_rotates_which_side_starts():
    sides = [("a", "A"), ("b", "B"), ("c", "C")]
    assert [t for t, _ in apc.side_order(sides, 1)] == ["a", "b", "c"]
    assert [t for t, _ in apc.side_order(sides, 2)] == ["b", "c", "a"]
    assert [t for t, _ in apc.side_order(sides, 4)] == ["a", "b", "c"]


def test_sides_run_one_fresh_process_per_round_spacer_and_side(tmp_path, monkeypatch):
    runs = []

    def fake_run(cmd, env, cwd, check):
        arg = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
        runs.append((arg("--tag"), int(arg("--spacer")), env["PYTHONPATH"].split(":")[0]))
        assert cmd[-1] == POINT and "--no-profile" in cmd and arg("--repeat") == "1"

    monkeypatch.setattr(apc.subprocess, "run", fake_run)
    monkeypatch.setattr(apc, "summary", lambda *a: [])
    old, new = tmp_path / "old", tmp_path / "new"
    apc.by_sides([("old", old), ("new", new)], [POINT], tmp_path, 2, [0, 8])
    assert [(t, s) for t, s, _ in runs] == [
        ("old", 0), ("new", 0), ("old", 8), ("new", 8),
        ("new", 0), ("old", 0), ("new", 8), ("old", 8),
    ]  # fmt: skip
    for tag, _, src in runs:
        assert src == str((old if tag == "old" else new).resolve())


def test_summary_gives_each_sides_processes_median_and_ratio(tmp_path, capsys):
    times = tmp_path / "t.jsonl"
    recs = [("old", 0, 492e-6), ("new", 0, 502e-6), ("old", 0, 490e-6), ("new", 0, 500e-6)]
    recs += [("old", 8, 504e-6), ("new", 8, 503e-6)]
    times.write_text(
        "".join(
            json.dumps(dict(tag=t, point=POINT, spacer_mib=s, figure=f)) + "\n" for t, s, f in recs
        )
    )
    rows = apc.summary(times, ["old", "new"])
    assert rows[0] == (POINT, 0, {"old": [492e-6, 490e-6], "new": [502e-6, 500e-6]})
    printed = capsys.readouterr().out
    row0 = "| 0 | 492.0, 490.0 | 491.0 | 1.000 | 502.0, 500.0 | 501.0 | 1.020 |"
    assert f"| {POINT} {row0}" in printed
    assert f"| {POINT} | 8 | 504.0 | 504.0 | 1.000 | 503.0 | 503.0 | 0.998 |" in printed
