"""Facts about how the kernels run, shared by the kernel families."""

import os


def interpreter_active():
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1): kernels then run
    on the CPU in numpy, take CPU tensors, and cannot use compiled-only features (loops over
    a loaded trip count as `range`, libdevice)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
