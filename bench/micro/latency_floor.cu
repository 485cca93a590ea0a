// Microbenchmark: the floors under the dense-decode small-batch cases (PERF.md D4: B 1, 4096
// keys; D5: B 1, 32768 keys; Hq 16, Sq 1), with no attention math at all. Each "op" streams one
// request's cache bytes (1152 per key) through G CTAs of one kernel as the split kernels do (one
// thread issues bulk copies into a ring of shared-memory stages, the CTA waits for each to land
// and releases it), then does what the op's structure needs after its stream:
//   stream       nothing: the bytes alone, in one launch
//   partials     every CTA writes a split's partial output (16 rows x 512 fp32) and 16 LSEs
//   combine      partials, then a second kernel launched with PDL merges them (main's structure:
//                the shape of dense_decode_combine_kernel until session 49, a block per (row,
//                column quarter))
//   cooperative  partials, then a grid-wide barrier (cooperative launch, which guarantees that
//                every CTA is resident) and the merge in the same kernel, each CTA taking a
//                slice of one row's columns
// and, for scale, an empty kernel and two empty kernels with PDL (what a graph node costs).
// Ops are timed as openmla-bench times D4 / D5: a CUDA graph of 20 calls, the sources rotating
// through copies larger than L2 together, replayed; median of 15 replays, divided by 20. A
// last pair of rows streams a D2-sized cache (1.2 GB) with 128 and with 132 CTAs, against a
// device-to-device copy, to bound what the 4 SMs that one CTA per request leaves idle cost.
// A diagnostic, not part of the benchmark's report; built with everything so that it keeps
// compiling (perf log, session 14).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_common.cuh"
#include "kernels/sm90/launch_dependencies.cuh"
#include "kernels/sm90/tma.cuh"
#include "kernels/sm90/wgmma.cuh"

namespace sm90 = openmla::kernels::sm90;
using openmla::micro::bulk_copy;
using openmla::micro::check;
using openmla::micro::median_us;

namespace {

constexpr int kThreads = 128;
constexpr int kRows = 16;  // Hq 16 x Sq 1
constexpr int kColumns = 512;
constexpr int kStageBytes = 36 * 1024;  // half a 16-bit key tile; 4 in flight = 2 key tiles
constexpr int kStages = 4;
constexpr int kMaxSplits = kThreads;  // one split LSE per thread
constexpr int64_t kBytesPerKey = 576 * 2;

struct FloorArgs {
  const uint8_t* source;  // this call's copy of the cache bytes
  int64_t bytes_per_cta;  // a multiple of 1 KB
  float* partial_out;     // [splits][kRows][kColumns]
  float* partial_lse;     // [splits][kRows], base 2
  __nv_bfloat16* out;     // [kRows][kColumns]
  unsigned* checksum;     // [splits]: keeps the stream's loads live
};

enum class After { kNothing, kPartials, kCooperativeMerge };


// One block merges `quads` float4 columns of row `row`, from `first_column` on, over `splits`
// partials: the block's threads in groups of `quads`, group g summing splits g, g + groups, ...
// (all of a group's loads in flight together), the groups' sums added in shared memory.
__device__ void merge_columns(const FloorArgs& args, int splits, int row, int first_column, int quads) {
  __shared__ float weights[kMaxSplits];
  __shared__ float warp_maxima[kThreads / 32], warp_sums[kThreads / 32];
  __shared__ float4 group_sums[kThreads];
  const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
  const float lse = thread < splits ? args.partial_lse[thread * kRows + row] : -INFINITY;
  float maximum = lse;
  for (int mask = 16; mask > 0; mask /= 2) maximum = fmaxf(maximum, __shfl_xor_sync(0xffffffffu, maximum, mask));
  if (lane == 0) warp_maxima[warp] = maximum;
  __syncthreads();
  maximum = fmaxf(fmaxf(warp_maxima[0], warp_maxima[1]), fmaxf(warp_maxima[2], warp_maxima[3]));
  const float weight = thread < splits ? exp2f(lse - maximum) : 0.0f;
  weights[thread] = weight;
  float sum = weight;
  for (int mask = 16; mask > 0; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  sum = warp_sums[0] + warp_sums[1] + warp_sums[2] + warp_sums[3];

  const int groups = kThreads / quads, group = thread / quads, quad = thread % quads;
  constexpr int kInFlight = 8;
  float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = group; first < splits; first += kInFlight * groups) {
    float4 parts[kInFlight];
    float part_weights[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int split = first + i * groups;
      part_weights[i] = split < splits ? weights[split] : 0.0f;
      parts[i] = split < splits ? reinterpret_cast<const float4*>(
                                      args.partial_out + (int64_t(split) * kRows + row) * kColumns + first_column)[quad]
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      total.x += part_weights[i] * parts[i].x;
      total.y += part_weights[i] * parts[i].y;
      total.z += part_weights[i] * parts[i].z;
      total.w += part_weights[i] * parts[i].w;
    }
  }
  group_sums[thread] = total;
  __syncthreads();
  if (group > 0) return;
  for (int other = 1; other < groups; ++other) {
    const float4 part = group_sums[other * quads + quad];
    total.x += part.x;
    total.y += part.y;
    total.z += part.z;
    total.w += part.w;
  }
  const float inverse = 1.0f / sum;
  __nv_bfloat16* destination = args.out + row * kColumns + first_column + 4 * quad;
  destination[0] = __float2bfloat16(total.x * inverse);
  destination[1] = __float2bfloat16(total.y * inverse);
  destination[2] = __float2bfloat16(total.z * inverse);
  destination[3] = __float2bfloat16(total.w * inverse);
}

template <After kAfter>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(FloorArgs args) {
  extern __shared__ __align__(128) uint8_t stages[];
  __shared__ uint64_t full[kStages];
  sm90::wait_for_previous_grid();
  sm90::allow_next_grid();
  const uint8_t* begin = args.source + int64_t(blockIdx.x) * args.bytes_per_cta;
  const int chunks = int((args.bytes_per_cta + kStageBytes - 1) / kStageBytes);
  if (threadIdx.x == 0) {
    for (int stage = 0; stage < kStages; ++stage) sm90::mbarrier_init(&full[stage], 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  auto issue = [&](int chunk) {
    const int64_t offset = int64_t(chunk) * kStageBytes;
    const uint32_t bytes = uint32_t(min(int64_t(kStageBytes), args.bytes_per_cta - offset));
    sm90::fence_shared_for_async_proxy();  // the stage's generic reads come before the refill
    sm90::mbarrier_arrive_expect_bytes(&full[chunk % kStages], bytes);
    bulk_copy(stages + (chunk % kStages) * kStageBytes, begin + offset, bytes, &full[chunk % kStages]);
  };
  if (threadIdx.x == 0) {
    for (int chunk = 0; chunk < min(kStages, chunks); ++chunk) issue(chunk);
  }
  unsigned checksum = 0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    sm90::mbarrier_wait(&full[chunk % kStages], (chunk / kStages) % 2);
    checksum += reinterpret_cast<const unsigned*>(stages + (chunk % kStages) * kStageBytes)[threadIdx.x];
    __syncthreads();  // every thread has read the stage
    if (threadIdx.x == 0 && chunk + kStages < chunks) issue(chunk + kStages);
  }
  if (threadIdx.x == 0) args.checksum[blockIdx.x] = checksum;
  if constexpr (kAfter == After::kNothing) return;

  // A split's partial output: one float4 of every row per thread, coalesced, as the real
  // epilogue's staged stores.
  const float value = float(checksum & 0xff) * (1.0f / 256.0f);
  for (int row = 0; row < kRows; ++row) {
    reinterpret_cast<float4*>(args.partial_out + (int64_t(blockIdx.x) * kRows + row) * kColumns)[threadIdx.x] =
        make_float4(value, value + 1.0f, value + 2.0f, float(row));
  }
  if (threadIdx.x < kRows) args.partial_lse[blockIdx.x * kRows + threadIdx.x] = value + float(threadIdx.x % 3);
  if constexpr (kAfter == After::kCooperativeMerge) {
    cooperative_groups::this_grid().sync();  // every split's partial is written and visible
    const int slices = int(gridDim.x) / kRows, columns = kColumns / slices;
    merge_columns(args, int(gridDim.x), int(blockIdx.x) % kRows, (int(blockIdx.x) / kRows) * columns, columns / 4);
  }
}

// The combine step in its shape until session 49: a block per (row, quarter of the columns), 4
// groups of 32 (main now takes eighths: combine_kernel.cuh).
__global__ void __launch_bounds__(kThreads) combine_kernel(FloorArgs args, int splits) {
  sm90::wait_for_previous_grid();  // PDL: the stream kernel's partials are complete and visible
  merge_columns(args, splits, int(blockIdx.x) / 4, (int(blockIdx.x) % 4) * (kColumns / 4), kColumns / 4 / 4);
}

__global__ void empty_kernel() {
  sm90::wait_for_previous_grid();
  sm90::allow_next_grid();
}


template <typename... Parameters, typename... Arguments>
cudaError_t launch(void (*kernel)(Parameters...), int grid, size_t shared_bytes, cudaStream_t stream,
                   bool programmatic, bool cooperative, Arguments... arguments) {
  cudaLaunchAttribute attributes[2]{};
  int count = 0;
  if (programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count++].val.cooperative = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, arguments...);
}

enum class Structure { kEmpty, kEmptyPair, kStream, kPartials, kCombine, kCooperative };
const char* name_of(Structure structure) {
  switch (structure) {
    case Structure::kEmpty: return "empty kernel";
    case Structure::kEmptyPair: return "two empty kernels (PDL)";
    case Structure::kStream: return "stream";
    case Structure::kPartials: return "stream + partials";
    case Structure::kCombine: return "stream + partials + combine (PDL)";
    case Structure::kCooperative: return "stream + partials + grid sync + merge";
  }
  return "?";
}

constexpr size_t kSharedBytes = size_t(kStages) * kStageBytes;

// One call of the op's structure on `args`, `splits` CTAs.
cudaError_t run_once(Structure structure, const FloorArgs& args, int splits, cudaStream_t stream) {
  switch (structure) {
    case Structure::kEmpty: return launch(empty_kernel, splits, 0, stream, true, false);
    case Structure::kEmptyPair: {
      const cudaError_t first = launch(empty_kernel, splits, 0, stream, true, false);
      return first != cudaSuccess ? first : launch(empty_kernel, kRows * 4, 0, stream, true, false);
    }
    case Structure::kStream:
      return launch(stream_kernel<After::kNothing>, splits, kSharedBytes, stream, true, false, args);
    case Structure::kPartials:
      return launch(stream_kernel<After::kPartials>, splits, kSharedBytes, stream, true, false, args);
    case Structure::kCombine: {
      const cudaError_t first = launch(stream_kernel<After::kPartials>, splits, kSharedBytes, stream, true, false, args);
      return first != cudaSuccess ? first : launch(combine_kernel, kRows * 4, 0, stream, true, false, args, splits);
    }
    case Structure::kCooperative:
      // PDL and a cooperative launch do not combine: the barrier needs the whole grid resident.
      return launch(stream_kernel<After::kCooperativeMerge>, splits, kSharedBytes, stream, false, true, args);
  }
  return cudaErrorInvalidValue;
}



// Microseconds per call: a graph of kCalls calls (sources rotating through `copies`), replayed.
// Negative if the structure cannot be captured or launched here (the error is printed).
float time_calls(Structure structure, FloorArgs args, int64_t op_bytes, int copies, int splits, cudaStream_t stream) {
  constexpr int kCalls = 20, kReplays = 15;
  const uint8_t* first_copy = args.source;
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
  cudaError_t status = cudaSuccess;
  for (int call = 0; call < kCalls && status == cudaSuccess; ++call) {
    args.source = first_copy + (call % copies) * op_bytes;
    status = run_once(structure, args, splits, stream);
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (status != cudaSuccess || ended != cudaSuccess) {
    std::printf("  (%s: %s)\n", name_of(structure), cudaGetErrorString(status != cudaSuccess ? status : ended));
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1.0f;
  }
  cudaGraphExec_t executable = nullptr;
  status = cudaGraphInstantiate(&executable, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    std::printf("  (%s: instantiate: %s)\n", name_of(structure), cudaGetErrorString(status));
    cudaGetLastError();
    return -1.0f;
  }
  const float us = median_us(stream, 3, kReplays, [&] { check(cudaGraphLaunch(executable, stream), "graph launch"); });
  cudaGraphExecDestroy(executable);
  return us / kCalls;
}

// Microseconds of one plain launch of the stream over `bytes` with `ctas` CTAs (a cache larger
// than L2: no rotation needed), median of 10.
float time_stream(FloorArgs args, int64_t bytes, int ctas, cudaStream_t stream) {
  args.bytes_per_cta = (bytes / ctas) / 1024 * 1024;
  return median_us(stream, 2, 10, [&] {
    check(launch(stream_kernel<After::kNothing>, ctas, kSharedBytes, stream, false, false, args), "stream");
  });
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  cudaDeviceProp properties{};
  check(cudaGetDevice(&device), "device");
  check(cudaGetDeviceProperties(&properties, device), "properties");
  sms = properties.multiProcessorCount;
  std::printf("%s, %d SMs\n", properties.name, sms);
  for (auto kernel : {stream_kernel<After::kNothing>, stream_kernel<After::kPartials>,
                      stream_kernel<After::kCooperativeMerge>}) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSharedBytes)), "smem");
  }

  const int64_t d2_bytes = int64_t(128) * 8192 * kBytesPerKey;  // D2: 128 requests x 8K keys
  const int64_t pool_bytes = std::max<int64_t>(d2_bytes, int64_t(160) << 20);
  uint8_t* pool = nullptr;
  float *partial_out = nullptr, *partial_lse = nullptr;
  __nv_bfloat16* out = nullptr;
  unsigned* checksum = nullptr;
  check(cudaMalloc(&pool, pool_bytes + kStageBytes), "cache");
  check(cudaMemset(pool, 0x3c, pool_bytes + kStageBytes), "cache fill");  // bf16 1.18: never zeros
  check(cudaMalloc(&partial_out, size_t(kMaxSplits) * kRows * kColumns * sizeof(float)), "partials");
  check(cudaMalloc(&partial_lse, size_t(kMaxSplits) * kRows * sizeof(float)), "partial LSEs");
  check(cudaMalloc(&out, size_t(kRows) * kColumns * sizeof(__nv_bfloat16)), "out");
  check(cudaMalloc(&checksum, size_t(2 * sms) * sizeof(unsigned)), "checksums");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  struct Case {
    const char* name;
    int64_t keys;
    int splits;
  };
  const Case cases[] = {{"D4 B1 (4096 keys)", 4096, 64}, {"D4 B1 (4096 keys)", 4096, 128},
                        {"D5 (32768 keys)", 32768, 128}};
  std::printf("%-20s %6s %-40s %10s %10s\n", "case", "CTAs", "structure", "us/call", "GB/s");
  for (const Case& c : cases) {
    const int64_t op_bytes = c.keys * kBytesPerKey;
    const int copies = int(std::max<int64_t>(2, std::min<int64_t>(32, pool_bytes / op_bytes)));
    FloorArgs args{pool, (op_bytes / c.splits) / 1024 * 1024, partial_out, partial_lse, out, checksum};
    for (Structure structure : {Structure::kEmpty, Structure::kEmptyPair, Structure::kStream, Structure::kPartials,
                                Structure::kCombine, Structure::kCooperative}) {
      const float us = time_calls(structure, args, op_bytes, copies, c.splits, stream);
      const bool streams = structure != Structure::kEmpty && structure != Structure::kEmptyPair;
      std::printf("%-20s %6d %-40s %10.2f %10.0f\n", c.name, c.splits, name_of(structure), us,
                  streams && us > 0 ? double(args.bytes_per_cta) * c.splits / (us * 1e3) : 0.0);
    }
  }
  check(cudaStreamSynchronize(stream), "cases");
  check(cudaGetLastError(), "cases");

  // D2's bytes with one CTA per request (128) and with every SM (132), against a copy.
  FloorArgs args{pool, 0, partial_out, partial_lse, out, checksum};
  for (int ctas : {128, sms}) {
    const float us = time_stream(args, d2_bytes, ctas, stream);
    const int64_t streamed = (d2_bytes / ctas) / 1024 * 1024 * ctas;
    std::printf("%-20s %6d %-40s %10.1f %10.0f\n", "D2 bytes (1.2 GB)", ctas, "stream (one launch)", us,
                double(streamed) / (us * 1e3));
  }
  {
    const int64_t copy_bytes = pool_bytes / 2;
    const float us = median_us(stream, 2, 5, [&] {
      check(cudaMemcpyAsync(pool + copy_bytes, pool, copy_bytes, cudaMemcpyDeviceToDevice, stream), "copy");
    });
    std::printf("%-20s %6s %-40s %10.1f %10.0f  (read + written)\n", "copy ceiling", "-", "cudaMemcpyAsync D2D", us,
                2.0 * double(copy_bytes) / (us * 1e3));
  }
  check(cudaStreamSynchronize(stream), "end");
  return 0;
}
