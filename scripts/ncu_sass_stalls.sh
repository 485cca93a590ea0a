#!/usr/bin/env bash
# Where a kernel's warps wait, per SASS instruction: Nsight Compute's source counters (warp-state
# samples) of launch 6 of the kernels matching KERNEL_REGEX in one benchmark case, exported as a
# report and printed as the TOP instructions by samples, with the instructions around each.
# Device script, like ncu_profile.sh (which builds the tree into build-ncu).
#
#   scripts/ncu_sass_stalls.sh KERNEL_REGEX CASE [TOP]
#
# Writes $OUT/stalls.txt (the table) and $OUT/stalls-sass.csv.gz (every instruction's samples).
# NCU_CACHE_CONTROL=none keeps the caches as the launches before left them (ncu's default, all,
# flushes them first: every instruction is then fetched from DRAM).
set -uo pipefail
cd "$(dirname "$0")/.."
regex="$1" case="$2" top="${3:-40}"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
. scripts/cuda_build_tree.sh
build_tree . build-ncu "$out/ncu-build.txt" openmla-bench ||
  { echo "build failed"; tail -30 "$out/ncu-build.txt"; exit 1; }
rm -f /tmp/stalls.ncu-rep
timeout 300 ncu --kernel-name "regex:$regex" --launch-skip 5 --launch-count 1 \
    --cache-control "${NCU_CACHE_CONTROL:-all}" --section SourceCounters \
    --section WarpStateStats -o /tmp/stalls build-ncu/bench/openmla-bench --quick --filter "$case" >/dev/null 2>&1
ncu --import /tmp/stalls.ncu-rep --page source --csv --print-source sass >"$out/stalls-sass.csv" 2>&1
ncu --import /tmp/stalls.ncu-rep --section WarpStateStats --print-details all >"$out/stalls.txt" 2>&1
python3 - "$out/stalls-sass.csv" "$top" >>"$out/stalls.txt" 2>&1 <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
print("first rows:", rows[:3])
head = next(i for i, r in enumerate(rows) if "Source" in r)
names, body = rows[head], rows[head + 1:]
col = lambda name: next(i for i, n in enumerate(names) if n.startswith(name))
source, samples = col("Source"), col("Warp Stall Sampling (All")
address = col("Address") if any(n.startswith("Address") for n in names) else None
reasons = [i for i, n in enumerate(names) if n.startswith("stall_") or "Stall" in n and i != samples]
def number(value):
    try: return float(value.replace(",", ""))
    except ValueError: return 0.0
total = sum(number(r[samples]) for r in body if len(r) > samples)
print(f"\ntotal samples {total:.0f}; columns: {names}")
order = sorted(range(len(body)), key=lambda i: -number(body[i][samples]) if len(body[i]) > samples else 0)
for i in order[:int(sys.argv[2])]:
    r = body[i]
    print(f"{number(r[samples]) / total * 100:5.1f}%  line {i:5d}  {r[source].strip()[:90]}")
PY
gzip -f "$out/stalls-sass.csv"
tail -c 9000 "$out/stalls.txt"
