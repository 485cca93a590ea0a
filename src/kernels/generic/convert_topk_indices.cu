// convert_topk_indices: request-local top-k positions -> global cache slots through the block
// table: block_table[r][p >> shift] * page_size + (p & (page_size - 1)); positions < 0, past
// the table's capacity, or at/after topk_length[t] become -1.
// Tiling: one thread per 4 consecutive entries of a row (one 16-byte load and store when the
// row segment is aligned and full), consecutive threads on consecutive segments, so a warp
// reads and writes 512 contiguous bytes.
// Pipeline: the local indices, the row's request id and length are independent loads; the
// block-table reads (L2-resident, one per valid entry) depend only on them.
// Limits: the block table is never read for an invalid entry; a request id outside [0, B)
// (trusted on the device, checked on the CPU path) gives -1 rather than a wild read.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/vector_access.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kEntriesPerThread = 4;

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

__global__ void __launch_bounds__(kThreads) convert_topk_indices_kernel(ConvertArgs args) {
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t token = item / args.segments_per_row;
  if (token >= args.tokens) return;
  const int64_t first = (item % args.segments_per_row) * kEntriesPerThread;
  const int count = int(args.topk - first < kEntriesPerThread ? args.topk - first : kEntriesPerThread);

  const int32_t* local = args.local + token * args.local_row + first;
  int32_t* global = args.global + token * args.global_row + first;
  int32_t positions[kEntriesPerThread];
  if (count == kEntriesPerThread) {
    uint4 chunk = load_chunk(local);
    positions[0] = int32_t(chunk.x);
    positions[1] = int32_t(chunk.y);
    positions[2] = int32_t(chunk.z);
    positions[3] = int32_t(chunk.w);
  } else {
#pragma unroll
    for (int k = 0; k < kEntriesPerThread; ++k) positions[k] = k < count ? local[k] : -1;
  }
  const int64_t valid = args.topk_length ? args.topk_length[token * args.topk_length_stride]
                                         : args.topk;
  const int64_t request = args.request_ids[token * args.request_ids_stride];
  const bool request_ok = request >= 0 && request < args.batch;
  const int32_t* table_row = args.block_table + request * args.block_table_row;
  const int64_t page_size = int64_t(1) << args.page_shift;

  int32_t slots[kEntriesPerThread];
#pragma unroll
  for (int k = 0; k < kEntriesPerThread; ++k) {
    const int64_t position = positions[k];
    slots[k] = -1;
    if (request_ok && first + k < valid && position >= 0 && position < args.capacity) {
      const int64_t page = table_row[position >> args.page_shift];
      slots[k] = int32_t(page * page_size + (position & (page_size - 1)));
    }
  }
  if (count == kEntriesPerThread) {
    store_chunk(global, make_uint4(uint32_t(slots[0]), uint32_t(slots[1]), uint32_t(slots[2]),
                                   uint32_t(slots[3])));
  } else {
    for (int k = 0; k < count; ++k) global[k] = slots[k];
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
  args.segments_per_row = (topk + kEntriesPerThread - 1) / kEntriesPerThread;
  convert_topk_indices_kernel<<<blocks_for(tokens * args.segments_per_row, kThreads), kThreads,
                                0, as_cuda_stream(params.stream)>>>(args);
  check_launch("convert_topk_indices");
}

}  // namespace openmla::kernels
