#!/usr/bin/env python3
"""Let asv's benchmark environments use the host's preinstalled torch and Triton.

asv builds a fresh virtualenv per Python version and installs only the project into it
(with --no-deps): torch and Triton, gigabytes and tied to the driver, stay where the runner
has them. A `.pth` file in the environment's site-packages appends the host's directories
to sys.path (after the environment's own, so the commit's `kernels` always wins).
VIRTUALENV_SYSTEM_SITE_PACKAGES does not do this when torch lives in a venv or conda env:
that flag exposes the base interpreter's site, not the venv's.

    python tools/asv_host_site.py --print        # with the host python: the directories
    python tools/asv_host_site.py --write ENV    # asv install_command, in the environment

--write reads ATTNBENCH_HOST_SITE (directories joined by os.pathsep), which scripts/main.sh
and tools/gpu_asv.sh export from `--print`.
"""

import argparse
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

PACKAGES = ("torch", "triton", "numpy")
PTH_NAME = "attnbench_host_site.pth"


def host_dirs():
    """The site directories holding torch, triton and numpy for this interpreter."""
    dirs = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"asv_host_site: {name} is not importable by {sys.executable}")
        site = str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)
        if site not in dirs:
            dirs.append(site)
    return dirs


def write_pth(env_dir):
    if Path(sys.prefix).resolve() != Path(env_dir).resolve():
        raise SystemExit(f"asv_host_site: run me with {env_dir}'s python, not {sys.executable}")
    dirs = [d for d in os.environ.get("ATTNBENCH_HOST_SITE", "").split(os.pathsep) if d]
    if not dirs:
        raise SystemExit(
            "asv_host_site: ATTNBENCH_HOST_SITE is not set; export it with\n"
            "  export ATTNBENCH_HOST_SITE=$(HOST_PYTHON tools/asv_host_site.py --print)\n"
            "(scripts/main.sh and tools/gpu_asv.sh do this)"
        )
    purelib = Path(sysconfig.get_paths()["purelib"])
    (purelib / PTH_NAME).write_text("".join(f"{d}\n" for d in dirs))
    print(f"asv_host_site: {purelib / PTH_NAME} -> {os.pathsep.join(dirs)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--print", action="store_true", help="print the host's directories")
    group.add_argument("--write", metavar="ENV_DIR", help="write the .pth into this environment")
    args = parser.parse_args(argv)
    if args.print:
        print(os.pathsep.join(host_dirs()))
    else:
        write_pth(args.write)


if __name__ == "__main__":
    main()
