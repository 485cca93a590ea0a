// cp.async (sm_80+): 16-byte global -> shared copies that hold no register while in flight,
// the way the memory-bound kernels keep many bytes in flight per SM; and the L2 line prefetch
// hint. One header for every kernel that stages through shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace openmla::kernels {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte global -> shared copy that holds no register while in flight.
__device__ __forceinline__ void copy_async_16(void* shared_destination, const void* global_source) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared_destination)),
               "l"(global_source)
               : "memory");
}
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// A hint: the 128-byte line holding `address` into L2 (through the SM's load path, not the TMA).
__device__ __forceinline__ void prefetch_line_to_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(address));
}

}  // namespace openmla::kernels
