// pack_kv_quantize_fp8: k_out[t, h] = fp8([k_nope[t, h] | k_pe[t, h or 0]] * k_inverse) (192
// values) and v_out[t, h] = fp8(v[t, h] * v_inverse) (128 values), from strided bf16/fp16
// views; the inverses are 1 / scale, rounded once on the host. Conversions are hardware
// instructions (convert.cuh: 8 fp8 cvt per 16 values).
// Tiling: one thread per 16 output values; a (t, h) pair is 20 such chunks (8 nope, 4 rope,
// 8 value), numbered consecutively so that neighbouring threads read neighbouring 32-byte
// input segments and write neighbouring 16-byte output segments.
// Pipeline: two 16-byte loads, 16 multiplies and 8 paired conversions, one 16-byte store per
// thread; occupancy (2048 threads per SM, 64 KiB of loads in flight) hides the memory latency.
// Limits: unaligned rows take the byte-access fallback; a one-head k_pe is broadcast: its
// rows are re-read once per head, but from L1/L2 (the heads of a token are neighbours in the
// grid), so DRAM sees them once.
#include "kernels/cuda_check.h"
#include "kernels/generic/kv_cache_kernels.h"
#include "kernels/generic/convert.cuh"

namespace openmla::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kValuesPerChunk = 16;
constexpr int kNopeChunks = 128 / kValuesPerChunk;   // 8
constexpr int kRopeChunks = 64 / kValuesPerChunk;    // 4
constexpr int kValueChunks = 128 / kValuesPerChunk;  // 8
constexpr int kChunksPerHead = kNopeChunks + kRopeChunks + kValueChunks;

struct PackArgs {
  const uint8_t* k_nope;
  int64_t k_nope_token, k_nope_head;  // strides in bytes
  const uint8_t* k_pe;
  int64_t k_pe_token, k_pe_head;      // k_pe_head = 0 broadcasts one head
  const uint8_t* v;
  int64_t v_token, v_head;
  uint8_t* k_out;
  int64_t k_out_token, k_out_head;
  uint8_t* v_out;
  int64_t v_out_token, v_out_head;
  int64_t heads;
  int64_t rows;  // tokens * heads
  float k_inverse;  // 1 / k_scale
  float v_inverse;
};

template <bool kFp16>
__global__ void __launch_bounds__(kThreads) pack_kv_quantize_fp8_kernel(PackArgs args) {
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = item / kChunksPerHead;
  if (row >= args.rows) return;
  const int chunk = int(item % kChunksPerHead);
  const int64_t token = row / args.heads;
  const int64_t head = row % args.heads;

  const uint8_t* source;
  uint8_t* destination;
  float inverse_scale;
  constexpr int kInputBytes = 2 * kValuesPerChunk;
  if (chunk < kNopeChunks) {
    source = args.k_nope + token * args.k_nope_token + head * args.k_nope_head + chunk * kInputBytes;
    destination = args.k_out + token * args.k_out_token + head * args.k_out_head + chunk * kValuesPerChunk;
    inverse_scale = args.k_inverse;
  } else if (chunk < kNopeChunks + kRopeChunks) {
    const int rope_chunk = chunk - kNopeChunks;
    source = args.k_pe + token * args.k_pe_token + head * args.k_pe_head + rope_chunk * kInputBytes;
    destination = args.k_out + token * args.k_out_token + head * args.k_out_head + chunk * kValuesPerChunk;
    inverse_scale = args.k_inverse;
  } else {
    const int value_chunk = chunk - kNopeChunks - kRopeChunks;
    source = args.v + token * args.v_token + head * args.v_head + value_chunk * kInputBytes;
    destination = args.v_out + token * args.v_out_token + head * args.v_out_head + value_chunk * kValuesPerChunk;
    inverse_scale = args.v_inverse;
  }
  const uint4 low = load_chunk(source);
  const uint4 high = load_chunk(source + kChunkBytes);
  store_chunk(destination, quantize_16<kFp16>(low, high, inverse_scale));
}

}  // namespace

void pack_kv_quantize_fp8(const PackKvQuantizeFp8Params& params) {
  const int64_t tokens = params.k_nope.size(0);
  const int64_t heads = params.k_nope.size(1);
  if (tokens == 0 || heads == 0) return;
  PackArgs args;
  args.k_nope = params.k_nope.ptr<const uint8_t>();
  args.k_nope_token = params.k_nope.stride(0) * 2;
  args.k_nope_head = params.k_nope.stride(1) * 2;
  args.k_pe = params.k_pe.ptr<const uint8_t>();
  args.k_pe_token = params.k_pe.stride(0) * 2;
  args.k_pe_head = params.k_pe.size(1) == 1 ? 0 : params.k_pe.stride(1) * 2;
  args.v = params.v.ptr<const uint8_t>();
  args.v_token = params.v.stride(0) * 2;
  args.v_head = params.v.stride(1) * 2;
  args.k_out = params.k_out.ptr<uint8_t>();
  args.k_out_token = params.k_out.stride(0);
  args.k_out_head = params.k_out.stride(1);
  args.v_out = params.v_out.ptr<uint8_t>();
  args.v_out_token = params.v_out.stride(0);
  args.v_out_head = params.v_out.stride(1);
  args.heads = heads;
  args.rows = tokens * heads;
  args.k_inverse = 1.0f / params.k_scale;
  args.v_inverse = 1.0f / params.v_scale;
  const unsigned blocks = blocks_for(args.rows * kChunksPerHead, kThreads);
  cudaStream_t stream = as_cuda_stream(params.stream);
  if (params.k_nope.dtype == DType::kFloat16) {
    pack_kv_quantize_fp8_kernel<true><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    pack_kv_quantize_fp8_kernel<false><<<blocks, kThreads, 0, stream>>>(args);
  }
  check_launch("pack_kv_quantize_fp8");
}

}  // namespace openmla::kernels
