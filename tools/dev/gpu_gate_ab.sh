#!/usr/bin/env bash
# The PR gate's verdict on two commits, on a GPU host, without GitHub: both stages of the
# gate step of .github/workflows/gpu-pr-gate.yml (`asv continuous`, then `ci.confirm`), with
# the settings of its env block read from the workflow file itself, so that an A/B run
# here judges as the gate would.
#
#   BASE=<commit> HEAD_REF=<commit> OUT=<dir> [BENCH=<asv -b regex>] bash tools/dev/gpu_gate_ab.sh
#
# Runs in a fresh scratch clone (AB_DIR, default /tmp/gate_ab) of AB_REPO (default this
# checkout; a git bundle works too, for a host that got the tree without its .git), never
# in this checkout's results/. Set-up as tools/gpu_asv.sh (tools/asv_host_env.sh: HOST_PY
# with CUDA torch and Triton, the wheelhouse WHEELHOUSE, default .whl, no network).
# MACHINE defaults to h200 or h100 by the GPU's name. A GATE_* variable set in the
# environment overrides the workflow's (GATE_CONFIRM_TIME_CAP=600 fits a 10-minute call
# sequence). BENCH (default: every benchmark) restricts both stages, as `asv -b`.
# DRY_RUN=1 prints the settings and the two commands, and runs nothing.
#
# Writes to $OUT: gate_ab.log, and gate.tgz (the gate/ folder as the workflow leaves it:
# continuous.log, compare.txt, suspects.json, confirm.json, final-compare.txt, ...; and the
# scratch clone's results/). Exit status: ci.confirm's (0 pass, 1 slower or lost numbers,
# 2 failures), 2 for a usage error.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WF=$ROOT/.github/workflows/gpu-pr-gate.yml
if [ -z "${BASE:-}" ] || [ -z "${HEAD_REF:-}" ]; then
    sed -n '2,21p' "$0" >&2
    exit 2
fi
# The gate's settings: each `  GATE_NAME: "value"` line of the workflow's env block, unless
# the environment already sets it.
while IFS='=' read -r name value; do
    [ -n "${!name+x}" ] || declare "$name=$value"
done < <(sed -n 's/^  \(GATE_[A-Z_]*\): "\(.*\)"$/\1=\2/p' "$WF")
for name in GATE_FACTOR GATE_EXTRA_ARGS GATE_CONFIRM_ROUNDS GATE_CONFIRM_SUSPECT \
    GATE_CONFIRM_FACTOR GATE_CONFIRM_SURE GATE_CONFIRM_BATCH GATE_CONFIRM_TIME_CAP \
    GATE_HOST_FACTOR GATE_HOST_QUANTILE; do
    [ -n "${!name+x}" ] || { echo "gpu_gate_ab: $name not found in $WF" >&2; exit 2; }
done
if [ -z "${MACHINE:-}" ]; then
    MACHINE=h200
    nvidia-smi -L 2>/dev/null | grep -q H100 && MACHINE=h100
fi
B=()
[ -n "${BENCH:-}" ] && B=(-b "$BENCH")
# shellcheck disable=SC2206  # GATE_EXTRA_ARGS is a list of arguments, as in the workflow
CONTINUOUS=(continuous --machine "$MACHINE" --factor "$GATE_FACTOR" $GATE_EXTRA_ARGS
    "${B[@]}" --show-stderr)
CONFIRM=(--machine "$MACHINE" --rounds "$GATE_CONFIRM_ROUNDS"
    --suspect "$GATE_CONFIRM_SUSPECT" --factor "$GATE_CONFIRM_FACTOR"
    --host-factor "$GATE_HOST_FACTOR" --host-quantile "$GATE_HOST_QUANTILE"
    --sure "$GATE_CONFIRM_SURE" --batch "$GATE_CONFIRM_BATCH"
    --time-cap "$GATE_CONFIRM_TIME_CAP" --out gate)
if [ "${DRY_RUN:-0}" = 1 ]; then
    # shell-quoted, so that the words read back as they would be passed
    printf 'asv'; printf ' %q' "${CONTINUOUS[@]}" "$BASE" "$HEAD_REF"; echo
    printf 'python -m ci.confirm'; printf ' %q' "${CONFIRM[@]}" --base "$BASE" --head "$HEAD_REF"
    echo
    exit 0
fi

OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/gate_ab.log") 2>&1
START=$(date +%s)
STAGES=ab DEADLINE_S=999999 SUMMARY=$OUT/summary.txt
export WHEELHOUSE
WHEELHOUSE=$(cd "${WHEELHOUSE:-.whl}" 2>/dev/null && pwd) || WHEELHOUSE=
AB_DIR=${AB_DIR:-/tmp/gate_ab}
rm -rf "$AB_DIR"
git clone -q "${AB_REPO:-$ROOT}" "$AB_DIR" || exit 2
cd "$AB_DIR" || exit 2
base=$(git rev-parse --verify "$BASE^{commit}") || exit 2
head=$(git rev-parse --verify "$HEAD_REF^{commit}") || exit 2
git checkout -q "$head" || exit 2
source tools/asv_host_env.sh || exit 2
note "gpu_gate_ab: $(date -u +%FT%TZ) base $base head $head machine $MACHINE"
"$HOST_PY" tools/asv_machine.py --machine "$MACHINE" | tee -a "$SUMMARY"
mkdir -p gate
"${ASV[@]}" "${CONTINUOUS[@]}" "${LM[@]}" "$base" "$head" 2>&1 | tee gate/continuous.log
code=${PIPESTATUS[0]}
note "gpu_gate_ab: stage 1 exit $code after $(elapsed) s"
"${ASV[@]}" compare --machine "$MACHINE" --factor "$GATE_FACTOR" "$base" "$head" \
    >gate/compare.txt || true
# asv is importable through PYTHONPATH only (asv_host_env.sh): keep it for ci.confirm's asv.
"$HOST_PY" -m ci.confirm "${CONFIRM[@]}" --base "$base" --head "$head" \
    --continuous-log gate/continuous.log --continuous-code "$code" \
    --stage1-compare gate/compare.txt --asv "${ASV[*]}" --run-args "${LM[*]}"
code=$?
note "gpu_gate_ab: verdict exit $code after $(elapsed) s"
tar czf "$OUT/gate.tgz" gate results
exit "$code"
