"""What the pieces of an eager call cost the host on a GPU box: allocations, fills, event
pairs and one Triton launch through `kernels._runtime.launch`'s direct path, with pointer
arguments given as tensors or as plain integers (Triton's launcher asks the driver about
every tensor pointer, `cuPointerGetAttribute`; an integer it takes as it is).

    PYTHONPATH=src:. python3 -m tools.dev.gpu_launch_cost [--out DIR]   (about 20 s)

Each figure is the suite's `track_time_host` timer (`benchmarks.common.host_seconds`: calls
issued behind a device sleep that outlasts them), median of its samples, us per operation.
"""

import argparse
import json
import pathlib
import statistics

import torch
import triton
import triton.language as tl

from benchmarks.common import host_seconds
from kernels import _runtime


@triton.jit
def _touch_kernel(
    p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, n0, n1, n2, n3,
    N_PTRS: tl.constexpr,
):  # fmt: skip
    # Reads nothing; one program stores one value, so each launch's device time is minimal.
    tl.store(p0 + tl.program_id(0), n0 + n1 + n2 + n3 + N_PTRS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device("cuda")
    bufs = [torch.zeros(1024, dtype=torch.int32, device=dev) for _ in range(16)]
    ints = (5, 7, 4096, 16)
    rows = {}

    def time(name, fn, ops=1):
        samples = host_seconds([fn], max(ops, 1))
        rows[name] = statistics.median(samples) * 1e6
        print(f"{name:44} {rows[name]:8.2f} us", flush=True)

    stream = torch.cuda.current_stream().cuda_stream
    for n_ptrs in (4, 16):
        tensors = bufs[:n_ptrs] + [bufs[0]] * (16 - n_ptrs)
        key = _runtime.launch_key("touch", n_ptrs)
        compiled = _runtime.launch(_touch_kernel, (1,), *tensors, *ints, N_PTRS=n_ptrs, key=key)
        addrs = [t.data_ptr() for t in tensors]
        run = compiled.run
        fixed = (1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None)
        torch.cuda.synchronize()
        time(
            f"compiled.run, {n_ptrs} distinct tensor pointers",
            lambda: run(*fixed, *tensors, *ints, n_ptrs),
        )
        time(f"compiled.run, {n_ptrs} pointers as ints", lambda: run(*fixed, *addrs, *ints, n_ptrs))
        c_launch, head = _runtime._launcher(compiled)  # Triton's C launcher, where it may
        time(
            f"_runtime._launcher's function, {n_ptrs} pointers as ints",
            lambda: c_launch(1, 1, 1, stream, compiled.function, *head, *addrs, *ints, n_ptrs),
        )
        time(
            f"_runtime.launch (keyed), {n_ptrs} pointers",
            lambda: _runtime.launch(_touch_kernel, (1,), *tensors, *ints, key=key),
        )
        options = {"N_PTRS": n_ptrs}
        args = (*tensors, *ints)
        _runtime.Call(key, dev).launch(_touch_kernel, (1,), args, options)  # fills the table
        call = _runtime.Call(key, dev)
        time(
            f"Call.launch, {n_ptrs} pointers",
            lambda: call.launch(_touch_kernel, (1,), args, options),
        )
        time(
            f"Call(key) and one Call.launch, {n_ptrs} pointers",
            lambda: _runtime.Call(key, dev).launch(_touch_kernel, (1,), args, options),
        )
    q_shape = (1, 16, 4096, 64)
    time(
        "torch.empty o [1,16,4096,64] bf16",
        lambda: torch.empty(q_shape, dtype=torch.bfloat16, device=dev),
        0,
    )
    time("torch.empty 4 MB uint8", lambda: torch.empty(4 << 20, dtype=torch.uint8, device=dev), 0)
    time(
        "torch.full 1 MB int32 -1",
        lambda: torch.full((1 << 18,), -1, dtype=torch.int32, device=dev),
    )
    time("torch.zeros 64 KB int32", lambda: torch.zeros(1 << 14, dtype=torch.int32, device=dev))
    words_1mb = torch.empty(1 << 18, dtype=torch.int32, device=dev)
    time("fill_(-1) of an int32 1 MB tensor", lambda: words_1mb.fill_(-1))
    # The same -1 fill as one driver memset on the current stream (what a direct forward does).
    at, n = words_1mb.data_ptr(), words_1mb.numel()
    words_1mb.zero_()
    time(
        "_runtime.fill_int32 (cuMemsetD32Async) int32 1 MB -1",
        lambda: _runtime.fill_int32(at, -1, n, stream),
    )
    torch.cuda.synchronize()
    assert bool((words_1mb == -1).all()), "fill_int32 did not write -1"
    big = torch.empty(4 << 20, dtype=torch.uint8, device=dev)
    time(
        "view of a byte buffer as int32 [4, 1024]",
        lambda: big[4096:20480].view(torch.int32).view(4, 1024),
        0,
    )
    words = big.view(torch.int32)
    time(
        "as_strided of an int32 buffer [4, 1024]",
        lambda: words.as_strided((4, 1024), (1024, 1), 4096),
        0,
    )
    side = torch.cuda.Stream()
    e1, e2 = torch.cuda.Event(), torch.cuda.Event()

    def fork_join():
        e1.record()
        side.wait_event(e1)
        e2.record(side)
        e2.wait()

    time("fork and join (two records, two waits)", fork_join, 4)
    cur = torch.cuda.current_stream()

    def fork_join_given():
        e1.record(cur)
        side.wait_event(e1)
        e2.record(side)
        cur.wait_event(e2)

    time("fork and join on a given current stream", fork_join_given, 4)
    time("torch.cuda.current_stream()", torch.cuda.current_stream, 0)
    time("x.data_ptr()", bufs[0].data_ptr, 0)
    if a.out:
        out = pathlib.Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__)  # fmt: skip
        (out / "launch_cost.json").write_text(json.dumps(dict(meta=meta, us=rows), indent=1))


if __name__ == "__main__":
    main()
