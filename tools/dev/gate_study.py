#!/usr/bin/env python3
"""How far the regression gate can be trusted: noise, A/A false positives, detection power.

The gate is `asv continuous BASE HEAD --factor F` (docs/benchmarks.md, "Gate settings").
This tool holds the pieces of a study of it; tools/dev/gpu_gate_study.sh runs them in order on a
GPU host and docs/measurement.md ("Not yet shown") says what each result answers.

    clone DIR                scratch repository of the working tree: commit `gate-base`, then
                             `gate-aa` (base + a docs-only commit), and two asv configurations
                             (gate.conf.json, noise.conf.json) with separate results dirs
    slow DIR KERNEL EXTRA [KERNEL EXTRA ...]
                             commit base + KERNEL's slow-down patch with EXTRA steps (branch
                             gate-slow-KERNEL-EXTRA, working tree untouched), more pairs in the
                             same commit (kernels of different files); prints the hash
    calibrate KERNEL --out F per-call slowdown of the patched kernel at every gated point of
                             its benchmark class, measured directly (the class's own timing
                             methods: CUDA-graph replay, and for a host-side patch the eager
                             and host figures too), and the EXTRA amounts that
                             come closest to the target slowdowns; checks that the patched
                             kernel's output is bitwise the original's
    amounts F / regex KERNEL [KERNEL ...]
                             the chosen EXTRA amounts of a calibration file / the asv -b regex
    rounds / noise           process rounds held by, and the CV table of, `asv run
                             --append-samples` results of one commit
    record KIND LOG ...      one `asv continuous` try: rows flagged in its output (parsed) and
                             every point's median ratio (from the stored results), as a line
                             of a JSONL file
    estimators --results R --machine M --base SHA --head SHA
                             per host-paced point of stored results (the last try of a
                             scratch repository), head / base by the gate's estimator and
                             by candidates that one process cannot move (`ESTIMATORS`)
    tries JSONL [...]        how many recorded tries match, and the last one's wall seconds
    summary DIR [DIR ...]    summary.md from everything in the study directories (their
                             records concatenated); --factors adds a post-hoc factor sweep

KERNEL is `nsa` or `nsa_loop` (the NSA selection forward, benchmark class nsa.NsaForward;
`nsa_paper_loop` slows it at the paper preset only), `nsa_bwd_loop` (the NSA backward's
dk/dv kernel, nsa.NsaBackward), `kda`, `kda_ahead` or `kda_loop` (the fused KDA verify,
kda.KdaVerify; slowed in different ways, see below), `kda_unfused_loop` (the unfused pair's
recurrent kernel, kda.KdaVerify's unfused modes), or a host-side slow-down of the NSA
forward wrapper, which the graph figure must not see and the eager and host figures must:
`nsa_host` (EXTRA microseconds of Python per call) and `nsa_launch` (EXTRA more launches of
a one-program kernel). A device slow-down patch adds, inside the Triton kernel, EXTRA
dependent fp32 multiply-adds per program after its own stores; their result is stored only
when a new runtime float argument is positive, and the wrapper always passes 0.0 (`kda_ahead`: the
chain runs first and every state access waits for a test of its result that holds while
that argument is 0.0; `nsa_loop`, `kda_loop`: after the stores, the amount a runtime
argument, so that every amount runs one compiled kernel). Triton
never specializes float arguments, so the compiler cannot drop the work, and nothing the
kernel writes changes (calibrate checks this bit for bit).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
# Run as a script (tools/dev/gpu_gate_study.sh calls it from the scratch repository, whose
# own tools/ must not be the one imported): the repository root goes on the path for `ci`.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from ci.asv_results import stored_samples, stored_values  # noqa: E402
from ci.confirm import HOST_FIGURE, HOST_QUANTILE, low_quantile  # noqa: E402
from ci.render_comment import parse  # noqa: E402

BASE_TAG, AA_TAG = "gate-base", "gate-aa"
CONFS = {"gate.conf.json": "results-gate", "noise.conf.json": "results-noise"}
DEFAULT_TARGETS = (1.0, 2.0, 5.0, 10.0)
# Fixed identity and dates: the same working tree gives the same commit hashes on any host.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "gate study",
    "GIT_AUTHOR_EMAIL": "gate-study@example.invalid",
    "GIT_COMMITTER_NAME": "gate study",
    "GIT_COMMITTER_EMAIL": "gate-study@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


# ---------------------------------------------------------------------------------------
# The slow-down patches


@dataclass(frozen=True)
class Hunk:
    """Insert `text` after (or before) the one line whose stripped text is `anchor`.

    `text` is dedented and indented like the anchor line (or by `indent` spaces); `{extra}`
    in it becomes the amount.
    """

    anchor: str
    text: str
    before: bool = False
    indent: int | None = None


# The dependent chain: x <- x * c + d, c = 1 - 2**-10, in fp32 (no fast math: it cannot be
# folded into a closed form), EXTRA times.
_CHAIN = """\
for _ in range(EXTRA):
    b_x = b_x * 0.9990234375 + 0.5
"""

NSA_HUNKS = (
    Hunk("T, NB, Hq, G, qk_scale, MIN_BLOCKS,", "gate_never,"),
    Hunk(
        "FOR_LOOP: tl.constexpr, SKIP_BLOCK_TILES: tl.constexpr, TRIGGER: tl.constexpr,",
        "EXTRA: tl.constexpr,",
    ),
    Hunk(
        "if todo:",
        "# gate-study extra work: EXTRA dependent steps per row of the tile, in every program\n"
        "# (block-handled tiles too); the store needs gate_never > 0, which the wrapper never\n"
        "# passes.\n"
        "i_x = tl.arange(0, BLOCK_T * BLOCK_G)\n"
        "b_x = tl.zeros([BLOCK_T * BLOCK_G], dtype=tl.float32) + qk_scale\n"
        + _CHAIN
        + "tl.store(LSE + i_x, b_x, mask=(i_x >= 0) & (gate_never > 0.0))\n",
        before=True,
        indent=4,
    ),
    Hunk("dims.T, dims.NB, dims.Hq, dims.G, qk_scale, min_blocks or 0,", "0.0,  # gate_never"),
    Hunk("shared, SKIP_BLOCK_TILES=min_blocks is not None, TRIGGER=pdl,", "EXTRA={extra},"),
)

# The NSA patch with the amount as a runtime argument, counted down by a `while` loop
# (`nsa_loop`, see KDA_LOOP_HUNKS): every amount runs one compiled kernel.
NSA_LOOP_HUNKS = (
    Hunk("T, NB, Hq, G, qk_scale, MIN_BLOCKS,", "gate_never, gate_steps,"),
    Hunk(
        "if todo:",
        "# gate-study extra work: gate_steps dependent steps per row of the tile, in every\n"
        "# program (block-handled tiles too); the store needs gate_never > 0, which the\n"
        "# wrapper never passes.\n"
        "i_x = tl.arange(0, BLOCK_T * BLOCK_G)\n"
        "b_x = tl.zeros([BLOCK_T * BLOCK_G], dtype=tl.float32) + qk_scale\n"
        "n_x = qk_scale * 0.0\n"
        "while n_x < gate_steps:\n"
        "    b_x = b_x * 0.9990234375 + 0.5\n"
        "    n_x += 1.0\n"
        "tl.store(LSE + i_x, b_x, mask=(i_x >= 0) & (gate_never > 0.0))\n",
        before=True,
        indent=4,
    ),
    Hunk(
        "dims.T, dims.NB, dims.Hq, dims.G, qk_scale, min_blocks or 0,",
        "0.0,  # gate_never\n{extra}.0,  # gate_steps",
    ),
)

KDA_HUNKS = (
    Hunk("lower_bound,", "gate_never,"),
    Hunk("RING: tl.constexpr,", "EXTRA: tl.constexpr,"),
    Hunk(
        "def fused_kda_conv_gating_verify(",
        "# gate-study extra work: EXTRA dependent steps per program after its own stores;\n"
        "# the store needs gate_never > 0, which the wrapper never passes.\n"
        "b_x = tl.zeros([BLOCK_V], dtype=tl.float32) + b_A_log\n"
        + _CHAIN
        + "o_x = i_v * BLOCK_V + tl.arange(0, BLOCK_V)\n"
        "p_x = o + i_tok * s_o_n + i_hv * s_o_h + o_x\n"
        "tl.store(p_x, b_x.to(o.dtype.element_ty), mask=(o_x >= 0) & (gate_never > 0.0))\n\n\n",
        before=True,
        indent=4,
    ),
    Hunk("0.0 if lower_bound is None else float(lower_bound),", "0.0,  # gate_never"),
    Hunk("RING=bool(cache_ring),", "EXTRA={extra},"),
)

# The same kernel slowed at the other end: the chain runs first, on the program's critical
# path (every state load and store is masked by `valid`, which now waits for the chain's
# result), instead of after the stores, where the compiler may interleave it with the
# kernel's own work and change its schedule (docs/measurement.md: the after-stores patch
# made some points faster). Each program is delayed by about EXTRA dependent FMA latencies.
# The test (b_x < 1e30) != (gate_never > 0) is true as long as the wrapper passes 0.0.
KDA_AHEAD_HUNKS = (
    Hunk("lower_bound,", "gate_never,"),
    Hunk("RING: tl.constexpr,", "EXTRA: tl.constexpr,"),
    Hunk(
        "valid = (i_slot >= 0) & (i_cline >= 0) & (i_line >= 0)",
        "# gate-study extra work: EXTRA dependent steps ahead of every state access.\n"
        "b_x = scale * 1.0\n" + _CHAIN + "valid = valid & ((b_x < 1.0e30) != (gate_never > 0.0))\n",
    ),
    Hunk("0.0 if lower_bound is None else float(lower_bound),", "0.0,  # gate_never"),
    Hunk("RING=bool(cache_ring),", "EXTRA={extra},"),
)


# The amount as a runtime argument (a float: Triton never specializes those), counted down
# by a `while` loop after the program's own stores (`kda_loop`). Every amount runs the same
# compiled kernel, and a loop is a wall the compiler does not move the kernel's own work
# across, so the patch leaves the kernel's schedule alone: the added time grows with the
# amount, smoothly, from about zero. (The same loop ahead of the state accesses, measured
# 2026-11-30, cost +4.0% at 4 steps and +4.6% at 16 at the reference point: the loop held
# back the loads behind it.)
KDA_LOOP_HUNKS = (
    Hunk("lower_bound,", "gate_never,\ngate_steps,"),
    Hunk(
        "def fused_kda_conv_gating_verify(",
        "# gate-study extra work: gate_steps dependent steps per program after its own\n"
        "# stores; the store needs gate_never > 0, which the wrapper never passes.\n"
        "b_x = scale * 1.0\n"
        "i_x = scale * 0.0\n"
        "while i_x < gate_steps:\n"
        "    b_x = b_x * 0.9990234375 + 0.5\n"
        "    i_x += 1.0\n"
        "o_x = i_v * BLOCK_V + tl.arange(0, BLOCK_V)\n"
        "p_x = o + i_tok * s_o_n + i_hv * s_o_h + o_x\n"
        "b_x = b_x + tl.zeros([BLOCK_V], dtype=tl.float32)\n"
        "tl.store(p_x, b_x.to(o.dtype.element_ty), mask=(o_x >= 0) & (gate_never > 0.0))\n\n\n",
        before=True,
        indent=4,
    ),
    Hunk(
        "0.0 if lower_bound is None else float(lower_bound),",
        "0.0,  # gate_never\n{extra}.0,  # gate_steps",
    ),
)


# The unfused KDA pair slowed in its recurrent kernel, the same way (`kda_unfused_loop`):
# KDA_LOOP_HUNKS with the chain at the end of `_recurrent_verify_kernel`.
KDA_UNFUSED_LOOP_HUNKS = (
    KDA_LOOP_HUNKS[0],
    replace(KDA_LOOP_HUNKS[1], anchor="def fused_sigmoid_gating_delta_rule_update("),
    KDA_LOOP_HUNKS[2],
)

# The NSA forward slowed at the paper preset only (`nsa_paper_loop`): nsa_loop's chain, run
# only where the group exceeds 8 query heads per kv head (paper: 16; seed: 4).
NSA_PAPER_LOOP_HUNKS = (
    NSA_LOOP_HUNKS[0],
    replace(
        NSA_LOOP_HUNKS[1],
        text=NSA_LOOP_HUNKS[1]
        .text.replace("while n_x < gate_steps:", "while n_x < tl.where(G > 8, gate_steps, 0.0):")
        .replace("per row of the tile, in every\n", "per row of the tile at G > 8, in every\n"),
    ),
    NSA_LOOP_HUNKS[2],
)

# The NSA backward slowed in its dk/dv kernel (`nsa_bwd_loop`): gate_steps dependent steps
# per program after its own stores (every block segment), the amount a runtime argument.
NSA_BWD_LOOP_HUNKS = (
    Hunk(
        "Q, K, V, DO, LSE, DELTA, LSE_LO, ROW_PTR, COL, SEG_BLOCK, SEG_START, PART_START, "
        "PART, DK, DV,",
        "gate_never, gate_steps,",
    ),
    Hunk(
        "tl.store(p_part + BS * D, b_dv)",
        "# gate-study extra work: gate_steps dependent steps per program after its own\n"
        "# stores; the store needs gate_never > 0, which the wrapper never passes.\n"
        "b_x = scale * 1.0\n"
        "n_x = scale * 0.0\n"
        "while n_x < gate_steps:\n"
        "    b_x = b_x * 0.9990234375 + 0.5\n"
        "    n_x += 1.0\n"
        "b_x = b_x + tl.zeros([BS, D], dtype=tl.float32)\n"
        "tl.store(DV + p_kv, b_x.to(DV.dtype.element_ty), mask=k_ok & (gate_never > 0.0))\n",
        indent=8,
    ),
    Hunk("seg_start, part_start, part, dk, dv,", "0.0,  # gate_never\n{extra}.0,  # gate_steps"),
)

# Host-side slow-downs of the NSA forward wrapper, which a CUDA-graph replay cannot see
# (kind "host"). `nsa_host`: EXTRA microseconds of Python per call, a spin on the host
# clock with no device work. `nsa_launch`: EXTRA more launches of a one-program kernel
# whose store needs gate_never > 0 (never passed): host work plus a launch's device cost.
HOST_MARK = "# gate-study extra host work"
NSA_HOST_HUNKS = (
    Hunk("from typing import NamedTuple", "import time"),
    Hunk(
        "tuning = resolve(tuning)",
        HOST_MARK + ": {extra} us of Python per call (no device work)\n"
        "_gate_end = time.perf_counter() + {extra} * 1e-6\n"
        "while time.perf_counter() < _gate_end:\n"
        "    pass\n",
    ),
)
NSA_LAUNCH_HUNKS = (
    Hunk(
        "def block_path_bytes(dims, element_size):",
        "@triton.jit\n"
        "def _gate_extra_kernel(X, gate_never):\n"
        "    i_x = tl.arange(0, 16)\n"
        "    tl.store(X + i_x, tl.zeros([16], tl.float32), mask=(i_x < 1) & (gate_never > 0.0))\n"
        "\n\n",
        before=True,
    ),
    Hunk(
        "return (o, lse) if return_lse else o",
        HOST_MARK + ": {extra} more launches per call\n"
        "for _ in range({extra}):\n"
        "    _gate_extra_kernel[(1,)](\n"
        "        lse,\n"
        "        0.0,  # gate_never\n"
        "    )\n",
        before=True,
    ),
)


@dataclass(frozen=True)
class Kernel:
    name: str
    path: str  # the patched file, relative to the repository root
    module: str  # its module
    api_attr: str  # the public function the benchmark calls, defined in that module
    bench: str  # benchmark module.class
    methods: tuple[str, ...]  # the gated timing methods
    uses: str  # a parameter value (at index 1) that selects the patched kernel
    reference: tuple  # the calibration's reference point (GPU mode)
    ladder: tuple[int, ...]  # EXTRA amounts tried at the reference point (GPU mode)
    hunks: tuple[Hunk, ...]
    # "device": extra work inside a kernel; "host": extra work in the Python wrapper (its
    # methods then include the eager and host figures, which are what it should move)
    kind: str = "device"

    @property
    def regex(self):
        """asv -b regex: the gated timing methods at the points that call the kernel."""
        cls = re.escape(self.bench)
        methods = "|".join(self.methods)
        return rf"{cls}\.({methods})\(.*'{re.escape(self.uses)}"


KERNELS = {
    "nsa": Kernel(
        name="nsa",
        path="src/kernels/nsa/forward.py",
        module="kernels.nsa.forward",
        api_attr="selection_forward_triton",
        bench="nsa.NsaForward",
        methods=("track_time",),
        uses="triton",
        reference=(32768, "triton", "seed", "recent"),
        ladder=(64, 128, 256, 512, 1024, 2048, 4096, 8192),
        hunks=NSA_HUNKS,
    ),
    "kda": Kernel(
        name="kda",
        path="src/kernels/kda/fused_verify.py",
        module="kernels.kda.fused_verify",
        api_attr="fused_kda_conv_gating_verify",
        bench="kda.KdaVerify",
        methods=("track_time", "track_time_cold"),
        uses="fused",
        reference=(64, "fused+ring", "safe", "H8-HV8"),
        ladder=(4, 8, 16, 32, 64, 128, 256, 512, 1024),
        hunks=KDA_HUNKS,
    ),
}
# The same kernels and points as "nsa" and "kda", slowed by the other patches.
KERNELS["nsa_loop"] = replace(KERNELS["nsa"], name="nsa_loop", hunks=NSA_LOOP_HUNKS)
KERNELS["kda_ahead"] = replace(KERNELS["kda"], name="kda_ahead", hunks=KDA_AHEAD_HUNKS)
KERNELS["kda_loop"] = replace(KERNELS["kda"], name="kda_loop", hunks=KDA_LOOP_HUNKS)
KERNELS["nsa_paper_loop"] = replace(
    KERNELS["nsa"], name="nsa_paper_loop", hunks=NSA_PAPER_LOOP_HUNKS,
    reference=(32768, "triton", "paper", "recent"),
)  # fmt: skip
KERNELS["nsa_bwd_loop"] = replace(
    KERNELS["nsa"], name="nsa_bwd_loop", path="src/kernels/nsa/backward.py",
    module="kernels.nsa.backward", api_attr="selection_backward_triton",
    bench="nsa.NsaBackward", ladder=(16, 32, 64, 128, 256, 512, 1024, 2048),
    hunks=NSA_BWD_LOOP_HUNKS,
)  # fmt: skip
KERNELS["kda_unfused_loop"] = replace(
    KERNELS["kda"], name="kda_unfused_loop", path="src/kernels/kda/recurrent.py",
    module="kernels.kda.recurrent", api_attr="fused_sigmoid_gating_delta_rule_update",
    uses="unfused", reference=(64, "unfused+ring", "safe", "H8-HV8"),
    hunks=KDA_UNFUSED_LOOP_HUNKS,
)  # fmt: skip
_HOST_METHODS = ("track_time", "track_time_eager", "track_time_host")
KERNELS["nsa_host"] = replace(
    KERNELS["nsa"], name="nsa_host", methods=_HOST_METHODS, hunks=NSA_HOST_HUNKS,
    reference=(4096, "triton", "seed", "recent"), ladder=(5, 10, 20, 50, 100, 200),
    kind="host",
)  # fmt: skip
KERNELS["nsa_launch"] = replace(KERNELS["nsa_host"], name="nsa_launch", hunks=NSA_LAUNCH_HUNKS,
                                ladder=(1, 2, 4, 8))  # fmt: skip
SMOKE_LADDER = (2, 4)


def patch_source(source, hunks, extra):
    """`source` with every hunk applied; ValueError when an anchor is not exactly one line."""
    lines = source.splitlines(keepends=True)
    for hunk in hunks:
        at = [i for i, line in enumerate(lines) if line.strip() == hunk.anchor]
        if len(at) != 1:
            raise ValueError(f"patch anchor {hunk.anchor!r} found {len(at)} times, want 1")
        i = at[0]
        pad = " " * (hunk.indent if hunk.indent is not None else _indent(lines[i]))
        body = textwrap.dedent(hunk.text).replace("{extra}", str(int(extra)))
        body += "" if body.endswith("\n") else "\n"
        new = [(pad + ln if ln.strip() else ln) for ln in body.splitlines(keepends=True)]
        lines[i if hunk.before else i + 1 : i if hunk.before else i + 1] = new
    return "".join(lines)


def _indent(line):
    return len(line) - len(line.lstrip(" "))


def load_patched(kernel, extra, workdir=None):
    """The kernel's module with the patch of `extra` steps applied (see load_source)."""
    text = patch_source((ROOT / KERNELS[kernel].path).read_text(), KERNELS[kernel].hunks, extra)
    return load_source(kernel, f"gate_extra{extra}", text, workdir)


def load_source(kernel, tag, text, workdir=None):
    """Module source `text` imported as a sibling of the kernel's module (same package, so
    its relative imports resolve), from a file in `workdir` (Triton reads kernel source
    from the file)."""
    k = KERNELS[kernel]
    importlib.import_module(k.module.rsplit(".", 1)[0])
    workdir = Path(workdir or tempfile.mkdtemp(prefix="gate_study_"))
    name = f"{k.module}_{tag}"
    path = workdir / f"{name.rsplit('.', 1)[1]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------
# The scratch repository


def git(repo, *args, env=None, input=None):
    res = subprocess.run(
        ["git", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV, **(env or {})},
        input=input,
    )
    return res.stdout.strip()


def make_clone(dest, env_dir):
    """Scratch repository of the working tree (tracked and untracked, not ignored files):
    commit gate-base, then gate-aa (a docs-only commit on top, branch main), plus the asv
    configurations. Reused when it exists. Returns (base, aa) hashes."""
    dest = Path(dest)
    if not (dest / ".git").exists():
        files = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
        for rel in filter(None, files.split("\0")):
            src = ROOT / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
        git(dest, "init", "-q", "-b", "main")
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", "gate study: base (the working tree)")
        git(dest, "tag", BASE_TAG)
        note = dest / "docs" / "gate-study-aa.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text("A documentation-only commit: the A/A pair of the gate study.\n")
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", "gate study: docs-only commit (A/A)")
        git(dest, "tag", AA_TAG)
    write_confs(dest, env_dir)
    return git(dest, "rev-parse", BASE_TAG), git(dest, "rev-parse", AA_TAG)


def write_confs(repo, env_dir):
    """The project's asv configuration with its own results dir per study part, written
    untracked into the scratch repository (asv runs there with --config)."""
    from asv.util import load_json

    for name, results in CONFS.items():
        conf = load_json(str(Path(repo) / "asv.conf.json"), js_comments=True)
        conf.update(repo=".", results_dir=results, html_dir="html", env_dir=str(env_dir))
        (Path(repo) / name).write_text(json.dumps(conf, indent=2))


def slow_commit(repo, kernel, extra, *more):
    """Commit gate-base + the kernel's patch with `extra` steps on branch
    gate-slow-KERNEL-EXTRA without touching the working tree; returns its hash. `more`:
    further (kernel, extra) pairs patched into the same commit (one slow-down in several
    kernel families at once, e.g. "nsa_loop", 512, "kda_loop", 64), each kernel in a file
    of its own."""
    pairs = [(kernel, int(extra))] + [(more[i], int(more[i + 1])) for i in range(0, len(more), 2)]
    if len(more) % 2 or len({KERNELS[k].path for k, _ in pairs}) != len(pairs):
        raise ValueError(f"want (kernel, extra) pairs, one per patched file: {pairs}")
    branch = "gate-slow-" + "-".join(f"{k}-{e}" for k, e in pairs)
    try:
        return git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}")
    except subprocess.CalledProcessError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", BASE_TAG, env=index)
        for name, amount in pairs:
            k = KERNELS[name]
            source = git(repo, "show", f"{BASE_TAG}:{k.path}") + "\n"
            text = patch_source(source, k.hunks, amount)
            blob = git(repo, "hash-object", "-w", "--stdin", input=text)
            git(repo, "update-index", "--cacheinfo", f"100644,{blob},{k.path}", env=index)
        tree = git(repo, "write-tree", env=index)
    msg = "gate study: " + "; ".join(
        f"{KERNELS[k].bench} kernel +{e} extra steps ({KERNELS[k].path})" for k, e in pairs
    )
    commit = git(repo, "commit-tree", tree, "-p", BASE_TAG, "-m", msg)
    git(repo, "branch", "-f", branch, commit)
    return commit


def regex_of(kernels):
    """asv -b regex of the gated points of every kernel named (one slow commit's)."""
    if len(kernels) == 1:
        return KERNELS[kernels[0]].regex
    return "|".join(f"({KERNELS[k].regex})" for k in kernels)


# ---------------------------------------------------------------------------------------
# Calibration: the patched kernel timed directly


def _bench_module():
    for p in (str(ROOT), str(ROOT / "src")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import benchmarks.common as common

    return common


def point_name(bench, method, params):
    """asv's name of one parameter set, as in `asv continuous` output."""
    return f"{bench}.{method}({', '.join(repr(p) for p in params)})"


def gated_points(kernel):
    """Parameter sets of the kernel's benchmark class (this mode's grid) that call it."""
    import benchmarks  # noqa: F401

    k = KERNELS[kernel]
    mod_name, cls_name = k.bench.split(".")
    cls = getattr(importlib.import_module(f"benchmarks.{mod_name}"), cls_name)
    return cls, [p for p in itertools.product(*cls.params) if str(p[1]).startswith(k.uses)]


def _rebind(bench, kernel, api):
    """Point a set-up benchmark instance at `api`; returns a callable giving its output."""
    bench.api = api
    if KERNELS[kernel].bench.startswith("nsa."):
        bench.prepare()
        return bench.peak_fn
    bench.fn = bench.call(seed=0)
    return bench.fn


def _median_time(bench, method, params):
    return statistics.median(getattr(bench, method)(*params)["samples"])


def measure_point(kernel, cls, params, variants, reps):
    """{method: {extra: median per-call seconds}} at one point, variants interleaved `reps`
    times, in alternating order (extra 0 is the original kernel); raises when a patched
    output differs."""
    import torch

    from benchmarks.common import set_up

    k = KERNELS[kernel]
    bench = cls()
    set_up(bench, *params)
    try:
        base_api = bench.api
        apis = {e: _patched_api(base_api, kernel, m) for e, m in variants.items()}
        ref = _outputs(_rebind(bench, kernel, base_api)())
        for extra, api in apis.items():
            got = _outputs(_rebind(bench, kernel, api)())
            if not all(torch.equal(g, r) for g, r in zip(got, ref, strict=True)):
                raise AssertionError(f"{kernel} +{extra}: the patched kernel's output differs")
        times = {m: {e: [] for e in apis} for m in k.methods}
        for rep in range(reps):
            # Forward, then backward order (A B C, C B A, ...): a drift over the calibration
            # (clocks, temperature) then weighs on every variant alike, not on the first.
            order = list(apis.items())
            for extra, api in order if rep % 2 == 0 else order[::-1]:
                _rebind(bench, kernel, api)
                for method in k.methods:
                    times[method][extra].append(_median_time(bench, method, params))
        return {m: {e: statistics.median(v) for e, v in t.items()} for m, t in times.items()}
    finally:
        if hasattr(bench, "teardown"):
            bench.teardown(*params)
        del bench
        _bench_module().free_memory()


def _outputs(out):
    """A call's output tensors (one, or the backward's tuple), copied."""
    return tuple(t.clone() for t in (out if isinstance(out, (tuple, list)) else (out,)))


def _patched_api(api, kernel, mod):
    """The benchmark's API namespace with the kernel's function taken from `mod` (None: as is)."""
    if mod is None:
        return api
    attr = KERNELS[kernel].api_attr
    return SimpleNamespace(**{**vars(api), attr: getattr(mod, attr)})


def slowdowns(times):
    """{extra: percent} from {extra: seconds}; extra 0 is the baseline."""
    base = times[0]
    return {e: 100.0 * (t / base - 1.0) for e, t in times.items() if e != 0}


def choose_amounts(curve, targets):
    """{target: extra}: for each target slowdown (percent), the amount interpolated on the
    measured curve {extra: percent} (made non-decreasing first; (0, 0) implied), or scaled
    from the largest amount when no measured point reaches the target."""
    pts = [(0, 0.0)]
    for extra in sorted(curve):
        pts.append((extra, max(curve[extra], pts[-1][1])))
    out = {}
    for target in targets:
        chosen = None
        for (e0, s0), (e1, s1) in itertools.pairwise(pts):
            if s0 < target <= s1:
                chosen = e0 + (target - s0) * (e1 - e0) / (s1 - s0)
                break
        if chosen is None:
            e_max, s_max = pts[-1]
            chosen = e_max * target / s_max if s_max > 0 else e_max
        out[target] = max(1, round(chosen))
    return out


def calibrate(kernel, targets=DEFAULT_TARGETS, reps=3, ladder=None, extras=None, first=None):
    """Calibrate the kernel's slow-down patch: the ladder at the reference point and the
    amounts interpolated from it for `targets` (or the given `extras` instead), then those
    amounts at every gated point (`first`: the first that many only). Returns a JSON-ready
    dict."""
    common = _bench_module()
    k = KERNELS[kernel]
    cls, points = gated_points(kernel)
    points = points[:first] if first else points
    method = k.methods[-1]  # the cold figure for KDA (its targets are stated on it)
    reference = k.reference if k.reference in points else points[0]
    workdir = tempfile.mkdtemp(prefix="gate_study_")
    mods = {}

    def variants(amounts):
        for e in amounts:
            if e not in mods:
                mods[e] = load_patched(kernel, e, workdir=workdir)
        return {0: None, **{e: mods[e] for e in amounts}}

    result = {
        "kernel": kernel,
        "mode": common.MODE_NAME,
        "reference": point_name(k.bench, method, reference),
        "ladder_pct": {},
        "targets": {},
        "extras": sorted(set(extras or ())),
        "points": {},
    }
    if not extras:
        ladder = tuple(ladder or (SMOKE_LADDER if common.SMOKE else k.ladder))
        curve = slowdowns(measure_point(kernel, cls, reference, variants(ladder), reps)[method])
        amounts = choose_amounts(curve, targets)
        result["ladder_pct"] = {str(e): s for e, s in curve.items()}
        result["targets"] = {f"{t:g}": e for t, e in amounts.items()}
        result["extras"] = sorted(set(amounts.values()))
    for params in points:
        try:
            times = measure_point(kernel, cls, params, variants(result["extras"]), reps)
        except NotImplementedError as exc:
            print(f"calibrate {kernel}: skip {params}: {exc}", file=sys.stderr)
            continue
        for m, t in times.items():
            result["points"][point_name(k.bench, m, params)] = {
                "base_s": t[0],
                "slowdown_pct": {str(e): s for e, s in slowdowns(t).items()},
            }
    shutil.rmtree(workdir, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------------------
# Noise: per-process medians of asv results with appended samples


def add_uncalibrated(calibration, extras):
    """`calibration` with the amounts `extras` added where it lacks them, uncalibrated: their
    per-point slowdown is None, so the tables give asv's ratios alone for them. Lets a reused
    calibration (CALIBRATION_FROM) be tried at amounts it never timed. Returns (calibration,
    the amounts added)."""
    known = set(calibration["extras"])
    added = sorted({int(e) for e in extras} - known)
    if added:
        calibration = dict(calibration, extras=sorted(known | set(added)))
        calibration["uncalibrated"] = sorted(set(calibration.get("uncalibrated", ())) | set(added))
        calibration["points"] = {
            name: dict(cal, slowdown_pct={**cal["slowdown_pct"], **{str(e): None for e in added}})
            for name, cal in calibration["points"].items()
        }
    return calibration, added


def split_processes(samples, per_process):
    """Consecutive chunks of `per_process` samples (one per process); a partial tail is
    dropped."""
    n = len(samples) // per_process
    return [samples[i * per_process : (i + 1) * per_process] for i in range(n)]


def cv_stats(chunks):
    """Spread of the per-process medians: n, their median, CV% (sample stdev / mean),
    range% (max - min over the median), and an A/A of the two halves (`halves`)."""
    meds = [statistics.median(c) for c in chunks]
    mid = statistics.median(meds)
    cv = 100.0 * statistics.stdev(meds) / statistics.fmean(meds) if len(meds) > 1 else math.nan
    by_median, by_fastest = halves(meds)
    return {
        "n": len(meds),
        "median_s": mid,
        "cv_pct": cv,
        "range_pct": 100.0 * (max(meds) - min(meds)) / mid,
        "medians_s": meds,
        "halves_median_ratio": by_median,
        "halves_fastest_ratio": by_fastest,
    }


def halves(meds):
    """An A/A from one commit's processes, as a gate would read it with the processes split
    into two sides in turn (odd-numbered over even-numbered): the ratio of the sides'
    medians, and of their fastest processes. The second is the estimator to try for the
    host-paced figures: host work only gets slower under interference, and a whole process
    can run 1.5-2x slow (docs/measurement.md). NaN with fewer than two processes."""
    a, b = meds[0::2], meds[1::2]
    if not a or not b:
        return math.nan, math.nan
    return statistics.median(b) / statistics.median(a), min(b) / min(a)


def noise_table(samples, per_process):
    """{point: cv_stats} for every point with at least one complete process."""
    out = {}
    for name, s in sorted(samples.items()):
        chunks = split_processes(s, per_process)
        if chunks:
            out[name] = cv_stats(chunks)
    return out


# Estimators of a host-paced figure over one side's processes (`side_estimates`), compared
# by `estimator_ratios` on stored results: the gate's (`pooled_q`: the q-quantile of the
# pooled samples, ci.confirm's), and candidates that one process alone cannot move: the
# median and the second lowest of the per-process q-quantiles, and the median of the
# per-process medians.
ESTIMATORS = ("pooled_q", "median_process_q", "second_process_q", "median_process_median")


def side_estimates(samples, per_process, q=HOST_QUANTILE):
    """{estimator: value, "n": processes} of one side's samples, split into processes of
    `per_process` consecutive samples (as asv appends them, process by process); None
    without one complete process."""
    chunks = split_processes(samples, per_process)
    if not chunks:
        return None
    per_q = sorted(low_quantile(c, q) for c in chunks)
    return {
        "pooled_q": low_quantile([x for c in chunks for x in c], q),
        "median_process_q": statistics.median(per_q),
        "second_process_q": per_q[min(1, len(per_q) - 1)],
        "median_process_median": statistics.median(statistics.median(c) for c in chunks),
        "n": len(chunks),
    }


def estimator_ratios(base, head, per_process, match=HOST_FIGURE.pattern, q=HOST_QUANTILE):
    """{point: {estimator: head / base, "n": (base processes, head processes)}} of the
    points both sides ({point: samples}) hold a complete process of, whose names match
    `match` (default: the host-paced figures)."""
    out = {}
    for name in sorted(set(base) & set(head)):
        if match and not re.search(match, name):
            continue
        b, h = (
            side_estimates(base[name], per_process, q),
            side_estimates(head[name], per_process, q),
        )
        if b is None or h is None:
            continue
        out[name] = {e: h[e] / b[e] for e in ESTIMATORS} | {"n": (b["n"], h["n"])}
    return out


def estimators_markdown(table):
    """The ratios of `estimator_ratios` as a table, with each estimator's ratios furthest
    below and above 1 in a last row."""
    if not table:
        return "No point with a complete process on both sides."
    lines = [
        "| point | processes | " + " | ".join(ESTIMATORS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in ESTIMATORS) + " |",
    ]
    for name, row in table.items():
        cells = " | ".join(f"{row[e]:.4f}" for e in ESTIMATORS)
        lines.append(f"| `{name}` | {row['n'][0]} / {row['n'][1]} | {cells} |")
    spans = " | ".join(
        f"{min(r[e] for r in table.values()):.4f}-{max(r[e] for r in table.values()):.4f}"
        for e in ESTIMATORS
    )
    lines.append(f"| range | | {spans} |")
    return "\n".join(lines)


def rounds_done(samples, per_process):
    """Complete process rounds every point holds (0 when there is nothing)."""
    counts = [len(s) // per_process for s in samples.values()]
    return min(counts) if counts else 0


def default_per_process():
    return _bench_module().SAMPLES


# ---------------------------------------------------------------------------------------
# asv continuous output


def record_try(kind, log_text, rc, base_values, head_values, confirm=None, **extra):
    """One continuous try as a JSON-ready dict: flagged rows from its output, and the median
    ratio head/base of every point both commits hold.

    confirm: the gate's second stage (`ci.confirm`), when it ran: {"suspects": [...],
    "compare": its compare output, "rc": its exit code, "stage1_ratios": every point's ratio
    before it re-ran any, "rejudged": the host figures' stage-1 flags it cleared on their own
    estimator without a re-run}. The suspects' flags are then its compare's (from pooled
    samples), the rejudged points have none, and the other points keep stage 1's;
    "stage1_worse", "stage1_better" and "stage1_ratios" keep stage 1's own ("ratios" are the
    pooled ones), and "rc" becomes the two-stage gate's."""
    rows = parse(log_text)
    ratios = {n: head_values[n] / base_values[n] for n in base_values if n in head_values}
    worse = {r.name for r in rows if r.mark in ("+", "!")}
    better = {r.name for r in rows if r.mark == "-"}
    out = {"kind": kind, "rc": rc}
    if confirm is not None:
        suspects = set(confirm["suspects"])
        again = {r.name: r.mark for r in parse(confirm["compare"])}
        out.update(
            rc=confirm["rc"],
            stage1_rc=rc,
            stage1_worse=sorted(worse),
            stage1_better=sorted(better),
            suspects=sorted(suspects),
            stage1_ratios=confirm.get("stage1_ratios", {}),
        )
        cleared = suspects | set(confirm.get("rejudged", ()))
        worse = (worse - cleared) | {n for n in suspects if again.get(n) in ("+", "!")}
        better = (better - cleared) | {n for n in suspects if again.get(n) == "-"}
    return {**out, "worse": sorted(worse), "better": sorted(better), "ratios": ratios, **extra}


def read_confirm(directory):
    """record_try's `confirm` argument from a `ci.confirm --out` directory."""
    d = Path(directory)
    compare = d / "confirm-compare.txt"
    suspects = json.loads((d / "suspects.json").read_text())
    verdict = json.loads((d / "confirm.json").read_text())
    return {
        "suspects": suspects["suspects"],
        "stage1_ratios": suspects.get("stage1_ratios", {}),
        "compare": compare.read_text(errors="replace") if compare.exists() else "",
        "rc": verdict["exit_code"],
        "rejudged": verdict.get("rejudged", []),
    }


def read_jsonl(path):
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def matching(records, **fields):
    """The records whose fields equal every given (not None) value."""
    want = {k: v for k, v in fields.items() if v is not None}
    return [r for r in records if all(r.get(k) == v for k, v in want.items())]


# ---------------------------------------------------------------------------------------
# Tables


def fmt_time(seconds):
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def noise_markdown(table):
    lines = [
        "| benchmark | processes | median | CV % | range % | halves: medians, fastest |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in table.items():
        by_median = s.get("halves_median_ratio", math.nan)
        by_fastest = s.get("halves_fastest_ratio", math.nan)
        lines.append(
            f"| `{name}` | {s['n']} | {fmt_time(s['median_s'])} | "
            f"{s['cv_pct']:.2f} | {s['range_pct']:.2f} | {by_median:.3f}, {by_fastest:.3f} |"
        )
    if table:
        cvs = [s["cv_pct"] for s in table.values() if s["cv_pct"] == s["cv_pct"]]
        if cvs:
            lines.append(
                f"\nCV over points: median {statistics.median(cvs):.2f} %, max {max(cvs):.2f} %."
            )
    return "\n".join(lines)


def aa_markdown(records):
    """The A/A table; with the second stage, stage 1's own flags and the ratio furthest
    from 1 before the re-runs get a column of their own."""
    two_stage = any("stage1_worse" in r for r in records)
    lines = [
        "| try | exit | flagged worse | flagged better | largest ratio |"
        + (" stage 1: flags, ratio furthest from 1 |" if two_stage else ""),
        "| --- | --- | --- | --- | --- |" + (" --- |" if two_stage else ""),
    ]
    for i, r in enumerate(records, 1):
        top = max(r["ratios"].items(), key=lambda kv: kv[1], default=("-", math.nan))
        row = (
            f"| {i} | {r['rc']} | {len(r['worse'])} {_names(r['worse'])} | "
            f"{len(r['better'])} {_names(r['better'])} | {top[1]:.4f} `{top[0]}` |"
        )
        if two_stage:
            far = max(
                r.get("stage1_ratios", {}).items(),
                key=lambda kv: abs(math.log(kv[1])),
                default=("-", math.nan),
            )
            worse, better = r.get("stage1_worse", []), r.get("stage1_better", [])
            flags = ", ".join(f"{len(n)} {w} {_names(n)}".rstrip() for w, n in
                              (("worse", worse), ("better", better)))  # fmt: skip
            row += f" {flags}; {far[1]:.4f} `{far[0]}` |" if far[0] != "-" else f" {flags}; - |"
        lines.append(row)
    flagged = sum(len(r["worse"]) + len(r["better"]) for r in records)
    points = sum(len(r["ratios"]) for r in records)
    lines.append(f"\nA/A: {len(records)} tries, {flagged} flags over {points} point comparisons.")
    return "\n".join(lines)


def _names(names):
    return "(" + ", ".join(f"`{n}`" for n in names) + ")" if names else ""


def kept_flags(record, factor=None):
    """{point: "worse" | "better"}: the flags of one try that remain at `factor` (None: all).

    asv flagged the points at the run's factor; at a larger factor a flag remains when the
    point's median ratio head/base is beyond it (above `factor` for worse, below 1/`factor`
    for better). A flag without a ratio (a newly failing benchmark) remains at every factor.
    """
    flags = {n: "worse" for n in record["worse"]}
    flags.update({n: "better" for n in record["better"]})
    if factor is None:
        return flags
    return {n: d for n, d in flags.items() if _beyond(record["ratios"].get(n), d, factor)}


def _beyond(ratio, direction, factor):
    """Whether a median ratio head/base is beyond `factor` in the flag's direction."""
    if ratio is None:
        return True
    return ratio > factor if direction == "worse" else ratio < 1.0 / factor


def detection_table(records, calibration, factor=None):
    """Per point: for every amount, the calibrated slowdown (None for an uncalibrated amount)
    and how many tries flagged it (at `factor`, see kept_flags; None: as the run flagged); and
    the smallest calibrated slowdown flagged in every try (None: never).

    Returns {point: {"amounts": {extra: {slowdown_pct, flagged, tries, ratios, rerun}},
    "smallest_pct": float | None}}; rerun[i]: whether try i's second stage re-ran the point
    (its ratio is then over the pooled samples)."""
    out = {}
    for name, cal in calibration["points"].items():
        amounts = {}
        for extra, pct in sorted(cal["slowdown_pct"].items(), key=lambda kv: int(kv[0])):
            tries = [r for r in records if str(r["extra"]) == extra and name in r["ratios"]]
            flagged = sum(kept_flags(r, factor).get(name) == "worse" for r in tries)
            ratios = [r["ratios"][name] for r in tries]
            amounts[extra] = {
                "slowdown_pct": pct,
                "tries": len(tries),
                "flagged": flagged,
                "ratios": ratios,
                "rerun": [name in r.get("suspects", ()) for r in tries],
            }
        always = [
            a["slowdown_pct"]
            for a in amounts.values()
            if a["slowdown_pct"] is not None and a["tries"] and a["flagged"] == a["tries"]
        ]
        out[name] = {"amounts": amounts, "smallest_pct": min(always) if always else None}
    return out


def detection_markdown(kernel, table, calibration):
    extras = [str(e) for e in calibration["extras"]]
    head = " | ".join(f"+{e} steps" for e in extras)
    rerun = any(any(a.get("rerun", ())) for row in table.values() for a in row["amounts"].values())
    lines = [
        f"Kernel `{kernel}`; reference `{calibration['reference']}`; targets (percent -> "
        f"steps) {calibration['targets']}. Cell: calibrated slowdown %, flagged / tries, "
        "asv median ratios"
        + (" (*: re-run by the second stage, the ratio of the pooled samples)." if rerun else ".")
        + (
            " n/c: an amount the calibration did not time (asv's ratios alone)."
            if calibration.get("uncalibrated")
            else ""
        ),
        "",
        f"| benchmark | {head} | smallest flagged in every try |",
        "| --- | " + " | ".join("---" for _ in extras) + " | --- |",
    ]
    for name, row in table.items():
        cells = []
        for e in extras:
            a = row["amounts"].get(e)
            if a is None:
                cells.append("-")
                continue
            marks = ["*" if m else "" for m in a.get("rerun") or [False] * len(a["ratios"])]
            ratios = ", ".join(f"{x:.3f}{m}" for x, m in zip(a["ratios"], marks, strict=True))
            pct = "n/c" if a["slowdown_pct"] is None else f"{a['slowdown_pct']:+.1f}%"
            cells.append(f"{pct}: {a['flagged']}/{a['tries']} ({ratios})")
        best = row["smallest_pct"]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {_pct(best)} |")
    worst = [r["smallest_pct"] for r in table.values()]
    if worst and all(w is not None for w in worst):
        lines.append(f"\nEvery point flagged in every try from {max(worst):+.1f}% on.")
    return "\n".join(lines)


def _pct(x):
    return "never" if x is None else f"{x:+.1f}%"


# ---------------------------------------------------------------------------------------
# Factor sweep: the run's flags re-judged at larger factors

# Columns of the sweep: calibrated base time per call, [low, high) seconds.
BASE_GROUPS = ((">= 100 us", 100e-6, math.inf), ("10-100 us", 10e-6, 100e-6))


def aa_flags_at(records, factor):
    """[(try number, point, direction, ratio)] of the A/A flags that remain at `factor`."""
    return [
        (i, name, direction, r["ratios"].get(name))
        for i, r in enumerate(records, 1)
        for name, direction in sorted(kept_flags(r, factor).items())
    ]


def sweep_points(calibration, min_pct=0.0):
    """The calibration's points sorted for the sweep: ({group label: [points]}, skipped,
    below). Skipped: no amount slowed the point by more than `min_pct` percent; below: base
    time under the smallest group's bound (in no group)."""
    groups = {label: [] for label, _, _ in BASE_GROUPS}
    skipped, below = [], []
    for name, cal in calibration["points"].items():
        if all(pct is None or pct <= min_pct for pct in cal["slowdown_pct"].values()):
            skipped.append(name)
            continue
        label = next((g for g, lo, hi in BASE_GROUPS if lo <= cal["base_s"] < hi), None)
        (groups[label] if label else below).append(name)
    return groups, skipped, below


def smallest_always_flagged(row, min_pct=0.0):
    """The amount of a detection_table row with the smallest calibrated slowdown (above
    `min_pct`) that every try flagged; None when there is none."""
    always = [
        a
        for a in row["amounts"].values()
        if a["slowdown_pct"] is not None
        and a["slowdown_pct"] > min_pct
        and a["tries"]
        and a["flagged"] == a["tries"]
    ]
    return min(always, key=lambda a: a["slowdown_pct"], default=None)


def group_cell(table, names, min_pct=0.0):
    """Over the points `names` of a detection_table: the worst case of the smallest slowdown
    flagged in every try, with the mean asv ratio at that amount; "never" when some point has
    none (how many); "-" when there are no points."""
    if not names:
        return "-"
    best = [smallest_always_flagged(table[n], min_pct) for n in names]
    never = sum(b is None for b in best)
    if never:
        return f"never ({never} of {len(names)} points)"
    worst = max(best, key=lambda a: a["slowdown_pct"])
    return f"{worst['slowdown_pct']:+.1f}% (asv {statistics.fmean(worst['ratios']):.3f})"


def sweep_row(factor, aa, detect, calibrations, groups, min_pct=0.0):
    """One factor of the sweep: (table cells, the A/A flags kept, the grouped points never
    flagged in every try). `groups` is {kernel: sweep_points(...)}."""
    flags = aa_flags_at(aa, factor)
    points = sum(len(r["ratios"]) for r in aa)
    cells = [f"{factor:g}", f"{len(flags)} / {points} comparisons ({len(aa)} tries)"]
    never = []
    for k, cal in calibrations.items():
        table = detection_table([r for r in detect if r.get("kernel") == k], cal, factor)
        for names in groups[k][0].values():
            cells.append(group_cell(table, names, min_pct))
            never += [n for n in names if smallest_always_flagged(table[n], min_pct) is None]
    return cells, flags, never


def sweep_markdown(aa, detect, calibrations, run_factor, factors, min_pct=0.0):
    """The factor sweep section: per factor the A/A false positives and, per calibrated
    kernel and base-time group, the worst-case smallest slowdown flagged in every try."""
    lines = [
        "## Factor sweep (post hoc)",
        "",
        f"A point counts as flagged at factor F' when asv flagged it in the run (--factor "
        f"{run_factor:g}) and its median ratio head/base is beyond F' (above F' slower, below "
        "1/F' faster). Kernel cells: over the points whose calibrated base time per call is in "
        "the column's range, the worst case of the smallest calibrated slowdown flagged in every "
        f"try (amounts slowing the point by more than {min_pct:g}% only), with the mean asv "
        "ratio at that amount; never: some point was not flagged in every try at any of them.",
        "",
    ]
    too_small = [f"{f:g}" for f in factors if f < run_factor]
    if too_small:
        lines += [
            f"Skipped factor(s) {', '.join(too_small)}: below the run's {run_factor:g} (asv "
            f"recorded flags at {run_factor:g} only).",
            "",
        ]
    head = ["factor", "A/A false positives"] + [
        f"`{k}` {label}" for k in calibrations for label, _, _ in BASE_GROUPS
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    groups = {k: sweep_points(cal, min_pct) for k, cal in calibrations.items()}
    aa_lists, never_lists = [], []
    for f in (f for f in factors if f >= run_factor):
        cells, flags, never = sweep_row(f, aa, detect, calibrations, groups, min_pct)
        lines.append("| " + " | ".join(cells) + " |")
        named = ", ".join(f"`{n}` (try {i}, {d}, {_ratio(x)})" for i, n, d, x in flags)
        aa_lists.append(f"- {f:g}: {named or 'none'}")
        never_lists.append(f"- {f:g}: {', '.join(f'`{n}`' for n in never) or 'none'}")
    lines += ["", "A/A flags kept per factor:", "", *aa_lists, ""]
    lines += ["Points never flagged in every try, per factor:", "", *never_lists, ""]
    for k, (grouped, skipped, below) in groups.items():
        sizes = ", ".join(f"{len(v)} {label}" for label, v in grouped.items())
        lines.append(
            f"`{k}` points: {sizes}; {len(below)} under {BASE_GROUPS[-1][1] * 1e6:g} us "
            f"(in no column); {len(skipped)} skipped (no calibrated slowdown above "
            f"{min_pct:g}%){': ' + _names(skipped) if skipped else ''}."
        )
    return "\n".join(lines)


def _ratio(x):
    return "no ratio" if x is None else f"ratio {x:.4f}"


def _first(studies, name):
    """The file `name` of the first study directory that has it (None: none has)."""
    return next((d / name for d in studies if (d / name).exists()), None)


def summary_markdown(studies, factor, factors=(), min_pct=0.0):
    """summary.md of one study directory or several (records concatenated in order; noise and
    calibration files from the first directory holding them); `factors` adds the sweep."""
    studies = [Path(studies)] if isinstance(studies, str | Path) else [Path(d) for d in studies]
    parts = [f"# Gate study (asv continuous --factor {factor})", ""]
    noise = _first(studies, "noise.json")
    if noise:
        data = json.loads(noise.read_text())
        parts += [
            "## Noise: per-process medians over fresh processes",
            "",
            noise_markdown(data),
            "",
        ]
    aa = [r for d in studies for r in read_jsonl(d / "aa.jsonl")]
    if aa:
        parts += [
            "## A/A: asv continuous between commits with identical kernels",
            "",
            aa_markdown(aa),
            "",
        ]
    detect = [r for d in studies for r in read_jsonl(d / "detect.jsonl")]
    calibrations = {}
    for kernel in KERNELS:
        cal_path = _first(studies, f"calibration-{kernel}.json")
        if cal_path is None:
            continue
        cal = calibrations[kernel] = json.loads(cal_path.read_text())
        recs = [r for r in detect if r.get("kernel") == kernel]
        parts += [
            f"## Detection: {KERNELS[kernel].bench}",
            "",
            detection_markdown(kernel, detection_table(recs, cal), cal),
            "",
        ]
    if factors:
        parts += [sweep_markdown(aa, detect, calibrations, float(factor), factors, min_pct), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# Command line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("clone")
    p.add_argument("dest")
    p.add_argument("--env-dir", required=True, help="asv env_dir of the scratch configurations")
    p = sub.add_parser("slow")
    p.add_argument("repo")
    p.add_argument("kernel", choices=KERNELS)
    p.add_argument("extra", type=int)
    p.add_argument("more", nargs="*", help="further KERNEL EXTRA pairs in the same commit")
    p = sub.add_parser("calibrate")
    p.add_argument("kernel", choices=KERNELS)
    p.add_argument("--out", required=True)
    p.add_argument("--targets", type=float, nargs="+", default=DEFAULT_TARGETS)
    p.add_argument("--ladder", type=int, nargs="+")
    p.add_argument("--extras", type=int, nargs="+", help="these amounts, no ladder search")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--first", type=int, help="calibrate the first N gated points only")
    p = sub.add_parser("amounts")
    p.add_argument("calibration")
    p = sub.add_parser("uncalibrated", help="add amounts to a calibration file, uncalibrated")
    p.add_argument("calibration")
    p.add_argument("extras", type=int, nargs="+")
    p = sub.add_parser("regex")
    p.add_argument("kernel", choices=KERNELS, nargs="+")
    for name in ("rounds", "noise"):
        p = sub.add_parser(name)
        p.add_argument("--results", required=True)
        p.add_argument("--machine", required=True)
        p.add_argument("--commit", required=True)
        p.add_argument("--per-process", type=int, help="samples per process (default: suite's)")
        p.add_argument("--out")
    p = sub.add_parser(
        "estimators", help="host-figure estimators head / base on stored results, per point"
    )
    p.add_argument("--results", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--head", required=True)
    p.add_argument("--match", default=HOST_FIGURE.pattern, help="points whose names match")
    p.add_argument("--quantile", type=float, default=HOST_QUANTILE)
    p.add_argument("--per-process", type=int, help="samples per process (default: suite's)")
    p = sub.add_parser("record")
    p.add_argument("kind", choices=("aa", "detect"))
    p.add_argument("log")
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--head", required=True)
    p.add_argument("--jsonl", required=True)
    p.add_argument("--kernel")
    p.add_argument("--extra", type=int)
    p.add_argument("--wall-s", type=float)
    p.add_argument("--try", dest="try_", type=int)
    p.add_argument("--confirm-dir", help="the gate's second stage's output (ci.confirm --out)")
    p = sub.add_parser("tries")
    p.add_argument("jsonl")
    p.add_argument("--kernel")
    p.add_argument("--extra", type=int)
    p.add_argument("--try", dest="try_", type=int)
    p = sub.add_parser("summary")
    p.add_argument("study", nargs="+")
    p.add_argument("--factor", default="1.015", help="the factor the study ran with")
    p.add_argument("--factors", type=float, nargs="+", default=(), help="post-hoc sweep")
    p.add_argument(
        "--min-slowdown",
        type=float,
        default=0.0,
        help="sweep: ignore calibrated slowdowns up to this percent (default: 0)",
    )
    args = ap.parse_args(argv)

    if args.cmd == "clone":
        base, aa = make_clone(args.dest, Path(args.env_dir).resolve())
        print(base, aa)
    elif args.cmd == "slow":
        print(slow_commit(args.repo, args.kernel, args.extra, *args.more))
    elif args.cmd == "calibrate":
        result = calibrate(
            args.kernel, args.targets, args.reps, args.ladder, args.extras, args.first
        )
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps({k: result[k] for k in ("reference", "ladder_pct", "targets")}))
    elif args.cmd == "amounts":
        print(" ".join(str(e) for e in json.loads(Path(args.calibration).read_text())["extras"]))
    elif args.cmd == "uncalibrated":
        path = Path(args.calibration)
        cal, added = add_uncalibrated(json.loads(path.read_text()), args.extras)
        path.write_text(json.dumps(cal, indent=1))
        print(" ".join(str(e) for e in added))
    elif args.cmd == "regex":
        print(regex_of(args.kernel))
    elif args.cmd in ("rounds", "noise"):
        per = args.per_process or default_per_process()
        samples = stored_samples(args.results, args.machine, args.commit)
        if args.cmd == "rounds":
            print(rounds_done(samples, per))
            return
        table = noise_table(samples, per)
        if args.out:
            Path(args.out).write_text(json.dumps(table, indent=1))
        print(noise_markdown(table))
    elif args.cmd == "estimators":
        per = args.per_process or default_per_process()
        sides = [stored_samples(args.results, args.machine, c) for c in (args.base, args.head)]
        print(estimators_markdown(estimator_ratios(*sides, per, args.match, args.quantile)))
    elif args.cmd == "record":
        rec = record_try(
            args.kind,
            Path(args.log).read_text(errors="replace"),
            args.rc,
            stored_values(args.results, args.machine, args.base),
            stored_values(args.results, args.machine, args.head),
            confirm=read_confirm(args.confirm_dir) if args.confirm_dir else None,
            kernel=args.kernel,
            extra=args.extra,
            try_=args.try_,
            wall_s=args.wall_s,
            base=args.base,
            head=args.head,
        )
        with open(args.jsonl, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(
            f"record {args.kind}: exit {rec['rc']}, worse {len(rec['worse'])}, "
            f"better {len(rec['better'])}, points {len(rec['ratios'])}"
        )
    elif args.cmd == "tries":
        recs = matching(
            read_jsonl(args.jsonl), kernel=args.kernel, extra=args.extra, try_=args.try_
        )
        print(len(recs), int(recs[-1]["wall_s"] or 0) if recs else 0)
    elif args.cmd == "summary":
        print(summary_markdown(args.study, args.factor, args.factors, args.min_slowdown))


if __name__ == "__main__":
    main()
