// openmla-bench: the benchmark CLI. With a GPU it measures the ceilings of ../shared/PERF.md
// (copy, bf16 GEMM, fp8 GEMM) and then every op case that has a GPU kernel, in one process,
// and reports each as a fraction of those ceilings. Without one it runs the CPU reference on
// a small case. Cases live in cases_*.cpp; this file is the command line and the run loop.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench.h"
#include "openmla/openmla.h"
#include "report.h"

#if OPENMLA_WITH_CUDA
#include <cuda_runtime.h>

#include "energy.h"
#include "kernels/cuda_check.h"
#endif

#ifndef OPENMLA_SOURCE_DIR
#define OPENMLA_SOURCE_DIR "."
#endif

namespace openmla::bench {
namespace {

constexpr const char* kUsage = R"(usage: openmla-bench [options]

Measures the speed-of-light ceilings of this GPU (device copy, cuBLASLt BF16 and FP8 GEMM)
and every openmla op that has a GPU kernel, and reports each op as a fraction of them.
Without a GPU, runs the CPU reference on a small case.

options:
  --filter LIST    run only the cases whose "op dtype case" contains one of the
                   comma-separated substrings of LIST (the ceilings always run)
  --quick          10 timed repetitions per case instead of 30
  --sustain SECONDS
                   steady state instead: every case, the ceilings included, runs back to
                   back for SECONDS and the mean time per call is reported (a GPU under
                   load for more than ~50 ms runs at its power limit, as in serving), with
                   the energy per call and the mean power where the driver's NVML reports
                   them, and the mean SM clock (SECONDS >= 1: its energy counter advances
                   in steps)
  --json PATH      write the results as JSON to PATH
  --plot PREFIX    write PNG bar charts PREFIX_<op>.png (fraction of ceiling per case)
                   with bench/plot.py; the JSON goes to PREFIX.json unless --json is given
  --help           this text

environment:
  OPENMLA_COMMIT   the commit recorded in the JSON (default: the commit at configure time)
)";

struct Options {
  std::string filter, json_path, plot_prefix;
  bool quick = false;
  double sustain_seconds = 0;  // > 0: steady-state timing (--sustain)
};

// Timed calls per case in the default (median) timing.
int timed_repetitions(const Options& options) { return options.quick ? 10 : 30; }

// Returns false (after saying why) on a malformed command line.
bool parse_options(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    auto next_value = [&](std::string& destination) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "openmla-bench: %s needs a value\n", argument.c_str());
        return false;
      }
      destination = argv[++i];
      return true;
    };
    if (argument == "--help" || argument == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (argument == "--quick") {
      options.quick = true;
    } else if (argument == "--sustain") {
      std::string seconds;
      if (!next_value(seconds)) return false;
      char* end = nullptr;
      options.sustain_seconds = std::strtod(seconds.c_str(), &end);
      if (end == seconds.c_str() || *end != '\0' || !(options.sustain_seconds > 0)) {
        std::fprintf(stderr, "openmla-bench: --sustain needs a number of seconds > 0, got '%s'\n",
                     seconds.c_str());
        return false;
      }
    } else if (argument == "--filter") {
      if (!next_value(options.filter)) return false;
    } else if (argument == "--json") {
      if (!next_value(options.json_path)) return false;
    } else if (argument == "--plot") {
      if (!next_value(options.plot_prefix)) return false;
    } else {
      std::fprintf(stderr, "openmla-bench: unknown argument '%s'\n\n%s", argument.c_str(), kUsage);
      return false;
    }
  }
  return true;
}

#if OPENMLA_WITH_CUDA
// The kernel driver's version (e.g. "580.65.06"), from the one place Linux states it; the CUDA
// driver API version where that file is missing.
std::string driver_version() {
  std::ifstream file("/proc/driver/nvidia/version");
  std::string token;
  while (file >> token) {
    const bool version_like = token.find('.') != std::string::npos &&
                              token.find_first_not_of("0123456789.") == std::string::npos;
    if (version_like) return token;
  }
  int version = 0;
  cudaDriverGetVersion(&version);
  return "CUDA driver API " + std::to_string(version / 1000) + "." +
         std::to_string(version % 1000 / 10);
}

std::string runtime_version() {
  int version = 0;
  cudaRuntimeGetVersion(&version);
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Measures the ceilings, then every case that matches the filter. Returns false when a case
// failed (a skipped one, without a GPU kernel yet, is not a failure).
bool run_gpu(const Options& options, RunInfo& info, Ceilings& ceilings,
             std::vector<Result>& results) {
  const char* op = "openmla-bench";
  check_cuda(cudaSetDevice(0), op, "cudaSetDevice");
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, 0), op, "cudaGetDeviceProperties");
  info.gpu = properties.name;
  info.driver = driver_version();
  info.cuda = runtime_version();
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), op, "cudaStreamCreate");

  std::vector<Case> ceiling_list = ceiling_cases();
  std::vector<Case> all_cases, cases;
  add_kv_cache_cases(all_cases);
  add_dense_decode_cases(all_cases);
  std::vector<std::string> wanted;  // --filter's alternatives
  for (size_t begin = 0;;) {
    const size_t comma = options.filter.find(',', begin);
    wanted.push_back(options.filter.substr(begin, comma - begin));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  for (const Case& candidate : all_cases) {
    const std::string label = candidate.op + " " + candidate.dtype + " " + candidate.name;
    for (const std::string& substring : wanted) {
      if (label.find(substring) != std::string::npos) {
        cases.push_back(candidate);
        break;
      }
    }
  }

  const int repetitions = timed_repetitions(options);
  const int total = int(ceiling_list.size() + cases.size());
  int step = 0;
  bool all_ran = true;
  const EnergyCounter energy(0);
  if (options.sustain_seconds > 0 && !energy.available()) {
    std::fprintf(stderr, "openmla-bench: no energy counter (NVML) for this GPU: no energy per call\n");
  }
  // Time of one case in us (median, or steady state with its energy), time NaN when it has no
  // GPU kernel yet or failed.
  auto measure = [&](const Case& bench_case) {
    std::fprintf(stderr, "[%d/%d] %s %s %s ...", ++step, total, bench_case.op.c_str(),
                 bench_case.dtype.c_str(), bench_case.name.c_str());
    try {
      const Launcher launcher = bench_case.prepare();
      Measurement measured;
      if (options.sustain_seconds > 0) {
        measured = steady_state(launcher, options.sustain_seconds, stream, energy);
      } else {
        measured.time_us = median_time_us(launcher, repetitions, stream);
      }
      std::fprintf(stderr, " %.2f us", measured.time_us);
      if (std::isfinite(measured.energy_mj)) {
        std::fprintf(stderr, ", %.3f mJ, %.0f W, SM %.0f MHz", measured.energy_mj, measured.power_w,
                     measured.sm_clock_mhz);
      }
      std::fprintf(stderr, "\n");
      return measured;
    } catch (const Error& error) {
      const bool missing_kernel = error.kind() == ErrorKind::kNotImplemented;
      std::fprintf(stderr, " %s: %s\n", missing_kernel ? "skipped" : "FAILED", error.what());
      all_ran = all_ran && missing_kernel;
    } catch (const std::exception& error) {
      std::fprintf(stderr, " FAILED: %s\n", error.what());
      all_ran = false;
    }
    return Measurement{};
  };

  const Ceilings unknown;
  ceilings.copy_gbps = make_result(ceiling_list[0], measure(ceiling_list[0]), unknown).gbps;
  ceilings.bf16_gemm_tflops = make_result(ceiling_list[1], measure(ceiling_list[1]), unknown).tflops;
  ceilings.fp8_gemm_tflops = make_result(ceiling_list[2], measure(ceiling_list[2]), unknown).tflops;
  std::printf("%s, driver %s, CUDA %s, commit %s\n", info.gpu.c_str(), info.driver.c_str(),
              info.cuda.c_str(), info.commit.c_str());
  std::printf("ceilings: copy %.0f GB/s, BF16 GEMM %.0f TFLOPS, FP8 GEMM %.0f TFLOPS\n\n",
              ceilings.copy_gbps, ceilings.bf16_gemm_tflops, ceilings.fp8_gemm_tflops);

  for (const Case& bench_case : cases) {
    const Measurement measured = measure(bench_case);
    if (std::isfinite(measured.time_us)) results.push_back(make_result(bench_case, measured, ceilings));
  }
  cudaStreamDestroy(stream);
  return all_ran && std::isfinite(ceilings.copy_gbps) &&
         std::isfinite(ceilings.bf16_gemm_tflops) && std::isfinite(ceilings.fp8_gemm_tflops);
}
#endif

// bench/plot.py: installed next to the binary's share/ folder, or in the source tree.
std::string find_plot_script() {
  std::error_code ignored;
  const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", ignored);
  const std::filesystem::path candidates[] = {
      executable.parent_path().parent_path() / "share" / "openmla" / "bench" / "plot.py",
      std::filesystem::path(OPENMLA_SOURCE_DIR) / "bench" / "plot.py",
  };
  for (const auto& candidate : candidates) {
    if (std::filesystem::exists(candidate, ignored)) return candidate.string();
  }
  return "";
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

bool write_file(const std::string& path, const std::string& contents) {
  std::ofstream file(path);
  file << contents;
  if (!file) std::fprintf(stderr, "openmla-bench: cannot write %s\n", path.c_str());
  return bool(file);
}

int run(int argc, char** argv) {
  Options options;
  if (!parse_options(argc, argv, options)) return 2;

  RunInfo info;
  info.commit = commit_id();
  info.date = iso_date_now();
  char timing[96];
  if (options.sustain_seconds > 0) {
    std::snprintf(timing, sizeof timing, "steady state: mean of back-to-back calls over %g s",
                  options.sustain_seconds);
  } else {
    std::snprintf(timing, sizeof timing, "median of %d calls after a 10 ms warm-up",
                  timed_repetitions(options));
  }
  info.timing = timing;
  Ceilings ceilings;
  std::vector<Result> results;
  bool ok = true;
  if (cuda_available()) {
#if OPENMLA_WITH_CUDA
    ok = run_gpu(options, info, ceilings, results);
#endif
  } else {
    std::printf("no GPU found: running the CPU reference on a small case\n");
    info.gpu = "none (CPU reference)";
    info.driver = info.cuda = "none";
    info.timing = "host wall clock";
    results = run_cpu_reference();
    std::printf("\n");
  }
  print_table(results);

  std::string json_path = options.json_path;
  if (json_path.empty() && !options.plot_prefix.empty()) json_path = options.plot_prefix + ".json";
  if (!json_path.empty()) {
    ok = write_file(json_path, results_json(info, ceilings, results)) && ok;
    std::printf("\nresults: %s\n", json_path.c_str());
  }
  if (!options.plot_prefix.empty()) {
    const std::string script = find_plot_script();
    if (script.empty()) {
      std::fprintf(stderr, "openmla-bench: bench/plot.py not found; no plots\n");
      return 1;
    }
    std::fflush(stdout);  // the table before the script's own output
    const std::string command = "python3 " + shell_quote(script) + " " + shell_quote(json_path) +
                                " " + shell_quote(options.plot_prefix);
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "openmla-bench: plotting failed: %s\n", command.c_str());
      return 1;
    }
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace openmla::bench

int main(int argc, char** argv) {
  try {
    return openmla::bench::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "openmla-bench: %s\n", error.what());
    return 1;
  }
}
