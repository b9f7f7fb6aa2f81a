#!/usr/bin/env bash
# Fill a wheelhouse (default .whl/, git-ignored) with every wheel an offline GPU host needs
# to run the asv suite with its own preinstalled torch and Triton (tools/gpu_asv.sh), and
# the README's two commands (scripts/main.sh, scripts/test.sh) with PIP_NO_INDEX=1
# PIP_FIND_LINKS=<wheelhouse>:
#
#   - asv and virtualenv, with their dependencies, for the host interpreter
#   - what asv installs into each new benchmark environment: pip, wheel, setuptools, build,
#     pyproject_hooks, packaging, asv_runner, pympler (and the project's build requirements,
#     setuptools and wheel)
#   - the test extra and the linters scripts/ci_tools.sh installs (ruff, pytest, zizmor,
#     check-jsonschema), with their dependencies
#
# Wheels are fetched for CPython 3.12 on manylinux x86_64 (the H200 host's interpreter),
# whatever this machine runs; pure-Python packages come as py3-none-any. Versions are the
# ones the suite is tested with (asv and asv_runner are pinned: the suite relies on asv's
# internal {"samples": ..., "number": ...} track format).
#
#   bash tools/build_wheelhouse.sh [DEST] [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYVER=${2:-3.12}
PY=${PYTHON:-python3}

PACKAGES=(
    # host: asv and virtualenv
    asv==0.6.6 asv_runner==0.3.2 virtualenv==21.15.11
    json5==0.17.3 tabulate==0.10.0 PyYAML==6.0.4 Pympler==1.1 importlib_metadata==10.2.0 lazy-importer==0.1.0
    zipp==4.1.2 distlib==0.4.4 filelock==4.3.1 platformdirs==4.14.8 python-discovery==1.9.6
    # every new asv environment, and the project's [build-system].requires
    pip==25.3 wheel==0.45.1 setuptools==80.9.0 build==1.6.1 pyproject_hooks==1.3.3 packaging==26.4
)

mkdir -p "$DEST"
for pkg in "${PACKAGES[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any \
        -d "$DEST" "$pkg"
done
# The README commands' tools, dependencies resolved for the target interpreter.
"$PY" -m pip download -q --only-binary=:all: \
    --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    -d "$DEST" ruff==0.17.6 "pytest>=8" "pytest-xdist>=3.8" zizmor==1.32.0 check-jsonschema==0.39.0
echo "build_wheelhouse: $(find "$DEST" -name '*.whl' | wc -l) wheels in $DEST (cp${PYVER/./} manylinux x86_64)"
