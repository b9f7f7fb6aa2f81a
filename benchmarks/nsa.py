"""NSA selection attention: the Triton kernels against the dense O(T^2) reference.

Axes: seq_len, impl (triton | reference), preset (head layout), pattern (block_idx).
Every process checks the Triton kernel against the reference on a small shape of the same
preset and pattern before it reports anything, so a wrong kernel never posts a fast number.
The reference's out-of-memory errors are data: those points record NaN (n/a) and the OOM
ceiling reads off the site as the first seq_len where the reference has no value.
"""

from dataclasses import dataclass

import torch

from .common import (
    DERIVED_SAMPLES,
    DEVICE,
    FULL_SUITE,
    SAMPLES,
    SMOKE,
    check_close,
    free_memory,
    generator,
    grid,
    load_api,
    matmul_tflops,
    median,
    metric,
    peak_bytes,
    per_call_seconds,
    preimport,
    randn,
    require_device,
    synchronize,
    timing_result,
)

preimport("kernels.nsa")

API = (
    "selection_forward_triton",
    "selection_backward_triton",
    "selection_forward_reference",
    "make_block_idx_recent",
    "make_block_idx_random",
)


@dataclass(frozen=True)
class Preset:
    B: int
    Hq: int
    Hkv: int
    D: int
    block_size: int
    S: int


# The seed's shape (G = 4) and the NSA paper's (G = 16); smoke runs tiny stand-ins whose
# names and seq_len values never occur on a GPU.
PRESETS = {
    "seed": Preset(B=1, Hq=16, Hkv=4, D=64, block_size=64, S=16),
    "paper": Preset(B=1, Hq=64, Hkv=4, D=64, block_size=64, S=16),
    "tiny-seed": Preset(B=1, Hq=4, Hkv=1, D=32, block_size=16, S=3),
    "tiny-paper": Preset(B=1, Hq=16, Hkv=1, D=32, block_size=16, S=3),
}
LONG_ONLY_PRESET = "paper"  # the only preset that runs at seq_len 65536 (nightly)
SMOKE_SEQ_LEN = 40  # not a multiple of the tiny block size: exercises the masks
CHECK_SEQ_LEN = SMOKE_SEQ_LEN if SMOKE else 512  # the correctness check's size
GRAPH_CALLS = 1 if SMOKE else 2  # Triton calls per captured CUDA graph


def _flops_forward(p, T):
    """Useful work of the sparse forward: QK^T and PV over S * block_size keys per query."""
    return 4 * p.B * p.Hq * T * p.S * p.block_size * p.D


class _Selection:
    """Shared parameters, inputs and metrics of the forward and backward classes."""

    params = [
        grid(
            [4096, 32768],
            nightly=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
            smoke=[SMOKE_SEQ_LEN],
        ),
        # The dense reference runs in the nightly sweep (crossover, OOM ceiling) and in smoke
        # mode; the default suite times what the gate judges, the kernels, with no skipped
        # points (each point of the grid costs a process even when it skips).
        grid(["triton"], nightly=["triton", "reference"], smoke=["triton", "reference"]),
        grid(["seed", "paper"], smoke=["tiny-seed"]),
        grid(["recent", "random"], smoke=["random"]),
    ]
    param_names = ["seq_len", "impl", "preset", "pattern"]
    timeout = 300
    flops_factor = 1.0  # work relative to the forward

    def setup(self, seq_len, impl, preset, pattern):
        p = PRESETS[preset]
        if seq_len > 32768 and preset != LONG_ONLY_PRESET:
            raise NotImplementedError("seq_len 65536 runs for the paper preset only")
        self.api = load_api("kernels.nsa", *API)
        require_device()
        if impl == "reference" and not SMOKE:
            # One fp32 [T, T] score matrix per head larger than the whole device: skip outright.
            total = torch.cuda.get_device_properties(0).total_memory
            if p.B * p.Hq * seq_len * seq_len * 4 > total:
                raise NotImplementedError("dense reference cannot fit on this device at all")
        self.p, self.T, self.impl = p, seq_len, impl
        self.oom = False
        if impl == "triton":
            self.check(self.inputs(CHECK_SEQ_LEN, pattern, seed=7))
        try:
            self.x = self.inputs(seq_len, pattern, seed=0)
            self.prepare()
            if not SMOKE:
                self.peak_fn()  # warm-up; an OOM here is recorded as n/a by every method
                synchronize()
        except torch.OutOfMemoryError:
            self.oom = True
            self.x = None
            free_memory()

    def inputs(self, T, pattern, seed):
        p, gen = self.p, generator(seed)
        if pattern == "recent":
            idx = self.api.make_block_idx_recent(p.B, p.Hkv, T, p.block_size, p.S, DEVICE)
        else:
            idx = self.api.make_block_idx_random(p.B, p.Hkv, T, p.block_size, p.S, DEVICE, seed)
        return {
            "q": randn(gen, p.B, p.Hq, T, p.D),
            "k": randn(gen, p.B, p.Hkv, T, p.D),
            "v": randn(gen, p.B, p.Hkv, T, p.D),
            "do": randn(gen, p.B, p.Hq, T, p.D),
            "idx": idx,
        }

    def samples(self, count=SAMPLES):
        fn, graph = self.timed_fn()
        calls = GRAPH_CALLS if graph else 1
        return per_call_seconds([fn], calls=calls, graph=graph, samples=count)

    def seconds(self):
        """Median per-call time for the derived figures."""
        return median(self.samples(DERIVED_SAMPLES))

    def tflops(self):
        return _flops_forward(self.p, self.T) * self.flops_factor / self.seconds() / 1e12

    @metric("seconds")
    def track_time(self, *params):
        return timing_result(self.samples())

    @metric("bytes")
    def track_peak_vram_bytes(self, *params):
        return peak_bytes(self.peak_fn)

    if FULL_SUITE:  # display-only figures: nightly sweep and smoke mode (common.FULL_SUITE)

        @metric("tokens/s")
        def track_tokens_per_s(self, *params):
            return self.p.B * self.T / self.seconds()

        @metric("TFLOP/s")
        def track_tflops(self, *params):
            return self.tflops()

        @metric("%")
        def track_pct_of_matmul(self, *params):
            return 100.0 * self.tflops() / matmul_tflops()


class NsaForward(_Selection):
    """Forward: selection_forward_triton vs selection_forward_reference (no autograd)."""

    version = "1"

    def check(self, x):
        a, bs = self.api, self.p.block_size
        got = a.selection_forward_triton(x["q"], x["k"], x["v"], x["idx"], bs)
        ref = a.selection_forward_reference(x["q"], x["k"], x["v"], x["idx"], bs)
        check_close("selection_forward_triton o", got, ref)

    def prepare(self):
        a, x, bs = self.api, self.x, self.p.block_size
        f = a.selection_forward_triton if self.impl == "triton" else a.selection_forward_reference
        self.fn = lambda: f(x["q"], x["k"], x["v"], x["idx"], bs)

    def peak_fn(self):
        with torch.no_grad():
            return self.fn()

    def timed_fn(self):
        return self.peak_fn, self.impl == "triton"


class NsaBackward(_Selection):
    """Backward: selection_backward_triton (o, lse from the forward, not timed) vs autograd
    through the dense reference. The reference's time is the backward of a retained graph;
    its peak memory covers forward + backward, since the backward needs the [T, T] graph.
    """

    version = "1"
    flops_factor = 2.5

    def check(self, x):
        a, bs = self.api, self.p.block_size
        o, lse = a.selection_forward_triton(x["q"], x["k"], x["v"], x["idx"], bs, return_lse=True)
        got = a.selection_backward_triton(x["q"], x["k"], x["v"], x["idx"], bs, x["do"], o, lse)
        ref = self.reference_grads(x)
        for name, g, r in zip(("dq", "dk", "dv"), got, ref, strict=True):
            check_close(f"selection_backward_triton {name}", g, r)

    def reference_grads(self, x, graph=None):
        """(dq, dk, dv) by autograd through the reference; `graph` reuses a retained forward."""
        leaves, o = graph or self.reference_forward(x)
        return torch.autograd.grad(o, leaves, x["do"], retain_graph=graph is not None)

    def reference_forward(self, x):
        leaves = [x[n].detach().requires_grad_(True) for n in ("q", "k", "v")]
        o = self.api.selection_forward_reference(*leaves, x["idx"], self.p.block_size)
        return leaves, o

    def prepare(self):
        a, x, bs = self.api, self.x, self.p.block_size
        if self.impl == "triton":
            qkv = (x["q"], x["k"], x["v"])
            o, lse = a.selection_forward_triton(*qkv, x["idx"], bs, return_lse=True)
            self.fn = lambda: a.selection_backward_triton(*qkv, x["idx"], bs, x["do"], o, lse)
        else:
            self.fn = lambda: self.reference_grads(x)

    def peak_fn(self):
        return self.fn()

    def timed_fn(self):
        if self.impl == "triton":
            return self.fn, True
        graph = self.reference_forward(self.x)  # retained while the backward is timed
        return (lambda: self.reference_grads(self.x, graph)), False
