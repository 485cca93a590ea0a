// openmla-bench: the one timing loop, used by the ceilings and by every op case alike.
// Each call is bracketed by its own pair of CUDA events (no host synchronisation between
// calls, so launch overhead overlaps the previous call as it would in an engine) and the
// median is reported: robust against the odd slow call (clock ramp, a neighbour's burst).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "bench.h"
#include "kernels/cuda_check.h"

namespace openmla::bench {

namespace {
constexpr const char* kOp = "openmla-bench";
constexpr int kMaxCopies = 8;
// The rotation should span this many L2 sizes, so that no call finds the previous call's
// lines of its own inputs still cached.
constexpr double kL2Multiple = 4.0;
// Warm-up runs the op for at least this long: SM clocks settle over milliseconds (idle
// clocks ramp up; after the GEMM ceilings' power draw they recover), and a fixed count of
// calls would warm a 40 us op far less than a 1 ms one. Not much longer: after ~50 ms of
// back-to-back GEMMs an H200 reaches its power limit and slows by ~10%, and the ceilings
// should be the rates that PERF.md's reference figures (a few warm-up calls) describe.
constexpr double kWarmupSeconds = 0.01;
constexpr int kMaxWarmupCalls = 10000;
}  // namespace

double median_time_us(const Launcher& launcher, int repetitions, Stream stream) {
  cudaStream_t cuda_stream = as_cuda_stream(stream);
  // Warm-up: every copy at least once (first touch, lazy module loading), then on until the
  // clocks have settled.
  const auto warmup_start = std::chrono::steady_clock::now();
  const size_t copies = size_t(launcher.copies);
  const size_t batch = std::max<size_t>(copies, 8);  // calls between checks of the clock
  size_t warmup = 0;
  for (;;) {
    for (size_t i = 0; i < batch; ++i, ++warmup) launcher.run(int(warmup % copies), stream);
    check_cuda(cudaStreamSynchronize(cuda_stream), kOp, "warm-up");
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - warmup_start;
    if (elapsed.count() >= kWarmupSeconds || warmup >= size_t(kMaxWarmupCalls)) break;
  }

  const size_t count = size_t(repetitions);
  std::vector<cudaEvent_t> starts(count), stops(count);
  for (size_t i = 0; i < count; ++i) {
    check_cuda(cudaEventCreate(&starts[i]), kOp, "cudaEventCreate");
    check_cuda(cudaEventCreate(&stops[i]), kOp, "cudaEventCreate");
  }
  for (size_t i = 0; i < count; ++i) {
    check_cuda(cudaEventRecord(starts[i], cuda_stream), kOp, "cudaEventRecord");
    launcher.run(int((warmup + i) % copies), stream);
    check_cuda(cudaEventRecord(stops[i], cuda_stream), kOp, "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(cuda_stream), kOp, "timed calls");

  std::vector<double> times_us;
  for (size_t i = 0; i < count; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, starts[i], stops[i]), kOp, "cudaEventElapsedTime");
    times_us.push_back(double(ms) * 1e3);
    cudaEventDestroy(starts[i]);
    cudaEventDestroy(stops[i]);
  }
  std::sort(times_us.begin(), times_us.end());
  const size_t middle = times_us.size() / 2;
  return times_us.size() % 2 ? times_us[middle]
                             : 0.5 * (times_us[middle - 1] + times_us[middle]);
}

int rotation_copies(double bytes_per_copy) {
  int device = 0, l2_bytes = 0;
  check_cuda(cudaGetDevice(&device), kOp, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), kOp,
             "cudaDeviceGetAttribute");
  const int copies = int(std::ceil(kL2Multiple * l2_bytes / std::max(bytes_per_copy, 1.0)));
  return std::clamp(copies, 2, kMaxCopies);
}

}  // namespace openmla::bench
