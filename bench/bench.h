// openmla-bench: the vocabulary shared by the runner and the case files.
//
// A Case is one workload of one op: its name, what it must move and compute at the very
// least (bytes read once + written once, FLOPs), and a prepare step that allocates random
// inputs and returns the launcher. Adding an op's cases is one function that appends Cases
// (see cases_kv_cache.cpp) plus one line in main.cpp's case list.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "openmla/tensor.h"

namespace openmla::bench {

// Issues one call of an op on input copy `copy` (0 .. copies-1). The inputs are rotated
// among several copies so that repeated calls never find their data in the L2 cache; the
// lambda owns the device memory through what it captures.
struct Launcher {
  int copies = 1;
  std::function<void(int copy, Stream stream)> run;
  // > 0: time the whole op, every kernel it launches included, by replaying a CUDA graph of
  // this many calls (copies rotating) and dividing by the count, for ops so short that launch
  // gaps would dominate event timing (PERF.md: D4, D5). 0: CUDA events around each call.
  int graph_calls = 0;
};

struct Case {
  std::string op;     // public API function, e.g. "write_kv_cache"
  std::string name;   // the PERF.md case id first when there is one, then the parameters
  std::string dtype;  // data format, e.g. "bf16", "fp8", "ds_mla"
  double bytes = 0;   // every byte the op must read once plus every byte it must write once
  double flops = 0;   // 0 for memory-bound ops
  std::function<Launcher()> prepare;
};

// The three speed-of-light figures every result is divided by, measured in the same process.
struct Ceilings {
  double copy_gbps = NAN;
  double bf16_gemm_tflops = NAN;
  double fp8_gemm_tflops = NAN;
};

// What was measured of one case: its time, and in steady state (steady_state) its energy where
// the GPU reports it. NaN: not measured.
struct Measurement {
  double time_us = NAN;    // per call
  double energy_mj = NAN;  // per call
  double power_w = NAN;    // the GPU's mean power meanwhile
  double sm_clock_mhz = NAN;  // the SM clock's mean, sampled as the energy
};

// One row of the table and of the JSON "results": what was measured, and the rates and
// fractions derived from it. NaN means "not known" (JSON null).
struct Result : Measurement {
  std::string op, name, dtype;
  double gbps = NAN;
  double tflops = NAN;
  double frac_copy = NAN;
  double frac_bf16_gemm = NAN;
  double frac_fp8_gemm = NAN;
};

// Rates and fractions of a case measured so.
Result make_result(const Case& bench_case, const Measurement& measured, const Ceilings& ceilings);

// The CPU reference path (no GPU, or a CPU-only build): a small dense decode and one KV-cache
// utility on host tensors, timed on the host, with a checksum printed.
std::vector<Result> run_cpu_reference();

#if OPENMLA_WITH_CUDA
// ---- GPU side (ceilings.cpp, timing.cpp, device_data.cu, cases_*.cpp) -----------------------

// Cases measuring the ceilings, in the order of Ceilings' fields: copy, bf16 GEMM, fp8 GEMM.
std::vector<Case> ceiling_cases();

// Per-op case lists. A new op adds one function here and one line in main.cpp.
void add_kv_cache_cases(std::vector<Case>& cases);
void add_dense_decode_cases(std::vector<Case>& cases);

// Median time of one call in microseconds: CUDA events around each call (or each replay of
// the call graph, see Launcher::graph_calls), after a warm-up that touches every copy, copies
// rotated call after call.
double median_time_us(const Launcher& launcher, int repetitions, Stream stream);

class EnergyCounter;

// Steady state of one call: calls (or graph replays) back to back for `seconds`, total time
// over the calls. After ~50 ms a GPU under heavy load sits at its power limit, as a serving GPU
// does; the median above describes the first milliseconds. With a counter that is available,
// also the energy per call and the mean power, between the first and the last step of the
// counter seen during the run (it advances in steps of ~100 ms), and the mean SM clock over the
// same synchronisations.
Measurement steady_state(const Launcher& launcher, double seconds, Stream stream, const EnergyCounter& energy);

// How many input copies keep a rotation of `bytes_per_copy` out of the L2 cache: enough to
// span several times the L2 of the current device, at least 2, but never more than fit in a
// fixed memory budget (a copy of a long-context decode case is 1-3 GB).
int rotation_copies(double bytes_per_copy);
#endif

}  // namespace openmla::bench
