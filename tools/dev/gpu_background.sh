#!/usr/bin/env bash
# Run a command longer than one device call (10 minutes): start it in the background on the
# GPU host, then poll it from the next calls. The host stays leased while calls follow each
# other closely, and is given back (the job with it) when it sits idle, so a poll should
# follow the previous call at once.
#
#   bash tools/dev/gpu_background.sh start NAME -- COMMAND [ARG ...]
#   bash tools/dev/gpu_background.sh poll NAME [SECONDS]     (default 540)
#
# start: runs COMMAND in its own session (setsid), from the current directory, its output
# prefixed with the wall-clock time, in $BG_DIR/NAME/log (BG_DIR: default /tmp/gpu_bg).
# poll: waits up to SECONDS for the job to end, then prints the elapsed time and the log's
# last lines; once it has ended, "DONE rc=N wall=S s", and the log is copied to $OUT (when
# set). Exit status: 0 when done, 3 while still running, 2 for a usage error.
set -u
BG_DIR=${BG_DIR:-/tmp/gpu_bg}
usage() {
    sed -n '2,15p' "$0" >&2
    exit 2
}
[ $# -ge 2 ] || usage
verb=$1 name=$2
shift 2
dir=$BG_DIR/$name
case $verb in
start)
    [ "${1:-}" = "--" ] || usage
    shift
    [ $# -ge 1 ] || usage
    rm -rf "$dir" && mkdir -p "$dir"
    date +%s >"$dir/start"
    # The job's status and end time are written by the job itself, after COMMAND exits.
    setsid bash -c '
        dir=$1; shift
        "$@" 2>&1 | while IFS= read -r line; do printf "%s %s\n" "$(date +%H:%M:%S)" "$line"; done >"$dir/log"
        echo "${PIPESTATUS[0]}" >"$dir/rc"
        date +%s >"$dir/end"
    ' bash "$dir" "$@" </dev/null >/dev/null 2>&1 &
    echo "gpu_background: started $name (log $dir/log)"
    ;;
poll)
    [ -f "$dir/start" ] || { echo "gpu_background: no job named $name" >&2; exit 2; }
    wait_s=${1:-540}
    for _ in $(seq 1 "$wait_s"); do
        [ -f "$dir/end" ] && break
        sleep 1
    done
    start=$(cat "$dir/start")
    echo "gpu_background: $name, $(( $(date +%s) - start )) s since start"
    tail -n "${BG_TAIL:-15}" "$dir/log" 2>/dev/null
    if [ -f "$dir/end" ]; then
        echo "DONE rc=$(cat "$dir/rc") wall=$(( $(cat "$dir/end") - start )) s"
        if [ -n "${OUT:-}" ]; then cp "$dir/log" "$OUT/$name.log"; fi
        exit 0
    fi
    echo "RUNNING"
    exit 3
    ;;
*) usage ;;
esac
