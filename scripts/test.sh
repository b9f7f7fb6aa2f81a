#!/usr/bin/env bash
# The README's test command: set-up, lint, format check, then the whole test suite.
# Without a GPU, tests marked `gpu` are skipped and kernels run under Triton's interpreter.
# On a GPU host the CPU tests run with the GPU hidden, then the `gpu` tests on the GPU.
# pytest runs one worker per CPU core (pytest-xdist; PYTEST_WORKERS overrides, 0 runs in this
# process); each test file stays on one worker, so a module's fixtures are built once, and
# files go out in their collection order (not most-tests-first, which would leave the
# longest file, the asv end-to-end one with few tests, until last).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/ci_tools.sh
VPY=.venv/bin/python
echo "== ruff check"
"$VPY" -m ruff check .
echo "== ruff format --check"
"$VPY" -m ruff format --check .
PYTEST=("$VPY" -m pytest --dist loadfile --no-loadscope-reorder)
# shellcheck source=scripts/host.sh
. scripts/host.sh
if gpu_host; then
    # Two passes on a GPU host. The CPU tests run as on a CPU host: the GPU hidden, kernels
    # under Triton's interpreter (which reads TRITON_INTERPRET when a kernel is decorated,
    # so it holds for a whole process). Then the tests marked `gpu` run on the GPU, and a
    # torch that cannot see it fails them instead of skipping them.
    # Both passes always run, so one command reports every failure; the command then exits
    # with the first failing pass's code. A pass that selects nothing (exit 5: arguments
    # naming only the other pass's tests) is no failure.
    status=0
    run_pass() { "$@" || { local rc=$?; [ "$rc" -eq 5 ] || [ "$status" -ne 0 ] || status=$rc; }; }
    echo "== pytest: CPU tests (GPU hidden, kernels under Triton's interpreter)"
    run_pass env CUDA_VISIBLE_DEVICES="" "${PYTEST[@]}" -n "${PYTEST_WORKERS:-auto}" \
        -m "not gpu" "$@"
    # Fewer workers share the GPU: each is a CUDA context, and the few tests that time
    # calls see the others' kernels.
    echo "== pytest: GPU tests"
    run_pass env ATTNBENCH_REQUIRE_GPU=1 "${PYTEST[@]}" -n "${PYTEST_GPU_WORKERS:-4}" \
        -m gpu "$@"
    exit "$status"
else
    echo "== pytest"
    "${PYTEST[@]}" -n "${PYTEST_WORKERS:-auto}" "$@"
fi
