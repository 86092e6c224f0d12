// Host helpers of the cuBLASLt probes and harnesses under tools/reference (gemm_algos.cu,
// gemm_epilogue_probe.cu, gemm_skinny_probe.cu, skinny_gemm_harness.cu): a status check, the
// handle, workspace and stream, plans of y = x Wᵀ in kernels/src/cuda/blas.rs's layout, the
// heuristic's picks, and blas.rs's batch-invariance filter (split K 1, no reduction).
//
// Layout: y [rows, n] = x [rows, k] · W [n, k]ᵀ; column-major A = W (transposed), B = x, C = D = y.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        auto s_ = (x);                                                                 \
        if ((int)s_ != 0) {                                                            \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)s_);      \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static cublasLtHandle_t lt;
static void* ws;
static const size_t WS = 32 << 20;  // blas.rs's workspace
static cudaStream_t st;

// The handle, the workspace and the stream every helper below uses.
static void lt_init() {
    CK(cublasLtCreate(&lt));
    CK(cudaStreamCreate(&st));
    CK(cudaMalloc(&ws, WS));
}

struct LtPlan {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
};

// The descriptors of y = x Wᵀ at `rows` rows with output type yt (no algorithm).
static LtPlan lt_plan(int rows, int k, int n, cudaDataType_t yt) {
    LtPlan p{};
    CK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int t = CUBLAS_OP_T;
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
    CK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, rows, k));
    CK(cublasLtMatrixLayoutCreate(&p.c, yt, n, rows, n));
    return p;
}

// Up to `count` of the heuristic's picks for `p` (within the workspace).
static std::vector<cublasLtMatmulAlgo_t> lt_heuristic(const LtPlan& p, int count) {
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = WS;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    std::vector<cublasLtMatmulHeuristicResult_t> r(count);
    int found = 0;
    std::vector<cublasLtMatmulAlgo_t> out;
    if (cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, count, r.data(), &found) ==
        CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < found; ++i)
            if (r[i].state == CUBLAS_STATUS_SUCCESS) out.push_back(r[i].algo);
    cublasLtMatmulPreferenceDestroy(pref);
    return out;
}

// A u32 setting of an algorithm (0 where cuBLASLt does not report it).
static uint32_t lt_cfg(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &w);
    return v;
}

// Whether `a` sums each output over the whole of K in one pass (blas.rs's splits_no_k).
static bool lt_unsplit(const cublasLtMatmulAlgo_t& a) {
    return lt_cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 1 &&
           lt_cfg(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) == CUBLASLT_REDUCTION_SCHEME_NONE;
}

// `a` with split K 1 and no reduction (blas.rs's without_split); false where cuBLASLt refuses.
static bool lt_remove_split(cublasLtMatmulAlgo_t& a) {
    uint32_t one = 1, none = CUBLASLT_REDUCTION_SCHEME_NONE;
    return cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) ==
               CUBLAS_STATUS_SUCCESS &&
           lt_unsplit(a);
}

// Whether cuBLASLt runs `a` on `p`'s exact shape within the workspace.
static bool lt_accepts(const LtPlan& p, const cublasLtMatmulAlgo_t& a) {
    cublasLtMatmulHeuristicResult_t r{};
    return cublasLtMatmulAlgoCheck(lt, p.desc, p.a, p.b, p.c, p.c, &a, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= WS;
}

// The batch-invariant reference of a shape: the heuristic's first pick at 4,096 rows that splits
// no K, else its first pick with the split removed (blas.rs's reference); false where none.
static bool lt_reference(int k, int n, cudaDataType_t yt, cublasLtMatmulAlgo_t& ref) {
    const LtPlan big = lt_plan(4096, k, n, yt);
    const auto picks = lt_heuristic(big, 16);
    for (auto a : picks)
        if (lt_unsplit(a)) {
            ref = a;
            return true;
        }
    for (auto a : picks)
        if (lt_remove_split(a) && lt_accepts(big, a)) {
            ref = a;
            return true;
        }
    return false;
}

// One matmul: y = x Wᵀ (+ beta · y) with `a`, on the stream.
static bool lt_run(const LtPlan& p, const cublasLtMatmulAlgo_t& a, const void* w, const void* x, void* y,
                   float beta) {
    const float alpha = 1.0f;
    return cublasLtMatmul(lt, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &a, ws, WS, st) ==
           CUBLAS_STATUS_SUCCESS;
}
