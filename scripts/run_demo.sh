#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the benchmark.
# On a machine with a Hopper GPU it measures the ceilings and every GPU kernel; without a GPU
# it runs the CPU reference on a small case and says so. Extra arguments go to openmla-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
OPENMLA_SKIP_PYTHON=1 bash scripts/build.sh
build="${OPENMLA_BUILD_DIR:-build}"
export PATH="$PWD/.venv/bin:$PATH"  # python3 with matplotlib for --plot
"$build/bench/openmla-bench" "$@"
