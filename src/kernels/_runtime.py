"""Facts about how the kernels run, shared by the kernel families."""

import os


def interpreter_active():
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1): kernels then run
    on the CPU in numpy, take CPU tensors, and cannot use compiled-only features (loops over
    a loaded trip count as `range`, libdevice)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


# Host-side integer helpers. Triton's own `triton.cdiv` and `triton.next_power_of_2` are
# constexpr functions that also run inside kernels, and a host call through that machinery
# costs microseconds; a launch wrapper computes a few dozen of these per call.
def cdiv(a, b):
    """ceil(a / b) for ints, b > 0."""
    return -(-a // b)


def next_pow2(n):
    """The smallest power of two >= n for n >= 1 (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
