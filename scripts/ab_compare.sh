#!/usr/bin/env bash
# A/B benchmark in one device call: builds the working tree and a baseline source tree, runs
# the GPU tests of the working tree (a gtest filter), then the benchmark of both in alternating
# rounds, so that both see the same GPU state; prints each case's times side by side and the
# ratio of the fastest rounds (new / baseline). Exits 1 when a test or a benchmark run fails.
#
#   scripts/ab_compare.sh BASELINE_DIR BENCH_FILTER [ROUNDS] [GTEST_FILTER]
#
# BASELINE_DIR: a copy of an earlier commit, e.g. `git worktree add .carry/base HEAD` here,
# carried to the device (`carry: [".carry/base"]`). BENCH_FILTER: openmla-bench --filter LIST
# (a baseline older than c8d5e78 takes a single substring, no commas).
# GTEST_FILTER (default: the dense-decode GPU tests; "-" skips the tests).
# Output: $OUT/ab.txt (the table), $OUT/ab-log.txt (builds and raw benchmark output).
set -uo pipefail
cd "$(dirname "$0")/.."
baseline="$1" filter="$2" rounds="${3:-2}" tests="${4:-*DenseDecodeGpu*}"
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
log="$out/ab-log.txt"
: >"$out/ab-raw.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv >"$log" 2>&1

build_tree() {  # source dir, build dir, targets...
  local source="$1" build="$2"; shift 2
  cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOPENMLA_CUDA=ON >>"$log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target "$@" >>"$log" 2>&1
}
targets=(openmla-bench)
[ "$tests" != "-" ] && targets+=(openmla_tests)
build_tree . build-ab-new "${targets[@]}" || { echo "build of the working tree failed"; tail -30 "$log"; exit 1; }
build_tree "$baseline" build-ab-base openmla-bench || { echo "baseline build failed"; tail -30 "$log"; exit 1; }

status=0
if [ "$tests" != "-" ]; then
  # A kernel that hangs must not spend the whole device call.
  timeout 300 build-ab-new/tests/openmla_tests --gtest_filter="$tests" --gtest_brief=1 >"$out/ab-tests.txt" 2>&1 ||
    { status=1; echo "tests failed or timed out (300 s)"; }
  tail -4 "$out/ab-tests.txt"
fi

for round in $(seq "$rounds"); do
  for side in base new; do
    echo "== round $round $side" >>"$log"
    # Each case's progress line on stderr: "[i/n] op dtype case ... T us".
    timeout 300 "build-ab-$side/bench/openmla-bench" --quick --filter "$filter" 2>/tmp/ab-progress.txt >>"$log" || {
      echo "benchmark run failed: $side, round $round (see ab-log.txt)"; status=1; }
    cat /tmp/ab-progress.txt >>"$log"
    grep ' us$' /tmp/ab-progress.txt | sed "s/^/$side\t$round\t/" >>"$out/ab-raw.txt"
  done
done

# One line per case: the baseline's and the new tree's times of every round.
python3 - "$out/ab-raw.txt" >"$out/ab.txt" <<'EOF'
import re, sys, collections
times = collections.defaultdict(lambda: {"base": [], "new": []})
order = []
for line in open(sys.argv[1]):
    side, _, text = line.rstrip("\n").split("\t", 2)
    match = re.match(r"\[\d+/\d+\] (.*) \.\.\. ([0-9.]+) us", text)
    if not match:
        continue
    name = match.group(1)
    if name not in times:
        order.append(name)
    times[name][side].append(float(match.group(2)))
print(f"{'case':58s} {'baseline us':>22s} {'new us':>22s} {'new/base':>8s}")
for name in order:
    base, new = times[name]["base"], times[name]["new"]
    ratio = min(new) / min(base) if base and new else float("nan")
    fmt = lambda values: " ".join(f"{v:.1f}" for v in values)
    print(f"{name[:58]:58s} {fmt(base):>22s} {fmt(new):>22s} {ratio:8.3f}")
EOF
cat "$out/ab.txt"
exit $status
