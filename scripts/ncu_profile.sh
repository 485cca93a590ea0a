#!/usr/bin/env bash
# Nsight Compute profiles of single benchmark cases, for the questions cycles alone do not answer
# (which unit bounds a kernel: tensor pipe, shared-memory banks, L2, issue slots). Builds the
# working tree's openmla-bench once, then per case profiles launch 6 of the kernels matching
# KERNEL_REGEX with the given sections (default: speed of light, memory tables, compute pipes)
# and writes $OUT/ncu.txt (every case, one after another). Device script, like ab_cycles.sh.
#
#   scripts/ncu_profile.sh KERNEL_REGEX "CASE1;CASE2;..." [SECTION...]
#
# CASE: an openmla-bench --filter substring naming one case ("bf16 D1 Hq=128 B=16"). The
# benchmark measures its ceilings first (cuBLAS GEMMs, the copy), so a regex matching cuBLAS's
# kernels ("nvjet|gemm") profiles the ceiling GEMM of that run.
set -uo pipefail
cd "$(dirname "$0")/.."
regex="$1"
IFS=';' read -r -a cases <<<"$2"
shift 2
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(SpeedOfLight MemoryWorkloadAnalysis_Tables ComputeWorkloadAnalysis)
section_args=()
for section in "${sections[@]}"; do section_args+=(--section "$section"); done
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
. scripts/cuda_build_tree.sh
build_tree . build-ncu "$out/ncu-build.txt" openmla-bench ||
  { echo "build failed"; tail -30 "$out/ncu-build.txt"; exit 1; }
for case in "${cases[@]}"; do
  echo "==== $case (kernels /$regex/)" >>"$out/ncu.txt"
  timeout 180 ncu --kernel-name "regex:$regex" --launch-skip 5 --launch-count 1 "${section_args[@]}" \
      --print-details all build-ncu/bench/openmla-bench --quick --filter "$case" >>"$out/ncu.txt" 2>&1
done
grep -E "^====|Shared|shared|Tensor|Duration|SM Frequency|Elapsed Cycles|Bank" "$out/ncu.txt" | head -200
