"""`tools/dev/gpu_nsa_ab.py`'s summary of fresh-process rounds, on fake result files (the
runs themselves need a GPU)."""

import torch

from tools.dev import gpu_nsa_ab


def _save(out, tag, times):
    torch.save({"outputs": {}, "times": times}, out / f"{tag}.pt")


def test_summary_gives_each_sides_median_graph_and_every_process_host(tmp_path, capsys):
    _save(tmp_path, "old1", {"4096:recent fwd": (76.0, 550.0), "4096:recent bwd": (200.0, 330.0)})
    _save(tmp_path, "new1", {"4096:recent fwd": (76.5, 265.0), "4096:recent bwd": (201.0, 296.0)})
    _save(tmp_path, "old2", {"4096:recent fwd": (77.0, 630.0), "4096:recent bwd": (202.0, 556.0)})
    _save(tmp_path, "new2", {"4096:recent fwd": (75.5, 262.0), "4096:recent bwd": (199.0, 268.0)})
    _save(tmp_path, "other1", {"4096:recent fwd": (1.0, 1.0)})  # another side: left out
    rows = gpu_nsa_ab.summary(tmp_path)
    by_name = {r[0]: r for r in rows}
    name, ga, gb, ratio, ha, hb, host_ratio, fastest = by_name["4096:recent fwd"]
    assert (ga, gb) == (76.5, 76.0) and abs(ratio - 76.0 / 76.5) < 1e-12
    assert ha == [550.0, 630.0] and hb == [265.0, 262.0]
    assert abs(host_ratio - 263.5 / 590.0) < 1e-12
    assert abs(fastest - 262.0 / 550.0) < 1e-12
    printed = capsys.readouterr().out
    assert (
        "| 4096:recent fwd | 76.5 | 76.0 | 0.993 | 550, 630 | 265, 262 | 0.45 | 0.476 |" in printed
    )
    assert "| 4096:recent bwd |" in printed


def test_tuning_pairs_are_read_as_literals_else_strings():
    assert gpu_nsa_ab.parse_tuning(["fix_pdl=False", "fix_tiles=64", "schedule=tile"]) == {
        "fix_pdl": False,
        "fix_tiles": 64,
        "schedule": "tile",
    }
    assert gpu_nsa_ab.parse_tuning(None) == {}


def test_rounds_alternate_which_side_runs_first(tmp_path, monkeypatch):
    """Old first in odd rounds, new first in even ones; each process gets its side's src
    first on PYTHONPATH and its side's tuning."""
    runs = []

    def fake_run(cmd, env, cwd, check):
        tag = cmd[cmd.index("run") + 1]
        tuning = cmd[cmd.index("--tuning") + 1 :] if "--tuning" in cmd else None
        runs.append((tag, env["PYTHONPATH"].split(":")[0], tuning))

    monkeypatch.setattr(gpu_nsa_ab.subprocess, "run", fake_run)
    monkeypatch.setattr(gpu_nsa_ab, "compare", lambda *a: None)
    monkeypatch.setattr(gpu_nsa_ab, "summary", lambda *a: [])
    old, new = tmp_path / "old_src", tmp_path / "new_src"
    gpu_nsa_ab.rounds(old, new, tmp_path, 3, ["512:recent"], "cuda", (None, ["fix_tiles=64"]))
    assert [tag for tag, _, _ in runs] == ["old1", "new1", "new2", "old2", "old3", "new3"]
    for tag, src, tuning in runs:
        side = tag.rstrip("0123456789")
        assert src == str((old if side == "old" else new).resolve())
        assert tuning == (None if side == "old" else ["fix_tiles=64"])
