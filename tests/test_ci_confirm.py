"""ci/confirm.py, the gate's second stage: which points are re-run, how, and the verdict."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import confirm  # noqa: E402
from ci.render_comment import Row, parse  # noqa: E402

P = "kda.KdaVerify.track_time{}({}, 'fused', 'safe', 'H8-HV8')"
A, B, C, D = P.format("", 1), P.format("", 16), P.format("_cold", 1), P.format("_cold", 16)


def table(*rows):
    """asv compare output with these (mark, ratio, name) rows."""
    head = "| Change | Before [aaaa] | After [bbbb] | Ratio | Benchmark (Parameter) |\n"
    rule = "|--------|---------------|--------------|-------|------------------------|\n"
    body = "".join(f"| {m} | 10.0±0.01μs | 10.2±0.01μs | {r} | {n} |\n" for m, r, n in rows)
    return head + rule + body


def test_pick_suspects_flagged_first_then_by_distance_both_ways():
    base = {A: 1.0, B: 1.0, C: 1.0, D: 1.0}
    head = {A: 1.004, B: 0.990, C: 1.007, D: 1.02}
    # D was flagged by stage 1; B (-1%) is farther from 1 than C (+0.7%); A is inside.
    assert confirm.pick_suspects(base, head, [D], 1.005, 4) == ([D, B, C], [])
    assert confirm.pick_suspects(base, head, [D], 1.005, 2) == ([D, B], [C])
    assert confirm.pick_suspects(base, head, [], 1.008, 4) == ([D, B], [])
    assert confirm.pick_suspects(base, base, [], 1.0, 4) == ([A, B, C, D], [])  # every point
    # Peak VRAM is not noisy: never a suspect; stage 1's flag on it stands (left out).
    vram = "nsa.NsaBackward.track_peak_vram_bytes(4096, 'triton', 'seed', 'random')"
    base2, head2 = {**base, vram: 100.0}, {**head, vram: 101.0}
    assert confirm.pick_suspects(base2, head2, [vram, D], 1.005, 4) == ([D, B, C], [vram])
    assert confirm.pick_suspects(base2, head2, [], 1.005, 4) == ([D, B, C], [])
    with pytest.raises(ValueError, match="--suspect"):
        confirm.pick_suspects(base, head, [], 0.99, 4)


def test_bench_regex_selects_exactly_the_points():
    rx = re.compile(confirm.bench_regex([A, D]))
    assert rx.search(A) and rx.search(D)
    assert not rx.search(C)  # track_time_cold(1, ...) is not track_time(1, ...)
    assert not rx.search(B)
    assert not rx.search(A.replace("(1,", "(11,"))


@pytest.mark.parametrize(
    "stage1,suspects,left_out,slower,rows,want",
    [
        (2, [A], [], [], [], 2),  # a failure in stage 1 is final
        (0, [], [], [], [], 0),  # nothing to confirm
        (1, [A], [], [A], [("", "1.01", A)], 0),  # stage 1's flag cleared
        (1, [A], [], [A], [("+", "1.02", A)], 1),  # confirmed
        (0, [B], [], [], [("+", "1.008", B)], 1),  # a 0.8% slowdown stage 1 missed
        (0, [B], [], [], [("-", "0.99", B)], 0),  # faster is not a regression
        (1, [A], [D], [A, D], [("", "1.00", A)], 1),  # a flag beyond --max stands
        (0, [B], [], [], [("!", "failed", B)], 2),
        (0, [B], [], [], [], 2),  # the suspect vanished from the compare: not a pass
    ],
)
def test_decide(stage1, suspects, left_out, slower, rows, want):
    parsed = [Row(m, "1", "2", r, n) for m, r, n in rows]
    code, reason = confirm.decide(stage1, suspects, left_out, slower, parsed)
    assert code == want, reason


FAKE_ASV = """\
import json, pathlib, sys
log, canned, args = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
with log.open("a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "compare":
    sys.stdout.write(canned.read_text())
"""


def run_main(tmp_path, monkeypatch, stage1_rows, code, base, head, compare_rows, **kw):
    """main() with stored medians `base`/`head` and a stand-in asv that logs its calls and
    prints `compare_rows` as its compare output."""
    fake = tmp_path / "fake_asv.py"
    fake.write_text(FAKE_ASV)
    calls, canned = tmp_path / "calls.txt", tmp_path / "compare.txt"
    canned.write_text(table(*compare_rows))
    cont = tmp_path / "continuous.log"
    cont.write_text(table(*stage1_rows))
    stored = {"BASE": base, "HEAD": head}
    monkeypatch.setattr(confirm, "stored_values", lambda res, machine, commit: stored[commit])
    out = tmp_path / "gate"
    argv = [
        "--machine", "h200", "--base", "BASE", "--head", "HEAD", "--continuous-log", str(cont),
        "--continuous-code", str(code), "--rounds", str(kw.get("rounds", 20)), "--suspect",
        "1.005", "--factor", "1.006", "--max", "4", "--out", str(out),
        "--asv", f"{sys.executable} {fake} {calls} {canned}",
    ]  # fmt: skip
    rc = confirm.main(argv)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return rc, [json.loads(ln) for ln in lines], out


def test_main_reruns_only_the_suspects_then_decides(tmp_path, monkeypatch):
    base = {A: 1.0, B: 1.0, C: 1.0}
    head = {A: 1.02, B: 1.001, C: 1.008}
    rc, calls, out = run_main(
        tmp_path, monkeypatch, [("+", "1.02", A)], 1, base, head,
        [("", "1.004", A), ("+", "1.008", C), ("", "1.001", B)],
    )  # fmt: skip
    assert rc == 1  # A cleared, C confirmed
    run, compare = calls
    assert run[:4] == ["run", "--machine", "h200", "--append-samples"]
    assert run[run.index("-a") : run.index("-a") + 3] == ["-a", "rounds=20", "--interleave-rounds"]
    assert run[-1] == f"HASHFILE:{out / 'confirm-hashes.txt'}"
    regex = run[run.index("-b") + 1]
    assert [n for n in (A, B, C) if re.search(regex, n)] == [A, C]
    assert compare == ["compare", "--machine", "h200", "--factor", "1.006", "BASE", "HEAD"]
    assert (out / "confirm-hashes.txt").read_text() == "BASE\nHEAD\n"
    # What the gate decided on: stage 2's rows for the suspects, stage 1's for the rest.
    final = parse((out / "final-compare.txt").read_text())
    assert [(r.mark, r.ratio, r.name) for r in final] == [("", "1.004", A), ("+", "1.008", C)]
    verdict = json.loads((out / "confirm.json").read_text())
    assert verdict["exit_code"] == 1 and verdict["suspects"] == [A, C]
    chosen = json.loads((out / "suspects.json").read_text())
    assert chosen["stage1_slower"] == [A]
    # stage 1's ratios, read before any re-run appended samples (the study records them)
    assert chosen["stage1_ratios"] == pytest.approx({A: 1.02, B: 1.001, C: 1.008})


def test_merged_table_takes_the_suspects_rows_from_stage_2():
    def rows_of(*cells):
        return [Row(m, "1", "1", r, n) for m, r, n in cells]

    stage1 = rows_of(("+", "1.02", A), ("", "1.00", B), ("", "1.0", D))
    again = rows_of(("", "1.004", A), ("+", "1.008", C), ("-", "0.9", D))
    rows = parse(confirm.merged_table(stage1, again, {A, C}))
    assert [(r.mark, r.ratio, r.name) for r in rows] == [
        ("", "1.004", A), ("", "1.00", B), ("", "1.0", D), ("+", "1.008", C)
    ]  # fmt: skip


def test_main_runs_nothing_without_suspects_or_after_a_failure(tmp_path, monkeypatch):
    same = {A: 1.0, B: 1.0}
    rc, calls, _ = run_main(tmp_path, monkeypatch, [], 0, same, dict(same), [])
    assert rc == 0 and calls == []
    rc, calls, _ = run_main(tmp_path, monkeypatch, [("!", "failed", B)], 2, same, same, [])
    assert rc == 2 and calls == []


def test_main_refuses_a_suspect_ratio_above_the_factor(tmp_path, capsys):
    with pytest.raises(SystemExit):
        confirm.main(
            ["--machine", "m", "--base", "a", "--head", "b", "--continuous-log", "x",
             "--continuous-code", "0", "--rounds", "2", "--suspect", "1.01", "--factor",
             "1.006", "--out", str(tmp_path)]
        )  # fmt: skip
    assert "--suspect must not exceed --factor" in capsys.readouterr().err
