// openmla-bench: the one timing loop, used by the ceilings and by every op case alike.
// Each call is bracketed by its own pair of CUDA events (no host synchronisation between
// calls, so launch overhead overlaps the previous call as it would in an engine) and the
// median is reported: robust against the odd slow call (clock ramp, a neighbour's burst).
// Ops of a few microseconds are timed as whole ops instead: a CUDA graph of N calls is
// replayed, each replay bracketed by events, and the time divided by N (PERF.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <vector>

#include "bench.h"
#include "energy.h"
#include "kernels/cuda_check.h"

namespace openmla::bench {

namespace {
constexpr const char* kOp = "openmla-bench";
// Enough for the smallest case (D4 B1: 4.7 MB per copy, 43 copies for 4 x an H100's 50 MB L2;
// with at most 8, its 38 MB rotation stayed largely in L2).
constexpr int kMaxCopies = 64;
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
// Rotation copies of one case stay within this much device memory (an H100 has 80 GB).
constexpr double kMaxRotationBytes = 32e9;

// Median time in us of `call(i)` (i counts calls, warm-up included): a warm-up of at least
// `min_warmup_calls` calls that goes on until the clocks have settled, then `repetitions` calls
// each bracketed by its own pair of events.
double median_event_time_us(const std::function<void(size_t)>& call, size_t min_warmup_calls,
                            int repetitions, cudaStream_t cuda_stream) {
  const auto warmup_start = std::chrono::steady_clock::now();
  const size_t batch = std::max<size_t>(min_warmup_calls, 8);  // calls between clock checks
  size_t warmup = 0;
  for (;;) {
    for (size_t i = 0; i < batch; ++i, ++warmup) call(warmup);
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
    call(warmup + i);
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

// Captures graph_calls calls of the launcher (copies rotating) into one executable graph.
// Every copy runs once eagerly first, so that first-touch work and lazy module loading (which
// capture forbids) are done, and an op that cannot run fails here, outside the capture.
cudaGraphExec_t capture_calls(const Launcher& launcher, Stream stream) {
  cudaStream_t cuda_stream = as_cuda_stream(stream);
  for (int copy = 0; copy < launcher.copies; ++copy) launcher.run(copy, stream);
  check_cuda(cudaStreamSynchronize(cuda_stream), kOp, "calls before capture");
  check_cuda(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeThreadLocal), kOp,
             "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    for (int i = 0; i < launcher.graph_calls; ++i) launcher.run(i % launcher.copies, stream);
  } catch (...) {
    cudaStreamEndCapture(cuda_stream, &graph);  // leave the stream usable for the next case
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check_cuda(cudaStreamEndCapture(cuda_stream, &graph), kOp, "cudaStreamEndCapture");
  cudaGraphExec_t executable = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&executable, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(instantiated, kOp, "cudaGraphInstantiate");
  return executable;
}

}  // namespace

double median_time_us(const Launcher& launcher, int repetitions, Stream stream) {
  cudaStream_t cuda_stream = as_cuda_stream(stream);
  const size_t copies = size_t(launcher.copies);
  if (launcher.graph_calls <= 0) {
    return median_event_time_us([&](size_t i) { launcher.run(int(i % copies), stream); },
                                copies, repetitions, cuda_stream);
  }
  cudaGraphExec_t executable = capture_calls(launcher, stream);
  const double replay_us = median_event_time_us(
      [&](size_t) { check_cuda(cudaGraphLaunch(executable, cuda_stream), kOp, "cudaGraphLaunch"); },
      1, repetitions, cuda_stream);
  cudaGraphExecDestroy(executable);
  return replay_us / launcher.graph_calls;
}

Measurement steady_state(const Launcher& launcher, double seconds, Stream stream, const EnergyCounter& energy) {
  cudaStream_t cuda_stream = as_cuda_stream(stream);
  const size_t copies = size_t(launcher.copies);
  cudaGraphExec_t executable = launcher.graph_calls > 0 ? capture_calls(launcher, stream) : nullptr;
  auto call = [&](size_t i) {
    if (executable) {
      check_cuda(cudaGraphLaunch(executable, cuda_stream), kOp, "cudaGraphLaunch");
    } else {
      launcher.run(int(i % copies), stream);
    }
  };
  for (size_t i = 0; i < copies; ++i) call(i);  // every copy once (first touch) before the clock
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), kOp, "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), kOp, "cudaEventCreate");
  check_cuda(cudaEventRecord(start, cuda_stream), kOp, "cudaEventRecord");
  const auto begin = std::chrono::steady_clock::now();
  auto seconds_since_begin = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  };
  size_t calls = 0;
  auto issue = [&](size_t count) {
    for (size_t i = 0; i < count; ++i, ++calls) call(calls);
  };
  // The calls go out in batches of >= kBatchSeconds, each followed by an event, and the host
  // waits for batch k only once batch k + 1 is queued: so the GPU never runs dry while the host
  // reads the clock or NVML (one read takes milliseconds: read after a full synchronisation per
  // 32 calls, they left the GPU idle for 40-50% of D2's steady state and 2x its D4 time). The
  // first 32 calls size the batches.
  constexpr double kBatchSeconds = 0.025;
  issue(32);
  check_cuda(cudaStreamSynchronize(cuda_stream), kOp, "steady-state calls");
  const size_t batch_calls =
      std::max<size_t>(32, size_t(std::ceil(32 * kBatchSeconds / std::max(seconds_since_begin(), 1e-6))));
  // The energy counter's first and last steps seen (read as each batch completes): the calls
  // completed and the host time at each (a step read while the next batch runs: within a read's
  // few milliseconds of energy at each end of runs of a second or more).
  struct Step {
    double millijoules = NAN;
    size_t calls = 0;
    double seconds = 0;
  };
  Step first_step, last_step;
  double counter = energy.millijoules();
  double clock_sum = 0;  // SM clock samples (MHz) from the first step on
  int clock_samples = 0;
  cudaEvent_t batch_done[2] = {};
  size_t calls_after[2] = {};
  for (cudaEvent_t& event : batch_done) {
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), kOp, "cudaEventCreate");
  }
  issue(batch_calls);
  check_cuda(cudaEventRecord(batch_done[0], cuda_stream), kOp, "cudaEventRecord");
  calls_after[0] = calls;
  for (int batch = 0;; ++batch) {
    const int next = (batch + 1) % 2;
    issue(batch_calls);
    check_cuda(cudaEventRecord(batch_done[next], cuda_stream), kOp, "cudaEventRecord");
    calls_after[next] = calls;
    check_cuda(cudaEventSynchronize(batch_done[batch % 2]), kOp, "steady-state calls");
    const double elapsed = seconds_since_begin();
    const double now = energy.millijoules();
    if (now != counter && std::isfinite(now)) {
      const Step step{now, calls_after[batch % 2], elapsed};
      if (!std::isfinite(first_step.millijoules)) first_step = step;
      last_step = step;
      counter = now;
    }
    const double clock = energy.sm_clock_mhz();
    if (std::isfinite(first_step.millijoules) && std::isfinite(clock)) {
      clock_sum += clock;
      ++clock_samples;
    }
    if (elapsed >= seconds) break;
  }
  for (cudaEvent_t event : batch_done) cudaEventDestroy(event);
  check_cuda(cudaEventRecord(stop, cuda_stream), kOp, "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), kOp, "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), kOp, "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (executable) cudaGraphExecDestroy(executable);
  const double per_replay = executable ? double(launcher.graph_calls) : 1.0;  // op calls per call()
  Measurement result;
  result.time_us = double(ms) * 1e3 / double(calls) / per_replay;
  if (last_step.calls > first_step.calls) {
    const double millijoules = last_step.millijoules - first_step.millijoules;
    result.energy_mj = millijoules / double(last_step.calls - first_step.calls) / per_replay;
    result.power_w = millijoules * 1e-3 / (last_step.seconds - first_step.seconds);
  }
  if (clock_samples > 0) result.sm_clock_mhz = clock_sum / clock_samples;
  return result;
}

int rotation_copies(double bytes_per_copy) {
  int device = 0, l2_bytes = 0;
  check_cuda(cudaGetDevice(&device), kOp, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), kOp,
             "cudaDeviceGetAttribute");
  const double bytes = std::max(bytes_per_copy, 1.0);
  const int copies = std::clamp(int(std::ceil(kL2Multiple * l2_bytes / bytes)), 2, kMaxCopies);
  const int affordable = int(std::min(kMaxRotationBytes / bytes, double(kMaxCopies)));
  return std::max(1, std::min(copies, affordable));
}

}  // namespace openmla::bench
