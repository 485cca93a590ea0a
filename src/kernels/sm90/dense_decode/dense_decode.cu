// Dense MLA decode on Hopper: the launcher. Picks the kernel (for <= 32 query rows, in tiles of
// 16 or 32, narrow_kernel.cuh with a 16-bit cache, narrow_fp8_kernel.cuh with an FP8 one; else
// alternating_kernel.cuh, 64-row tiles) and the
// instantiation for the dtypes, describes the cache to the TMA, plans the split-KV grid from
// shapes alone (plan/decode_plan.h), and launches the attention kernel and, when the plan has
// several splits, the combine kernel (combine_kernel.cuh: a warp per row for balanced plans
// and for uniform plans with many rows, a block per row eighth for uniform plans with few).
// Nothing here reads device memory or synchronises, so a call captures into a CUDA graph and
// replays with new seq_lens and block tables.
#include "kernels/sm90/dense_decode/dense_decode.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "kernels/sm90/dense_decode/alternating_kernel.cuh"
#include "kernels/sm90/dense_decode/combine_kernel.cuh"
#include "kernels/sm90/dense_decode/narrow_fp8_kernel.cuh"
#include "kernels/sm90/dense_decode/narrow_kernel.cuh"
#include "plan/decode_plan.h"

namespace openmla::kernels::sm90 {

namespace {

constexpr const char* kOp = "dense_decode";

// cp.async and the vector loads need 16-byte-aligned rows; the output's vector stores 8-byte.
void require_alignment(const char* argument, const TensorView& view, int bytes) {
  const size_t element = dtype_size(view.dtype);
  bool aligned = reinterpret_cast<uintptr_t>(view.data) % bytes == 0;
  for (int dim = 0; dim + 1 < view.rank; ++dim) aligned = aligned && (view.stride(dim) * element) % bytes == 0;
  if (!aligned) {
    throw Error(ErrorKind::kInvalidArgument, kOp, argument,
                "expected " + std::to_string(bytes) +
                    "-byte aligned rows (base pointer and every stride but the last) on CUDA");
  }
}

// The cache's TMA descriptors (key_tiles.cuh KeyMaps), 128-byte swizzled: 5-D views (dims of a
// block, 8 tokens of a group, blocks, groups of a page, pages; every block's line is 128 bytes)
// whose boxes of min(page, 64) tokens land a part of a key tile as [group][block][token]
// (GroupedTile). 16-bit caches: blocks of 64 dims, boxes of `latent_part_blocks` (the latent
// part: 4, or 8 for SmallPageKeyTileParts) and 1 (`rope`). FP8 caches (one layout): blocks of 128
// dims (half the box rows of 64-dim ones, which the TMA takes at its own pace; V^T by
// ldmatrix.trans, fp8_fragments.cuh WideValueFragments), `latent` boxes of dims 0..511, `rope`
// boxes of 128 dims in a view of whole rows, from the kernels' raw_rope_first_dim (by page size).
// L2 promotion 128 B, the box line's own size: with 256 B every 128-byte line a box reads pulls
// a 256-byte L2 fetch whose other half another box (or part) reads later, and on an H200 that cost
// the streams 6-7% (bf16 D2 Hq16 301 -> 279 us, FP8 Hq16 -3%, D5 -2.6%; perf log, session 57);
// an H100 read none / 128 / 256 B alike for bf16 (session 4).
KeyMaps make_key_maps(const TensorView& cache, int latent_part_blocks) {
  using Encode = PFN_cuTensorMapEncodeTiled_v12000;
  static Encode encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      function = nullptr;
    }
    return reinterpret_cast<Encode>(function);
  }();
  if (encode == nullptr) {
    throw Error(ErrorKind::kCuda, kOp, "kv_cache", "the driver has no cuTensorMapEncodeTiled (TMA)");
  }
  const bool fp8 = cache.dtype == DType::kFloat8E4M3;
  const cuuint64_t element = dtype_size(cache.dtype);
  const int64_t page_size = cache.size(1), box_tokens = std::min<int64_t>(page_size, kTileKeys);
  const cuuint64_t token_bytes = cuuint64_t(cache.stride(1)) * element, page_bytes = cuuint64_t(cache.stride(0)) * element;
  auto make = [&](CUtensorMap& map, int rank, const cuuint64_t* sizes, const cuuint64_t* strides, const cuuint32_t* box) {
    const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
    const CUresult result =
        encode(&map, fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16, cuuint32_t(rank), cache.data,
               sizes, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
      throw Error(ErrorKind::kInvalidArgument, kOp, "kv_cache",
                  "cannot be described to the TMA (cuTensorMapEncodeTiled error " + std::to_string(int(result)) +
                      "): expected 16-byte aligned pages and tokens");
    }
  };
  const cuuint64_t groups = cuuint64_t(page_size / 8), box_groups = cuuint64_t(box_tokens / 8);
  const cuuint64_t strides[4] = {token_bytes, 128, 8 * token_bytes, page_bytes};
  KeyMaps maps{};
  if (fp8) {
    const cuuint64_t latent_sizes[5] = {128, 8, kLatentDim / 128, groups, cuuint64_t(cache.size(0))};
    const cuuint32_t latent_box[5] = {128, 8, cuuint32_t(RawTileParts::blocks_in(0)), cuuint32_t(box_groups), 1};
    make(maps.latent, 5, latent_sizes, strides, latent_box);
    // Whole rows (576 dims, the one "block" a dummy): boxes at dim 448 (the row's last 128) or 512
    // (the rope, then zeros past the row's end), raw_rope_first_dim.
    const cuuint64_t rope_sizes[5] = {cuuint64_t(kHeadDim), 8, 1, groups, cuuint64_t(cache.size(0))};
    const cuuint32_t rope_box[5] = {128, 8, 1, cuuint32_t(box_groups), 1};
    make(maps.rope, 5, rope_sizes, strides, rope_box);
  } else {
    const cuuint64_t sizes[5] = {64, 8, cuuint64_t(kDimBlocks), groups, cuuint64_t(cache.size(0))};
    const cuuint32_t latent_box[5] = {64, 8, cuuint32_t(latent_part_blocks), cuuint32_t(box_groups), 1};
    const cuuint32_t rope_box[5] = {64, 8, 1, cuuint32_t(box_groups), 1};  // the rope part: one block
    make(maps.latent, 5, sizes, strides, latent_box);
    make(maps.rope, 5, sizes, strides, rope_box);
  }
  return maps;
}

// small_page_tiles: the 64-row kernel's 16-bit tiles in SmallPageKeyTileParts (pages of 16 tokens).
// speculative_first_tile: the narrow kernels at 16 rows issue a split's first tile (16-bit: its
// first part) right after the PDL wait (their kSpeculative forms).
// cta_rows: the query rows of one CTA (a row tile's: decode_plan.h rows_per_tile).
template <bool kHalf, bool kFp8Q, bool kFp8Cache>
void launch_split(const KeyMaps& maps, const SplitArgs& args, dim3 grid, int cta_rows, cudaStream_t stream,
                  bool programmatic, bool small_page_tiles, bool speculative_first_tile) {
  // Not a stream operation: allowed during graph capture, and cheap enough to repeat.
  auto launch = [&](auto kernel, int threads, int bytes) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), kOp,
               "cudaFuncSetAttribute");
    launch_kernel(kOp, kernel, grid, dim3(threads), bytes, stream, programmatic, maps, args);
  };
  auto launch_narrow = [&](auto rows) {  // the transposed kernels: the rows are wgmma's N
    constexpr int kRows = decltype(rows)::value;
    if constexpr (kFp8Cache) {
      using Layout = NarrowFp8Layout<kFp8Q, kRows>;
      if (kRows == 16 && speculative_first_tile) {
        launch(dense_decode_narrow_fp8_kernel<kFp8Q, kRows, kRows == 16>, Layout::kThreads, Layout::kLaunchBytes);
      } else {
        launch(dense_decode_narrow_fp8_kernel<kFp8Q, kRows>, Layout::kThreads, Layout::kLaunchBytes);
      }
    } else {
      using Layout = NarrowLayout<kRows>;
      if (kRows == 16 && speculative_first_tile) {
        launch(dense_decode_narrow_kernel<kHalf, kRows, kRows == 16>, Layout::kThreads, Layout::kLaunchBytes);
      } else {
        launch(dense_decode_narrow_kernel<kHalf, kRows>, Layout::kThreads, Layout::kLaunchBytes);
      }
    }
  };
  if (uses_narrow_kernel(cta_rows)) {
    if (cta_rows <= 16) {
      launch_narrow(std::integral_constant<int, 16>{});
    } else {
      launch_narrow(std::integral_constant<int, 32>{});
    }
  } else {  // 64-row tiles; the warpgroups take turns on the tiles (FP8 caches: split by role)
    constexpr int kThreads = alternating_threads<kFp8Cache>();
    constexpr int kBytes = AlternatingLayoutOf<kFp8Q, kFp8Cache>::kLaunchBytes;
    if constexpr (!kFp8Cache) {
      if (small_page_tiles) {
        launch(dense_decode_alternating_kernel<kHalf, false, false, SmallPageKeyTileParts>, kThreads, kBytes);
        return;
      }
    }
    launch(dense_decode_alternating_kernel<kHalf, kFp8Q, kFp8Cache>, kThreads, kBytes);
  }
}

}  // namespace

void dense_decode(const DenseDecodeParams& params) {
  const TensorView& q = params.q;
  const TensorView& cache = params.kv_cache;
  require_alignment("q", q, q.dtype == DType::kFloat8E4M3 ? 8 : 16);  // fp8 q: 8-byte loads
  require_alignment("kv_cache", cache, 16);
  require_alignment("out", params.out, 8);
  if (q.size(0) > 65535) {
    throw Error(ErrorKind::kInvalidArgument, kOp, "q", "expected a batch of at most 65535 on CUDA (grid y)");
  }

  const int batch = int(q.size(0)), query_tokens = int(q.size(1)), heads = int(q.size(2));
  const int sm_count = planning_sm_count(q.device);
  const bool fp8_cache = cache.dtype == DType::kFloat8E4M3;
  const bool fp8_q = q.dtype == DType::kFloat8E4M3;
  const bool half = q.dtype == DType::kFloat16;
  // Value halves (split_common.cuh key_range_of): only the 16-bit narrow kernel at 16 rows (D4,
  // D5; the 32-row kernel runs at its register limit), only for partials (a uniform split plan).
  const bool may_halve_values = !fp8_cache && query_tokens * heads <= 16;
  // Bounded by max_seq_len and the block table's capacity: no split that would get no keys.
  const int64_t length_bound = decode_length_bound(params.max_seq_len, params.block_table.size(1), cache.size(1));
  const DenseDecodePlan bounded = bound_decode_splits(plan_dense_decode(batch, query_tokens, heads, sm_count),
                                                      length_bound, may_halve_values ? 2 : 1);
  // 17..64 rows in CTAs of 16 where those get few key tiles each (decode_plan.h). With an FP8
  // cache up to 8 (D5's 32K keys at Sq 2: 8 a CTA, 11% faster than 32 rows in 4; D4 Sq 4 B4: 16%
  // faster than the 64-row kernel's 2); with a 16-bit one up to 2 for 17..32 rows (D5 Sq 2's 8
  // were 3% slower than 32 rows in 4; D4's one or two 10-12% faster) and 4 for 33..64 (D4 Sq 4 B2:
  // 27% faster than the 64-row kernel's 1; its B4's 8 3% slower, session 55). H200, perf log
  // session 54.
  const DenseDecodePlan plan =
      latency_row_tiles(bounded, batch, query_tokens * heads, length_bound, sm_count,
                        fp8_cache ? 8 : query_tokens * heads > kNarrowRows ? 4 : 2);

  SplitArgs args{};
  args.q = q.ptr<const uint8_t>();
  args.q_batch = q.stride(0);
  args.q_token = q.stride(1);
  args.q_head = q.stride(2);
  args.block_table = params.block_table.ptr<const int32_t>();
  args.block_table_row = params.block_table.stride(0);
  args.block_table_columns = int(params.block_table.size(1));
  args.cache_pages = int(cache.size(0));
  args.seq_lens = params.seq_lens.ptr<const int32_t>();
  args.seq_lens_stride = params.seq_lens.stride(0);
  args.page_shift = log2_of(cache.size(1));
  args.query_tokens = query_tokens;
  args.heads = heads;
  args.rows = query_tokens * heads;
  args.splits = int(plan.splits);
  args.balanced = plan.balanced;
  args.prefetch_before_wait = params.enable_pdl;
  args.halve_values = !plan.balanced && plan.splits >= 2 && may_halve_values;
  args.sm_count = sm_count;
  args.causal = params.causal;
  const float q_scale = fp8_q ? params.q_descale : 1.0f;
  const float kv_scale = fp8_cache ? params.kv_scale : 1.0f;
  args.logit_scale_log2 = params.softmax_scale * q_scale * kv_scale * kLog2e;
  args.value_scale = kv_scale;
  args.out = params.out.ptr<uint16_t>();
  args.out_batch = params.out.stride(0);
  args.out_token = params.out.stride(1);
  args.out_head = params.out.stride(2);
  if (params.lse.present()) {
    args.lse = params.lse.ptr<float>();
    args.lse_batch = params.lse.stride(0);
    args.lse_token = params.lse.stride(1);
    args.lse_head = params.lse.stride(2);
  }
  args.lse_base2 = params.lse_base == LseBase::kBase2;
  // The split kernels store float2 / float4 and the combine kernel loads float4 from the workspace.
  if (plan.splits > 1) require_alignment("workspace", params.workspace, 16);
  float* workspace = params.workspace.ptr<float>();
  const int64_t split_rows = plan.splits * int64_t(batch) * args.rows;
  args.partial_out = workspace;
  args.partial_lse = workspace + split_rows * kLatentDim;
  args.split_counts = reinterpret_cast<int32_t*>(args.partial_lse + split_rows);
  args.discard_read_partials = reinterpret_cast<uintptr_t>(workspace) % 128 == 0;
  args.batch = batch;
  if (batch == 0) return;

  // Splits outermost: the hardware starts CTAs in grid order, so every request's first split
  // starts before any second one (in a balanced plan most second splits are unused: they exit
  // after the prologue's seq_lens scan, on the SMs that the first wave left idle and at its end).
  // A balanced plan with ragged lengths walks this plane longest request first instead
  // (split_common.cuh cta_work).
  const dim3 grid(unsigned(plan.row_tiles), unsigned(batch), unsigned(plan.splits));
  // With PDL the narrow kernels at 16 rows issue a split's first tile right after the wait, from
  // the entries read before it (key_tiles.cuh start_split_cta), where the grid is one wave. The
  // FP8 kernel only where the grid takes at most half the SMs or serves one request: there (FP8
  // D4 B1's 64 CTAs) an fp8 q's one-tile splits gained 2.5-3%, and with every SM's first tile in
  // one burst right after the wait (D4 B2's 128 CTAs) the call was 4-6% slower (H100 and H200,
  // perf log session 51); one request's 128 splits hold keys only as far as it reaches (a wide
  // table's D4 B1: 64 of them, fp8-qkv -3..4%; D5 -0.5..1%; H200, session 54). The 16-bit kernel
  // takes its tile's first part (32 KB, in L2 since the prefetch) only, and gains at every such
  // plan: D4 B1 / B2 / B4 PDL -2.5 / -2.7 / -6%, D5 -2.4% (H200, perf log session 53). The 32-row
  // kernels were slower with it (Sq 2 x 16 heads: 16-bit 0..1.5%, FP8 1..2.6%; session 54).
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  const int cta_rows = int(std::min<int64_t>(args.rows, plan.rows_per_tile));
  const bool speculative_first_tile =
      params.enable_pdl && !plan.balanced && cta_rows <= 16 &&
      (fp8_cache ? 2 * ctas <= sm_count || (batch == 1 && ctas <= sm_count) : plan.splits >= 2 && ctas <= sm_count);
  const cudaStream_t stream = as_cuda_stream(params.stream);
  // Pages of 16 tokens: the 64-row kernel's 16-bit tiles in two parts (fewer TMA boxes;
  // key_tiles.cuh SmallPageKeyTileParts).
  const bool small_page_tiles = !fp8_cache && !uses_narrow_kernel(cta_rows) && cache.size(1) <= kSmallPageTokens;
  const KeyMaps maps = make_key_maps(
      cache, small_page_tiles ? SmallPageKeyTileParts::blocks_in(0) : KeyTileParts::blocks_in(0));
  if (half) {
    launch_split<true, false, false>(maps, args, grid, cta_rows, stream, params.enable_pdl, small_page_tiles,
                                     speculative_first_tile);
  } else if (fp8_q) {  // S (<= 32 rows: S^T) on e4m3 tensor cores, P V in fp16
    launch_split<true, true, true>(maps, args, grid, cta_rows, stream, params.enable_pdl, small_page_tiles,
                                   speculative_first_tile);
  } else if (fp8_cache) {
    launch_split<true, false, true>(maps, args, grid, cta_rows, stream, params.enable_pdl, small_page_tiles,
                                    speculative_first_tile);
  } else {
    launch_split<false, false, false>(maps, args, grid, cta_rows, stream, params.enable_pdl, small_page_tiles,
                                      speculative_first_tile);
  }

  // The combine kernel waits for the attention kernel's results (griddepcontrol.wait) before
  // reading any, so it launches programmatically whatever enable_pdl says: its launch latency
  // then overlaps the attention kernel (a balanced plan launches it even when no request was
  // split, to find that out).
  constexpr bool kCombineOverlaps = true;
  const int64_t all_rows = int64_t(batch) * args.rows;
  const int64_t row_blocks = (all_rows + kCombineRowsPerBlock - 1) / kCombineRowsPerBlock;
  if (plan.balanced) {
    launch_kernel(kOp, dense_decode_combine_rows_kernel<int(kBalancedSplits)>, dim3(unsigned(row_blocks)),
                  dim3(32 * kCombineRowsPerBlock), 0, stream, kCombineOverlaps, args);
  } else if (plan.splits > 1 && plan.splits <= kCombineRowsMaxSplits && all_rows >= kCombineRowsMinRows) {
    launch_kernel(kOp, dense_decode_combine_rows_kernel<kCombineRowsMaxSplits>, dim3(unsigned(row_blocks)),
                  dim3(32 * kCombineRowsPerBlock), 0, stream, kCombineOverlaps, args);
  } else if (plan.splits > 1) {
    // A block per row eighth; the lean form for few splits and more than 2 blocks an SM.
    const int64_t blocks = all_rows * kCombineColumnBlocks;
    const bool lean = plan.splits <= kCombineFewSplits && blocks > kCombineLeanAboveBlocksPerSm * int64_t(sm_count);
    const auto combine =
        lean ? dense_decode_combine_kernel<kCombineFewSplits> : dense_decode_combine_kernel<int(kMaxDecodeSplits)>;
    launch_kernel(kOp, combine, dim3(unsigned(args.rows * kCombineColumnBlocks), unsigned(batch)),
                  dim3(kCombineThreads), 0, stream, kCombineOverlaps, args);
  }
}

}  // namespace openmla::kernels::sm90
