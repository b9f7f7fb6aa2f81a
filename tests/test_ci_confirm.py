"""ci/confirm.py, the gate's second stage: which points are re-run, how, and the verdict."""

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci import confirm, na_reasons  # noqa: E402
from ci.asv_results import Point  # noqa: E402
from ci.render_comment import Row, parse  # noqa: E402

P = "kda.KdaVerify.track_time{}({}, 'fused', 'safe', 'H8-HV8')"
A, B, C, D = P.format("", 1), P.format("", 16), P.format("_cold", 1), P.format("_cold", 16)


def table(*rows):
    """asv compare output with these (mark, ratio, name) rows."""
    head = "| Change | Before [aaaa] | After [bbbb] | Ratio | Benchmark (Parameter) |\n"
    rule = "|--------|---------------|--------------|-------|------------------------|\n"
    body = "".join(f"| {m} | 10.0±0.01μs | 10.2±0.01μs | {r} | {n} |\n" for m, r, n in rows)
    return head + rule + body


def pts(values, spread=0.001):
    """{name: Point} with these medians and a 99% interval of +-spread (relative)."""
    out = {}
    for name, v in values.items():
        ci = (v * (1 - spread), v * (1 + spread)) if na_reasons.is_measured(v) else None
        out[name] = Point(name, name.split("(")[0], (), v, ci)
    return out


def test_plan_flagged_first_then_by_distance_both_ways():
    base = pts({A: 1.0, B: 1.0, C: 1.0, D: 1.0})
    head = pts({A: 1.004, B: 0.990, C: 1.007, D: 1.02})
    # D was flagged by stage 1 (1.02 < 1.03: not beyond doubt); then the slower side (C),
    # then the faster (B); A is inside the suspect factor.
    plan = confirm.plan_stage2(base, head, [D], 1.005)
    assert plan.suspects == [D, C, B] and plan.sure == [] and plan.kept == []
    assert confirm.plan_stage2(base, head, [], 1.008).suspects == [D, B]
    assert confirm.plan_stage2(base, base, [], 1.0).suspects == [A, B, C, D]  # every point
    # Peak VRAM is not noisy: never a suspect; stage 1's flag on it stands (kept).
    vram = "nsa.NsaBackward.track_peak_vram_bytes(4096, 'triton', 'seed', 'random')"
    base2, head2 = {**base, **pts({vram: 100.0})}, {**head, **pts({vram: 101.0})}
    plan = confirm.plan_stage2(base2, head2, [vram, D], 1.005)
    assert plan.suspects == [D, C, B] and plan.kept == [vram]
    assert confirm.plan_stage2(base2, head2, [], 1.005).suspects == [D, C, B]
    # stage 2 off: every stage-1 flag is kept, nothing is a suspect
    off = confirm.plan_stage2(base2, head2, [vram, D], 1.005, rerun=False)
    assert off.suspects == [] and off.kept == [vram, D]
    with pytest.raises(ValueError, match="--suspect"):
        confirm.plan_stage2(base, head, [], 0.99)


def test_flags_beyond_doubt_are_kept_the_doubtful_re_run():
    """A stage-1 flag at >= 1.03 with disjoint 99% intervals stands without a re-run; one
    at >= 1.03 whose intervals overlap, or one below 1.03, is a suspect (the most likely
    first), and so is a point no flag marked that lies beyond the suspect factor."""
    base = pts({A: 1.0, B: 1.0, C: 1.0, D: 1.0})
    head = {**pts({A: 1.05, C: 1.016, D: 1.008}), **pts({B: 1.04}, spread=0.05)}
    plan = confirm.plan_stage2(base, head, [A, B, C], 1.005)
    assert plan.sure == [A]
    assert plan.suspects == [B, C, D]
    assert confirm.plan_stage2(base, head, [A, B, C], 1.005, sure=1.06).sure == []
    # no interval stored: never beyond doubt
    bare = {n: Point(n, n, (), p.value, None) for n, p in head.items()}
    assert confirm.plan_stage2(base, bare, [A], 1.005).sure == []


@pytest.mark.parametrize(
    "method",
    ["track_time", "track_time_cold", "track_time_eager", "track_time_host",
     "track_time_memcpy", "time_forward"],
)  # fmt: skip
def test_every_track_time_figure_is_a_timing(method):
    assert confirm.is_timing(f"nsa.NsaForward.{method}(4096, 'triton')")


@pytest.mark.parametrize(
    "method", ["track_peak_vram_bytes", "peakmem_forward", "track_tflops", "track_tokens_per_s"]
)
def test_other_figures_are_not_timings(method):
    assert not confirm.is_timing(f"nsa.NsaForward.{method}(4096, 'triton')")


def test_retime_judges_every_suspect_in_batches_within_the_cap():
    names = [f"p{i}" for i in range(20)]
    clock = {"t": 0.0}
    batches = []

    def run_batch(chunk, per_point=10.0):
        batches.append(list(chunk))
        clock["t"] += per_point * len(chunk)

    def tick():
        return clock["t"]

    judged, left, spent = confirm.retime(names, 8, 1000.0, run_batch, tick)
    assert judged == names and left == [] and [len(b) for b in batches] == [8, 8, 4]
    assert spent == 200.0
    # A cap of 150 s at 10 s a point: a first batch of 8, then the 7 that fit in the 70 s
    # left; the 5 that remain are returned, unjudged, never dropped.
    batches.clear()
    clock["t"] = 0.0
    judged, left, spent = confirm.retime(names, 8, 150.0, run_batch, tick)
    assert [len(b) for b in batches] == [8, 7] and spent == 150.0
    assert judged == names[:15] and left == names[15:]
    # a cap of 0: nothing is re-run, everything is unjudged
    batches.clear()
    assert confirm.retime(names, 8, 0.0, run_batch, tick)[:2] == ([], names)
    assert batches == []
    with pytest.raises(ValueError, match="batch"):
        confirm.retime(names, 0, 10.0, run_batch, tick)


def test_lost_numbers_and_a_head_without_numbers():
    nan = float("nan")
    base = pts({A: 1.0, B: 1.0, C: 1.0, D: 1.0, "x.X.track_time": nan})
    head = pts({A: 1.0, B: nan, C: None})  # D absent: not run
    oom = {("h" * 40, B.split("(")[0], ())}
    lost = confirm.lost_numbers(base, head, oom, "h" * 40)
    got = {n: r for n, r, _ in lost}
    assert got == {B: na_reasons.NaReason.OUT_OF_MEMORY, C: na_reasons.NaReason.FAILED,
                   D: na_reasons.NaReason.NOT_RUN}  # fmt: skip
    lost = confirm.lost_numbers(base, head, set(), "h" * 40)
    assert {n: r for n, r, _ in lost}[B] == na_reasons.NaReason.SKIPPED
    assert not confirm.head_has_no_number(head)
    assert confirm.head_has_no_number(pts({A: nan, B: None}))
    assert confirm.head_has_no_number({})


def test_bench_regex_selects_exactly_the_points():
    rx = re.compile(confirm.bench_regex([A, D]))
    assert rx.search(A) and rx.search(D)
    assert not rx.search(C)  # track_time_cold(1, ...) is not track_time(1, ...)
    assert not rx.search(B)
    assert not rx.search(A.replace("(1,", "(11,"))


# The host-paced figures, in the classes that have them (one name per class).
HOST = (
    "nsa.NsaForward.track_time_host(4096, 'triton', 'seed', 'random')",
    "nsa.NsaBackward.track_time_eager(4096, 'triton', 'seed', 'random')",
    "nsa.NsaAutograd.track_time_host(4096, 'triton', 'seed', 'random')",
    "nsa.NsaSeedBackward.track_time_eager(4096, 'triton', 'seed', 'random')",
)
G = "nsa.NsaForward.track_time(4096, 'triton', 'seed', 'random')"  # a graph figure
H, E = HOST[2], HOST[3]


@pytest.mark.parametrize("name", HOST)
def test_host_figures_are_named_in_every_class(name):
    assert confirm.is_host_figure(name) and confirm.is_timing(name)
    assert confirm.factor_for(name, 1.006, 1.05) == 1.05
    assert confirm.factor_for(name, 1.006) == 1.006  # no host factor: judged as the others


@pytest.mark.parametrize(
    "name", [G, A, C, "nsa.NsaForward.track_time_cold(1)", "nsa.X.track_time_hosted(1)",
             "nsa.X.track_peak_vram_bytes(1)", "nsa.X.time_host(1)"],
)  # fmt: skip
def test_graph_figures_keep_the_graph_factor(name):
    assert not confirm.is_host_figure(name)
    assert confirm.factor_for(name, 1.006, 1.05) == 1.006


def test_plan_judges_host_figures_at_the_host_factor():
    """1.03 with disjoint intervals is beyond doubt for a graph figure; a host figure's flag
    never is (1.03 and 1.08 are both re-run: two slow processes can make any stage-1
    ratio, with tight intervals). Unflagged, a host figure at
    1.03 lies within its scaled suspect ratio (about 1.04 at these settings), a graph figure
    at 1.03 does not; the order reads each ratio in units of its own factor."""
    g2 = "nsa.NsaForward.track_time(8192, 'triton', 'seed', 'random')"
    h2 = HOST[0]
    base = pts(dict.fromkeys([G, g2, H, E, h2, A], 1.0))
    head = pts({G: 1.03, g2: 1.03, H: 1.03, E: 1.08, h2: 1.045, A: 1.01})
    kw = {"factor": 1.006, "host_factor": 1.05}
    plan = confirm.plan_stage2(base, head, [G, H, E], 1.005, **kw)
    assert plan.sure == [G]
    # the host flags first (E, H by scaled ratio); then g2, A, h2 by scaled ratio
    assert plan.suspects == [E, H, g2, A, h2]
    # without a host factor the host figures are judged as the graph ones
    plan = confirm.plan_stage2(base, head, [G, H, E], 1.005)
    assert plan.sure == [G, H, E] and plan.suspects == [h2, g2, A]
    # stage 2 off: a host flag below the host factor is cleared on its ratio, not kept
    off = confirm.plan_stage2(base, head, [G, H, E], 1.005, rerun=False, **kw)
    assert off.kept == [G, E] and off.rejudged == [H] and off.suspects == []
    v = confirm.decide(1, off, [], [], [G, H, E], [])
    assert v.code == 1 and v.cleared == [H]
    off = confirm.plan_stage2(base, head, [H], 1.005, rerun=False, **kw)
    assert confirm.decide(1, off, [], [], [H], []).code == 0
    with pytest.raises(ValueError, match="--host-factor"):
        confirm.plan_stage2(base, head, [], 1.005, factor=1.006, host_factor=1.004)
    with pytest.raises(ValueError, match="--host-factor"):
        confirm.plan_stage2(base, head, [], 1.005, host_factor=1.05)


def test_plan_rejudges_a_host_figures_faster_flag_on_its_estimator():
    """Stage 1 flagged H and E faster by their medians (a slow base process). H's estimator
    reads 0.99, within its scaled suspect band: cleared, no longer listed as faster. E's
    reads 0.9, beyond it: listed as a faster suspect, not cleared. A graph figure's faster
    flag is never rejudged, and a point flagged both ways counts as slower."""
    base = pts(dict.fromkeys([G, H, E], 1.0))
    head = pts({G: 0.97, H: 0.9, E: 0.9})
    kw = {"factor": 1.006, "host_factor": 1.05, "host_ratio": {H: 0.99, E: 0.9}}
    plan = confirm.plan_stage2(base, head, [], 1.005, faster=[G, H, E], **kw)
    assert plan.rejudged == [H] and plan.faster == [G, E] and plan.suspects == [G, E]
    v = confirm.decide(0, plan, [], [G, E], [], [])  # asv exits 0 on faster points only
    assert v.code == 0 and v.cleared == [H] and v.unjudged_faster == [G, E]
    # without faster flags nothing changes: H within its band is no suspect, E is one
    plan = confirm.plan_stage2(base, head, [], 1.005, **kw)
    assert plan.rejudged == [] and plan.suspects == [G, E]
    # stage 2 off: a faster host flag within the host factor (0.99 > 1 / 1.05) is cleared
    off = confirm.plan_stage2(base, head, [], 1.005, rerun=False, faster=[G, H, E], **kw)
    assert off.rejudged == [H] and off.kept == []
    # a name among the slower flags is judged as one, whatever the faster list says
    both = confirm.plan_stage2(base, head, [H], 1.005, faster=[H], **kw)
    assert both.rejudged == [H]


def test_main_a_faster_host_flag_within_its_band_leaves_the_table(tmp_path, monkeypatch):
    """Stage 1 marks H faster at 0.90 by medians (one slow base process); its low quantile
    reads 1.0: the final table and the verdict list it nowhere. A faster graph flag stays."""
    base, head = dict.fromkeys([G, H], 1.0), {G: 0.9, H: pts({H: 0.9}, spread=0.1)[H]}
    proc = [100.0 + 0.1 * i for i in range(10)]
    samples = {"BASE": {H: proc + [x * 1.6 for x in proc]}, "HEAD": {H: proc + proc}}
    rc, calls, out = run_main(tmp_path, monkeypatch, [("-", "0.90", G), ("-", "0.90", H)], 0,
                              base, head, [], "--host-factor", "1.05",
                              samples=samples)  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 0 and calls == [] and verdict["rejudged"] == [H]
    assert {r.name: r.mark for r in parse((out / "final-compare.txt").read_text())} == {
        G: "-",
        H: "",
    }


def test_low_quantile_and_host_ratios():
    assert confirm.low_quantile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert confirm.low_quantile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert confirm.low_quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert confirm.low_quantile([7.0], 0.1) == 7.0
    with pytest.raises(ValueError):
        confirm.low_quantile([], 0.1)
    # one slow process in a side's pooled samples moves its median, not its low tail
    fast, slow = [100.0 + i for i in range(10)], [180.0 + i for i in range(10)]
    base, head = {H: fast + fast}, {H: fast + slow, G: fast, A: fast}
    assert confirm.host_ratios(base, head) == pytest.approx({H: 1.0}, rel=0.02)  # no graph point
    shifted = {H: [x * 1.1 for x in fast + fast]}
    assert confirm.host_ratios(base, shifted)[H] == pytest.approx(1.1)


def stage1_samples(ratio, median_ratio=None):
    """{commit: {H: stage-1 samples}}: two processes a side, the head's low tail `ratio`
    times the base's; with median_ratio, the head's second process reads that much slower
    (a slow process: it moves the median, not the low tail)."""
    proc = [100.0 + 0.1 * i for i in range(10)]
    head2 = [x * (median_ratio or ratio) for x in proc]
    return {"BASE": {H: proc + proc}, "HEAD": {H: [x * ratio for x in proc] + head2}}


def host_gate(tmp_path, monkeypatch, ratio, graph_mark="+", **kw):
    """main() with --host-factor 1.05 over a graph point G and a host point H, both flagged
    by stage 1 at `ratio` with overlapping intervals; the compare at 1.006 marks G
    `graph_mark`; H's samples read `ratio` (stage 1's and every re-run's)."""
    r = f"{ratio:.2f}"
    base = dict.fromkeys([G, H], 1.0)
    head = {n: pts({n: ratio}, spread=0.1)[n] for n in (G, H)}
    return run_main(
        tmp_path, monkeypatch, [("+", r, G), ("+", r, H)], 1, base, head,
        [(graph_mark, r, G), ("+", r, H)], "--host-factor", "1.05",
        samples=stage1_samples(ratio), **kw,
    )  # fmt: skip


def test_main_a_host_point_at_3_percent_is_cleared_on_its_estimator(tmp_path, monkeypatch):
    """1.03 lies within the host figure's suspect band (1.005 in units of log 1.05 / log
    1.006: about 1.042): stage 1's flag is cleared on its own estimator, not re-run."""
    rc, calls, out = host_gate(tmp_path, monkeypatch, 1.03)
    runs = [c for c in calls if c[0] == "run"]
    assert [n for c in runs for n in (G, H) if re.search(c[c.index("-b") + 1], n)] == [G]
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["confirmed"] == [G] and verdict["cleared"] == [H]
    assert verdict["rejudged"] == [H]
    assert verdict["judged_at"] == {G: "1.006 (pooled)",
                                    H: "1.05 (host factor, stage 1's 0.1 quantile)"}  # fmt: skip
    assert verdict["host_factor"] == 1.05 and verdict["host_quantile"] == 0.1
    final = {r.name: r.mark for r in parse((out / "final-compare.txt").read_text())}
    assert final == {G: "+", H: ""}
    # the graph point cleared too: the gate passes
    rc, _, out = host_gate(tmp_path / "b", monkeypatch, 1.03, graph_mark="")
    assert rc == 0 and json.loads((out / "confirm.json").read_text())["confirmed"] == []


def test_main_a_host_point_is_judged_on_its_pooled_low_quantile(tmp_path, monkeypatch):
    """1.045: beyond the suspect band, re-run; the pooled estimator (1.045) is below the host
    factor: cleared. 1.08: re-run and confirmed, its row the estimator's."""
    rc, calls, out = host_gate(tmp_path, monkeypatch, 1.045, graph_mark="")
    verdict = json.loads((out / "confirm.json").read_text())
    assert [c[c.index("--factor") + 1] for c in calls if c[0] == "compare"] == ["1.006"]
    assert rc == 0 and verdict["suspects"] == [G, H] and verdict["cleared"] == [G, H]
    assert verdict["judged_at"][H] == "1.05 (host factor, pooled 0.1 quantile)"
    rc, calls, out = host_gate(tmp_path / "b", monkeypatch, 1.08, graph_mark="")
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["confirmed"] == [H] and verdict["cleared"] == [G]
    assert "1 suspect(s) confirmed slower" in verdict["reason"]
    row = {r.name: r for r in parse((out / "final-compare.txt").read_text())}[H]
    assert (row.mark, row.ratio) == ("+", "1.080")
    assert parse((out / "confirm-host.txt").read_text()) == [row]


def test_main_a_slow_head_process_is_no_host_regression(tmp_path, monkeypatch):
    """Stage 1 flags H at 1.3 by its medians: one of the head's two processes was slow. The
    low quantile reads 1.0: cleared without a re-run. The same medians with the whole head
    10% slower: re-run (disjoint intervals make no host flag sure) and confirmed."""
    base, head = {H: 1.0}, {H: pts({H: 1.3}, spread=0.1)[H]}

    def gate(where, low_tail_ratio):
        rc, calls, out = run_main(where, monkeypatch, [("+", "1.30", H)], 1, base, head, [],
                                  "--host-factor", "1.05",
                                  samples=stage1_samples(low_tail_ratio, 1.6))  # fmt: skip
        return rc, calls, json.loads((out / "confirm.json").read_text())

    rc, calls, verdict = gate(tmp_path, 1.0)
    assert rc == 0 and calls == [] and verdict["cleared"] == [H]
    rc, calls, verdict = gate(tmp_path / "b", 1.1)
    assert rc == 1 and verdict["sure"] == [] and verdict["confirmed"] == [H]


def test_main_a_graph_point_at_3_percent_still_is_one(tmp_path, monkeypatch):
    """Without a host point among the judged, no host table is written, and the graph
    point's 1.03 is confirmed at 1.006 as before."""
    base, head = {G: 1.0}, {G: pts({G: 1.03}, spread=0.05)[G]}
    rc, calls, out = run_main(tmp_path, monkeypatch, [("+", "1.03", G)], 1, base, head,
                              [("+", "1.03", G)], "--host-factor", "1.05")  # fmt: skip
    assert [c[c.index("--factor") + 1] for c in calls if c[0] == "compare"] == ["1.006"]
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["confirmed"] == [G] and not (out / "confirm-host.txt").exists()


def test_main_host_flag_is_never_beyond_doubt(tmp_path, monkeypatch):
    """Disjoint intervals at 1.045: the graph flag stands unrun, the host flag is re-run
    (and cleared: its estimator is below 1.05)."""
    base, head = dict.fromkeys([G, H], 1.0), dict.fromkeys([G, H], 1.045)
    rc, calls, out = run_main(tmp_path, monkeypatch, [("+", "1.05", G), ("+", "1.05", H)], 1,
                              base, head, [], "--host-factor", "1.05",
                              samples=stage1_samples(1.045))  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["sure"] == [G] and verdict["suspects"] == [H]
    assert verdict["cleared"] == [H]


def test_main_with_stage_2_off_clears_a_host_flag_below_its_factor(tmp_path, monkeypatch):
    base, head = dict.fromkeys([G, H], 1.0), dict.fromkeys([G, H], 1.03)
    rc, calls, out = run_main(tmp_path, monkeypatch, [("+", "1.03", H)], 1, base, head, [],
                              "--host-factor", "1.05", rounds=0,
                              samples=stage1_samples(1.045, 1.3))  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 0 and calls == [] and verdict["rejudged"] == [H] and verdict["cleared"] == [H]
    assert verdict["judged_at"] == {H: "1.05 (host factor, stage 1's 0.1 quantile)"}
    assert {r.name: r.mark for r in parse((out / "final-compare.txt").read_text())} == {H: ""}
    rc, _, _ = run_main(tmp_path / "g", monkeypatch, [("+", "1.03", G), ("+", "1.03", H)], 1,
                        base, head, [], "--host-factor", "1.05", rounds=0)  # fmt: skip
    assert rc == 1  # the graph flag stands
    rc, _, _ = run_main(
        tmp_path / "h",
        monkeypatch,
        [("+", "1.03", H)],
        1,
        base,
        head,
        [],
        "--host-factor",
        "1.05",
        rounds=0,
        samples=stage1_samples(1.06),
    )
    assert rc == 1  # its estimator at the host factor or more: kept


def test_main_refuses_a_host_factor_below_the_factor(tmp_path, capsys):
    with pytest.raises(SystemExit):
        confirm.main(
            ["--machine", "m", "--base", "a", "--head", "b", "--continuous-log", "x",
             "--continuous-code", "0", "--rounds", "2", "--suspect", "1.005", "--factor",
             "1.006", "--host-factor", "1.004", "--out", str(tmp_path)]
        )  # fmt: skip
    assert "--host-factor needs" in capsys.readouterr().err


R = {A: 1.02, B: 1.008, C: 0.99, D: 1.04}  # stage-1 ratios of the decide cases


@pytest.mark.parametrize(
    "stage1,judged,unjudged,slower,rows,want",
    [
        (2, [], [], [], [], 2),  # a failure in stage 1 is final
        (0, [], [], [], [], 0),  # nothing to confirm
        (1, [A], [], [A], [("", "1.01", A)], 0),  # stage 1's flag cleared
        (1, [A], [], [A], [("+", "1.02", A)], 1),  # confirmed
        (0, [B], [], [], [("+", "1.008", B)], 1),  # a 0.8% slowdown stage 1 missed
        (0, [C], [], [], [("-", "0.99", C)], 0),  # faster is not a regression
        (0, [B], [], [], [("!", "failed", B)], 2),
        (0, [B], [], [], [], 2),  # the suspect vanished from the compare: not a pass
        (0, [C], [B], [], [("", "1.0", C)], 1),  # a slower suspect the cap left: fails
        (1, [B], [A], [A], [("", "1.0", B)], 1),  # a stage-1 flag the cap left: fails
        (0, [B], [C], [], [("", "1.0", B)], 0),  # only a faster one left: no regression
        (1, [], [], [], [], 1),  # stage 1's exit 1 with no row parsed stands
    ],
)
def test_decide(stage1, judged, unjudged, slower, rows, want):
    parsed = [Row(m, "1", "2", r, n) for m, r, n in rows]
    plan = confirm.Plan(suspects=judged + unjudged, ratios=R)
    v = confirm.decide(stage1, plan, judged, unjudged, slower, parsed)
    assert v.code == want, v.reason
    if unjudged and want == 1:
        assert v.unjudged_slower == unjudged and "not judged within the time cap" in v.reason


def test_decide_sure_kept_lost_and_no_number_fail():
    plan = confirm.Plan(sure=[D], ratios=R)
    v = confirm.decide(1, plan, [], [], [D], [])
    assert v.code == 1 and "1 stage-1 flag(s) beyond doubt" in v.reason
    v = confirm.decide(0, confirm.Plan(kept=["x.X.track_peak_vram_bytes"]), [], [], [], [])
    assert v.code == 1 and "not re-run, kept" in v.reason
    lost = [(A, na_reasons.NaReason.OUT_OF_MEMORY, 1.0), (B, na_reasons.NaReason.SKIPPED, 2.0)]
    v = confirm.decide(0, confirm.Plan(), [], [], [], [], lost=lost)
    assert v.code == 1
    assert "2 point(s) the base measured have no number at the head" in v.reason
    assert "out of memory: 1" in v.reason and "skipped by choice: 1" in v.reason
    v = confirm.decide(0, confirm.Plan(), [], [], [], [], no_number=True)
    assert v.code == 1 and "every point n/a" in v.reason


FAKE_ASV = """\
import json, pathlib, sys
log, canned, args = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
with log.open("a") as f:
    f.write(json.dumps(args) + "\\n")
if args[0] == "compare":  # the canned table of its --factor when there is one
    at = canned.with_name(f"{canned.stem}-{args[args.index('--factor') + 1]}.txt")
    sys.stdout.write((at if at.exists() else canned).read_text())
"""


def samples_from_calls(calls, lazy=(), stage1=None):
    """A stand-in for stored_samples: a point has one sample per logged `asv run` that
    selected it (none for the points of `lazy`, whose re-runs record nothing), after the
    samples `stage1` gives it ({commit: {point: samples}}). A run appends a copy of those
    (1.0 without): a re-run reads as stage 1 did."""
    stage1 = stage1 or {}

    def stored_samples(results, machine, commit):
        lines = calls.read_text().splitlines() if calls.exists() else []
        runs = [json.loads(ln) for ln in lines if json.loads(ln)[0] == "run"]
        first = stage1.get(commit, {})
        out = {n: list(v) for n, v in first.items()}
        for run in runs:
            rx = run[run.index("-b") + 1]
            for name in (A, B, C, D, G, *HOST, *[P.format("", i) for i in range(10)],
                         *[f"nsa.NsaForward.track_time('p{i}')" for i in range(3)]):  # fmt: skip
                if re.search(rx, name) and name not in lazy:
                    out.setdefault(name, []).extend(first.get(name, [1.0]))
        return out

    return stored_samples


def run_main(tmp_path, monkeypatch, stage1_rows, code, base, head, compare_rows, *extra, **kw):
    """main() with stored medians `base`/`head` ({name: value}, or Points) and a stand-in
    asv that logs its calls and prints `compare_rows` as its compare output."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    fake = tmp_path / "fake_asv.py"
    fake.write_text(FAKE_ASV)
    calls, canned = tmp_path / "calls.txt", tmp_path / "compare.txt"
    canned.write_text(table(*compare_rows))
    for f, rows in kw.get("compare_at", {}).items():  # what a compare at factor f prints
        (tmp_path / f"compare-{f}.txt").write_text(table(*rows))
    cont = tmp_path / "continuous.log"
    cont.write_text(table(*stage1_rows))

    def as_points(d):
        return {n: v if isinstance(v, Point) else pts({n: v})[n] for n, v in d.items()}

    b_id, h_id = kw.get("ids", ("BASE", "HEAD"))
    stored = {b_id: as_points(base), h_id: as_points(head)}
    monkeypatch.setattr(confirm, "stored_points", lambda res, machine, commit: stored[commit])
    monkeypatch.setattr(
        confirm, "stored_samples", samples_from_calls(calls, kw.get("lazy", ()), kw.get("samples"))
    )
    out = tmp_path / "gate"
    argv = [
        "--machine", "h200", "--base", b_id, "--head", h_id, "--continuous-log", str(cont),
        "--continuous-code", str(code), "--rounds", str(kw.get("rounds", 20)), "--suspect",
        "1.005", "--factor", "1.006", "--max", "4", "--out", str(out), "--results",
        str(tmp_path / "results"), "--asv", f"{sys.executable} {fake} {calls} {canned}", *extra,
    ]  # fmt: skip
    rc = confirm.main(argv, **({"clock": kw["clock"]} if "clock" in kw else {}))
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
    assert verdict["confirmed"] == [C] and verdict["cleared"] == [A]
    chosen = json.loads((out / "suspects.json").read_text())
    assert chosen["stage1_slower"] == [A]
    # stage 1's ratios, read before any re-run appended samples (the study records them)
    assert chosen["stage1_ratios"] == pytest.approx({A: 1.02, B: 1.001, C: 1.008})


def test_main_judges_more_suspects_than_a_batch(tmp_path, monkeypatch):
    """A change that moves many points at once: ten suspects, batches of 4 (--max), every
    one re-run and judged; the comment's lists name each one judged slower."""
    names = [P.format("", i) for i in range(10)]
    base = dict.fromkeys(names, 1.0)
    head = {n: 1.008 + 0.001 * i for i, n in enumerate(names)}
    rows = [("+", f"{head[n]:.3f}", n) for n in names]
    rc, calls, out = run_main(tmp_path, monkeypatch, [], 0, base, head, rows)
    runs = [c for c in calls if c[0] == "run"]
    assert len(runs) == 3  # 4 + 4 + 2
    picked = [[n for n in names if re.search(c[c.index("-b") + 1], n)] for c in runs]
    assert sorted(sum(picked, [])) == sorted(names) and [len(b) for b in picked] == [4, 4, 2]
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and sorted(verdict["confirmed"]) == sorted(names)
    assert verdict["unjudged_slower"] == []


def test_main_lists_unjudged_suspects_past_the_cap_and_fails(tmp_path, monkeypatch):
    names = [P.format("", i) for i in range(6)]
    base = dict.fromkeys(names, 1.0)
    head = dict.fromkeys(names, 1.008)
    t = {"now": 0.0}

    def clock():
        t["now"] += 30.0  # every look at the clock: 30 s later
        return t["now"]

    rows = [("", "1.001", n) for n in names]
    rc, calls, out = run_main(tmp_path, monkeypatch, [], 0, base, head, rows, "--time-cap",
                              "100", clock=clock)  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    judged, left = verdict["suspects"], verdict["unjudged_slower"]
    assert rc == 1 and left and judged and sorted(judged + left) == sorted(names)
    assert "not judged within the time cap" in verdict["reason"]
    assert verdict["not_retimed"] == []
    assert json.loads((out / "suspects.json").read_text())["unjudged"] == left
    # the unjudged keep stage 1's rows in the table (never stage 2's, at its lower factor)
    assert {r.name for r in parse((out / "final-compare.txt").read_text())} <= set(names)


def test_main_fails_on_lost_numbers_with_their_reason(tmp_path, monkeypatch):
    nan = float("nan")
    base = {A: 1.0, B: 1.0, C: 1.0}
    head = {A: 1.0, B: nan}  # C: not run at the head
    log = na_reasons.log_path(tmp_path / "results", "h200")
    na_reasons.record_oom(log, "f" * 40, B.split("(")[0], [])
    rc, calls, out = run_main(
        tmp_path, monkeypatch, [], 0, base, head, [], ids=("e" * 40, "f" * 40)
    )
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and calls == []
    assert {d["name"]: d["label"] for d in verdict["lost"]} == {B: "out of memory", C: "not run"}


def test_main_fails_a_head_without_numbers(tmp_path, monkeypatch):
    nan = float("nan")
    rc, calls, out = run_main(tmp_path, monkeypatch, [], 0, {A: nan}, {A: nan}, [])
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["head_has_no_number"] and calls == []
    rc, _, _ = run_main(tmp_path, monkeypatch, [], 0, {}, {}, [])
    assert rc == 1


def test_main_keeps_flags_beyond_doubt_without_a_re_run(tmp_path, monkeypatch):
    base = {A: 1.0, B: 1.0}
    head = {A: 1.10, B: 1.02}
    rc, calls, out = run_main(tmp_path, monkeypatch, [("+", "1.10", A), ("+", "1.02", B)], 1,
                              base, head, [("", "1.001", B), ("+", "1.10", A)])  # fmt: skip
    runs = [c for c in calls if c[0] == "run"]
    assert len(runs) == 1 and not re.search(runs[0][runs[0].index("-b") + 1], A)
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["sure"] == [A] and verdict["cleared"] == [B]
    final = {r.name: r.mark for r in parse((out / "final-compare.txt").read_text())}
    assert final == {A: "+", B: ""}


def test_main_with_stage_2_off_keeps_stage_1_flags(tmp_path, monkeypatch):
    base, head = {A: 1.0, B: 1.0}, {A: 1.02, B: 1.008}
    rc, calls, _ = run_main(tmp_path, monkeypatch, [("+", "1.02", A)], 1, base, head, [],
                            rounds=0)  # fmt: skip
    assert rc == 1 and calls == []
    rc, calls, _ = run_main(tmp_path, monkeypatch, [], 0, base, head, [], rounds=0)
    assert rc == 0 and calls == []


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


def test_main_reads_real_asv_result_files(tmp_path, monkeypatch):
    """No stand-in for the stored results: asv-format files of base and head (as
    Results.save writes them) through asv's own reader. p0 is 10% slower with disjoint
    intervals (beyond doubt, not re-run), p1 has no number at the head (out of memory, as
    the OOM log says), p2 is a suspect at +0.8%; the compare after its re-run clears it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_ci_results_check import write_results

    base_c, head_c = "1a" * 20, "2b" * 20
    results = tmp_path / "results"
    write_results(results, [base_c], values=(1.0, 1.0, 1.0))
    write_results(results, [head_c], values=(1.1, float("nan"), 1.008))
    name = "nsa.NsaForward.track_time({})"
    p0, p1, p2 = (name.format(f"'p{i}'") for i in range(3))
    na_reasons.record_oom(na_reasons.log_path(results, "h200"), head_c,
                          "nsa.NsaForward.track_time", ["'p1'"])  # fmt: skip
    fake = tmp_path / "fake_asv.py"
    fake.write_text(FAKE_ASV)
    calls, canned, cont = tmp_path / "calls.txt", tmp_path / "compare.txt", tmp_path / "c.log"
    canned.write_text(table(("", "1.001", p2)))
    cont.write_text(table(("+", "1.10", p0)))
    out = tmp_path / "gate"
    # asv's own samples are not appended by the stand-in asv: count its runs instead
    monkeypatch.setattr(confirm, "stored_samples", samples_from_calls(calls))
    rc = confirm.main([
        "--machine", "h200", "--base", base_c, "--head", head_c, "--continuous-log", str(cont),
        "--continuous-code", "1", "--rounds", "6", "--suspect", "1.005", "--factor", "1.006",
        "--out", str(out), "--results", str(results),
        "--asv", f"{sys.executable} {fake} {calls} {canned}",
    ])  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1
    assert verdict["sure"] == [p0] and verdict["suspects"] == [p2] and verdict["cleared"] == []
    assert verdict["lost"] == [{"name": p1, "reason": "out-of-memory", "label": "out of memory",
                                "base": 1.0}]  # fmt: skip
    (run, _) = [json.loads(ln) for ln in calls.read_text().splitlines()]
    assert [n for n in (p0, p1, p2) if re.search(run[run.index("-b") + 1], n)] == [p2]


def test_a_re_run_that_recorded_nothing_leaves_its_suspects_unjudged(tmp_path, monkeypatch):
    """The batch's asv run wrote no sample for C (a build that broke, a crash): C's compare
    row would be stage 1's samples at the lower factor, so C is unjudged, listed, and, on the
    slower side, fails the gate; A, re-run, is judged."""
    base, head = {A: 1.0, C: 1.0}, {A: 1.008, C: 1.007}
    rc, calls, out = run_main(tmp_path, monkeypatch, [], 0, base, head,
                              [("", "1.001", A), ("", "1.001", C)], lazy=(C,))  # fmt: skip
    verdict = json.loads((out / "confirm.json").read_text())
    assert rc == 1 and verdict["suspects"] == [A] and verdict["not_retimed"] == [C]
    assert verdict["unjudged_slower"] == [C]
    final = {r.name: r.ratio for r in parse((out / "final-compare.txt").read_text())}
    assert final == {A: "1.001"}  # C keeps stage 1's row (none in this stage-1 table)


@pytest.mark.parametrize("retime_faster", [False, True])
def test_main_lists_faster_suspects_without_re_running_them(tmp_path, monkeypatch, retime_faster):
    """A faster point is no regression: by default it is listed, not re-timed, so a change
    that speeds many points up does not spend the time cap on them (--retime-faster: it
    is re-run after the slower ones)."""
    base, head = {A: 1.0, B: 1.0}, {A: 1.008, B: 0.99}
    extra = ["--retime-faster"] if retime_faster else []
    rc, calls, out = run_main(tmp_path, monkeypatch, [], 0, base, head,
                              [("", "1.001", A), ("-", "0.99", B)], *extra)  # fmt: skip
    runs = [c for c in calls if c[0] == "run"]
    picked = [n for c in runs for n in (A, B) if re.search(c[c.index("-b") + 1], n)]
    verdict = json.loads((out / "confirm.json").read_text())
    chosen = json.loads((out / "suspects.json").read_text())
    assert rc == 0 and chosen["faster"] == [B]
    if retime_faster:
        assert picked == [A, B] and verdict["unjudged_faster"] == []
    else:
        assert picked == [A] and verdict["unjudged_faster"] == [B]
        assert "1 faster suspect(s) not judged (no regression)" in verdict["reason"]
