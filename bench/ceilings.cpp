// openmla-bench: the speed-of-light ceilings of ../shared/PERF.md, measured in the same process
// and on the same GPU as the ops, so that every op figure is a fraction that does not drift
// with the machine:
//   copy: device-to-device cudaMemcpyAsync of 2 GiB, (bytes read + bytes written) / time;
//   bf16 / fp8: cuBLASLt 8192^3 GEMM, fp32 accumulation, bf16 output, cuBLASLt's first
//   heuristic choice. FP8 E4M3 GEMMs need the "TN" layout (A transposed); both GEMMs use it
//   so the two differ by input type alone. The fp8 GEMM uses fast accumulation, as fp8
//   attention kernels do: the ceiling is the fastest fp8 rate the tensor cores give.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "bench.h"
#include "device_data.h"
#include "kernels/cuda_check.h"

namespace openmla::bench {

namespace {

constexpr const char* kOp = "openmla-bench";
constexpr int64_t kCopyBytes = int64_t(2) << 30;  // 2 GiB: far beyond any L2
constexpr int64_t kGemmSize = 8192;
constexpr size_t kGemmWorkspaceBytes = size_t(64) << 20;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(ErrorKind::kCuda, kOp, "",
                std::string(what) + " failed: " + cublasLtGetStatusString(status));
  }
}

Case copy_ceiling_case() {
  Case copy;
  copy.op = "ceiling";
  copy.name = "device copy 2 GiB";
  copy.dtype = "bytes";
  copy.bytes = 2.0 * double(kCopyBytes);  // read once + written once
  copy.prepare = [] {
    DeviceTensor source(DType::kUInt8, {kCopyBytes});
    DeviceTensor destination(DType::kUInt8, {kCopyBytes});
    // Random bytes (as fp8 values), never zeros, like every input of the bench.
    launch_fill_uniform(source.view().data, DType::kFloat8E4M3, kCopyBytes, 11, -400, 400);
    Launcher launcher;
    launcher.copies = 1;  // 2 GiB already is dozens of L2 sizes
    launcher.run = [source, destination](int, Stream stream) {
      check_cuda(cudaMemcpyAsync(destination.view().data, source.view().data, kCopyBytes,
                                 cudaMemcpyDeviceToDevice, as_cuda_stream(stream)),
                 kOp, "cudaMemcpyAsync");
    };
    return launcher;
  };
  return copy;
}

// Everything one cuBLASLt GEMM needs, released together when the last launch is dropped.
struct GemmSetup {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  DeviceTensor a, b, d, workspace;

  ~GemmSetup() {
    if (d_layout) cublasLtMatrixLayoutDestroy(d_layout);
    if (b_layout) cublasLtMatrixLayoutDestroy(b_layout);
    if (a_layout) cublasLtMatrixLayoutDestroy(a_layout);
    if (operation) cublasLtMatmulDescDestroy(operation);
    if (handle) cublasLtDestroy(handle);
  }
};

// D[m, n] = op(A) B with m = n = k = kGemmSize, column-major as cuBLASLt counts:
// A is stored k x m and transposed, B is k x n, D is m x n in bf16.
std::shared_ptr<GemmSetup> make_gemm(DType input_dtype) {
  const bool fp8 = input_dtype == DType::kFloat8E4M3;
  const cudaDataType_t input_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  auto gemm = std::make_shared<GemmSetup>();
  gemm->a = DeviceTensor(input_dtype, {kGemmSize, kGemmSize});
  gemm->b = DeviceTensor(input_dtype, {kGemmSize, kGemmSize});
  gemm->d = DeviceTensor(DType::kBFloat16, {kGemmSize, kGemmSize});
  gemm->workspace = DeviceTensor(DType::kUInt8, {int64_t(kGemmWorkspaceBytes)});
  gemm->a.fill_uniform(21);
  gemm->b.fill_uniform(22);

  check_cublas(cublasLtCreate(&gemm->handle), "cublasLtCreate");
  check_cublas(cublasLtMatmulDescCreate(&gemm->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(gemm->operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                              &transpose, sizeof(transpose)),
               "set TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(gemm->operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                              &keep, sizeof(keep)),
               "set TRANSB");
  if (fp8) {
    const int8_t fast_accumulation = 1;
    check_cublas(cublasLtMatmulDescSetAttribute(gemm->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                &fast_accumulation, sizeof(fast_accumulation)),
                 "set FAST_ACCUM");
  }
  const uint64_t n = uint64_t(kGemmSize);
  check_cublas(cublasLtMatrixLayoutCreate(&gemm->a_layout, input_type, n, n, int64_t(n)),
               "layout A");
  check_cublas(cublasLtMatrixLayoutCreate(&gemm->b_layout, input_type, n, n, int64_t(n)),
               "layout B");
  check_cublas(cublasLtMatrixLayoutCreate(&gemm->d_layout, CUDA_R_16BF, n, n, int64_t(n)),
               "layout D");

  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = kGemmWorkspaceBytes;
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
      sizeof(workspace_bytes));
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(gemm->handle, gemm->operation, gemm->a_layout,
                                            gemm->b_layout, gemm->d_layout, gemm->d_layout,
                                            preference, 1, &heuristic, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) {
    throw Error(ErrorKind::kNotImplemented, kOp, "",
                std::string("cuBLASLt has no algorithm for the ") + (fp8 ? "fp8" : "bf16") +
                    " GEMM on this GPU");
  }
  gemm->algorithm = heuristic.algo;
  return gemm;
}

Case gemm_ceiling_case(DType input_dtype, const char* dtype_label) {
  Case gemm;
  gemm.op = "ceiling";
  gemm.name = "cuBLASLt GEMM 8192^3 TN";
  gemm.dtype = dtype_label;
  const double n = double(kGemmSize);
  gemm.flops = 2.0 * n * n * n;
  gemm.bytes = n * n * (2.0 * double(dtype_size(input_dtype)) + 2.0);
  gemm.prepare = [input_dtype] {
    std::shared_ptr<GemmSetup> setup = make_gemm(input_dtype);
    Launcher launcher;
    launcher.copies = 1;  // compute-bound: the cache does not matter
    launcher.run = [setup](int, Stream stream) {
      const float alpha = 1.0f, beta = 0.0f;
      void* d = setup->d.view().data;
      check_cublas(cublasLtMatmul(setup->handle, setup->operation, &alpha, setup->a.view().data,
                                  setup->a_layout, setup->b.view().data, setup->b_layout, &beta,
                                  d, setup->d_layout, d, setup->d_layout, &setup->algorithm,
                                  setup->workspace.view().data, kGemmWorkspaceBytes,
                                  as_cuda_stream(stream)),
                   "cublasLtMatmul");
    };
    return launcher;
  };
  return gemm;
}

}  // namespace

std::vector<Case> ceiling_cases() {
  return {copy_ceiling_case(), gemm_ceiling_case(DType::kBFloat16, "bf16"),
          gemm_ceiling_case(DType::kFloat8E4M3, "fp8")};
}

}  // namespace openmla::bench
