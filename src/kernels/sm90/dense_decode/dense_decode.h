// Hopper dense MLA decode: split-KV attention kernel + combine. Entry point for src/api.
#pragma once

#include "openmla/dense_decode.h"

namespace openmla::kernels::sm90 {

// params are validated (src/api/dense_decode.cpp): CUDA tensors, cache seen as 3-D, workspace
// of at least dense_decode_workspace_size() bytes. Launches on params.stream; never syncs.
void dense_decode(const DenseDecodeParams& params);

}  // namespace openmla::kernels::sm90
