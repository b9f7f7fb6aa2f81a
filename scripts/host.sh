# Sourced by scripts/bootstrap.sh and scripts/test.sh: what kind of host this is.
#   ATTNBENCH_GPU_HOST=1|0      override the device-node test

# Exit 0 on a GPU host: an NVIDIA device node (/dev/nvidia0 ...) is present. Read from the
# device nodes, not from torch, so that a GPU host whose torch cannot see CUDA is still one.
gpu_host() {
    case "${ATTNBENCH_GPU_HOST:-}" in
        1 | true | yes) return 0 ;;
        0 | false | no) return 1 ;;
    esac
    compgen -G "/dev/nvidia[0-9]*" >/dev/null
}
