"""One run of the seed's backward sweep against kernels.nsa: the seed's own `bench_seqlen`
(its timer: one `selection_backward_triton(q, k, v, idx, bs, do, o)` call with lse=None,
sync to sync, median of 3), unchanged, at chosen T; prints `T:kernel_ms` per T on one line.

    PYTHONPATH=src python3 -m tools.dev.gpu_seed_backward SEED_FILE [T ...]   (T: 512 1024 2048)

SEED_FILE: the seed script (`bench_kernel_backward.py`; a first line holding only the
file's name, as the shared copy has, is skipped). Our functions go in under the seed's
module names (`nsa_selection_kernel`, `nsa_selection_backward`); where matplotlib is
missing a stand-in takes its place (this runs no plot). The issue's figure is the median
over 5 runs, each a fresh process.
"""

import sys
import types

import kernels.nsa as nsa


def _seed_module(path):
    sys.modules["nsa_selection_kernel"] = types.SimpleNamespace(
        selection_forward_triton=nsa.selection_forward_triton,
        selection_forward_reference=nsa.selection_forward_reference,
    )
    sys.modules["nsa_selection_backward"] = types.SimpleNamespace(
        selection_backward_triton=nsa.selection_backward_triton
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        mpl = types.ModuleType("matplotlib")
        mpl.use = lambda *args, **kwargs: None
        mpl.pyplot = types.ModuleType("matplotlib.pyplot")
        sys.modules["matplotlib"], sys.modules["matplotlib.pyplot"] = mpl, mpl.pyplot
    with open(path) as fh:
        src = fh.read()
    first, rest = src.split("\n", 1)
    if first.strip().endswith(".py") and " " not in first.strip():
        src = rest
    mod = types.ModuleType("seed_backward")  # __name__ is not "__main__": main() stays unrun
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    mod = _seed_module(sys.argv[1])
    seq_lens = [int(t) for t in sys.argv[2:]] or [512, 1024, 2048]
    import torch

    # As the seed's main() does before its sweep: cuBLAS initialised.
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    (w @ w).sum().backward()
    torch.cuda.synchronize()
    print(" ".join(f"{T}:{mod.bench_seqlen(T)['kernel_ms']:.3f}" for T in seq_lens))


if __name__ == "__main__":
    main()
