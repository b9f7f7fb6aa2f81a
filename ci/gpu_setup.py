#!/usr/bin/env python3
"""Prepare a self-hosted GPU runner's job: persistent caches and the asv machine entry.

Self-hosted runners keep their home directory between jobs, so the expensive state lives
there, outside the (cleaned) workspace, under a cache root (default
`$HOME/.cache/attnbench`) with one subtree per purpose: `main` for the history runs and
`pr` for the PR gate, so that a PR job never writes into the environments that the
published history is measured with.

    <root>/<purpose>/asv-env   asv's environments; the conf's env_dir is a link to it
    <root>/<purpose>/triton    Triton's kernel cache (TRITON_CACHE_DIR)
    <root>/wheelhouse          optional offline wheelhouse (PIP_NO_INDEX/PIP_FIND_LINKS)

The asv machine is named after the GPU type label (h200, h100, ...) so results of several
GPU types publish into one site side by side; tools/asv_machine.py adds the GPU's name,
driver, CUDA, torch and Triton versions to the entry (they show on the site as filters).

Before anything else it checks that CUDA works: a tiny CUDA operation, run in a fresh
interpreter (a broken driver may crash or hang the process that tries), must give the
right answer within a time limit. Otherwise the job stops with the error: a runner whose
GPU is unusable would otherwise record n/a for every benchmark and report no regression.

Usage (from the repo root, with the project's .venv):
    .venv/bin/python -m ci.gpu_setup --machine h200 --purpose main --github-env "$GITHUB_ENV"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The check: allocate on the GPU, compute, synchronize, read back (1 + 2 + ... + 8 = 36).
CUDA_PROBE = """\
import torch
if not torch.cuda.is_available():
    raise SystemExit("torch.cuda.is_available() is False (torch " + torch.__version__ + ")")
x = torch.arange(1, 9, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
got = float(x.sum().item())
if got != 36.0:
    raise SystemExit(f"a sum on the GPU gave {got}, not 36")
print(torch.cuda.get_device_name(0))
"""
CUDA_PROBE_TIMEOUT_S = 300.0


class CudaUnusable(RuntimeError):
    """CUDA does not work on this runner; the message says what failed."""


def check_cuda(python: str = sys.executable, timeout: float = CUDA_PROBE_TIMEOUT_S,
               probe: str = CUDA_PROBE) -> str:  # fmt: skip
    """Run `probe` (default: a tiny CUDA operation) with `python` in a subprocess; returns
    the device name it prints. Raises CudaUnusable on a non-zero exit, a crash or a hang
    past `timeout` seconds, with the probe's own error output."""
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise CudaUnusable(f"a tiny CUDA operation did not finish in {timeout:g} s") from exc
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-5:]
        raise CudaUnusable(
            f"a tiny CUDA operation failed (exit {res.returncode}): " + " | ".join(tail)
        )
    return res.stdout.strip()


def env_dir(conf: Path) -> Path:
    """The environment directory that asv.conf.json names (relative to the conf's folder)."""
    from asv.util import load_json

    data = load_json(str(conf), js_comments=True)
    return conf.parent / data.get("env_dir", "env")


def link_env_dir(target: Path, cache: Path) -> None:
    """Point `target` (asv's env_dir) at the persistent `cache` directory."""
    cache.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        print(f"gpu_setup: {target} is a real directory; leaving it (not cached)")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(cache.resolve(), target_is_directory=True)


def job_env(root: Path, purpose: str, wheelhouse: Path | None) -> dict[str, str]:
    """Variables the later steps of the job need."""
    triton = root / purpose / "triton"
    triton.mkdir(parents=True, exist_ok=True)
    # GPU mode (never the interpreter), and the host's torch/Triton inside asv's
    # environments (tools/asv_host_site.py, as scripts/main.sh does).
    env = {
        "TRITON_CACHE_DIR": str(triton),
        "ATTNBENCH_SMOKE": "0",
        "ATTNBENCH_HOST_SITE": host_tool("asv_host_site.py", "--print"),
    }
    if wheelhouse and wheelhouse.is_dir():
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse))
    return env


def host_tool(*args: str) -> str:
    """Run one of the project's tools/ scripts with this interpreter; its stdout."""
    tool = ROOT / "tools" / args[0]
    res = subprocess.run([sys.executable, str(tool), *args[1:]], check=True, capture_output=True,
                         text=True)  # fmt: skip
    return res.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", required=True, help="asv machine name = GPU type label")
    ap.add_argument("--purpose", choices=["main", "pr"], required=True)
    ap.add_argument(
        "--cache-root",
        type=Path,
        default=Path(os.environ.get("ATTNBENCH_CACHE", Path.home() / ".cache" / "attnbench")),
    )
    ap.add_argument("--conf", type=Path, default=Path("asv.conf.json"))
    ap.add_argument("--github-env", type=Path, help="append KEY=VALUE lines here")
    ap.add_argument("--no-machine", action="store_true", help="skip the asv machine entry")
    ap.add_argument(
        "--no-cuda-check", action="store_true", help="skip the CUDA check (tests on a CPU host)"
    )
    args = ap.parse_args(argv)

    if not args.no_cuda_check:
        try:
            print(f"gpu_setup: CUDA works: {check_cuda()}")
        except CudaUnusable as exc:
            print(f"::error::gpu_setup: CUDA does not work on this runner: {exc}")
            print(f"gpu_setup: error: CUDA does not work on this runner: {exc}", file=sys.stderr)
            return 1

    root = args.cache_root
    link_env_dir(env_dir(args.conf), root / args.purpose / "asv-env")
    wheelhouse = Path(os.environ.get("ATTNBENCH_WHEELHOUSE", root / "wheelhouse"))
    env = job_env(root, args.purpose, wheelhouse)
    if args.github_env:
        with args.github_env.open("a") as f:
            f.writelines(f"{k}={v}\n" for k, v in env.items())
    for k, v in env.items():
        print(f"gpu_setup: {k}={v}")
    if not args.no_machine:
        # GPU name, driver, CUDA, torch and Triton go into the machine entry.
        print(host_tool("asv_machine.py", "--machine", args.machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
