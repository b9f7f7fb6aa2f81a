"""ci/render_comment.py on `asv compare` output: marker, verdict, regression and kind tables."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import render_comment  # noqa: E402

SAMPLE = Path(__file__).parent / "data" / "asv_compare_sample.txt"


def section(body: str, title: str) -> str:
    """The text from a heading/summary containing `title` to the next blank-line gap."""
    start = body.index(title)
    end = body.find("\n\n#", start)
    return body[start : end if end > 0 else None]


def test_parse_reads_every_row():
    rows = render_comment.parse(SAMPLE.read_text())
    assert len(rows) == 8
    assert [r.mark for r in rows] == ["+", "!", "", "-", "+", "x", "", ""]
    assert rows[0].name == "nsa.NsaForward.track_time(4096, 'triton', 'seed', 'random')"
    assert rows[0].method == "track_time"
    assert [r.kind for r in rows] == [
        "time",
        "time",
        "vram",
        "time",
        "vram",
        "time",
        "time",
        "other",
    ]
    assert rows[6].ratio == "~1.06"
    assert rows[1].after == "failed"


def gate_dir(path: Path, machine: str, exit_code: int, text: str) -> Path:
    args = ["meta", str(path), "--base", "main", "--head", "5e6f7a8b", "--machine", machine,
            "--factor", "1.05", "--exit-code", str(exit_code)]  # fmt: skip
    assert render_comment.main(args) == 0
    (path / render_comment.COMPARE).write_text(text)
    return path


def test_render_failing_gate(tmp_path):
    out = tmp_path / "comment.md"
    h200 = gate_dir(tmp_path / "gate-h200", "h200", 2, SAMPLE.read_text())
    url = "https://example.invalid/run/1"
    assert render_comment.main(["render", str(h200), "--run-url", url, "--out", str(out)]) == 0
    body = out.read_text()
    assert body.startswith(render_comment.MARKER + "\n")
    assert body.count(render_comment.MARKER) == 1
    assert "`h200`: `main` → `5e6f7a8b`" in body
    assert "Benchmark failures" in body and "exit 2" in body
    assert "2 slower, 1 failed, 1 faster, 1 not comparable, 3 unchanged" in body
    assert "factor 1.05" in body
    # the failed cell is named with the shared n/a encoding's label
    assert "Cells without a value: `failed`: failed (ci/na_reasons.py)." in body
    regressions = section(body, "#### Regressions")
    assert "NsaForward.track_time(4096," in regressions
    assert "KdaVerify.track_peak_vram_bytes(16," in regressions
    assert "KdaVerify.track_time(8," in regressions  # the failure
    assert "KdaVerify.track_time(16," not in regressions  # the improvement
    assert "KdaVerify.track_time(16," in section(body, "#### Improvements")
    vram = body[body.index("Peak VRAM: 2 benchmark(s)") :].split("</details>")[0]
    assert vram.count("track_peak_vram_bytes") == 2 and "time" not in vram
    assert "Time: 5 benchmark(s)" in body and "Other: 1 benchmark(s)" in body
    assert body.rstrip().endswith("(https://example.invalid/run/1)")


@pytest.mark.parametrize(
    "code,headline",
    [(0, "No significant regression"), (1, "Significant slowdown"), (2, "Benchmark failures")],
)
def test_verdict_follows_the_exit_code(code, headline):
    body = render_comment.render_section(SAMPLE.read_text(), "a", "b", "h100", "1.05", code)
    assert headline in body.split("\n")[2]


def test_clean_run_and_no_tables():
    clean = "\n".join(
        line.replace("| +  ", "|    ").replace("| !  ", "|    ").replace("| -  ", "|    ")
        for line in SAMPLE.read_text().splitlines()
    )
    body = render_comment.render_section(clean, "a", "b", "h200", "1.05")
    assert "No significant regression" in body
    assert "#### Regressions" not in body and "#### Improvements" not in body
    empty = render_comment.render_section(
        "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n", "a", "b", "h", "1"
    )
    assert "no benchmarks" in empty


def test_one_comment_for_several_gpu_types(tmp_path):
    """Sections sorted by machine under a single marker; a missing compare.txt still renders."""
    gate_dir(tmp_path / "b", "h200", 0, SAMPLE.read_text())
    gate_dir(tmp_path / "a", "h100", 3, "")
    (tmp_path / "a" / render_comment.COMPARE).unlink()
    body = render_comment.render_dirs([tmp_path / "b", tmp_path / "a"])
    assert body.count(render_comment.MARKER) == 1
    assert body.index("`h100`") < body.index("`h200`")
    assert "exit 3" in body


def test_the_second_stage_is_explained(tmp_path):
    """With ci.confirm's confirm.json beside the tables, the section says which points
    were re-timed and why the verdict is what it is; without it, nothing is said."""
    d = gate_dir(tmp_path / "g", "h200", 0, SAMPLE.read_text())
    assert "Second stage" not in render_comment.render_dirs([d])
    name = "kda.KdaVerify.track_time(16, 'unfused', 'safe', 'H8-HV8')"
    verdict = {"exit_code": 0, "reason": "no suspect confirmed (1 stage-1 flag(s) cleared)",
               "stage1_code": 1, "suspects": [name]}  # fmt: skip
    (d / render_comment.CONFIRM).write_text(json.dumps(verdict))
    body = render_comment.render_dirs([d])
    assert f"Second stage: re-timed 1 point(s) (`{name}`); no suspect confirmed (1 " in body
    (d / render_comment.CONFIRM).write_text(json.dumps({**verdict, "suspects": []}))
    assert "Second stage: re-timed nothing;" in render_comment.render_dirs([d])


def test_unknown_mark_is_an_error():
    with pytest.raises(ValueError, match="change mark"):
        render_comment.parse("| ? | 1ms | 2ms | 2.00 | b.time_x |\n")


def test_long_output_is_truncated():
    row = "|    | 1.00±0.01ms | 1.00±0.01ms | 1.00 | bench.C.time_x({}) |\n"
    text = "".join(row.format(i) for i in range(3000))
    body = render_comment.render([render_comment.render_section(text, "a", "b", "h", "1", 0)])
    assert len(body) < 65536 and "truncated" in body


def test_value_less_cells_are_explained():
    text = (
        "| Change | Before [a] | After [b] | Ratio | Benchmark (Parameter) |\n"
        "|--------|-----------|-----------|-------|------------------------|\n"
        "|        | n/a       | n/a       | n/a   | nsa.NsaForward.track_time(65536) |\n"
        "|        | 1.00ms    | 1.01ms    | 1.01  | nsa.NsaForward.track_time(4096) |\n"
    )
    body = render_comment.render_section(text, "main", "head", "h200", "1.015", 0)
    assert "`n/a`: skipped by choice, out of memory or not run" in body
    assert "`failed`" not in body
    plain = text.replace("| n/a       | n/a       | n/a   |", "| 1.00ms | 1.00ms | 1.00 |")
    assert "Cells without a value" not in render_comment.render_section(
        plain, "main", "head", "h200", "1.015", 0
    )


def confirm_dir(tmp_path, code, verdict, text=None):
    d = gate_dir(tmp_path / "g", "h200", code, SAMPLE.read_text() if text is None else text)
    (d / render_comment.CONFIRM).write_text(json.dumps({"reason": "r", "suspects": [], **verdict}))
    return d


def test_lost_numbers_are_listed_with_their_reason(tmp_path):
    lost = [{"name": "nsa.NsaForward.track_time(4096)", "reason": "out-of-memory",
             "label": "out of memory", "base": 0.002},
            {"name": "kda.KdaVerify.track_time(1)", "reason": "not-run", "label": "not run",
             "base": 1e-5}]  # fmt: skip
    clean = "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"
    body = render_comment.render_dirs([confirm_dir(tmp_path, 1, {"lost": lost}, clean)])
    assert "Numbers lost" in body.split("\n")[4]  # the headline
    part = section(body, "#### Numbers lost: 2 point(s)")
    assert "`nsa.NsaForward.track_time(4096)` | 0.002 | n/a: out of memory |" in part
    assert "`kda.KdaVerify.track_time(1)` | 1e-05 | n/a: not run |" in part


def test_a_head_without_numbers_and_unjudged_suspects(tmp_path):
    d = confirm_dir(tmp_path, 1, {"head_has_no_number": True}, "")
    assert "No numbers at the head" in render_comment.render_dirs([d])
    names = [f"nsa.NsaForward.track_time({i})" for i in range(3)]
    verdict = {"unjudged_slower": names, "unjudged_faster": ["kda.K.track_time(1)"],
               "time_cap_s": 1800.0}  # fmt: skip
    clean = "BENCHMARKS NOT SIGNIFICANTLY CHANGED.\n"
    body = render_comment.render_dirs([confirm_dir(tmp_path / "u", 1, verdict, clean)])
    assert "Suspects not judged" in body
    part = section(body, "#### Not judged: 3 slower suspect(s)")
    assert "(1800.0 s)" in part and all(f"- `{n}`" in part for n in names)
    assert "faster at stage 1, no regression): 1 point(s)" in body


def test_every_regression_is_reported_even_when_the_comment_is_long(tmp_path):
    """Hundreds of slower points and thousands of unchanged ones: the per-kind tables go,
    every slower row stays, whole."""
    slow = "| + | 1.00±0.01ms | 1.05±0.01ms | 1.05 | nsa.NsaForward.track_time({}) |\n"
    same = "|   | 1.00±0.01ms | 1.00±0.01ms | 1.00 | kda.KdaVerify.track_time({}) |\n"
    text = "".join(slow.format(i) for i in range(250)) + "".join(
        same.format(i) for i in range(3000)
    )
    body = render_comment.render_dirs([confirm_dir(tmp_path, 1, {}, text)])
    assert len(body) < 65536 and "truncated" not in body
    assert "#### Regressions and failures: 250 point(s)" in body
    assert all(f"track_time({i})` |" in body for i in range(250))
    assert "tables of every point are left out" in body and "<details>" not in body


def test_the_comment_says_which_factor_judged_each_point(tmp_path):
    """A host figure judged at the host factor, a graph figure at stage 2's, the rest at
    stage 1's: every table's last column names it."""
    host = "nsa.NsaAutograd.track_time_host(4096, 'triton', 'seed', 'random')"
    graph = "nsa.NsaForward.track_time(4096, 'triton', 'seed', 'random')"
    other = "kda.KdaVerify.track_time(1)"
    text = (
        f"| + | 1.00±0.01ms | 1.03±0.01ms | 1.03 | {graph} |\n"
        f"|   | 1.00±0.01ms | 1.03±0.01ms | 1.03 | {host} |\n"
        f"|   | 1.00±0.01ms | 1.00±0.01ms | 1.00 | {other} |\n"
    )
    judged_at = {graph: "1.006 (pooled)", host: "1.05 (host factor, pooled)"}
    verdict = {"judged_at": judged_at, "host_factor": 1.05, "factor": 1.006}
    body = render_comment.render_dirs([confirm_dir(tmp_path, 1, verdict, text)])
    assert "judged at 1.05, the other timings at 1.006" in body
    assert f"| `{graph}` | 1.006 (pooled) |" in section(body, "#### Regressions")
    times = body[body.index("Time: 3 benchmark(s)") :].split("</details>")[0]
    assert "| Judged at |" in times
    assert f"| `{host}` | 1.05 (host factor, pooled) |" in times
    assert f"| `{other}` | stage 1 |" in times
    # without judged_at (a verdict of an older gate), no column and no factor line
    body = render_comment.render_dirs([confirm_dir(tmp_path / "o", 1, {}, text)])
    assert "Judged at" not in body and "host-paced" not in body
