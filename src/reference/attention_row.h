// One query row of softmax attention in float64, shared by the four attention references:
// an online softmax (running max, rescaled sum and accumulator) so that keys stream through
// once, plus the conventions every op shares for writing a row out (empty row = 0 / -inf,
// sink in the denominator only, LSE base).
#pragma once

#include <cmath>
#include <limits>
#include <vector>

#include "openmla/common.h"
#include "reference/tensor_access.h"

namespace openmla::reference {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// Loads `count` consecutive elements (the contiguous last dim) from `offset`, times `scale`.
inline void load_row(const TensorView& view, int64_t offset, int64_t count, double scale,
                     double* row) {
  for (int64_t i = 0; i < count; ++i) row[i] = load(view, offset + i) * scale;
}

inline double dot(const double* a, const double* b, int64_t count) {
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += a[i] * b[i];
  return sum;
}

class AttentionRow {
 public:
  explicit AttentionRow(int64_t value_dim) : accumulator_(size_t(value_dim), 0.0) {}

  // One attended key: its scaled logit and the first value_dim entries of `value`.
  void add(double logit, const double* value) {
    if (logit > max_logit_) {
      // A new maximum: rescale what was summed so far (exp(-inf) = 0 on the first key).
      double rescale = std::exp(max_logit_ - logit);
      sum_ *= rescale;
      for (double& entry : accumulator_) entry *= rescale;
      max_logit_ = logit;
    }
    double weight = std::exp(logit - max_logit_);
    sum_ += weight;
    for (size_t d = 0; d < accumulator_.size(); ++d) accumulator_[d] += weight * value[d];
  }

  bool empty() const { return sum_ == 0; }
  double max_logit() const { return max_logit_; }
  // Natural-log LSE of the attended keys (the sink excluded); -inf when none was attended.
  double lse() const { return empty() ? kNegativeInfinity : max_logit_ + std::log(sum_); }

  // Normalised output: sum_j p_j v_j / (sum_j p_j + exp(sink)); all zeros when empty.
  // sink_logit = -inf means no sink.
  std::vector<double> output(double sink_logit = kNegativeInfinity) const {
    std::vector<double> out(accumulator_.size(), 0.0);
    if (empty()) return out;
    double denominator = sum_ + std::exp(sink_logit - max_logit_);
    for (size_t d = 0; d < out.size(); ++d) out[d] = accumulator_[d] / denominator;
    return out;
  }

 private:
  std::vector<double> accumulator_;
  double sum_ = 0;
  double max_logit_ = kNegativeInfinity;
};

inline double lse_in_base(double natural_lse, LseBase base) {
  return base == LseBase::kBase2 ? natural_lse / M_LN2 : natural_lse;
}

// Writes a finished row: out[offset .. offset + value_dim) (contiguous last dim) and, when the
// optional view is present, the LSE at lse_offset.
inline void store_row(const AttentionRow& row, double sink_logit, const TensorView& out,
                      int64_t out_offset, const TensorView& lse, int64_t lse_offset,
                      LseBase lse_base) {
  std::vector<double> values = row.output(sink_logit);
  for (size_t d = 0; d < values.size(); ++d) store(out, out_offset + int64_t(d), values[d]);
  if (lse.present()) store(lse, lse_offset, lse_in_base(row.lse(), lse_base));
}

}  // namespace openmla::reference
