"""Test configuration shared by every test module.

Without a CUDA GPU, Triton kernels run under Triton's interpreter (numpy on the CPU).
The switch is read when a kernel is *decorated*, so it is set here, before any test
module imports `kernels`. The interpreter is right for fp32/fp16 but wrong for bf16,
so bf16 checks are marked `gpu` and run on a GPU only.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Every keyed launch (kernels._runtime.launch) also checks that its caller's key stands for
# one specialization only: a key that leaves something out fails the test that meets it.
os.environ.setdefault("ATTNBENCH_CHECK_LAUNCH_KEYS", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_configure(config):
    # scripts/test.sh's GPU pass on a GPU host: a torch that cannot see the GPU fails the
    # run instead of skipping every GPU test.
    if os.environ.get("ATTNBENCH_REQUIRE_GPU") == "1" and not HAS_CUDA:
        raise pytest.UsageError(
            "ATTNBENCH_REQUIRE_GPU=1 (a GPU host), but torch.cuda.is_available() is False: "
            "check the driver and that .venv's torch is a CUDA build"
        )


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run: the GPU when there is one, else the CPU (interpreter)."""
    return DEVICE


@pytest.fixture(params=[torch.float32, torch.float16], ids=["fp32", "fp16"])
def cpu_dtype(request):
    """The dtypes every kernel is checked in everywhere (bf16 is GPU-only)."""
    return request.param
