#!/usr/bin/env bash
# The asv suite on an offline GPU host with its own torch and Triton, in one command.
#
#   OUT=/some/dir bash tools/gpu_asv.sh
#
# Needs: a wheelhouse in .whl/ (tools/build_wheelhouse.sh: asv, asv_runner, virtualenv and
# asv's environment base requirements for cp312 manylinux x86_64) and a host interpreter
# with CUDA torch and Triton (HOST_PY, default /opt/torch/.venv/bin/python3). No network.
#
# Stages (STAGES, default "run compare continuous publish"):
#   precheck    always: imports the suite without touching CUDA (forkserver safety) and
#               counts the benchmark processes of one commit
#   run         asv run, one commit at a time (the last COMMITS, default 3), each timed;
#               commits already in results/ are skipped, so a second call resumes
#   compare     asv compare HEAD~1 HEAD from the stored samples (an A/A when src/ did not
#               change between them; free: nothing is re-run)
#   continuous  asv continuous HEAD~1 HEAD on CONT_BENCH (a regex; default the NSA forward
#               and KDA verify times), the PR gate as CI runs it; only if src/ is unchanged
#   publish     asv publish and tools/report.py
# Anything past DEADLINE_S seconds (default 540) is skipped with a note, so that one call
# fits a 10-minute limit; a second call with STAGES="continuous publish" picks up the results
# a first call left in results/.
#
# Other knobs: MACHINE (default h200), ATTNBENCH_SUITE=nightly, BENCH (asv -b regex for run),
# FACTOR (default 1.015, the gate's), CONT_ARGS (more `asv continuous` arguments, default the
# gate's "-a rounds=2 --interleave-rounds"; CONT_ARGS= for one process per side), LAUNCH
# (asv --launch-method, default from asv.conf.json), WHEELHOUSE (default .whl).
# Writes to $OUT (at most 6 files): summary.txt, gpu_asv.log, results.tar.gz,
# report.tar.gz, html.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_asv.log") 2>&1
START=$(date +%s)
STAGES=${STAGES:-run compare continuous publish}
COMMITS=${COMMITS:-3}
DEADLINE_S=${DEADLINE_S:-540}
MACHINE=${MACHINE:-h200}
FACTOR=${FACTOR:-1.015}
CONT_ARGS=${CONT_ARGS--a rounds=2 --interleave-rounds}
CONT_BENCH=${CONT_BENCH:-NsaForward.track_time|KdaVerify.track_time}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

# --- tools (asv, virtualenv), environment, helpers: shared with tools/dev/gpu_gate_study.sh
source tools/asv_host_env.sh || exit 1
B=()
[ -n "${BENCH:-}" ] && B=(-b "$BENCH")
mkdir -p "results/$MACHINE"
export ATTNBENCH_NA_LOG=$PWD/results/$MACHINE/na_reasons.jsonl  # OOM points (ci/na_reasons.py)

note "gpu_asv: $(date -u +%FT%TZ) host=$(hostname) stages='$STAGES' suite=${ATTNBENCH_SUITE:-default}"
note "gpu_asv: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
"$HOST_PY" tools/asv_machine.py --machine "$MACHINE" | tee -a "$SUMMARY"

# --- precheck: no CUDA before the fork; how many processes one commit costs
"$HOST_PY" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import inspect, itertools, math
import torch
import benchmarks.common as c
from benchmarks import ceilings, kda, nsa
assert not torch.cuda.is_initialized(), "the suite initialized CUDA at import (breaks forkserver)"
total = 0
for mod in (c, nsa, kda, ceilings):
    for name, cls in vars(mod).items():
        if inspect.isclass(cls) and not name.startswith("_") and cls.__module__ == mod.__name__:
            methods = [m for m in dir(cls) if m.startswith("track_")]
            if not methods:
                continue
            points = math.prod(len(p) for p in getattr(cls, "params", [])) if hasattr(cls, "params") else 1
            total += points * len(methods)
            print(f"precheck: {name}: {points} points x {len(methods)} methods")
print(f"precheck: mode={c.MODE_NAME}: {total} benchmark processes per commit (skips included); "
      f"torch {torch.__version__}, CUDA initialized at import: {torch.cuda.is_initialized()}")
EOF

# --- run: one commit at a time, timed
if has_stage run; then
    last=0  # the previous commit's wall time: the estimate for the next one
    for c in $(git rev-list --max-count="$COMMITS" HEAD | tac); do
        in_time "run $c" "$last" || break
        t0=$(date +%s)
        "${ASV[@]}" run "$c^!" --machine "$MACHINE" --record-samples --show-stderr \
            --skip-existing-commits "${LM[@]}" "${B[@]}"
        rc=$?
        last=$(($(date +%s) - t0))
        note "run $(git log -1 --format='%h %s' "$c"): exit $rc, $last s wall"
    done
fi

# --- compare / continuous: A/A when the kernels did not change between HEAD~1 and HEAD
SRC_SAME=no
git diff --quiet HEAD~1 HEAD -- src/ 2>/dev/null && SRC_SAME=yes
note "src/ unchanged between HEAD~1 and HEAD: $SRC_SAME"
if has_stage compare; then
    "${ASV[@]}" compare HEAD~1 HEAD --machine "$MACHINE" --factor "$FACTOR" --split \
        | tee -a "$SUMMARY"
    "${ASV[@]}" show HEAD --machine "$MACHINE" >>"$SUMMARY" 2>&1
fi
if has_stage continuous && in_time continuous; then
    if [ "$SRC_SAME" = yes ]; then
        t0=$(date +%s)
        "${ASV[@]}" continuous HEAD~1 HEAD --machine "$MACHINE" --factor "$FACTOR" \
            -b "$CONT_BENCH" --show-stderr "${LM[@]}" $CONT_ARGS | tee -a "$SUMMARY"
        note "continuous (A/A, -b '$CONT_BENCH'): exit ${PIPESTATUS[0]}, $(($(date +%s) - t0)) s"
    else
        note "continuous skipped: src/ changed between HEAD~1 and HEAD (not an A/A)"
    fi
fi

# --- publish, report, and what comes back
if has_stage publish; then
    "${ASV[@]}" publish && note "publish: html/ written"
    "$HOST_PY" tools/report.py --results results --out report --machine "$MACHINE" \
        | tee -a "$SUMMARY"
    "$HOST_PY" tools/site_extras.py html --report report
fi
[ -d results ] && tar czf "$OUT/results.tar.gz" results
[ -d report ] && tar czf "$OUT/report.tar.gz" report
[ -d html ] && tar czf "$OUT/html.tar.gz" html
note "gpu_asv: done in $(elapsed) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
