#!/usr/bin/env python3
"""Record this machine for asv, with the GPU, driver, CUDA, torch and Triton versions.

`asv machine --yes` records CPU, OS and RAM but nothing about the GPU. This writes the same
entry through asv's own API, plus `gpu`, `driver`, `cuda`, `torch` and `triton`, under NAME
in ~/.asv-machine.json ($HOME decides where). asv copies a machine's keys into every result
and offers them as filters on the site, so a figure always carries the stack it came from.

Run it with the interpreter that has asv and sees the host's torch (scripts/main.sh and
tools/gpu_asv.sh do):

    python tools/asv_machine.py --machine h200          # a GPU runner
    python tools/asv_machine.py --machine cpu-smoke     # smoke results (no GPU)

It reads versions without initializing CUDA (torch.version.cuda, nvidia-smi).
"""

import argparse
import os
import subprocess


def nvidia_smi():
    """(GPU name, driver version) of the first GPU, or None without nvidia-smi or with the
    GPUs hidden (CUDA_VISIBLE_DEVICES "" or "-1", as for the CPU tests on a GPU host:
    nvidia-smi itself ignores that variable, and a run that cannot use the GPU must not
    record one)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return None
    name, driver = (part.strip() for part in lines[0].split(",", 1))
    return f"{len(lines)}x {name}" if len(lines) > 1 else name, driver


def stack_info():
    """The keys this project adds to the machine entry."""
    import torch
    import triton

    smi = nvidia_smi()
    return {
        "gpu": smi[0] if smi else "none",
        "driver": smi[1] if smi else "none",
        "cuda": torch.version.cuda or "none",
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True, help="the machine name results go under")
    args = parser.parse_args(argv)
    from asv.machine import Machine, MachineCollection

    # `asv machine --yes --machine NAME` records only the name when NAME is not the host
    # name; asv's own defaults (os, arch, cpu, num_cpu, ram) are saved here explicitly.
    entry = {**Machine.get_defaults(), "machine": args.machine, **stack_info()}
    MachineCollection.save(args.machine, entry)
    path = MachineCollection.get_machine_file_path()
    print(f"asv_machine: {args.machine} in {path}: " + ", ".join(f"{k}={entry[k]}" for k in (
        "gpu", "driver", "cuda", "torch", "triton")))  # fmt: skip


if __name__ == "__main__":
    main()
