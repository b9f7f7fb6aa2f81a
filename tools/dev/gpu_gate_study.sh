#!/usr/bin/env bash
# The regression gate's own numbers on a GPU host: noise, A/A false positives, detection.
#
#   OUT=/some/dir bash tools/dev/gpu_gate_study.sh                       # all stages
#   OUT=/some/dir STAGES=noise bash tools/dev/gpu_gate_study.sh          # one stage
#
# Same set-up as tools/gpu_asv.sh (tools/asv_host_env.sh: wheelhouse in .whl/, HOST_PY with
# CUDA torch and Triton, no network). Everything runs in a scratch repository,
# $STUDY/repo (tools/dev/gate_study.py clone: commit gate-base = this working tree, gate-aa = base
# + a docs-only commit), never in this checkout's history or results/.
#
# Stages (STAGES, default "noise aa detect"); each resumes where an earlier call stopped
# (state in $STUDY, default .asv/gate_study, kept while the machine is):
#   noise   `asv run gate-base^! --append-samples` on NOISE_BENCH (asv -b regex, default
#           every timing: track_time, track_time_cold and the host-paced track_time_eager
#           and track_time_host, whose own gate factor this sets), one fresh process per
#           point per call of asv run, until NOISE_N (default 5) processes per point; then
#           the CV of the per-process medians. About 2 min per round for the default
#           suite's graph and cold timings; the host-paced ones add to it (not timed yet).
#   aa      `asv continuous gate-base gate-aa --factor FACTOR -b AA_BENCH` (default the same
#           timings), AA_TRIES times (default 3): every flag is a false positive.
#           About 4 min per try.
#   detect  calibration first (tools/dev/gate_study.py calibrate, 2 to 4 min per kernel): the
#           EXTRA amounts that slow the NSA forward and the fused KDA verify kernels by
#           DETECT_TARGETS percent (default "1 2 5 10") at their reference points, and the
#           slowdown each amount gives at every gated point; then, for each kernel and
#           amount, DETECT_TRIES (default 3) times `asv continuous gate-base <slowed commit>
#           --factor FACTOR -b <that kernel's points>`. About 1 min per try.
# Anything past DEADLINE_S seconds (default 540) is skipped with a note, so one call fits a
# 10-minute limit; call again for the rest.
#
# Other knobs: MACHINE (default h200), FACTOR (default 1.015, the gate's), DETECT_KERNELS
# (default "nsa_loop kda_loop"; also nsa, kda, kda_ahead, nsa_paper_loop, nsa_bwd_loop,
# kda_unfused_loop, and the host-side nsa_host and nsa_launch), CONT_ARGS (more `asv continuous`
# arguments for aa and detect, default the gate's "-a rounds=2 --interleave-rounds";
# CONT_ARGS= for one process per side),
# CONFIRM_ROUNDS (default 6, the gate's; 0: stage 1 alone): the gate's second stage,
# ci.confirm, after every aa and detect try. Every suspect is judged, in batches of
# CONFIRM_MAX (default 8, the gate's GATE_CONFIRM_BATCH: the stage-2 batch size, ci.confirm's
# --batch) points per asv run, under ci.confirm's time cap (CONFIRM_TIME_CAP seconds, default
# ci.confirm's --time-cap, the gate's 30 min: past it the rest are listed unjudged); each
# gets CONFIRM_ROUNDS more processes per side and is judged at CONFIRM_FACTOR (1.006), a
# host-paced figure by its CONFIRM_HOST_QUANTILE (0.1) quantile at CONFIRM_HOST_FACTOR
# (default the gate's GATE_HOST_FACTOR, 1.08, or CONFIRM_FACTOR when that is higher:
# ci.confirm takes no host factor below it); a
# suspect's stage-1 ratio is beyond CONFIRM_SUSPECT (1.005); a stage-1 flag at CONFIRM_SURE
# (default the gate's 1.03, ci.confirm's --sure) or more with non-overlapping intervals stays
# flagged without a re-run. The records then hold the
# two-stage verdict, stage 1's beside it. An A/A try takes 6.5-9 min with it, 6 without.
# CALIBRATION_FROM (a directory holding an earlier call's calibration-<kernel>.json, used
# instead of calibrating again: a fresh machine saves the 2 to 4 min; DETECT_EXTRAS_<KERNEL>
# amounts it lacks are tried uncalibrated, "n/c" in the tables: asv's ratios alone),
# SWEEP_FACTORS (the summary's post-hoc factor sweep; factors below FACTOR are skipped),
# DETECT_EXTRAS_NSA / DETECT_EXTRAS_KDA_LOOP / ... (EXTRA amounts to calibrate and test
# instead of the targets' search; with CALIBRATION_FROM, which amounts to test),
# CAL_REPS (default 3), ASV_ENV_DIR (default .asv/env, shared with tools/gpu_asv.sh), LAUNCH,
# CPU_AFFINITY (every benchmark process pinned, asv's --cpu-affinity, stage 2 included),
# WHEELHOUSE, HOST_PY, ASV_HOST_TOOLS, ATTNBENCH_SMOKE (1: the CPU smoke suite).
# Writes to $OUT: summary.md (tables), gate_study.log (everything), study.tar.gz
# (noise.json, aa.jsonl, detect.jsonl, calibration-*.json, every asv continuous log, the
# scratch repository's asv results under results/), and
# each calibration-<kernel>.json as soon as it is taken.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/gate_study.log") 2>&1
START=$(date +%s)
STAGES=${STAGES:-noise aa detect}
DEADLINE_S=${DEADLINE_S:-540}
MACHINE=${MACHINE:-h200}
FACTOR=${FACTOR:-1.015}
STUDY=${STUDY:-$ROOT/.asv/gate_study}
TIMINGS='\.track_time(_cold|_eager|_host)?\('
NOISE_N=${NOISE_N:-5}
NOISE_BENCH=${NOISE_BENCH:-$TIMINGS}
AA_TRIES=${AA_TRIES:-3}
AA_BENCH=${AA_BENCH:-$TIMINGS}
DETECT_TRIES=${DETECT_TRIES:-3}
DETECT_KERNELS=${DETECT_KERNELS:-nsa_loop kda_loop}
DETECT_TARGETS=${DETECT_TARGETS:-1 2 5 10}
CONT_ARGS=${CONT_ARGS--a rounds=2 --interleave-rounds}  # the gate's; CONT_ARGS= for none
CONFIRM_ROUNDS=${CONFIRM_ROUNDS:-6}  # the gate's second stage after each try (ci.confirm); 0: off
CONFIRM_SUSPECT=${CONFIRM_SUSPECT:-1.005}
CONFIRM_FACTOR=${CONFIRM_FACTOR:-1.006}
CONFIRM_SURE=${CONFIRM_SURE:-1.03}
CONFIRM_MAX=${CONFIRM_MAX:-8}  # the stage-2 batch size (ci.confirm --batch)
CONFIRM_HOST_FACTOR=${CONFIRM_HOST_FACTOR:-$(awk -v h=1.08 -v f="$CONFIRM_FACTOR" \
    'BEGIN { print (h + 0 >= f + 0) ? h : f }')}
CONFIRM_HOST_QUANTILE=${CONFIRM_HOST_QUANTILE:-0.1}  # the gate's GATE_HOST_QUANTILE
SWEEP_FACTORS=${SWEEP_FACTORS:-1.01 1.015 1.02 1.03 1.05}
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

source tools/asv_host_env.sh || exit 1
GS=("$HOST_PY" "$ROOT/tools/dev/gate_study.py")
mkdir -p "$STUDY/logs"
REPO=$STUDY/repo

note "gate_study: $(date -u +%FT%TZ) host=$(hostname) stages='$STAGES' factor=$FACTOR" \
    "smoke=$ATTNBENCH_SMOKE"
"$HOST_PY" tools/asv_machine.py --machine "$MACHINE" | tee -a "$SUMMARY"
read -r BASE AA < <("${GS[@]}" clone "$REPO" --env-dir "${ASV_ENV_DIR:-$ROOT/.asv/env}")
[ -n "${AA:-}" ] || { note "gate_study: scratch repository failed"; exit 1; }
note "gate_study: scratch repository $REPO: base $BASE, aa $AA"
cd "$REPO" || exit 1

# cont KIND LOG JSONL HEAD BENCH [record args]: one asv continuous try (and, with
# CONFIRM_ROUNDS > 0, the gate's second stage, ci.confirm), recorded; returns 1 when the
# record could not be written
cont() {
    local kind=$1 log=$2 jsonl=$3 head=$4 bench=$5 t0 rc confirm=()
    shift 5
    t0=$(date +%s)
    "${ASV[@]}" continuous "$BASE" "$head" --config gate.conf.json --machine "$MACHINE" \
        --factor "$FACTOR" -b "$bench" --show-stderr "${LM[@]}" $CONT_ARGS 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$CONFIRM_ROUNDS" -gt 0 ]; then
        # asv is importable through PYTHONPATH only (asv_host_env.sh): keep it.
        PYTHONPATH=$ROOT:${PYTHONPATH:-} "$HOST_PY" -m ci.confirm --machine "$MACHINE" \
            --base "$BASE" --head "$head" --continuous-log "$log" --continuous-code "$rc" \
            --rounds "$CONFIRM_ROUNDS" --suspect "$CONFIRM_SUSPECT" --factor "$CONFIRM_FACTOR" \
            --host-factor "$CONFIRM_HOST_FACTOR" --host-quantile "$CONFIRM_HOST_QUANTILE" --sure "$CONFIRM_SURE" --batch "$CONFIRM_MAX" \
            ${CONFIRM_TIME_CAP:+--time-cap "$CONFIRM_TIME_CAP"} \
            --out "${log%.log}-confirm" --asv "${ASV[*]}" \
            --config gate.conf.json --results results-gate --run-args "${LM[*]}" 2>&1 \
            | tee "${log%.log}-confirm.log"
        confirm=(--confirm-dir "${log%.log}-confirm")
    fi
    "${GS[@]}" record "$kind" "$log" --rc "$rc" --results results-gate --machine "$MACHINE" \
        --base "$BASE" --head "$head" --jsonl "$jsonl" --wall-s $(($(date +%s) - t0)) \
        "${confirm[@]}" "$@" | tee -a "$SUMMARY"
    # A try that left no record would be run again and again: stop the stage instead.
    [ "${PIPESTATUS[0]}" -eq 0 ] || { note "record $kind failed: $log"; return 1; }
    # The host-paced points by the gate's estimator and by per-process ones (gate_study.py
    # estimators), from the samples both stages left.
    "${GS[@]}" estimators --results results-gate --machine "$MACHINE" --base "$BASE" \
        --head "$head" >"${log%.log}-estimators.md" 2>&1 || true
}

# --- noise: one more process per point with every asv run, until NOISE_N
if has_stage noise; then
    last=0
    while :; do
        done_n=$("${GS[@]}" rounds --results results-noise --machine "$MACHINE" --commit "$BASE")
        [ "${done_n:-0}" -ge "$NOISE_N" ] && break
        in_time "noise round $((done_n + 1))" "$last" || break
        t0=$(date +%s)
        "${ASV[@]}" run "$BASE^!" --config noise.conf.json --machine "$MACHINE" \
            --record-samples --append-samples -b "$NOISE_BENCH" --show-stderr "${LM[@]}"
        rc=$?
        last=$(($(date +%s) - t0))
        note "noise round $((done_n + 1)): exit $rc, $last s wall"
        [ "$rc" -eq 0 ] || break
    done
    "${GS[@]}" noise --results results-noise --machine "$MACHINE" --commit "$BASE" \
        --out "$STUDY/noise.json" | tee -a "$SUMMARY"
fi

# --- aa: asv continuous between commits with identical kernels
if has_stage aa; then
    while :; do
        read -r n wall < <("${GS[@]}" tries "$STUDY/aa.jsonl")  # tries so far, last one's wall s
        [ "$n" -ge "$AA_TRIES" ] && break
        in_time "A/A try $((n + 1))" "$wall" || break
        cont aa "$STUDY/logs/aa-$((n + 1)).log" "$STUDY/aa.jsonl" "$AA" "$AA_BENCH" || break
    done
fi

# --- detect: calibrate, then asv continuous against each slowed commit, try-major order
if has_stage detect; then
    declare -A EXTRAS
    for k in $DETECT_KERNELS; do
        cal=$STUDY/calibration-$k.json
        override=DETECT_EXTRAS_${k^^}
        # A calibration taken by an earlier call (another machine of the same model): its
        # amounts and per-point slowdowns are used as they are, and the summary says so.
        if [ ! -f "$cal" ] && [ -n "${CALIBRATION_FROM:-}" ] \
            && [ -f "$CALIBRATION_FROM/calibration-$k.json" ]; then
            cp "$CALIBRATION_FROM/calibration-$k.json" "$cal"
            note "detect $k: calibration from $CALIBRATION_FROM, not measured in this call"
        fi
        if [ ! -f "$cal" ]; then
            # Expected seconds: the ladder search and every target (KDA, 2026-11-30: about
            # 130 s with the environment's creation), or only the given amounts.
            args=(--targets $DETECT_TARGETS) expect=240
            [ -n "${!override:-}" ] && args=(--extras ${!override}) expect=120
            in_time "calibrate $k" "$expect" || continue
            # In this checkout (the same sources as gate-base), not in the scratch repository.
            (cd "$ROOT" && "${GS[@]}" calibrate "$k" --out "$cal" "${args[@]}" \
                --reps "${CAL_REPS:-3}") || { note "calibrate $k failed"; continue; }
            # A copy comes back at once, even if a later step runs past the call's limit.
            cp "$cal" "$OUT/"
        fi
        if [ -n "${!override:-}" ] && [ -n "${CALIBRATION_FROM:-}" ]; then
            # Amounts a reused calibration never timed are tried too, with asv's ratios alone.
            added=$("${GS[@]}" uncalibrated "$cal" ${!override}) \
                || { note "detect $k: bad calibration $cal"; continue; }
            [ -z "$added" ] || note "detect $k: amounts $added not in the calibration: uncalibrated"
        fi
        EXTRAS[$k]=$("${GS[@]}" amounts "$cal")
        if [ -n "${!override:-}" ]; then  # only the given amounts (of a reused calibration)
            keep=() && for e in ${EXTRAS[$k]}; do
                [[ " ${!override} " == *" $e "* ]] && keep+=("$e")
            done
            EXTRAS[$k]=${keep[*]}
        fi
        note "detect $k: EXTRA amounts ${EXTRAS[$k]} ($cal)"
    done
    jsonl=$STUDY/detect.jsonl
    for t in $(seq 1 "$DETECT_TRIES"); do
        for k in $DETECT_KERNELS; do
            for e in ${EXTRAS[$k]:-}; do
                read -r n _ < <("${GS[@]}" tries "$jsonl" --kernel "$k" --extra "$e" --try "$t")
                [ "$n" -gt 0 ] && continue
                read -r _ wall < <("${GS[@]}" tries "$jsonl")
                in_time "detect $k +$e try $t" "$wall" || break 3
                head=$("${GS[@]}" slow "$REPO" "$k" "$e") \
                    || { note "slow commit $k $e failed"; continue; }
                cont detect "$STUDY/logs/detect-$k-$e-$t.log" "$jsonl" "$head" \
                    "$("${GS[@]}" regex "$k")" --kernel "$k" --extra "$e" --try "$t" || break 3
            done
        done
    done
fi

# --- what comes back: the tables, then this call's notes
note "gate_study: done in $(elapsed) s"
{
    "${GS[@]}" summary "$STUDY" --factor "$FACTOR" --factors $SWEEP_FACTORS --min-slowdown 1
    printf '\n## This call\n\n```\n'
    cat "$SUMMARY"
    printf '```\n'
} >"$OUT/summary.md"
rm -f "$SUMMARY"
# The scratch repository's asv results go too (results/results-gate, results/results-noise):
# their per-process samples are what a flag is analysed from afterwards.
mkdir -p "$STUDY/results"
for r in results-gate results-noise; do
    [ -d "$REPO/$r" ] && cp -r "$REPO/$r" "$STUDY/results/"
done
tar czf "$OUT/study.tar.gz" -C "$STUDY" --exclude ./repo .
echo "gate_study: files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
