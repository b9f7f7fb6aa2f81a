# Shared set-up of the GPU-host asv scripts; sourced (from the repository root) by
# tools/gpu_asv.sh and tools/dev/gpu_gate_study.sh, after they set START, STAGES, DEADLINE_S and
# SUMMARY.
#
# Reads: HOST_PY (default /opt/torch/.venv/bin/python3), WHEELHOUSE (default .whl), LAUNCH,
# CPU_AFFINITY (asv's --cpu-affinity for every benchmark process, e.g. "3": host-paced
# figures without the scheduler moving the process between cores), ATTNBENCH_SMOKE
# (default 0). Sets: HOST_PY, TOOLS, ASV (the asv command, an array), LM (the
# --launch-method and --cpu-affinity args), PYTHONPATH, PATH, ATTNBENCH_SMOKE and ATTNBENCH_HOST_SITE
# (exported), and the helpers note, elapsed, has_stage and in_time.
#
# asv, asv_runner and virtualenv come from the wheelhouse into .asv/hosttools when the host
# interpreter cannot import them; with a wheelhouse, asv's environments install from it only
# (PIP_NO_INDEX). Without one, HOST_PY must already have asv and virtualenv.

note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(($(date +%s) - START)); }
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
in_time() {  # in_time WHAT [EXPECTED_S]: would WHAT still end before DEADLINE_S?
    if [ $(($(elapsed) + ${2:-0})) -ge "$DEADLINE_S" ]; then
        note "SKIPPED $1: elapsed $(elapsed) s + expected ${2:-0} s >= DEADLINE_S=$DEADLINE_S"
        return 1
    fi
}

HOST_PY=${HOST_PY:-/opt/torch/.venv/bin/python3}
TOOLS=${ASV_HOST_TOOLS:-$PWD/.asv/hosttools}  # asv and virtualenv, when HOST_PY has none
if [ -d "${WHEELHOUSE:-.whl}" ]; then
    WHL=$(cd "${WHEELHOUSE:-.whl}" && pwd)
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=$WHL PIP_DISABLE_PIP_VERSION_CHECK=1
fi
if ! PYTHONPATH=$TOOLS "$HOST_PY" -c 'import asv, virtualenv' 2>/dev/null; then
    if [ -z "${WHL:-}" ]; then
        echo "asv_host_env: no wheelhouse (tools/build_wheelhouse.sh) and no asv in $HOST_PY"
        return 1
    fi
    "$HOST_PY" -m pip install -q --target "$TOOLS" asv==0.6.6 asv_runner==0.3.2 virtualenv \
        || return 1
fi
export PYTHONPATH=$TOOLS  # asv drops PYTHONPATH inside its environments
export PATH=$(dirname "$HOST_PY"):$TOOLS/bin:$PATH  # python3.X for virtualenv: the host's
export ATTNBENCH_SMOKE=${ATTNBENCH_SMOKE:-0}
ATTNBENCH_HOST_SITE=$("$HOST_PY" tools/asv_host_site.py --print) || return 1
export ATTNBENCH_HOST_SITE
ASV=("$HOST_PY" -m asv)
LM=()
[ -n "${LAUNCH:-}" ] && LM=(--launch-method "$LAUNCH")
[ -n "${CPU_AFFINITY:-}" ] && LM+=(--cpu-affinity "$CPU_AFFINITY")
true
