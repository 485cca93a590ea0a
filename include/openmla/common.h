// openmla: conventions shared by every operation's parameter struct.
#pragma once

#include "openmla/error.h"
#include "openmla/tensor.h"

namespace openmla {

// Base of the log-sum-exp an op returns. Natural log is the default; base 2 is what some
// engines keep internally (LSE2 = LSE / ln 2).
enum class LseBase : int32_t { kNatural, kBase2 };

// Version of the library, "major.minor.patch".
const char* version();

// True when this build has CUDA kernels and a CUDA device is visible.
bool cuda_available();

}  // namespace openmla
