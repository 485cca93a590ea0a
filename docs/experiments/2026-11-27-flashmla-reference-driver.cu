// Reference driver (session 29, 2026-11-27; not part of the library, not built by CMake): times
// FlashMLA's Hopper dense split-KV decode kernel beside openmla on the same GPU. Results:
// docs/experiments/2026-11-27-h100-flashmla-287061e-nvcc124.json, perf log "Session 29".
//
// Rebuild (nothing of FlashMLA is committed here; fetch it yourself):
// 1. FlashMLA at commit 287061e (csrc/kernels: splitkv_mla.cu, mla_combine.cu and their headers;
//    the release line before the sliding window: the later csrc/sm90 line spills with every
//    toolchain tried). Small headers that commit lacks (config.h: block 64, page 64, dims 576 /
//    512, fixed overhead 5 blocks; flash_mla.h: the params struct without the fp8 descales;
//    get_mla_metadata.cu without window_left) were written from what the code uses.
// 2. CUDA 12.4 front end: Debian trixie non-free nvidia-cuda-toolkit_12.4.131 and libnvvm4
//    (dpkg-deb -x; nvcc, cicc, cudafe++, ptxas, fatbinary, nvlink, libdevice), headers and
//    libcudart.so.12 from PyPI nvidia-cuda-nvcc-cu12 / nvidia-cuda-runtime-cu12 12.4.127, CCCL from
//    nvidia-cuda-cccl-cu12 12.4.127.post1 (the toolkit's cuda/std is incomplete), first on -I.
// 3. CUTLASS 3.8 headers (PyPI nvidia-cutlass 3.8.0.0). With CUTLASS 4.2 the same kernel spills
//    320 bytes; with 3.8 it takes 246 registers and spills nothing.
// 4. nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -DNDEBUG -DFLASH_MLA_DISABLE_FP16
//    --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math (FlashMLA's setup.py flags)
//    for each .cu, then g++ *.o -lcudart -Wl,-rpath,'$ORIGIN' with libcudart.so.12 beside it.
// Run: flashmla_bench OUT.json [CASE]: without CASE, float64 checks (small cases, a split + combine
// case, 8 row blocks, sampled rows of every benchmark case) and then every case; with CASE
// (e.g. "D1 Hq=128 B=16") only that case's timing, for ncu.
// The driver as built (helper-written): the benchmark driver for FlashMLA's Hopper dense split-KV MLA decode kernel,
// OLDER pre-sliding-window version (csrc/kernels/ line, splitkv_mla.cu + mla_combine.cu at commit 287061e,
// the April 2025 release). Adapted from /tmp/flashmla_ref/driver.cu (69f3193 build). No torch: replicates
// csrc/flash_api.cpp @287061e (get_mla_metadata + mha_fwd_kvcache_mla) for the dense bf16, non-causal, h_k = 1 case.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
#include <algorithm>
#include <numeric>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>
#include <cutlass/fast_math.h>

#include "config.h"
#include "flash_mla.h"
#include "get_mla_metadata.h"
#include "splitkv_mla.h"
#include "mla_combine.h"

#ifndef BUILD_TOOLCHAIN
#define BUILD_TOOLCHAIN "nvcc 12.4"
#endif

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                    __LINE__, cudaGetErrorString(e_));                                        \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)
#define CK_LAUNCH() CK(cudaGetLastError())

static FILE* g_out = nullptr;
static void emit(const char* line) {
    printf("%s\n", line);
    fflush(stdout);
    if (g_out) { fprintf(g_out, "%s\n", line); fflush(g_out); }
}

// ---------------------------------------------------------------- host bf16 + RNG
static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t r = 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
    return (uint16_t)((u + r) >> 16);
}
static inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f;
}
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    inline uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    inline float uniform_pm1() {  // uniform in [-1, 1)
        return (float)((next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
};
static void fill_bf16(std::vector<uint16_t>& v, uint64_t seed) {
    Rng r(seed);
    for (auto& x : v) x = f2bf(r.uniform_pm1());
}

// ---------------------------------------------------------------- one problem instance
struct Case {
    std::string name;
    int B, Sq, Hq, Lk;
};

struct Problem {
    int B, Sq, Hq, Hk, Lk, max_pages, num_pages;
    int q_seq_per_hk, num_sm_parts, total_num_splits;
    float scale;
    std::vector<int> block_table;   // host copy [B, max_pages]
    // device
    uint16_t *q = nullptr, *kcache = nullptr, *out = nullptr;
    float *lse = nullptr, *lse_accum = nullptr, *o_accum = nullptr;
    int *d_block_table = nullptr, *seqlens = nullptr, *tile_md = nullptr, *num_splits = nullptr;
    Flash_fwd_mla_params params{};
    Mla_metadata_params md{};
};

static void setup(Problem& P, const Case& c, int sm_count, const std::vector<uint16_t>& hq,
                  const std::vector<uint16_t>& hk, uint64_t perm_seed) {
    const int page = Config::PAGE_BLOCK_SIZE;  // 64
    const int D = Config::HEAD_DIM_K, DV = Config::HEAD_DIM_V;
    P.B = c.B; P.Sq = c.Sq; P.Hq = c.Hq; P.Hk = 1; P.Lk = c.Lk;
    P.max_pages = (c.Lk + page - 1) / page;
    P.num_pages = P.B * P.max_pages;
    const size_t q_elems = (size_t)P.B * P.Sq * P.Hq * D;
    const size_t k_elems = (size_t)P.num_pages * page * P.Hk * D;
    if (hq.size() < q_elems || hk.size() < k_elems) { fprintf(stderr, "host buffers too small\n"); exit(1); }

    // block table: random permutation of all pages
    std::vector<int> perm(P.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    Rng r(perm_seed);
    for (int i = P.num_pages - 1; i > 0; --i) std::swap(perm[i], perm[(int)(r.next() % (uint64_t)(i + 1))]);
    P.block_table = perm;  // [B, max_pages] row-major

    // ---- flash_api.cpp: get_mla_metadata(seqlens_k, num_heads_per_head_k = s_q*h_q/h_k, h_k)
    const int num_heads_per_head_k = P.Sq * (P.Hq / P.Hk);
    P.num_sm_parts = sm_count / P.Hk / cutlass::ceil_div(num_heads_per_head_k, Config::BLOCK_SIZE_M);

    // ---- flash_api.cpp: mha_fwd_kvcache_mla
    const int num_q_heads_per_hk = P.Hq / P.Hk;
    P.q_seq_per_hk = P.Sq * num_q_heads_per_hk;
    P.total_num_splits = P.B + P.num_sm_parts;
    P.scale = 1.0f / sqrtf((float)D);

    // allocations (sizes exactly as flash_api.cpp)
    CK(cudaMalloc(&P.q, q_elems * 2));
    CK(cudaMalloc(&P.kcache, k_elems * 2));
    CK(cudaMalloc(&P.d_block_table, sizeof(int) * (size_t)P.B * P.max_pages));
    CK(cudaMalloc(&P.seqlens, sizeof(int) * P.B));
    CK(cudaMalloc(&P.out, (size_t)P.B * P.q_seq_per_hk * P.Hk * DV * 2));              // [b, q_seq_per_hk, h_k, d_v]
    CK(cudaMalloc(&P.lse, sizeof(float) * (size_t)P.B * P.Hk * P.q_seq_per_hk));          // [b, h_k, q_seq_per_hk]
    CK(cudaMalloc(&P.tile_md, sizeof(int) * (size_t)P.num_sm_parts * TileSchedulerMetaDataSize));
    CK(cudaMalloc(&P.num_splits, sizeof(int) * (P.B + 1)));
    CK(cudaMalloc(&P.lse_accum, sizeof(float) * (size_t)P.total_num_splits * P.Hk * P.q_seq_per_hk));       // [total, h_k, q_seq_per_hk]
    CK(cudaMalloc(&P.o_accum, sizeof(float) * (size_t)P.total_num_splits * P.Hk * P.q_seq_per_hk * DV));    // [total, h_k, q_seq_per_hk, d_v]

    // q [B, Sq, Hq, 576]. With h_k == 1 the flash_api reshape
    //   view(b, s_q, h_k, h_q/h_k, d).transpose(2,3).reshape(b, s_q*h_q/h_k, h_k, d)
    // is the identity on memory: row (s*Hq + h) of the [b, q_seq_per_hk, 1, d] view is q[b, s, h, :].
    CK(cudaMemcpy(P.q, hq.data(), q_elems * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.kcache, hk.data(), k_elems * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.d_block_table, P.block_table.data(), sizeof(int) * (size_t)P.B * P.max_pages, cudaMemcpyHostToDevice));
    std::vector<int> sl(P.B, P.Lk);
    CK(cudaMemcpy(P.seqlens, sl.data(), sizeof(int) * P.B, cudaMemcpyHostToDevice));
    // poison outputs so stale zeros can't pass the check
    CK(cudaMemset(P.out, 0xFF, (size_t)P.B * P.q_seq_per_hk * P.Hk * DV * 2));
    CK(cudaMemset(P.lse, 0xFF, sizeof(float) * (size_t)P.B * P.Hk * P.q_seq_per_hk));

    // Mla_metadata_params exactly as get_mla_metadata() in flash_api.cpp
    Mla_metadata_params& m = P.md;
    m = {};
    m.seqlens_k_ptr = P.seqlens;
    m.tile_scheduler_metadata_ptr = P.tile_md;
    m.num_splits_ptr = P.num_splits;
    m.batch_size = P.B;
    m.block_size_n = Config::PAGE_BLOCK_SIZE;
    m.fixed_overhead_num_blocks = Config::FIXED_OVERHEAD_NUM_BLOCKS;
    m.num_sm_parts = P.num_sm_parts;

    // Flash_fwd_mla_params exactly as mha_fwd_kvcache_mla() in flash_api.cpp
    const bool is_causal = false;  // the benchmark cases are not causal
    Flash_fwd_mla_params& p = P.params;
    p = {};
    p.b = P.B;
    p.s_q = P.Sq;
    p.q_seq_per_hk = P.q_seq_per_hk;
    p.seqlens_k_ptr = P.seqlens;
    p.h_q = P.Hq;
    p.h_k = P.Hk;
    p.num_blocks = P.num_pages;
    p.q_head_per_hk = num_q_heads_per_hk;
    p.is_causal = is_causal;
    p.d = D;
    p.d_v = DV;
    p.scale_softmax = P.scale;
    p.scale_softmax_log2 = float(P.scale * M_LOG2E);
    p.q_ptr = P.q;
    p.k_ptr = P.kcache;
    p.o_ptr = P.out;
    p.softmax_lse_ptr = P.lse;
    // strides in elements. q (after reshape): [b, q_seq_per_hk, h_k, d] contiguous
    p.q_batch_stride = (int64_t)P.q_seq_per_hk * P.Hk * D;
    p.q_row_stride = (int64_t)P.Hk * D;   // q.stride(-3)
    p.q_head_stride = D;                  // q.stride(-2)
    // kcache: [num_blocks, page, h_k, d] contiguous
    p.k_batch_stride = (int64_t)page * P.Hk * D;
    p.k_row_stride = (int64_t)P.Hk * D;
    p.k_head_stride = D;
    // out: [b, q_seq_per_hk, h_k, d_v] contiguous
    p.o_batch_stride = (int64_t)P.q_seq_per_hk * P.Hk * DV;
    p.o_row_stride = (int64_t)P.Hk * DV;
    p.o_head_stride = DV;
    p.block_table = P.d_block_table;
    p.block_table_batch_stride = P.max_pages;
    p.page_block_size = page;
    p.tile_scheduler_metadata_ptr = P.tile_md;
    p.num_sm_parts = P.num_sm_parts;   // tile_scheduler_metadata.size(0)
    p.num_splits_ptr = P.num_splits;
    p.total_num_splits = P.total_num_splits;
    p.softmax_lseaccum_ptr = P.lse_accum;
    p.oaccum_ptr = P.o_accum;
}

static void teardown(Problem& P) {
    CK(cudaFree(P.q)); CK(cudaFree(P.kcache)); CK(cudaFree(P.out)); CK(cudaFree(P.lse));
    CK(cudaFree(P.lse_accum)); CK(cudaFree(P.o_accum)); CK(cudaFree(P.d_block_table));
    CK(cudaFree(P.seqlens)); CK(cudaFree(P.tile_md)); CK(cudaFree(P.num_splits));
}

static void run_metadata(Problem& P, cudaStream_t st) {
    run_get_mla_metadata_kernel(P.md, st);
    CK_LAUNCH();
}
static void run_splitkv(Problem& P, cudaStream_t st) {
    run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(P.params, st);
    CK_LAUNCH();
}
static void run_combine(Problem& P, cudaStream_t st) {
    run_flash_mla_combine_kernel<cutlass::bfloat16_t>(P.params, st);
    CK_LAUNCH();
}

// ---------------------------------------------------------------- float64 reference for one (b, s, h) row
// returns lse (natural log) and writes o_ref[512]
static double ref_row(const Problem& P, const std::vector<uint16_t>& hq, const std::vector<uint16_t>& hk,
                      int b, int s, int h, std::vector<double>& o_ref, std::vector<double>& logits) {
    const int D = 576, DV = 512, page = 64;
    const uint16_t* qrow = hq.data() + (((size_t)b * P.Sq + s) * P.Hq + h) * D;
    double qd[576];
    for (int d = 0; d < D; ++d) qd[d] = bf2f(qrow[d]);
    logits.resize(P.Lk);
    double mx = -1e300;
    for (int j = 0; j < P.Lk; ++j) {
        int pg = P.block_table[(size_t)b * P.max_pages + j / page];
        const uint16_t* krow = hk.data() + ((size_t)pg * page + (j % page)) * D;  // h_k = 1
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += qd[d] * (double)bf2f(krow[d]);
        logits[j] = acc * (double)P.scale;
        mx = std::max(mx, logits[j]);
    }
    double sum = 0;
    o_ref.assign(DV, 0.0);
    for (int j = 0; j < P.Lk; ++j) {
        double w = exp(logits[j] - mx);
        sum += w;
        int pg = P.block_table[(size_t)b * P.max_pages + j / page];
        const uint16_t* vrow = hk.data() + ((size_t)pg * page + (j % page)) * D;
        for (int d = 0; d < DV; ++d) o_ref[d] += w * (double)bf2f(vrow[d]);
    }
    for (int d = 0; d < DV; ++d) o_ref[d] /= sum;
    return mx + log(sum);
}

// Compare rows; rows == empty -> all rows. Returns rel Frobenius error; lse_err = max abs lse error.
static double check(const Problem& P, const std::vector<uint16_t>& hq, const std::vector<uint16_t>& hk,
                    const std::vector<int3>& rows_in, double& lse_err, bool& finite) {
    const int DV = 512;
    std::vector<uint16_t> out((size_t)P.B * P.q_seq_per_hk * DV);
    std::vector<float> lse((size_t)P.B * P.q_seq_per_hk);
    CK(cudaMemcpy(out.data(), P.out, out.size() * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lse.data(), P.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
    finite = true;
    for (auto v : out) { float f = bf2f(v); if (!std::isfinite(f)) { finite = false; break; } }
    for (auto v : lse) if (!std::isfinite(v)) { finite = false; break; }
    std::vector<int3> rows = rows_in;
    if (rows.empty())
        for (int b = 0; b < P.B; ++b) for (int s = 0; s < P.Sq; ++s) for (int h = 0; h < P.Hq; ++h) rows.push_back(make_int3(b, s, h));
    double num = 0, den = 0; lse_err = 0;
    std::vector<double> o_ref, logits;
    for (auto r : rows) {
        int b = r.x, s = r.y, h = r.z;
        double lse_ref = ref_row(P, hq, hk, b, s, h, o_ref, logits);
        // kernel layout: out [b, s*Hq + h, 0, :], lse [b, 0, s*Hq + h]  (h_k == 1)
        size_t row = (size_t)b * P.q_seq_per_hk + (size_t)s * P.Hq + h;
        for (int d = 0; d < DV; ++d) {
            double o = bf2f(out[row * DV + d]);
            num += (o - o_ref[d]) * (o - o_ref[d]);
            den += o_ref[d] * o_ref[d];
        }
        double le = fabs((double)lse[row] - lse_ref);
        if (!(le <= lse_err)) lse_err = std::isnan(le) ? INFINITY : std::max(lse_err, le);
    }
    return sqrt(num / den);
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char** argv) {
    // Usage: flashmla_bench [OUTPUT_JSONL [CASE_NAME]]
    // With CASE_NAME (e.g. "D1 Hq=128 B=16"): skip all correctness checks and run only that benchmark case.
    const char* only = argc > 2 ? argv[2] : nullptr;
    if (argc > 1) {
        g_out = fopen(argv[1], "w");
        if (!g_out) { fprintf(stderr, "cannot open %s\n", argv[1]); return 1; }
    }
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"gpu\": \"%s\", \"sm_count\": %d, \"cc\": \"%d.%d\", \"cuda_runtime\": %d, \"cuda_driver\": %d, \"build\": \"FlashMLA csrc/kernels 287061e (pre-window) / " BUILD_TOOLCHAIN "\"}",
             prop.name, prop.multiProcessorCount, prop.major, prop.minor, rt, drv);
    emit(buf);
    if (prop.major != 9 || prop.minor != 0) { fprintf(stderr, "needs an sm_90 GPU\n"); return 1; }
    const int sm_count = prop.multiProcessorCount;

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    const std::vector<Case> cases = {
        {"D1 Hq=128 B=4", 4, 4, 128, 81920},
        {"D1 Hq=128 B=8", 8, 4, 128, 81920},
        {"D1 Hq=128 B=16", 16, 4, 128, 81920},
        {"D1 Hq=32 B=16", 16, 4, 32, 81920},
        {"D2 Hq=64 B=128", 128, 1, 64, 8192},
    };
    // host data, generated once at the largest size (fixed seeds); each case uses a prefix
    size_t max_q = 0, max_k = 0;
    for (auto& c : cases) {
        max_q = std::max(max_q, (size_t)c.B * c.Sq * c.Hq * 576);
        max_k = std::max(max_k, (size_t)c.B * ((c.Lk + 63) / 64) * 64 * 576);
    }
    if (only) {
        bool found = false;
        for (auto& c : cases) found |= (c.name == only);
        if (!found) {
            fprintf(stderr, "unknown case \"%s\"; known cases:", only);
            for (auto& c : cases) fprintf(stderr, " \"%s\"", c.name.c_str());
            fprintf(stderr, "\n");
            return 2;
        }
    }
    std::vector<uint16_t> hq(max_q), hk(max_k);
    fill_bf16(hq, 12345);
    fill_bf16(hk, 67890);

    bool any_check_failed = false;

    // ---------------- correctness (full float64 reference)
    const std::vector<Case> checks = {
        {"check B=2 Sq=2 Hq=16 Lk=300", 2, 2, 16, 300},    // no split (combine is a no-op)
        {"check B=2 Sq=2 Hq=16 Lk=5000", 2, 2, 16, 5000},  // split-KV + combine path
        {"check B=3 Sq=4 Hq=128 Lk=1000", 3, 4, 128, 1000},  // 8 m-blocks, ragged last page
    };
    for (auto& c : checks) {
        if (only) break;  // case filter given: no correctness checks
        Problem P;
        setup(P, c, sm_count, hq, hk, 777);
        run_metadata(P, st);
        run_splitkv(P, st);
        run_combine(P, st);
        CK(cudaStreamSynchronize(st));
        std::vector<int> ns(P.B + 1);
        CK(cudaMemcpy(ns.data(), P.num_splits, sizeof(int) * (P.B + 1), cudaMemcpyDeviceToHost));
        double lse_err; bool finite;
        double err = check(P, hq, hk, {}, lse_err, finite);
        bool ok = finite && err < 1e-2 && lse_err < 1e-2;
        any_check_failed |= !ok;
        snprintf(buf, sizeof buf,
                 "{\"check\": \"%s\", \"num_sm_parts\": %d, \"total_splits\": %d, \"rel_fro_err\": %.3e, \"lse_max_abs_err\": %.3e, \"finite\": %s, \"ok\": %s}",
                 c.name.c_str(), P.num_sm_parts, ns[P.B], err, lse_err, finite ? "true" : "false", ok ? "true" : "false");
        emit(buf);
        teardown(P);
    }

    // ---------------- benchmarks
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (auto& c : cases) {
        if (only && c.name != only) continue;
        Problem P;
        setup(P, c, sm_count, hq, hk, 4242);
        run_metadata(P, st);
        run_splitkv(P, st);
        run_combine(P, st);
        CK(cudaStreamSynchronize(st));

        // sampled float64 check (a few rows; the full reference is too slow on a CPU); skipped with a case filter
        if (!only) {
        std::vector<int3> rows = {make_int3(0, 0, 0), make_int3(P.B - 1, P.Sq - 1, P.Hq - 1),
                                  make_int3(P.B / 2, P.Sq / 2, P.Hq / 2 + 1), make_int3(0, P.Sq - 1, 7 % P.Hq)};
        double lse_err; bool finite;
        double err = check(P, hq, hk, rows, lse_err, finite);
        bool ok = finite && err < 1e-2 && lse_err < 1e-2;
        any_check_failed |= !ok;
        std::vector<int> ns(P.B + 1);
        CK(cudaMemcpy(ns.data(), P.num_splits, sizeof(int) * (P.B + 1), cudaMemcpyDeviceToHost));
        snprintf(buf, sizeof buf,
                 "{\"check\": \"%s (4 sampled rows)\", \"num_sm_parts\": %d, \"total_splits\": %d, \"rel_fro_err\": %.3e, \"lse_max_abs_err\": %.3e, \"finite\": %s, \"ok\": %s}",
                 c.name.c_str(), P.num_sm_parts, ns[P.B], err, lse_err, finite ? "true" : "false", ok ? "true" : "false");
        emit(buf);
        }

        // Timed as openmla-bench times its ops: >= 10 ms of back-to-back warm-up calls, then 20
        // back-to-back calls, each bracketed by its own pair of events (sustained power state).
        std::vector<float> t_k, t_kc;
        std::vector<cudaEvent_t> starts(20), stops(20);
        for (int i = 0; i < 20; ++i) { CK(cudaEventCreate(&starts[i])); CK(cudaEventCreate(&stops[i])); }
        for (int mode = 0; mode < 2; ++mode) {
            auto call = [&] { run_splitkv(P, st); if (mode == 1) run_combine(P, st); };
            auto t0 = std::chrono::steady_clock::now();
            for (;;) {
                for (int w = 0; w < 8; ++w) call();
                CK(cudaStreamSynchronize(st));
                if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.01) break;
            }
            for (int it = 0; it < 20; ++it) {
                CK(cudaEventRecord(starts[it], st));
                call();
                CK(cudaEventRecord(stops[it], st));
            }
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            for (int it = 0; it < 20; ++it) {
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, starts[it], stops[it]));
                (mode == 0 ? t_k : t_kc).push_back(ms * 1000.0f);
            }
        }
        for (int i = 0; i < 20; ++i) { cudaEventDestroy(starts[i]); cudaEventDestroy(stops[i]); }
        CK(cudaStreamSynchronize(st));
        double us_k = median(t_k), us_kc = median(t_kc);
        double flops = 2.0 * c.B * c.Sq * c.Hq * (double)c.Lk * (576 + 512);
        snprintf(buf, sizeof buf,
                 "{\"case\": \"%s\", \"kernel_us\": %.2f, \"with_combine_us\": %.2f, \"tflops_kernel\": %.2f, \"tflops_with_combine\": %.2f}",
                 c.name.c_str(), us_k, us_kc, flops / (us_k * 1e-6) / 1e12, flops / (us_kc * 1e-6) / 1e12);
        emit(buf);
        teardown(P);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(st));
    if (g_out) fclose(g_out);
    if (any_check_failed) { fprintf(stderr, "a correctness check failed\n"); return 3; }
    return 0;
}
