// openmla: the whole public API. Host-only headers: no CUDA toolkit needed to include them.
#pragma once

#include "openmla/common.h"
#include "openmla/dense_decode.h"
#include "openmla/dense_prefill.h"
#include "openmla/error.h"
#include "openmla/kv_cache.h"
#include "openmla/numerics.h"
#include "openmla/sparse_decode.h"
#include "openmla/sparse_prefill.h"
#include "openmla/tensor.h"
