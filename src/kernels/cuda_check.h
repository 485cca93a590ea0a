// The one launch-check helper: every CUDA runtime call and every kernel launch in openmla
// goes through these, so a failure becomes an openmla::Error naming the op.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "openmla/error.h"

namespace openmla {

inline void check_cuda(cudaError_t status, const char* op, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::kCuda, op, "",
                std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}

// Call right after a <<<...>>> launch: reports a bad configuration at once (asynchronous
// faults surface at the caller's next synchronisation, as usual in CUDA).
inline void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

// Launches `kernel` and checks the launch. With `programmatic` (programmatic dependent launch,
// sm_90), the kernel may begin while the previous kernel in the stream finishes; it must call
// griddepcontrol.wait (kernels/sm90/launch_dependencies.cuh) before reading that kernel's output.
template <typename... Parameters, typename... Arguments>
void launch_kernel(const char* op, void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, bool programmatic, Arguments&&... arguments) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...), op, "kernel launch");
}

inline cudaStream_t as_cuda_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Blocks for a 1-D grid over `work_items`, each block covering `items_per_block`.
inline unsigned blocks_for(long long work_items, long long items_per_block) {
  long long blocks = (work_items + items_per_block - 1) / items_per_block;
  return unsigned(blocks < 1 ? 1 : blocks);
}

// log2 of a power of two (a page size), for shift/mask addressing.
inline int log2_of(int64_t power_of_two) {
  int shift = 0;
  while ((int64_t(1) << shift) < power_of_two) ++shift;
  return shift;
}

}  // namespace openmla
