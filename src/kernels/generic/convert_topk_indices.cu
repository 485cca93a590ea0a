// convert_topk_indices: request-local top-k positions -> global cache slots through the block
// table: block_table[r][p >> shift] * page_size + (p & (page_size - 1)); positions < 0, past
// the table's capacity, or at/after topk_length[t] become -1.
// Tiling: a 2-D grid: blockIdx.y walks the tokens (grid-stride past 65535), blockIdx.x the
// row's 4-entry segments. A thread takes 4 segments (16 entries) of one row, strided by the
// block size so that each of its 16-byte loads and stores is coalesced across the warp; the
// block size (32..256) follows topk so that short rows do not idle whole warps.
// Pipeline: the row's request id and length, and the thread's 4 position loads, are
// independent; then all 16 block-table reads (L2-resident) are issued before any is used, so
// each thread has 16 dependent-free loads in flight.
// Limits: the block table is never read for an invalid entry; a request id outside [0, B)
// (trusted on the device, checked on the CPU path) gives -1 rather than a wild read.
#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kEntriesPerSegment = 4;  // one 16-byte access
constexpr int kSegmentsPerThread = 4;
constexpr int kEntriesPerThread = kEntriesPerSegment * kSegmentsPerThread;
constexpr int kMaxGridY = 65535;

struct ConvertArgs {
  const int32_t* local;
  int64_t local_row;
  const int32_t* request_ids;
  int64_t request_ids_stride;
  const int32_t* block_table;
  int64_t block_table_row;
  int64_t batch;
  int page_shift;
  int64_t capacity;  // max_pages * page_size
  const int32_t* topk_length;  // null when not given
  int64_t topk_length_stride;
  int32_t* global;
  int64_t global_row;
  int64_t tokens;
  int64_t topk;
  int64_t segments_per_row;
};

__global__ void __launch_bounds__(kMaxThreads) convert_topk_indices_kernel(ConvertArgs args) {
  const int64_t page_size = int64_t(1) << args.page_shift;
  const int64_t block_first_segment = int64_t(blockIdx.x) * blockDim.x * kSegmentsPerThread;
  for (int64_t token = blockIdx.y; token < args.tokens; token += gridDim.y) {
    const int64_t valid = args.topk_length ? args.topk_length[token * args.topk_length_stride]
                                           : args.topk;
    const int64_t request = args.request_ids[token * args.request_ids_stride];
    const bool request_ok = request >= 0 && request < args.batch;
    const int32_t* table_row = args.block_table + request * args.block_table_row;
    const int32_t* local = args.local + token * args.local_row;
    int32_t* global = args.global + token * args.global_row;

    int64_t firsts[kSegmentsPerThread];
    int counts[kSegmentsPerThread];
    int32_t positions[kEntriesPerThread];
#pragma unroll
    for (int s = 0; s < kSegmentsPerThread; ++s) {
      const int64_t segment = block_first_segment + s * blockDim.x + threadIdx.x;
      firsts[s] = segment * kEntriesPerSegment;
      const int64_t left = args.topk - firsts[s];
      counts[s] = segment < args.segments_per_row ? int(left < kEntriesPerSegment ? left : kEntriesPerSegment) : 0;
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
    // All block-table reads first (independent of each other), then the arithmetic.
    int32_t pages[kEntriesPerThread];
    bool used[kEntriesPerThread];
#pragma unroll
    for (int i = 0; i < kEntriesPerThread; ++i) {
      const int64_t position = positions[i];
      const int s = i / kEntriesPerSegment, k = i % kEntriesPerSegment;
      used[i] = request_ok && k < counts[s] && firsts[s] + k < valid && position >= 0 &&
                position < args.capacity;
      pages[i] = used[i] ? table_row[position >> args.page_shift] : 0;
    }
    int32_t slots[kEntriesPerThread];
#pragma unroll
    for (int i = 0; i < kEntriesPerThread; ++i) {
      slots[i] = used[i] ? int32_t(pages[i] * page_size + (positions[i] & (page_size - 1))) : -1;
    }
#pragma unroll
    for (int s = 0; s < kSegmentsPerThread; ++s) {
      const int32_t* slot = slots + s * kEntriesPerSegment;
      if (counts[s] == kEntriesPerSegment) {
        store_chunk(global + firsts[s], make_uint4(uint32_t(slot[0]), uint32_t(slot[1]),
                                                   uint32_t(slot[2]), uint32_t(slot[3])));
      } else {
        for (int k = 0; k < counts[s]; ++k) global[firsts[s] + k] = slot[k];
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
  args.capacity = params.block_table.size(1) * params.page_size;
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
  const dim3 grid(unsigned(blocks_for(args.segments_per_row, int64_t(threads) * kSegmentsPerThread)),
                  unsigned(std::min<int64_t>(tokens, kMaxGridY)));
  convert_topk_indices_kernel<<<grid, threads, 0, as_cuda_stream(params.stream)>>>(args);
  check_launch("convert_topk_indices");
}

}  // namespace openmla::kernels
