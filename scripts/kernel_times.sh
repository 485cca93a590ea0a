#!/usr/bin/env bash
# Per-kernel durations of single benchmark cases (Nsight Compute at the GPU's own clocks, caches
# not flushed between kernels, so a combine step reads its partials where the attention kernel
# left them), for the question "which kernel of the op takes the time". Device script, like
# ab_cycles.sh: builds the working tree's openmla-bench, then per case reads
# gpu__time_duration of launches 13..24 of every kernel whose name matches KERNEL_REGEX.
#
#   scripts/kernel_times.sh KERNEL_REGEX "CASE1;CASE2;..."
#
# Output: $OUT/kernel-times.txt (per case and kernel, the median and range in us). Kernels run
# one at a time under ncu, so PDL's overlap is gone: the sum is not the op's event time.
set -uo pipefail
cd "$(dirname "$0")/.."
regex="$1"
IFS=';' read -r -a cases <<<"$2"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
raw="$out/kernel-times-raw.csv"
: >"$raw"
. scripts/cuda_build_tree.sh
build_tree . build-ncu "$out/kernel-times-build.txt" openmla-bench ||
  { echo "build failed"; tail -30 "$out/kernel-times-build.txt"; exit 1; }
for case in "${cases[@]}"; do
  timeout 180 ncu --kernel-name "regex:$regex" --launch-skip 12 --launch-count 12 --cache-control none \
      --clock-control none --metrics gpu__time_duration.sum --csv \
      build-ncu/bench/openmla-bench --quick --filter "$case" 2>/dev/null |
    grep '"gpu__time_duration.sum"' | sed "s|^|$case;|" >>"$raw"
done
python3 - "$raw" >"$out/kernel-times.txt" <<'PY'
import csv, collections, re, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    case, rest = line.rstrip("\n").split(";", 1)
    row = next(csv.reader([rest]))
    name = re.sub(r"[<(].*", "", row[4]).split()[-1]
    unit, value = row[-2], float(row[-1].replace(",", ""))
    times[(case, name)].append(value * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[unit])
for (case, name), v in times.items():
    print(f"{case:32s} {name:40s} median {statistics.median(v):9.2f} us  range {min(v):9.2f}-{max(v):9.2f}  n={len(v)}")
PY
cat "$out/kernel-times.txt"
