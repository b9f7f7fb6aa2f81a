"""The asv benchmark suite (see docs/benchmarks.md).

Modules: `nsa` (NSA selection forward/backward), `kda` (KDA chain-verify and its value-tile
sweep), `ceilings` (the device's matmul and copy rates), `common` (the shared machinery:
modes, timing, VRAM, the device base class). Importing the package reads the
mode switches (ATTNBENCH_SMOKE, ATTNBENCH_SUITE) and sets TRITON_INTERPRET for smoke runs
before any kernel module is imported.
"""

from . import common  # noqa: F401  (mode switches first)
