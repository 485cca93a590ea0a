// convert_topk_indices: request-local top-k positions -> global cache slots through the block
// table: block_table[r][p >> shift] * page_size + (p & (page_size - 1)); positions < 0, past
// the table's capacity, or at/after topk_length[t] become -1.
// Tiling: a 2-D grid: blockIdx.y walks groups of kRowsPerBlock consecutive tokens (grid-stride
// past 65535 groups), blockIdx.x the rows' 4-entry segments. Per row, a thread takes 2 segments
// (8 entries), strided by the block size so that each of its 16-byte loads and stores is
// coalesced across the warp; the block size (32..256) follows topk so that short rows do not
// idle whole warps.
// Staged table: the lookups hit random words of a request's table row, so a warp's load
// touches ~20-32 L1 lines and L1 tag throughput, not DRAM, bounds the kernel. When all rows of
// a group share one valid request (rows of a request are consecutive in practice), the block
// first copies that table row into shared memory (coalesced, 16-byte chunks when aligned) and
// looks up there. A group with mixed requests looks up in global memory. The choice is
// uniform per block, so the barriers never diverge.
// Pipeline: per row, the row's request id and length and the thread's 2 position loads are
// independent; then all 8 table reads are issued before any is used.
// Limits: staging needs max_pages <= kMaxStagedPages (48 KB of shared memory) and is skipped
// when a group does fewer lookups than the table has pages (short rows, huge tables). The block
// table is never read for an invalid entry; a request id outside [0, B) (trusted on the
// device, checked on the CPU path) gives -1 rather than a wild read.
#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kEntriesPerSegment = 4;  // one 16-byte access
constexpr int kSegmentsPerThread = 2;
constexpr int kEntriesPerThread = kEntriesPerSegment * kSegmentsPerThread;
constexpr int kMaxGridY = 65535;
// 8 entries per thread and a 64-register cap (4 blocks of 256 per SM, no spills): measured on
// an H200 at 0.88 of copy, against 0.82 uncapped (3 blocks) and 0.78 at 5 blocks (spills).
constexpr int kMinBlocksPerSm = 4;
constexpr int kRowsPerBlock = 8;
constexpr int64_t kMaxStagedPages = 48 * 1024 / sizeof(int32_t);  // no opt-in needed up to 48 KB

struct ConvertArgs {
  const int32_t* local;
  int64_t local_row;
  const int32_t* request_ids;
  int64_t request_ids_stride;
  const int32_t* block_table;
  int64_t block_table_row;
  int64_t batch;
  int page_shift;
  int64_t max_pages;
  int64_t capacity;  // max_pages * page_size
  bool stage_table;  // copy a group's table row to shared memory when the group has one request
  const int32_t* topk_length;  // null when not given
  int64_t topk_length_stride;
  int32_t* global;
  int64_t global_row;
  int64_t tokens;
  int64_t topk;
  int64_t segments_per_row;
};

// One token row: lookups in `table` (the request's table row, in shared or global memory).
// Everything inside a row is 32-bit (topk, positions, capacity and slots fit int32; the host
// checks capacity): at ~16 entries per thread the index arithmetic, not DRAM, was the limit
// with 64-bit math.
__device__ __forceinline__ void convert_row(const ConvertArgs& args, int64_t token, bool request_ok,
                                            const int32_t* table, int64_t block_first_segment) {
  const int32_t offset_mask = (int32_t(1) << args.page_shift) - 1;
  const int32_t topk = int32_t(args.topk);
  const int32_t valid = args.topk_length ? args.topk_length[token * args.topk_length_stride] : topk;
  const int32_t capacity = int32_t(args.capacity);
  const int32_t* local = args.local + token * args.local_row;
  int32_t* global = args.global + token * args.global_row;

  int32_t firsts[kSegmentsPerThread];
  int counts[kSegmentsPerThread];
  int32_t positions[kEntriesPerThread];
#pragma unroll
  for (int s = 0; s < kSegmentsPerThread; ++s) {
    const int64_t segment = block_first_segment + s * blockDim.x + threadIdx.x;
    firsts[s] = int32_t(segment) * kEntriesPerSegment;
    const int32_t left = topk - firsts[s];
    counts[s] = segment < args.segments_per_row ? (left < kEntriesPerSegment ? left : kEntriesPerSegment) : 0;
    int32_t* entry = positions + s * kEntriesPerSegment;
    if (counts[s] == kEntriesPerSegment) {
      uint4 chunk = load_chunk(local + firsts[s]);
      entry[0] = int32_t(chunk.x);
      entry[1] = int32_t(chunk.y);
      entry[2] = int32_t(chunk.z);
      entry[3] = int32_t(chunk.w);
    } else {
#pragma unroll
      for (int k = 0; k < kEntriesPerSegment; ++k) entry[k] = k < counts[s] ? local[firsts[s] + k] : -1;
    }
  }
  // All table reads first (independent of each other), then the arithmetic.
  int32_t pages[kEntriesPerThread];
  bool used[kEntriesPerThread];
#pragma unroll
  for (int i = 0; i < kEntriesPerThread; ++i) {
    const int32_t position = positions[i];
    const int s = i / kEntriesPerSegment, k = i % kEntriesPerSegment;
    // Unsigned compare: negative positions wrap above capacity, one test for both bounds.
    used[i] = request_ok && k < counts[s] && firsts[s] + k < valid &&
              uint32_t(position) < uint32_t(capacity);
    pages[i] = used[i] ? table[position >> args.page_shift] : 0;
  }
  int32_t slots[kEntriesPerThread];
#pragma unroll
  for (int i = 0; i < kEntriesPerThread; ++i) {
    slots[i] = used[i] ? (pages[i] << args.page_shift) + (positions[i] & offset_mask) : -1;
  }
#pragma unroll
  for (int s = 0; s < kSegmentsPerThread; ++s) {
    const int32_t* slot = slots + s * kEntriesPerSegment;
    if (counts[s] == kEntriesPerSegment) {
      store_chunk(global + firsts[s], make_uint4(uint32_t(slot[0]), uint32_t(slot[1]),
                                                 uint32_t(slot[2]), uint32_t(slot[3])));
    } else {
#pragma unroll
      for (int k = 0; k < kEntriesPerSegment; ++k) {
        if (k < counts[s]) global[firsts[s] + k] = slot[k];
      }
    }
  }
}

__device__ __forceinline__ void stage_table_row(const int32_t* table_row, int64_t max_pages,
                                                int32_t* staged) {
  int64_t first_scalar = 0;
  if (chunk_aligned(table_row)) {  // the shared buffer is 16-byte aligned
    const int64_t chunks = max_pages / kEntriesPerSegment;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      reinterpret_cast<uint4*>(staged)[c] = __ldg(reinterpret_cast<const uint4*>(table_row) + c);
    }
    first_scalar = chunks * kEntriesPerSegment;
  }
  for (int64_t p = first_scalar + threadIdx.x; p < max_pages; p += blockDim.x) staged[p] = __ldg(table_row + p);
}

__global__ void __launch_bounds__(kMaxThreads, kMinBlocksPerSm) convert_topk_indices_kernel(ConvertArgs args) {
  extern __shared__ __align__(16) int32_t staged_table[];
  const int64_t block_first_segment = int64_t(blockIdx.x) * blockDim.x * kSegmentsPerThread;
  for (int64_t first_row = int64_t(blockIdx.y) * kRowsPerBlock; first_row < args.tokens;
       first_row += int64_t(gridDim.y) * kRowsPerBlock) {
    const int rows = int(min(int64_t(kRowsPerBlock), args.tokens - first_row));
    bool staged = false;
    if (args.stage_table) {
      const int64_t request = args.request_ids[first_row * args.request_ids_stride];
      const bool same_request =
          int(threadIdx.x) >= rows ||
          args.request_ids[(first_row + threadIdx.x) * args.request_ids_stride] == request;
      // The barrier also keeps the previous group's lookups ahead of the refill below.
      staged = __syncthreads_and(same_request) && request >= 0 && request < args.batch;
      if (staged) {
        stage_table_row(args.block_table + request * args.block_table_row, args.max_pages, staged_table);
        __syncthreads();
      }
    }
    for (int row = 0; row < rows; ++row) {
      const int64_t token = first_row + row;
      if (staged) {
        convert_row(args, token, true, staged_table, block_first_segment);
      } else {
        const int64_t request = args.request_ids[token * args.request_ids_stride];
        const bool request_ok = request >= 0 && request < args.batch;
        convert_row(args, token, request_ok, args.block_table + (request_ok ? request : 0) * args.block_table_row,
                    block_first_segment);
      }
    }
  }
}

}  // namespace

void convert_topk_indices(const ConvertTopkIndicesParams& params) {
  const int64_t tokens = params.local_indices.size(0);
  const int64_t topk = params.local_indices.size(1);
  if (tokens == 0 || topk == 0) return;
  ConvertArgs args;
  args.local = params.local_indices.ptr<const int32_t>();
  args.local_row = params.local_indices.stride(0);
  args.request_ids = params.request_ids.ptr<const int32_t>();
  args.request_ids_stride = params.request_ids.stride(0);
  args.block_table = params.block_table.ptr<const int32_t>();
  args.block_table_row = params.block_table.stride(0);
  args.batch = params.block_table.size(0);
  args.page_shift = log2_of(params.page_size);
  args.max_pages = params.block_table.size(1);
  args.capacity = args.max_pages * params.page_size;
  args.topk_length = params.topk_length.present() ? params.topk_length.ptr<const int32_t>() : nullptr;
  args.topk_length_stride = params.topk_length.present() ? params.topk_length.stride(0) : 0;
  args.global = params.global_indices.ptr<int32_t>();
  args.global_row = params.global_indices.stride(0);
  args.tokens = tokens;
  args.topk = topk;
  args.segments_per_row = (topk + kEntriesPerSegment - 1) / kEntriesPerSegment;
  // Enough threads for the row (whole warps), at most kMaxThreads; more blocks along x beyond.
  const int64_t threads_needed = (args.segments_per_row + kSegmentsPerThread - 1) / kSegmentsPerThread;
  const int threads = int(std::min<int64_t>(kMaxThreads, (threads_needed + kWarpSize - 1) / kWarpSize * kWarpSize));
  // Staging reads max_pages entries: worth it only when a group looks up at least as many.
  const int64_t lookups_per_group = kRowsPerBlock * std::min<int64_t>(topk, int64_t(threads) * kEntriesPerThread);
  args.stage_table = args.max_pages <= kMaxStagedPages && lookups_per_group >= args.max_pages;
  const size_t shared_bytes = args.stage_table ? size_t(args.max_pages) * sizeof(int32_t) : 0;
  const int64_t groups = (tokens + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid(unsigned(blocks_for(args.segments_per_row, int64_t(threads) * kSegmentsPerThread)),
                  unsigned(std::min<int64_t>(groups, kMaxGridY)));
  convert_topk_indices_kernel<<<grid, threads, shared_bytes, as_cuda_stream(params.stream)>>>(args);
  check_launch("convert_topk_indices");
}

}  // namespace openmla::kernels
