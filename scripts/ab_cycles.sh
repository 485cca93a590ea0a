#!/usr/bin/env bash
# Kernel cycles under Nsight Compute's clock control (base clocks locked while a kernel is
# profiled), for A/B comparisons of compute-bound cases whose event times move by +-5% between
# runs (bf16 D1 Hq128 on an H100, perf log session 18). For each tree and case: the bench runs
# that one case and ncu reads gpu__time_duration and sm__cycles_elapsed.max of launches
# 6..8 of the kernels matching KERNEL_REGEX.
#
#   scripts/ab_cycles.sh TREE[,TREE...] KERNEL_REGEX "CASE1;CASE2;..." [ROUNDS]
#
# TREE: a source tree (`git worktree add .carry/base HEAD`, carried) or "." (the working tree,
# named "new"). CASE: an openmla-bench --filter substring naming one case. Output:
# $OUT/cycles.txt (the table: per case and tree, the median over the profiled launches of every
# round), $OUT/cycles-raw.csv, $OUT/cycles-build.txt (the builds' output).
set -uo pipefail
cd "$(dirname "$0")/.."
IFS=, read -r -a trees <<<"$1"
regex="$2" rounds="${4:-1}"
IFS=';' read -r -a cases <<<"$3"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
raw="$out/cycles-raw.csv"
: >"$raw"
: >"$out/cycles-build.txt"
. scripts/cuda_build_tree.sh
for tree in "${trees[@]}"; do
  side="$(basename "$tree")"; [ "$tree" = . ] && side=new
  build_tree "$tree" "build-ab-$side" "$out/cycles-build.txt" openmla-bench ||
    { echo "build of $tree failed"; tail -30 "$out/cycles-build.txt"; exit 1; }
done
for round in $(seq "$rounds"); do
  for case in "${cases[@]}"; do
    for tree in "${trees[@]}"; do
      side="$(basename "$tree")"; [ "$tree" = . ] && side=new
      timeout 120 ncu --kernel-name "regex:$regex" --launch-skip 5 --launch-count 3 \
          --metrics gpu__time_duration.sum,sm__cycles_elapsed.max --csv \
          "build-ab-$side/bench/openmla-bench" --quick --filter "$case" 2>/dev/null |
        grep -E '"(gpu__time_duration.sum|sm__cycles_elapsed.max)"' |
        sed "s|^|$side;$round;$case;|" >>"$raw"
    done
  done
done
python3 - "$raw" >"$out/cycles.txt" <<'PY'
import csv, collections, statistics, sys
values = collections.defaultdict(list)
sides, cases = [], []
for line in open(sys.argv[1]):
    side, _, case, rest = line.rstrip("\n").split(";", 3)
    row = next(csv.reader([rest]))
    metric, value = row[-3], float(row[-1].replace(",", ""))
    values[(case, side, metric)].append(value)
    if side not in sides: sides.append(side)
    if case not in cases: cases.append(case)
for metric in ("sm__cycles_elapsed.max", "gpu__time_duration.sum"):
    print(metric)
    for case in cases:
        base = values.get((case, sides[0], metric))
        cells = []
        for side in sides:
            v = values.get((case, side, metric))
            if not v or not base:
                cells.append(f"{side}: -"); continue
            m = statistics.median(v)
            cells.append(f"{side}: {m:.0f} ({m / statistics.median(base):.3f}, n {len(v)}, spread {(max(v) - min(v)) / m:.3f})")
        print(f"  {case:28s} " + "  ".join(cells))
PY
cat "$out/cycles.txt"
