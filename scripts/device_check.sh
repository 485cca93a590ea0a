#!/usr/bin/env bash
# One call on a GPU machine (the device tool): build with every core, run the C++ tests (GPU
# tests included), compute-sanitizer memcheck + racecheck over the GPU tests, the Python tests,
# and the benchmark. Logs and JSON go to $OUT (at most 8 files come back from the device).
# Needs on that machine: CUDA toolkit, cmake, ninja, GoogleTest, python3 with torch,
# nanobind, scikit-build-core, pytest, matplotlib (the device image has them). Installs nothing.
# The benchmark JSON records the commit seen at configure time; where the machine's git
# metadata can lag the copied tree, pass OPENMLA_COMMIT=<hash> in the environment.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
build="${OPENMLA_BUILD_DIR:-build-device}"
log="$out/log.txt"
status=0
step() { echo "== $*" | tee -a "$log"; }

step "environment"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv;
  nvcc --version | tail -2; python3 -c 'import torch; print("torch", torch.__version__)'; } >>"$log" 2>&1

step "build"
. scripts/cuda_build_tree.sh
if ! build_tree . "$build" "$log"; then
  tail -40 "$log"; exit 1
fi

step "C++ tests"
# Timeouts: a kernel that hangs costs its step's timeout instead of running into the device
# call's limit (the steps' timeouts add up to more than a call, so a hang may still cut the last).
timeout 240 "$build/tests/openmla_tests" --gtest_brief=1 >"$out/gtest.txt" 2>&1 || status=1
tail -5 "$out/gtest.txt" | tee -a "$log"

if [ "${OPENMLA_SANITIZE:-1}" = "1" ]; then
  step "compute-sanitizer (GPU tests)"
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/openmla_tests" \
        --gtest_filter="${OPENMLA_SANITIZE_FILTER:-KvCacheGpu*:NumericsGpu*:*Small/*:DenseDecodeGpuEdges*:DenseDecodeGpuGraph*:DenseDecodeGpuPdl*}" --gtest_brief=1 \
        >"$out/sanitizer-$tool.txt" 2>&1 || status=1
    tail -3 "$out/sanitizer-$tool.txt" | tee -a "$log"
  done
fi

step "Python tests"
rm -rf /tmp/openmla-site
if python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/openmla-site \
       -Cbuild-dir="$build/python" . >>"$log" 2>&1; then
  PYTHONPATH=/tmp/openmla-site timeout 300 python3 -m pytest tests/python -q -rs >"$out/pytest.txt" 2>&1 || status=1
  tail -5 "$out/pytest.txt" | tee -a "$log"
else
  echo "python package build failed" | tee -a "$log"; status=1
fi

step "benchmark"
# Only 8 files come back from the device: keep the summary chart, leave the per-op ones.
mkdir -p /tmp/openmla-plots
timeout 400 "$build/bench/openmla-bench" --json "$out/bench.json" --plot /tmp/openmla-plots/bench "$@" 2>>"$log" | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" = "0" ] || status=1
cp /tmp/openmla-plots/bench_summary.png "$out/" 2>/dev/null
exit $status
