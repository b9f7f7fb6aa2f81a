#!/usr/bin/env bash
# The README's main job command: from a fresh clone, benchmark recent commits with asv and
# build the regression site.
#
#   1. scripts/bootstrap.sh (.venv with the project and its bench extra: asv, virtualenv)
#   2. the machine entry (tools/asv_machine.py: GPU, driver, CUDA, torch, Triton)
#   3. asv run over the last ATTNBENCH_COMMITS commits (default 3; commits already measured
#      on this machine are skipped): real sizes on a GPU, smoke sizes (Triton's interpreter,
#      machine "cpu-smoke") without one
#   4. the seed's view at HEAD only: a second asv run with ATTNBENCH_SUITE=view (NSA forward
#      and backward, kernel vs dense reference, seq_len 512..32768, eager per-call figures)
#      under its own machine name, "<machine>-view" (skipped when HEAD is already measured)
#   5. asv publish, then the report (CSV, plots, KDA tables) in report/ and the view's in
#      report/view/
#
# Environment:
#   ATTNBENCH_SMOKE=1|0        force smoke mode on or off (default: on without a GPU)
#   ATTNBENCH_SUITE=nightly    the full grids for step 3 (default: the per-commit subset)
#   ATTNBENCH_VIEW=0           skip step 4 (the seed's view) and its report
#   ATTNBENCH_MACHINE=NAME     machine name (default: cpu-smoke, or gpu-<hostname>)
#   ATTNBENCH_COMMITS=N        how many commits back from HEAD (default 3; 0 skips step 3,
#                              so that with the view on only the view runs)
#   ATTNBENCH_BENCH=REGEX      step 3 runs only the benchmarks matching REGEX (asv -b): one
#                              shard of a long suite (the nightly's, say '^kda\.' then
#                              '^(nsa|ceilings)\.'), run in calls of their own; shards of
#                              the same commits add up, as a sharded step 3 skips only the
#                              benchmarks a commit already has results for
#   ATTNBENCH_WHEELHOUSE=DIR   offline: asv's environments install from DIR only
#                              (tools/build_wheelhouse.sh fills one)
set -euo pipefail
cd "$(dirname "$0")/.."
COMMITS=${ATTNBENCH_COMMITS:-3}
case "$COMMITS" in
    '' | *[!0-9]*)
        echo "main: ATTNBENCH_COMMITS must be a whole number, got '$COMMITS'" >&2
        exit 2
        ;;
esac
if [ "$COMMITS" -eq 0 ] && [ "${ATTNBENCH_VIEW:-1}" = 0 ]; then
    echo "main: ATTNBENCH_COMMITS=0 with ATTNBENCH_VIEW=0 leaves nothing to run" >&2
    exit 2
fi
bash scripts/bootstrap.sh

VPY=$PWD/.venv/bin/python
# The suite decides smoke vs GPU itself (benchmarks/common.py); pin the answer so that
# every asv process agrees with the machine name chosen here.
# The view's asv selection (-b) comes from the suite too (benchmarks/nsa.py).
SUITE_INFO=$("$VPY" -c 'import benchmarks.common as c, benchmarks.nsa as n
print(c.MODE_NAME)
print(n.VIEW_BENCHMARKS)')
MODE=$(sed -n 1p <<<"$SUITE_INFO")
VIEW_BENCH=$(sed -n 2p <<<"$SUITE_INFO")
if [ "$MODE" = smoke ]; then
    export ATTNBENCH_SMOKE=1
    MACHINE=${ATTNBENCH_MACHINE:-cpu-smoke}
else
    export ATTNBENCH_SMOKE=0
    MACHINE=${ATTNBENCH_MACHINE:-gpu-$(hostname -s)}
fi
if [ -n "${ATTNBENCH_WHEELHOUSE:-}" ]; then
    export PIP_NO_INDEX=1 PIP_FIND_LINKS
    PIP_FIND_LINKS=$(cd "$ATTNBENCH_WHEELHOUSE" && pwd)
fi
# asv's environments get torch and Triton from here (tools/asv_host_site.py).
ATTNBENCH_HOST_SITE=$("$VPY" tools/asv_host_site.py --print)
export ATTNBENCH_HOST_SITE

"$VPY" tools/asv_machine.py --machine "$MACHINE"
mkdir -p .asv
git rev-list --max-count="$COMMITS" HEAD >.asv/commits.txt
echo "main: mode=$MODE machine=$MACHINE commits=$(wc -l <.asv/commits.txt)"

# Out-of-memory points are logged beside the results, so the report and the site can tell
# "out of memory" from the other n/a reasons (ci/na_reasons.py).
mkdir -p "results/$MACHINE"
export ATTNBENCH_NA_LOG=$PWD/results/$MACHINE/na_reasons.jsonl

# A commit already measured on this machine is skipped whole; with a shard selection
# (ATTNBENCH_BENCH) only the benchmarks it already has results for are, so that the next
# shard of the same commit still runs.
SELECT=(--skip-existing-commits)
if [ -n "${ATTNBENCH_BENCH:-}" ]; then
    SELECT=(-b "$ATTNBENCH_BENCH" --skip-existing)
    echo "main: shard of the suite: benchmarks matching '$ATTNBENCH_BENCH'"
fi
status=0
if [ "$COMMITS" -gt 0 ]; then
    "$VPY" -m asv run "HASHFILE:.asv/commits.txt" --machine "$MACHINE" "${SELECT[@]}" \
        --record-samples --show-stderr || status=$?
fi

# The seed's view, HEAD only, under a machine of its own (its figures are no history of the
# default suite's). asv rewrites results/benchmarks.json from every run's discovery; the
# default suite's copy is put back afterwards, so the site keeps describing the per-commit
# suite (the view's sweep is shown by its report, report/view/).
VIEW_MACHINE=$MACHINE-view
view_status=0
rm -rf report/view
if [ "${ATTNBENCH_VIEW:-1}" != 0 ]; then
    "$VPY" tools/asv_machine.py --machine "$VIEW_MACHINE"
    mkdir -p "results/$VIEW_MACHINE"
    if [ -f results/benchmarks.json ]; then
        cp results/benchmarks.json .asv/benchmarks.default.json
    fi
    echo "main: the seed's view at HEAD, machine=$VIEW_MACHINE"
    ATTNBENCH_SUITE=view ATTNBENCH_NA_LOG=$PWD/results/$VIEW_MACHINE/na_reasons.jsonl \
        "$VPY" -m asv run "HEAD^!" --machine "$VIEW_MACHINE" -b "$VIEW_BENCH" \
        --skip-existing-commits --record-samples --show-stderr || view_status=$?
    if [ -f .asv/benchmarks.default.json ]; then
        mv .asv/benchmarks.default.json results/benchmarks.json
    fi
fi
"$VPY" -m asv publish
# The site loads its JavaScript libraries from public CDNs; vendor them (from node_modules,
# installed by `npm ci`) so it works offline and behind firewalls.
if [ ! -d node_modules ] && command -v npm >/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error || echo "main: npm ci failed" >&2
fi
VENDORED=yes
if [ -d node_modules ]; then
    "$VPY" tools/site_vendor.py html
else
    VENDORED=no
fi
# The default suite's report, where it has results (not with ATTNBENCH_COMMITS=0 on a new
# machine: asv's result files are <commit>-<environment>.json beside its machine.json).
if [ -n "$(find "results/$MACHINE" -maxdepth 1 -name '*-*.json' -print -quit)" ]; then
    "$VPY" tools/report.py --results results --out report --machine "$MACHINE"
else
    echo "main: no results for machine $MACHINE, so no report of the default suite"
fi
if [ "${ATTNBENCH_VIEW:-1}" != 0 ] && [ -d "results/$VIEW_MACHINE" ]; then
    "$VPY" tools/report.py --results results --out report/view --machine "$VIEW_MACHINE" \
        --title "The seed's view at HEAD" || echo "main: no report of the view" >&2
fi
# The report's page, the smoke banner and the page-from-disk note go in after every publish.
mkdir -p report
"$VPY" tools/site_extras.py html --report report

cat <<EOF

main: preview the site with   .venv/bin/asv preview   then open http://127.0.0.1:8080
main: (asv's pages load their data by XHR, which browsers refuse for pages opened from disk)
main: site files in $PWD/html/
main: report (CSV, plots, KDA tables) in $PWD/report/
EOF
if [ -d report/view ]; then
    echo "main: the seed's view at HEAD (VRAM, tokens/s, crossover) in $PWD/report/view/"
fi
if [ "$VENDORED" = no ]; then
    echo "main: no npm here, so the site's JavaScript libraries are not vendored: its pages" \
        "load them from public CDNs and need the internet (npm ci, then this command again)"
fi
if [ "$status" -ne 0 ]; then
    echo "main: asv run exited $status (a benchmark failed; see the output above)" >&2
fi
if [ "$view_status" -ne 0 ]; then
    echo "main: the view's asv run exited $view_status (see the output above)" >&2
fi
# The default suite's status first: a failed view never hides it.
if [ "$status" -eq 0 ]; then
    status=$view_status
fi
exit "$status"
