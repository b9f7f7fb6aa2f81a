"""Device ceilings: the dense matmul rate and the device copy rate of this run's machine.

They use no kernel package: each measures the device itself, in the same run and on the
same machine as the kernels' figures. tools/report.py divides by them (the NSA kernels'
TFLOP/s as % of the matmul rate, the KDA verify's bytes per cold call as % of the copy
rate, each against the ceiling of the same commit; docs/benchmarks.md, "Derived figures").
Higher is better, so they are not gated. They run in the nightly sweep and in smoke mode
(`common.FULL_SUITE`), so CI exercises their plumbing, and the matmul rate also in the
seed's view (`common.VIEW`; `nsa.VIEW_BENCHMARKS` selects it), whose report gives the
kernels' TFLOP/s as a share of it.
"""

import torch

from .common import (
    DEVICE,
    DTYPE,
    FULL_SUITE,
    SMOKE,
    VIEW,
    generator,
    median,
    metric,
    per_call_seconds,
    randn,
    require_device,
)

# A ceiling takes the median of fewer samples than a kernel's time (common.SAMPLES): it is
# a denominator read beside the figures, never compared between commits by the gate.
DERIVED_SAMPLES = 3 if SMOKE else 5


def matmul_tflops():
    """Dense matmul rate of this device now (TFLOP/s): bf16 8192^3 on a GPU, fp32 256^3 in smoke."""
    n = 256 if SMOKE else 8192
    gen = generator(1)
    a, b = randn(gen, n, n), randn(gen, n, n)
    out = torch.empty(n, n, device=DEVICE, dtype=DTYPE)
    fn = lambda: torch.matmul(a, b, out=out)
    samples = per_call_seconds([fn], calls=4, samples=DERIVED_SAMPLES)
    return 2 * n**3 / median(samples) / 1e12


def copy_bytes_per_s():
    """Device copy rate of this device now (bytes read + written per second): a 256 MiB
    buffer (larger than L2) copied into another on a GPU, 1 MiB in smoke."""
    n = (1 << 20 if SMOKE else 256 << 20) // 4
    src = torch.ones(n, device=DEVICE, dtype=torch.float32)
    dst = torch.empty_like(src)
    samples = per_call_seconds([lambda: dst.copy_(src)], calls=4, samples=DERIVED_SAMPLES)
    return 2 * src.numel() * src.element_size() / median(samples)


class _Ceiling:
    """A device ceiling measured in the same run on the same machine (displayed beside the
    kernels' figures; higher is better, so it is not gated)."""

    version = "1"
    timeout = 120

    def setup(self):
        require_device()


if FULL_SUITE:

    class CopyRate(_Ceiling):
        """The device copy rate: the ceiling of memory-bound kernels (tools/report.py
        gives the KDA verify's bytes per cold call as % of this value of the same commit)."""

        @metric("GB/s")
        def track_copy_gb_per_s(self):
            return copy_bytes_per_s() / 1e9


if FULL_SUITE or VIEW:

    class Matmul(_Ceiling):
        """The dense bf16 matmul ceiling (tools/report.py gives the NSA kernels' TFLOP/s as %
        of this value of the same commit)."""

        @metric("TFLOP/s")
        def track_bf16_tflops(self):
            return matmul_tflops()
