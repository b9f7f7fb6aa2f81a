"""The KDA verify kernels compile for an H200 (sm_90) without a GPU, with no spills.

The interpreter runs the kernels' Python, not the compiler: a kernel that only fails in
Triton's GPU lowering (tuples in loops, layouts, register pressure) would pass every CPU
test. `tools/dev/compile_kda_sm90.py` compiles through the public wrappers down to a cubin
with ptxas and reads registers, local memory and the stack frame (spills) from it; this
runs it on the shipped tiles' shapes (no spills allowed), the sub-tile loop (one and
two stages), and state tiles with and without key chunks.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = "tools.dev.compile_kda_sm90"


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    return subprocess.run(
        [sys.executable, "-m", TOOL, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.parametrize(
    "args,n_rows",
    [
        # B=2 in the tool: the small-batch tiles.
        (["--block-v", "4", "8", "--warps", "1", "2", "4"], 24),
        # 128-row programs in two 64-row sub-tiles, key chunks of 64, compiled for every
        # mode; the fused kernel's snapshot tile from B = 5 (read at B * HV / 8): 32 rows
        # in one piece on 4 warps, plain, at both head shapes.
        (["--block-v", "128", "--sub-v", "64", "--warps", "4", "--key-chunk", "64"], 4),
        (["--modes", "fused", "--block-v", "32", "--warps", "4", "--key-chunk", "128"], 1),
        (["--modes", "fused", "--block-v", "32", "--warps", "4", "--key-chunk", "128",
          "--hv", "16"], 1),
        # The ring modes' projected one-piece tiles at 2 < B <= 8 (up to v13; fused+ring's
        # 16 rows at 2 < B <= 4 since v14): 16 and 32 rows on 2 warps with key chunks of
        # 32; the recurrent kernel's 4 rows on 1 warp, plain.
        (["--modes", "fused+ring", "unfused+ring", "--block-v", "16", "32", "--warps", "2",
          "--key-chunk", "32", "--project", "on"], 4),
        (["--modes", "unfused+ring", "--block-v", "4", "--warps", "1", "--key-chunk", "128",
          "--project", "on"], 1),
        # The plain [rows, K] state tile (no key chunks), one piece.
        (["--modes", "fused", "unfused+ring", "--block-v", "4", "64", "--warps", "4",
          "--key-chunk", "128"], 4),
        # fused+ring's stepwise plain 16-row tile on 2 warps at 4 < B <= 8, norms as rows.
        (["--modes", "fused+ring", "--block-v", "16", "--warps", "2", "--key-chunk", "128",
          "--project", "off", "--norm-row", "on"], 1),
    ],
    ids=["small-tiles", "wide-tiles", "fused-snapshot-tile", "fused-snapshot-tile-hv16",
         "projected-small-tiles",
         "projected-4-row-tile", "plain-tile", "ring-plain-16-row-tile"],
)  # fmt: skip
def test_kernels_compile_for_sm90_without_spills(args, n_rows):
    r = _run(*args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 compile errors, 0 kernels with spills" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if "_verify_kernel" in ln]
    assert len(rows) == n_rows, r.stdout


@pytest.mark.parametrize(
    "mode,bv,stages",
    [("fused+ring", 64, 2), ("fused+ring", 128, 2), ("unfused+ring", 64, 2),
     ("unfused+ring", 128, 1)],
)  # fmt: skip
def test_projected_ring_tiles_compile_for_sm90(mode, bv, stages):
    """The ring modes' B > 16 tiles of the table (projected form, 32-row sub-tiles on 2
    warps, key chunks of 32), both gates: they compile at the register limit (255), and
    what ptxas puts on the stack stays a few words (0-48 bytes; these tiles measured
    fastest with it). A larger spill fails here."""
    for gate in ([], ["--safe-gate"]):
        tile = ["--block-v", str(bv), "--sub-v", "32", "--warps", "2", "--stages", str(stages)]
        r = _run("--modes", mode, *tile, "--key-chunk", "32", "--project", "on", *gate)
        assert "0 compile errors," in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        (row,) = [ln.split() for ln in r.stdout.splitlines() if "_verify_kernel" in ln]
        reg, stack, local = int(row[7]), int(row[8]), int(row[9])
        assert reg <= 255 and stack + local <= 64, row


def test_sub_tile_loop_compiles_for_sm90():
    """The sub-tile loop, plain and pipelined, with key chunks of 32: every variant
    compiles. 64-row programs in 32-row sub-tiles spill at 4 warps (255
    registers and a stack frame; pipelined, 64 to 192 bytes): they are not in the table,
    and the report says so."""
    r = _run("--block-v", "64", "--sub-v", "32", "--stages", "1", "2", "--warps", "4",
             "--key-chunk", "32")  # fmt: skip
    assert "0 compile errors," in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [ln for ln in r.stdout.splitlines() if "_verify_kernel" in ln]
    assert len(rows) == 8, r.stdout


def test_register_cap_spills_are_reported():
    """A register cap the B=64 tile does not fit (128 per thread: it takes about 220) is
    applied (REG <= 128) and its spills are reported as a failure (stack frame), so the
    no-spill test can fail."""
    r = _run("--modes", "fused+ring", "--block-v", "128", "--sub-v", "64", "--warps", "4",
             "--key-chunk", "64", "--maxnreg", "128")  # fmt: skip
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "0 compile errors, 1 kernels with spills" in r.stdout
    (row,) = [ln.split() for ln in r.stdout.splitlines() if "_fused_verify_kernel" in ln]
    reg, stack = int(row[7]), int(row[8])
    assert reg <= 128 and stack > 0, row


def _sass_counts(*args):
    """{kernel name: (BAR, SHFL)} of `compile_kda_sm90 --sass ARGS`, which must compile with
    no spills."""
    r = _run(*args, "--sass")
    assert "0 compile errors, 0 kernels with spills" in r.stdout, r.stdout[-3000:]
    counts = {}
    for ln in r.stdout.splitlines():
        if "_verify_kernel" in ln:
            fields = dict(kv.split("=") for kv in ln.split() if "=" in kv)
            counts[ln.split()[6]] = (int(fields["BAR"]), int(fields["SHFL"]))
    return counts


def test_norm_rows_take_barriers_out_of_two_warp_tiles():
    """The norm_row tuning (the q/k norms summed as [1, K] rows) is in the table for the
    2-warp plain tiles because there the norms' sums stop crossing warps: with one reduction
    per norm (stack_sums off) the compiled kernels carry fewer barriers with it (49 -> 25
    with Triton 3.6) and no more lane shuffles. If a compiler change undoes that, the
    table's reason is gone."""
    tile = ("--modes", "fused", "unfused", "--block-v", "4", "--warps", "2", "--stack-sums", "off")
    off = _sass_counts(*tile, "--norm-row", "off")
    on = _sass_counts(*tile, "--norm-row", "on")
    for kernel in ("_fused_verify_kernel", "_recurrent_verify_kernel"):
        (bar_off, shfl_off), (bar_on, shfl_on) = off[kernel], on[kernel]
        assert bar_on + 16 <= bar_off and shfl_on <= shfl_off, (off, on)


def test_stacked_sums_share_their_barriers():
    """stack_sums takes the prologue's reductions (the q/k norms and the projection's T^2
    dot products, `step._sums`) eight at a time, one shared-memory round trip each: the
    B = 64 ring tile (128/32, 2 warps, 2 stages, chunks of 32, projected, norm_row off)
    compiles with well under half the barriers of one reduction at a time (109 -> 46 with
    Triton 3.6)."""
    tile = ("--modes", "fused+ring", "unfused+ring", "--block-v", "128", "--sub-v", "32",
            "--warps", "2", "--stages", "2", "--key-chunk", "32", "--project", "on",
            "--norm-row", "off", "--safe-gate")  # fmt: skip
    off = _sass_counts(*tile, "--stack-sums", "off")
    on = _sass_counts(*tile, "--stack-sums", "on")
    for kernel in ("_fused_verify_kernel", "_recurrent_verify_kernel"):
        assert 2 * on[kernel][0] < off[kernel][0], (off, on)


def test_floor_tool_kernels_compile_for_sm90():
    """tools/dev/gpu_kda_floor.py's kernels (the grid and persistent floors: ring, snapshots,
    snapshots with the whole step; the ring modes' whole-traffic floor; the launch probe's
    empty kernel with and without programmatic dependent launch) compile for sm_90: a GPU
    session's probe must not be the first to find them broken."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    r = subprocess.run(
        [sys.executable, "-m", "tools.dev.gpu_kda_floor", "--part", "compile"], cwd=ROOT,
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    regs = json.loads(r.stdout.strip().splitlines()[-1])
    want = {f"{k} {t}" for k in ("floor", "persist") for t in ("ring", "snap", "full")}
    assert want | {"ringio", "ringio spread", "empty pdl=False", "empty pdl=True"} == set(regs)
    assert all(0 < n <= 255 for n in regs.values())


def _floor_smoke(part):
    """stdout of `gpu_kda_floor --part PART --cpu-smoke` (its own interpreter switch), which
    must exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    r = subprocess.run(
        [sys.executable, "-m", "tools.dev.gpu_kda_floor", "--part", part, "--cpu-smoke"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_ring_traffic_floor_writes_what_the_ring_modes_write():
    """The `ringio` floor (tools/dev/gpu_kda_floor.py) under Triton's interpreter: its o
    matches PyTorch, and its windows, raw k, raw v, g and beta are exactly the inputs they
    copy, at the sequences' shuffled lines and slots, with every other row and ring position
    left poisoned, for three tiles (one piece, sub-tiles, key chunks), with the q/k traffic
    owned by one value head per q/k head and spread over every program. A floor that moved
    fewer bytes than the ring modes would be no floor."""
    assert "ringio smoke: 6 of 6 tiles ok" in _floor_smoke("ringio")


def test_stream_floor_moves_the_modes_bytes():
    """The `stream` floor (tools/dev/gpu_kda_floor.py) under Triton's interpreter writes
    src + 1 over its whole destination, reads longer or shorter than writes, and
    `mode_bytes` counts exactly the bytes the fused kernel writes in the ring and the
    snapshot mode (o plus every poisoned element it overwrote). A floor that moved fewer
    bytes than the mode would be no floor."""
    assert "stream smoke: ok" in _floor_smoke("stream")


def test_floor_probe_compiles_for_sm90():
    """The fused kernel's floor probe (`VerifyTuning.floor_probe`) compiles for sm_90 at the
    B = 64 tiles of both modes, and carries fewer instructions than the kernel (its input
    arithmetic is gone): the snapshot tile without spills; the ring tile at the register
    limit (its stack is what docs/perf/kda.md v17 reports, not bounded here)."""
    snap = ["--modes", "fused", "--block-v", "32", "--warps", "4", "--key-chunk", "128",
            "--norm-row", "off", "--safe-gate", "--sass"]  # fmt: skip
    ring = ["--modes", "fused+ring", "--block-v", "128", "--sub-v", "32", "--warps", "2",
            "--stages", "2", "--key-chunk", "32", "--project", "on", "--norm-row", "off",
            "--safe-gate", "--sass"]  # fmt: skip

    def sass(args):
        r = _run(*args)
        assert "0 compile errors," in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        (row,) = [ln for ln in r.stdout.splitlines() if "_fused_verify_kernel" in ln]
        return r, row.split(), int(row.split("SASS=")[1].split()[0])

    for args in (snap, ring):
        _, _, kernel = sass(args)
        r, row, probe = sass([*args, "--floor-probe"])
        assert probe < kernel, (probe, kernel)
        assert int(row[7]) <= 255, row
        if args is snap:
            assert "0 kernels with spills" in r.stdout, r.stdout
