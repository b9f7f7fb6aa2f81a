#!/usr/bin/env bash
# A queue of GPU measurements run one after another within a lease's device time, in the
# background, so that the lease goes to measurement rather than to machine starts.
#
#   bash tools/dev/gpu_queue.sh start QUEUE BUDGET_S [SECONDS]   # the first call
#   bash tools/dev/gpu_queue.sh poll [SECONDS]                   # each call after it, at once
#
# QUEUE: a file of jobs, one a line, `NAME EXPECTED_S WHERE COMMAND ...`; blank lines and
# lines starting with `#` are skipped.
#   NAME        letters, digits, `_` and `-`: the job's folder, $QUEUE_DIR/NAME.
#   EXPECTED_S  what the job takes on a warm machine: it starts only while that fits the
#               seconds left of BUDGET_S, and otherwise is skipped ("budget").
#   WHERE       `any`, or a word the GPU's name must contain (`H200`): otherwise skipped
#               ("gpu"). For figures that a bar states on one card.
#   COMMAND     bash, run from the repository root under `timeout` of twice EXPECTED_S or
#               the seconds left, whichever is less ("rc=124" when it ran out), with
#               JOB_OUT (its folder, for its files), PYTHONPATH (the wheelhouse's packages in
#               /tmp/site, src, the root) and PYTHONUNBUFFERED=1 exported.
# start: installs the test packages from the wheelhouse (WHEELHOUSE, default .whl; pip with
#   no index) into /tmp/site, then starts the queue (tools/dev/gpu_background.sh, job
#   `queue`), then polls as `poll` does.
# poll: waits up to SECONDS (default 540) for the queue to end, prints the queue's log and
#   the status of each job ended so far (ok, rc=N, budget, gpu) with its wall seconds, and
#   packs $QUEUE_DIR into
#   $OUT/queue.tgz (every job's log and files, and queue.txt, the status table). Exit 0
#   once the queue has ended, 3 while it runs.
# QUEUE_DIR: default /tmp/gpu_queue; BG_DIR as for gpu_background.sh. `run QUEUE BUDGET_S`
# is the queue itself (what `start` puts in the background).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
QUEUE_DIR=${QUEUE_DIR:-/tmp/gpu_queue}
SITE=${QUEUE_SITE:-/tmp/site}
usage() {
    sed -n '2,33p' "$0" >&2
    exit 2
}

gpu_name() {
    python3 -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' 2>/dev/null || echo none
}

# status NAME STATE WALL: one row of queue.txt.
status() { printf '%-24s %-10s %6s\n' "$1" "$2" "$3" >>"$QUEUE_DIR/queue.txt"; }

run_queue() {
    local queue=$1 budget=$2 start gpu name expected where command left limit rc t0 state
    start=$(date +%s)
    gpu=$(gpu_name)
    echo "gpu_queue: $(date -u +%FT%TZ) gpu '$gpu', budget $budget s, queue $queue"
    export PYTHONPATH=$SITE:$ROOT/src:$ROOT PYTHONUNBUFFERED=1
    while read -r name expected where command; do
        case $name in '' | '#'*) continue ;; esac
        left=$((budget - ($(date +%s) - start)))
        if [[ $where != any && $gpu != *"$where"* ]]; then
            echo "gpu_queue: $name skipped: needs $where, this is $gpu"
            status "$name" gpu -
            continue
        fi
        if [ "$expected" -gt "$left" ]; then
            echo "gpu_queue: $name skipped: expects $expected s, $left s left"
            status "$name" budget -
            continue
        fi
        mkdir -p "$QUEUE_DIR/$name"
        echo "gpu_queue: $name started ($left s left): $command"
        t0=$(date +%s)
        limit=$((2 * expected < left ? 2 * expected : left))
        JOB_OUT=$QUEUE_DIR/$name timeout --kill-after=10 "$limit" bash -c "$command" \
            >"$QUEUE_DIR/$name/log" 2>&1 </dev/null
        rc=$?
        [ $rc = 0 ] && state=ok || state=rc=$rc
        echo "gpu_queue: $name $state in $(($(date +%s) - t0)) s"
        status "$name" "$state" $(($(date +%s) - t0))
    done <"$queue"
    echo "gpu_queue: done in $(($(date +%s) - start)) s"
}

poll_queue() {
    local wait_s=${1:-540} rc
    BG_TAIL=${BG_TAIL:-40} bash tools/dev/gpu_background.sh poll queue "$wait_s"
    rc=$?
    [ -f "$QUEUE_DIR/queue.txt" ] && cat "$QUEUE_DIR/queue.txt"
    if [ -n "${OUT:-}" ]; then
        cp "${BG_DIR:-/tmp/gpu_bg}/queue/log" "$QUEUE_DIR/queue.log" 2>/dev/null
        tar czf "$OUT/queue.tgz" -C "$QUEUE_DIR" . && ls -l "$OUT/queue.tgz"
    fi
    return $rc
}

[ $# -ge 1 ] || usage
case $1 in
start)
    [ $# -ge 3 ] || usage
    queue=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
    [ -f "$queue" ] || { echo "gpu_queue: no queue file $2" >&2; exit 2; }
    rm -rf "$QUEUE_DIR" && mkdir -p "$QUEUE_DIR"
    printf '%-24s %-10s %6s\n' job status wall_s >"$QUEUE_DIR/queue.txt"
    if [ -d "${WHEELHOUSE:-.whl}" ]; then
        python3 -m pip install -q --no-index --find-links "${WHEELHOUSE:-.whl}" \
            --no-compile --no-cache-dir --target "$SITE" pytest pytest-xdist \
            || echo "gpu_queue: the wheelhouse's test packages did not install"
    fi
    QUEUE_DIR=$QUEUE_DIR QUEUE_SITE=$SITE bash tools/dev/gpu_background.sh start queue -- \
        bash tools/dev/gpu_queue.sh run "$queue" "$3"
    poll_queue "${4:-540}"
    ;;
poll) poll_queue "${2:-540}" ;;
run)
    [ $# -ge 3 ] || usage
    run_queue "$2" "$3"
    ;;
*) usage ;;
esac
