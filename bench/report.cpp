// openmla-bench: results, the table and the JSON document.
#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "json_writer.h"

#ifndef OPENMLA_BENCH_COMMIT
#define OPENMLA_BENCH_COMMIT "unknown"
#endif

namespace openmla::bench {

Result make_result(const Case& bench_case, const Measurement& measured, const Ceilings& ceilings) {
  const double time_us = measured.time_us;
  Result result;
  static_cast<Measurement&>(result) = measured;
  result.op = bench_case.op;
  result.name = bench_case.name;
  result.dtype = bench_case.dtype;
  result.gbps = bench_case.bytes / (time_us * 1e-6) / 1e9;
  result.tflops = bench_case.flops / (time_us * 1e-6) / 1e12;
  result.frac_copy = result.gbps / ceilings.copy_gbps;
  result.frac_bf16_gemm = result.tflops / ceilings.bf16_gemm_tflops;
  result.frac_fp8_gemm = result.tflops / ceilings.fp8_gemm_tflops;
  return result;
}

std::string commit_id() {
  const char* from_environment = std::getenv("OPENMLA_COMMIT");
  return from_environment && *from_environment ? from_environment : OPENMLA_BENCH_COMMIT;
}

std::string iso_date_now() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

namespace {

// A number column: "-" when unknown (no ceiling) or meaningless (no FLOPs counted); three
// significant digits for small values, so that slow CPU-reference rates still show.
std::string cell(double value, const char* format) {
  if (!(value > 0) || !std::isfinite(value)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), value < 10 ? "%.3g" : format, value);
  return buffer;
}

}  // namespace

void print_table(const std::vector<Result>& results) {
  size_t op_width = 2, name_width = 4, dtype_width = 5;
  bool energy = false;  // the energy columns only where a steady-state run measured some
  for (const Result& r : results) {
    op_width = std::max(op_width, r.op.size());
    name_width = std::max(name_width, r.name.size());
    dtype_width = std::max(dtype_width, r.dtype.size());
    energy = energy || std::isfinite(r.energy_mj);
  }
  const int ow = int(op_width), nw = int(name_width), dw = int(dtype_width);
  std::printf("%-*s  %-*s  %-*s  %10s  %8s  %7s  %9s  %9s  %8s", ow, "op", nw, "case", dw, "dtype", "time_us",
              "GB/s", "TFLOPS", "frac_copy", "frac_bf16", "frac_fp8");
  if (energy) std::printf("  %9s  %6s  %7s", "mJ/call", "W", "SM_MHz");
  std::printf("\n");
  for (const Result& r : results) {
    std::printf("%-*s  %-*s  %-*s  %10s  %8s  %7s  %9s  %9s  %8s", ow, r.op.c_str(), nw, r.name.c_str(), dw,
                r.dtype.c_str(), cell(r.time_us, "%.2f").c_str(), cell(r.gbps, "%.0f").c_str(),
                cell(r.tflops, "%.1f").c_str(), cell(r.frac_copy, "%.3f").c_str(),
                cell(r.frac_bf16_gemm, "%.3f").c_str(), cell(r.frac_fp8_gemm, "%.3f").c_str());
    if (energy) {
      std::printf("  %9s  %6s  %7s", cell(r.energy_mj, "%.2f").c_str(), cell(r.power_w, "%.0f").c_str(),
                  cell(r.sm_clock_mhz, "%.0f").c_str());
    }
    std::printf("\n");
  }
}

std::string results_json(const RunInfo& info, const Ceilings& ceilings,
                         const std::vector<Result>& results) {
  JsonWriter json;
  json.begin_object()
      .field("gpu", info.gpu)
      .field("driver", info.driver)
      .field("cuda", info.cuda)
      .field("commit", info.commit)
      .field("date", info.date)
      .field("timing", info.timing);
  json.key("ceilings")
      .begin_object()
      .field("copy_gbps", ceilings.copy_gbps)
      .field("bf16_gemm_tflops", ceilings.bf16_gemm_tflops)
      .field("fp8_gemm_tflops", ceilings.fp8_gemm_tflops)
      .end_object();
  json.key("results").begin_array();
  for (const Result& r : results) {
    json.begin_object()
        .field("op", r.op)
        .field("case", r.name)
        .field("dtype", r.dtype)
        .field("time_us", r.time_us)
        .field("gbps", r.gbps)
        .field("tflops", r.tflops)
        .field("frac_copy", r.frac_copy)
        .field("frac_bf16_gemm", r.frac_bf16_gemm)
        .field("frac_fp8_gemm", r.frac_fp8_gemm)
        .field("energy_mj", r.energy_mj)
        .field("power_w", r.power_w)
        .field("sm_clock_mhz", r.sm_clock_mhz)
        .end_object();
  }
  json.end_array().end_object();
  return json.text() + "\n";
}

}  // namespace openmla::bench
