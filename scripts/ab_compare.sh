#!/usr/bin/env bash
# A/B benchmark in one device call: builds the working tree and one or more other source trees,
# runs the GPU tests of the working tree (a gtest filter), then the benchmark of every tree in
# alternating rounds, so that all see the same GPU state; prints each case's times side by side
# and the ratio of each tree's fastest round to the first tree's. Exits 1 when a test or a
# benchmark run fails.
#
#   scripts/ab_compare.sh BASELINE_DIR[,OTHER_DIR...] BENCH_FILTER [ROUNDS] [GTEST_FILTER]
#
# BASELINE_DIR: a copy of an earlier commit, e.g. `git worktree add .carry/base HEAD` here,
# carried to the device (`carry: [".carry/base"]`); further trees (variants, diagnostics) are
# compared to it as well, each named by its folder's name. BENCH_FILTER: openmla-bench
# --filter LIST (a baseline older than c8d5e78 takes a single substring, no commas).
# GTEST_FILTER (default: the dense-decode GPU tests; "-" skips the tests). AB_TEST_TIMEOUT and
# AB_BENCH_TIMEOUT (seconds, default 300 each) bound the test run and each benchmark run.
# AB_SUSTAIN=SECONDS runs the benchmark in steady state (--sustain SECONDS, >= 1) instead of
# --quick, and the table then also compares the energy per call (NVML), the measure of a change
# in work that the power-capped clock does not blur (perf log, session 36).
# Output: $OUT/ab.txt (the table), $OUT/ab-log.txt (builds and raw benchmark output).
set -uo pipefail
cd "$(dirname "$0")/.."
IFS=, read -r -a others <<<"$1"
filter="$2" rounds="${3:-2}" tests="${4:-*DenseDecodeGpu*}"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
log="$out/ab-log.txt"
: >"$out/ab-raw.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv >"$log" 2>&1

. scripts/cuda_build_tree.sh
targets=(openmla-bench)
[ "$tests" != "-" ] && targets+=(openmla_tests)
build_tree . build-ab-new "$log" "${targets[@]}" || { echo "build of the working tree failed"; tail -30 "$log"; exit 1; }
sides=()
for tree in "${others[@]}"; do
  side="$(basename "$tree")"
  [ "$side" = new ] && { echo "a compared tree may not be named 'new'"; exit 1; }
  build_tree "$tree" "build-ab-$side" "$log" openmla-bench || { echo "build of $tree failed"; tail -30 "$log"; exit 1; }
  sides+=("$side")
done
sides+=(new)

mode=(--quick)
[ -n "${AB_SUSTAIN:-}" ] && mode=(--sustain "$AB_SUSTAIN")

status=0
if [ "$tests" != "-" ]; then
  # A kernel that hangs must not spend the whole device call; nor is a failing tree benchmarked.
  timeout "${AB_TEST_TIMEOUT:-300}" build-ab-new/tests/openmla_tests --gtest_filter="$tests" \
      >"$out/ab-tests.txt" 2>&1 || { echo "tests failed or timed out (${AB_TEST_TIMEOUT:-300} s)"; tail -20 "$out/ab-tests.txt"; exit 1; }
  grep -E "PASSED|FAILED" "$out/ab-tests.txt" | tail -8
fi

for round in $(seq "$rounds"); do
  for side in "${sides[@]}"; do
    echo "== round $round $side" >>"$log"
    # Each case's progress line on stderr: "[i/n] op dtype case ... T us".
    # (steady state: "... T us, E mJ, P W, SM C MHz")
    timeout "${AB_BENCH_TIMEOUT:-300}" "build-ab-$side/bench/openmla-bench" "${mode[@]}" --filter "$filter" 2>/tmp/ab-progress.txt >>"$log" || {
      echo "benchmark run failed: $side, round $round (see ab-log.txt)"; status=1; }
    cat /tmp/ab-progress.txt >>"$log"
    grep -E ' us(,|$)' /tmp/ab-progress.txt | sed "s/^/$side\t$round\t/" >>"$out/ab-raw.txt"
  done
done

# One line per case: every tree's times of every round, and each tree's best over the first tree's;
# in steady state the same for the energy per call.
python3 - "$out/ab-raw.txt" "${sides[@]}" >"$out/ab.txt" <<'EOF'
import re, sys, collections
sides = sys.argv[2:]
measures = {"us": collections.defaultdict(lambda: collections.defaultdict(list)),
            "mJ": collections.defaultdict(lambda: collections.defaultdict(list))}
order = []
for line in open(sys.argv[1]):
    side, _, text = line.rstrip("\n").split("\t", 2)
    match = re.match(r"\[\d+/\d+\] (.*) \.\.\. ([0-9.]+) us(?:, ([0-9.]+) mJ)?", text)
    if not match:
        continue
    name = match.group(1)
    if name not in measures["us"]:
        order.append(name)
    measures["us"][name][side].append(float(match.group(2)))
    if match.group(3):
        measures["mJ"][name][side].append(float(match.group(3)))
first = sides[0]
for unit, values in measures.items():
    if not values:
        continue
    header = f"{'case':52s}" + "".join(f" {side + ' ' + unit:>20s}" for side in sides)
    header += "".join(f" {side + '/' + first:>12s}" for side in sides[1:])
    print(header)
    for name in order:
        digits = 1 if unit == "us" else 2
        fmt = lambda numbers: " ".join(f"{v:.{digits}f}" for v in numbers)
        row = f"{name[:52]:52s}" + "".join(f" {fmt(values[name][side]):>20s}" for side in sides)
        for side in sides[1:]:
            a, b = values[name][side], values[name][first]
            row += f" {min(a) / min(b) if a and b else float('nan'):12.3f}"
        print(row)
    print()
EOF
cat "$out/ab.txt"
exit $status
