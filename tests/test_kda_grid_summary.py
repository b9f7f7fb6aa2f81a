"""tools/dev/kda_grid_summary.py on made-up gpu_check_kda results (no GPU)."""

import json

import pytest

from tools.dev import kda_grid_summary as summary


def result(times):
    """One process's kda_check.json: times {(HV, B, mode): (seed_us, cold_us)}."""
    return {
        "timings": [
            dict(HV=hv, gate="safe", B=b, mode=m, seed_us=s, cold_us=c, sets=10)
            for (hv, b, m), (s, c) in times.items()
        ]
    }


def test_medians_over_processes_and_the_losing_points(tmp_path, capsys):
    base = {(8, 4, "unfused"): (10.0, 12.0), (8, 4, "unfused+ring"): (8.0, 9.0),
            (8, 4, "fused+ring"): (6.0, 7.0)}  # fmt: skip
    runs = [
        result({**base, (8, 4, "fused"): (10.2, 11.0)}),
        result({**base, (8, 4, "fused"): (9.9, 11.5)}),
        result({**base, (8, 4, "fused"): (10.1, 30.0)}),  # one outlier process
    ]
    body, losing = summary.rows(runs, 1.005)
    ((hv, gate, b, cells),) = body
    assert (hv, gate, b) == (8, "safe", 4)
    ratio, f, u, n = cells[("fused", "seed_us")]
    assert (f, u, n) == (10.1, 10.0, 3) and abs(ratio - 1.01) < 1e-9  # the median process
    assert cells[("fused", "cold_us")][0] < 1  # 11.5 / 12: the outlier does not move it
    assert losing == [(8, "safe", 4, "fused", "seed_us")]
    paths = []
    for i, r in enumerate(runs):
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps(r))
    summary.main([str(p) for p in paths])
    text = capsys.readouterr().out
    assert "1.010 !" in text and "1 of 4 ratios above 1.005 (3 processes)" in text


def test_a_point_one_side_lacks_shows_a_dash():
    runs = [result({(16, 1, "fused"): (5.0, 6.0)})]
    text, losing = summary.table(runs, 1.005)
    assert losing == [] and "| 16 | safe | 1 | - | - | - | - |" in text


def test_results_of_two_tunings_are_not_mixed(tmp_path, capsys):
    paths = []
    for i, heads in enumerate((None, 8)):
        r = dict(result({(8, 4, "fused"): (5.0, 6.0)}), table_heads=heads)
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps(r))
    with pytest.raises(SystemExit):
        summary.main([str(p) for p in paths])
    assert "mix tunings" in capsys.readouterr().err
    summary.main([str(paths[1])])
    assert "table_heads: 8" in capsys.readouterr().out
