// Argument validation shared by every op's API file: each check names the op and the
// argument and says what was expected, and runs before anything is launched or written.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "openmla/common.h"

namespace openmla {

class ArgumentChecker {
 public:
  explicit ArgumentChecker(const char* op) : op_(op) {}
  const char* op() const { return op_; }

  [[noreturn]] void fail(const char* argument, const std::string& detail) const;
  [[noreturn]] void not_implemented(const std::string& detail) const;

  void required(const char* argument, const TensorView& tensor) const;
  void dtype(const char* argument, const TensorView& tensor,
             std::initializer_list<DType> allowed) const;
  void same_dtype(const char* argument, const TensorView& tensor, const char* other_argument,
                  const TensorView& other) const;
  void rank(const char* argument, const TensorView& tensor, int expected) const;
  // dim may be negative (from the end); meaning names the dimension in the message.
  void size(const char* argument, const TensorView& tensor, int dim, int64_t expected,
            const char* meaning) const;
  void same_size(const char* argument, const TensorView& tensor, int dim,
                 const char* other_argument, const TensorView& other, int other_dim,
                 const char* meaning) const;
  void last_dim_contiguous(const char* argument, const TensorView& tensor) const;
  void positive_finite(const char* argument, float value) const;
  void power_of_two(const char* argument, int64_t value, int64_t min, int64_t max) const;
  // int32 [batch+1]; when host-resident also checks starts at 0, non-decreasing, last <= total.
  void cu_seqlens(const char* argument, const TensorView& tensor, int64_t batch,
                  int64_t total) const;
  void workspace(const TensorView& workspace, size_t needed_bytes) const;

  // Every present tensor must be on one device; returns it. Absent optionals are ignored.
  Device common_device(
      std::initializer_list<std::pair<const char*, const TensorView*>> tensors) const;

 private:
  const char* op_;
};

// The outputs every decode op shares: out [B, Sq, Hq, 512] bf16, optional lse [B, Sq, Hq] fp32.
void check_decode_outputs(const ArgumentChecker& check, const TensorView& out, const TensorView& lse,
                          int64_t batch, int64_t query_tokens, int64_t heads);

// A [pages, page, 1, last] cache view seen as [pages, page, last] (a single kv head).
TensorView drop_single_head_dim(const ArgumentChecker& check, const char* argument,
                                const TensorView& cache);

}  // namespace openmla
