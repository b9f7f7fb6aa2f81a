"""tools/dev/nsa_host_ab: the host A/B table from per-process host.json folders."""

import json
from pathlib import Path

import pytest

from tools.dev import nsa_host_ab


def _write(root, name, rows):
    d = root / name
    d.mkdir()
    (d / "host.json").write_text(json.dumps(rows))


def _row(T, pattern, call, host):
    return dict(T=T, pattern=pattern, call=call, ops=3, host_us=host, eager_us=1.0, graph_us=1.0)


def test_table_lists_every_process_the_fastest_and_the_bars(tmp_path, capsys):
    # Two processes a side, written out of round order; a split row (no T-less rows break
    # it) and a folder of another side that is not asked for.
    _write(tmp_path, "new_2", [_row(1024, "random", "forward", 70.0),
                               _row(1024, "random", "backward", 160.0)])  # fmt: skip
    _write(tmp_path, "new_1", [_row(1024, "random", "forward", 90.0),
                               _row(1024, "random", "backward", 140.0),
                               dict(T=1024, pattern="random", call="autograd_split",
                                    forward_wrapper_us=5.0)])  # fmt: skip
    _write(tmp_path, "old_1", [_row(1024, "random", "forward", 75.0),
                               _row(1024, "random", "backward", 120.0)])  # fmt: skip
    _write(tmp_path, "old_2", [_row(1024, "random", "forward", 78.0),
                               _row(1024, "random", "backward", 130.0)])  # fmt: skip
    _write(tmp_path, "mid_1", [_row(1024, "random", "forward", 1.0)])
    nsa_host_ab.main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "new: 2 processes, old: 2 processes"
    rows = {line.split(" | ")[2]: line.strip("| ").split(" | ") for line in out[3:]}
    assert set(rows) == {"backward", "forward"}
    # Round order, fastest, median, and the fastest processes' ratio.
    assert rows["forward"][3:6] == ["90.0, 70.0", "70.0", "80.0"]
    assert rows["forward"][6:9] == ["75.0, 78.0", "75.0 (bar met)", "76.5"]
    assert rows["forward"][9] == f"{70 / 75:.2f}"
    # A side meets a bar only when every process is under it.
    assert rows["backward"][4] == "140.0"
    assert rows["backward"][7] == "120.0 (bar met)"


def test_a_missing_side_is_an_error(tmp_path):
    _write(tmp_path, "new_1", [_row(1024, "random", "forward", 70.0)])
    with pytest.raises(SystemExit, match="old"):
        nsa_host_ab.main([str(tmp_path)])


def test_host_tool_vs_fields_are_parsed_and_checked():
    # gpu_nsa_host --vs: FIELD=VALUE pairs as Python literals, checked against the NSA
    # tuning's fields before any device work.
    from tools.dev import gpu_nsa_host

    assert gpu_nsa_host.parse_fields(None) is None
    fields = gpu_nsa_host.parse_fields(["overlap_tile_kernel=False", "tile_rows=32"])
    assert fields == {"overlap_tile_kernel": False, "tile_rows": 32}
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        gpu_nsa_host.parse_fields(["overlap_tile_kernel"])
    with pytest.raises(SystemExit, match="no_such_field"):
        gpu_nsa_host.parse_fields(["no_such_field=1"])


def test_host_tool_interleaves_rounds_starting_one_row_later_each_time():
    # gpu_nsa_host --rounds: every row timed once a round; round r starts at row r mod n,
    # so each row is timed first once in n rounds; figures come back per row, in round order.
    from tools.dev import gpu_nsa_host

    order = []

    def time_row(i):
        order.append(i)
        return {"t": 10 * i + len(order)}

    got = gpu_nsa_host.interleaved(3, 4, time_row)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    assert [[f["t"] for f in row] for row in got] == [[1, 6, 8, 10], [12, 14, 19, 21],
                                                      [23, 25, 27, 32]]  # fmt: skip
    assert gpu_nsa_host.interleaved(2, 1, lambda i: i) == [[0], [1]]


def test_host_tool_loads_another_backward_beside_this_trees(tmp_path):
    # gpu_nsa_host --backward-from: a version of backward.py loaded as a module of
    # kernels.nsa (here this tree's own file, under another name, with a change in a
    # comment): a module of its own whose relative imports take this tree's modules, and
    # whose backward gives this tree's results bit for bit (interpreter, fp32).
    import torch

    import kernels.nsa.backward as ours
    from kernels import nsa
    from tools.dev import gpu_nsa_host

    src = Path(ours.__file__).read_text() + "\n# another version\n"
    (tmp_path / "backward_v0.py").write_text(src)
    mod = gpu_nsa_host.load_sibling(tmp_path / "backward_v0.py")
    assert mod.__name__ == "kernels.nsa._from_backward_v0" and mod is not ours
    assert mod.checked_forward is ours.checked_forward  # this tree's forward, shared
    assert mod.selection_backward_triton is not ours.selection_backward_triton
    g = torch.Generator().manual_seed(0)
    bs = gpu_nsa_host.BS  # the tool's block size
    B, Hq, Hkv, T, D, S = 1, 4, 2, 2 * bs + 9, 32, 2
    q, do = (torch.randn(B, Hq, T, D, generator=g) for _ in range(2))
    k, v = (torch.randn(B, Hkv, T, D, generator=g) for _ in range(2))
    idx = nsa.make_block_idx_random(B, Hkv, T, bs, S, "cpu", seed=1)
    o, lse = nsa.selection_forward_triton(q, k, v, idx, bs, return_lse=True)
    x = dict(q=q, k=k, v=v, idx=idx, do=do, o=o, lse=lse)
    got = gpu_nsa_host.sibling_backward(mod, x)()
    want = ours.selection_backward_triton(q, k, v, idx, bs, do, o, lse)
    diffs = [(a - b).abs().max().item() for a, b in zip(got, want, strict=True)]
    assert diffs == [0.0, 0.0, 0.0], diffs
    assert any(bool(t.abs().sum() > 0) for t in got)


def test_host_tool_main_writes_each_rows_median_over_interleaved_rounds(
    tmp_path, monkeypatch, capsys
):
    # gpu_nsa_host's main with every device part stubbed: with --rounds, each row's
    # figures are the medians of its rounds, kept beside them in host.json.
    import json
    import sys

    from tools.dev import gpu_nsa_host as tool

    clock = iter(range(1, 10_000))
    seconds = lambda *a, **kw: [next(clock) * 1e-6]  # noqa: E731
    monkeypatch.setattr(tool, "inputs", lambda T, pattern, seed: {"seed": seed})
    fns = {"forward": lambda: None, "backward": lambda: None}
    monkeypatch.setattr(tool, "calls", lambda x, tuning=None: fns)
    monkeypatch.setattr(tool, "device_ops", lambda fn: 8)
    for name in ("host_seconds", "eager_seconds", "per_call_seconds"):
        monkeypatch.setattr(tool, name, seconds)
    for name in ("host_listing", "torch_listing"):
        monkeypatch.setattr(tool, name, lambda fn: "listing")
    argv = ["gpu_nsa_host", "64", "--calls", "forward", "backward", "--rounds", "3",
            "--vs", "overlap_tile_kernel=False", "--out", str(tmp_path)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    tool.main()
    rows = json.loads((tmp_path / "host.json").read_text())
    assert [(r["pattern"], r["call"]) for r in rows] == [
        (p, c) for p in ("recent", "random") for c in
        ("forward", "forward[overlap_tile_kernel=False]", "backward",
         "backward[overlap_tile_kernel=False]")
    ]  # fmt: skip
    for r in rows:
        assert len(r["rounds"]) == 3 and r["ops"] == 8
        for key in ("host_us", "eager_us", "graph_us"):
            each = [f[key] for f in r["rounds"]]
            assert r[key] == pytest.approx(sorted(each)[1])
    assert (tmp_path / "cprofile.txt").read_text().count("=== ") == 4
    assert "forward[overlap_tile_kernel=False]" in capsys.readouterr().out
