#!/usr/bin/env bash
# Configures and builds the C++ library, tests and benchmark into build/ (CUDA kernels for
# sm_90a when a CUDA toolkit is found), and installs the Python package into the venv.
# Environment: OPENMLA_BUILD_DIR (build), OPENMLA_VENV (.venv), OPENMLA_JOBS (all cores),
# OPENMLA_SKIP_PYTHON=1 to skip the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${OPENMLA_BUILD_DIR:-build}"
venv="${OPENMLA_VENV:-.venv}"
jobs="${OPENMLA_JOBS:-$(nproc)}"

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$PWD/$build/install" ${OPENMLA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
cmake --install "$build" >/dev/null

if [ "${OPENMLA_SKIP_PYTHON:-0}" != "1" ]; then
  echo "openmla: building the Python package"
  CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$venv/bin/python" -m pip install -q --no-build-isolation \
      --no-deps -Cbuild-dir="$build/python" .
fi
