#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything, runs the C++
# (GoogleTest via ctest) and Python (pytest) suites. GPU tests skip where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
build="${OPENMLA_BUILD_DIR:-build}"
venv="${OPENMLA_VENV:-.venv}"
echo "openmla: C++ tests"
ctest --test-dir "$build" --output-on-failure -j "${OPENMLA_JOBS:-$(nproc)}"
echo "openmla: Python tests"
"$venv/bin/python" -m pytest tests/python -q -rs
