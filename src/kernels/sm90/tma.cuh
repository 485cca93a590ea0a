// Hopper bulk-copy vocabulary: the tensor memory accelerator (TMA) loading boxes of a paged KV
// cache into shared memory, and the mbarriers that say when they have landed and when a stage
// may be refilled (dense_decode/key_tiles.cuh), and that hand data between warpgroups
// (dense_decode/alternating_kernel.cuh).
//
// A paged cache [pages, page_size, 576] is described to the TMA as 5-D tensors whose boxes land
// parts of key tiles 128-byte swizzled (tma_load_group_box): the layout that wgmma reads
// (wgmma.cuh) and, for FP8 caches, that ldmatrix reads without bank conflicts
// (dense_decode/fp8_fragments.cuh). (tma_load_box: the 3-D form, for the micro-benchmarks.)
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/async_copy.cuh"

namespace openmla::kernels::sm90 {

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}
// Makes the initialised barriers visible to the TMA unit (the async proxy) and other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA traffic the current phase must wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}
// Blocks until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// Fetches a TMA descriptor (a __grid_constant__ kernel parameter) ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// TMA: box at coordinates (dim, token, page) of `map` -> shared `destination`; completion is
// counted in bytes on `barrier`.
__device__ __forceinline__ void tma_load_box(void* destination, const CUtensorMap* map, int dim, int token,
                                             int page, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(shared_address(destination)),
      "l"(map), "r"(dim), "r"(token), "r"(page), "r"(shared_address(barrier))
      : "memory");
}

// TMA: box at (dim, line 0, block, group, page) of a 5-D view of a paged cache (dims of a block,
// 8 lines of a group, blocks, 8-line groups of a page, pages): the box's blocks and groups land
// [group][block][line] (dense_decode/key_tiles.cuh GroupedTile).
__device__ __forceinline__ void tma_load_group_box(void* destination, const CUtensorMap* map, int dim, int block,
                                                   int group, int page, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], "
      "[%7];\n" ::"r"(shared_address(destination)),
      "l"(map), "r"(dim), "r"(0), "r"(block), "r"(group), "r"(page), "r"(shared_address(barrier))
      : "memory");
}

// The same box into L2 only: a hint that nothing waits for (dense_decode/key_tiles.cuh
// prefetch_first_key_tiles).
__device__ __forceinline__ void tma_prefetch_group_box(const CUtensorMap* map, int dim, int block, int group, int page) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];\n" ::"l"(map), "r"(dim),
               "r"(0), "r"(block), "r"(group), "r"(page)
               : "memory");
}

}  // namespace openmla::kernels::sm90
