// Probe of cuBLASLt algorithms for the model's GEMM shapes, to see what the heuristic leaves out
// (split-K, other tiles) and whether it is faster. Not part of the build; run on the GPU machine:
//   nvcc -O2 -std=c++17 -o /tmp/gemm_algos tools/reference/gemm_algos.cu -lcublasLt && /tmp/gemm_algos 712
// Layout as kernels/src/cuda/blas.rs: y [rows, n] = x [rows, k] · W [n, k]ᵀ, bf16 operands, f32
// compute, f32 (or bf16) output; column-major A = W (transposed), B = x, C = D = y.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cublaslt_host.h"


struct Shape {
    const char* name;
    int k, n;
    bool bf16_out;
};


struct Problem {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    void *w, *x, *y;
    int rows, k, n;
};

static float time_algo(const Problem& p, const cublasLtMatmulAlgo_t& algo, int runs = 20) {
    float alpha = 1, beta = 0;
    auto go = [&]() {
        return cublasLtMatmul(lt, p.desc, &alpha, p.w, p.a, p.x, p.b, &beta, p.y, p.c, p.y, p.c, &algo, ws, WS,
                              st);
    };
    if (go() != CUBLAS_STATUS_SUCCESS) return -1;
    for (int i = 0; i < 3; ++i) go();
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, st);
    for (int i = 0; i < runs; ++i) go();
    cudaEventRecord(e1, st);
    if (cudaEventSynchronize(e1) != cudaSuccess) return -1;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0f * ms / runs;  // µs
}

static bool check(const Problem& p, const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt, p.desc, p.a, p.b, p.c, p.c, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
    return r.workspaceSize <= WS;
}

static std::string describe(const cublasLtMatmulAlgo_t& algo) {
    int id = -1;
    uint32_t tile = 0, splitk = 0, red = 0, stages = 0, swz = 0, custom = 0;
    uint16_t cluster = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                         &w);
    char buf[200];
    snprintf(buf, sizeof buf, "id=%d tile=%u splitk=%u red=%u stages=%u swz=%u custom=%u cluster=%u", id, tile,
             splitk, red, stages, swz, custom, (unsigned)cluster);
    return buf;
}

static void probe(int rows, const Shape& s, bool enumerate) {
    Problem p{};
    p.rows = rows;
    p.k = s.k;
    p.n = s.n;
    cudaDataType_t yt = s.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
    CK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int t = CUBLAS_OP_T;
    CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, s.k, s.n, s.k));
    CK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, s.k, rows, s.k));
    CK(cublasLtMatrixLayoutCreate(&p.c, yt, s.n, rows, s.n));
    CK(cudaMalloc(&p.w, (size_t)s.k * s.n * 2));
    CK(cudaMalloc(&p.x, (size_t)s.k * rows * 2));
    CK(cudaMalloc(&p.y, (size_t)s.n * rows * 4));
    cudaMemset(p.w, 0x3c, (size_t)s.k * s.n * 2);
    cudaMemset(p.x, 0x3c, (size_t)s.k * rows * 2);

    const double flop = 2.0 * rows * s.k * s.n;
    auto tf = [&](float us) { return flop / (us * 1e-6) / 1e12; };

    // 1. The heuristic's list.
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = WS;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    const int WANT = 64;
    std::vector<cublasLtMatmulHeuristicResult_t> res(WANT);
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, WANT, res.data(), &found));
    printf("\n== %s rows=%d k=%d n=%d%s: heuristic returned %d\n", s.name, rows, s.k, s.n,
           s.bf16_out ? " bf16-out" : "", found);
    float best_h = 1e9, first = -1;
    int best_i = -1;
    for (int i = 0; i < found; ++i) {
        float us = time_algo(p, res[i].algo);
        if (i == 0) first = us;
        if (us > 0 && us < best_h) best_h = us, best_i = i;
        if (i < 12 || us == best_h)
            printf("  h%-2d %8.2f us %6.1f TF waves=%.2f %s\n", i, us, tf(us), res[i].wavesCount,
                   describe(res[i].algo).c_str());
    }
    printf("  heuristic: first %.2f us, best h%d %.2f us (%.1f TF)\n", first, best_i, best_h, tf(best_h));

    // 1b. The heuristic asked to plan for fewer SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET).
    for (int32_t sms : {128, 120, 112, 104, 96, 88, 66}) {
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms);
        std::vector<cublasLtMatmulHeuristicResult_t> r2(16);
        int f2 = 0;
        if (cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 16, r2.data(), &f2)) continue;
        float b2 = 1e9;
        int bi2 = -1;
        for (int i = 0; i < f2; ++i) {
            float us = time_algo(p, r2[i].algo);
            if (us > 0 && us < b2) b2 = us, bi2 = i;
        }
        if (bi2 >= 0)
            printf("  sm_count_target %d: %d candidates, best h%d %.2f us (%.1f TF) %s\n", sms, f2, bi2, b2, tf(b2),
                   describe(r2[bi2].algo).c_str());
    }
    {
        int32_t zero = 0;
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &zero, sizeof zero);
    }

    // 2. Split-K variants of the heuristic's candidates.
    float best_s = 1e9;
    std::string best_s_desc;
    for (int i = 0; i < std::min(found, 16); ++i) {
        for (uint32_t sk : {2u, 3u, 4u, 6u, 8u}) {
            for (uint32_t red : {1u, 2u, 4u}) {
                cublasLtMatmulAlgo_t a = res[i].algo;
                if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk))
                    continue;
                if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                         sizeof red))
                    continue;
                if (!check(p, a)) continue;
                float us = time_algo(p, a);
                if (us > 0 && us < best_s) best_s = us, best_s_desc = "h" + std::to_string(i) + " " + describe(a);
            }
        }
    }
    if (best_s < 1e9)
        printf("  split-K of heuristic picks: best %.2f us (%.1f TF) %s\n", best_s, tf(best_s), best_s_desc.c_str());
    else
        printf("  split-K of heuristic picks: none accepted\n");

    // 3. Every algorithm id, its tiles x split-K x swizzle (stages left to the library).
    if (enumerate) {
        int ids[512];
        int nid = 0;
        CK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, yt, yt, 512, ids,
                                    &nid));
        printf("  AlgoGetIds: %d ids:", nid);
        for (int i = 0; i < nid; ++i) printf(" %d", ids[i]);
        printf("\n");
        float best_e = 1e9;
        std::string best_e_desc;
        int tried = 0, accepted = 0;
        for (int i = 0; i < nid; ++i) {
            cublasLtMatmulAlgo_t base;
            if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, yt, yt, ids[i],
                                       &base))
                continue;
            size_t w = 0;
            std::vector<uint32_t> tiles(256);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &w);
            int ntiles = (int)(w / sizeof(uint32_t));
            if (ntiles > 256) ntiles = 256;
            if (ntiles > 0)
                cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(),
                                                  ntiles * sizeof(uint32_t), &w);
            else {
                tiles[0] = CUBLASLT_MATMUL_TILE_UNDEFINED;
                ntiles = 1;
            }
            int splitk_ok = 0;
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok,
                                              &w);
            printf("  id %d: %d tiles, splitK %s\n", ids[i], ntiles, splitk_ok ? "yes" : "no");
            for (int ti = 0; ti < ntiles; ++ti) {
                {
                    for (uint32_t sk : {1u, 2u, 4u}) {
                        if (sk > 1 && !splitk_ok) continue;
                        cublasLtMatmulAlgo_t a = base;
                        uint32_t red = sk > 1 ? 1u : 0u;
                        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[ti],
                                                             sizeof(uint32_t));
                        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk);
                        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                             sizeof red);
                        ++tried;
                        if (!check(p, a)) continue;
                        ++accepted;
                        float us = time_algo(p, a, 10);
                        if (us > 0 && us < best_e) best_e = us, best_e_desc = describe(a);
                    }
                }
            }
        }
        printf("  enumerated: %d configs tried, %d accepted, best %.2f us (%.1f TF) %s\n", tried, accepted,
               best_e < 1e9 ? best_e : -1.f, best_e < 1e9 ? tf(best_e) : 0., best_e_desc.c_str());
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cudaFree(p.w);
    cudaFree(p.x);
    cudaFree(p.y);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
}

int main(int argc, char** argv) {
    lt_init();
    const Shape shapes[] = {
        {"delta in_proj", 2560, 12352, false}, {"out_proj/o_proj", 4096, 2560, false},
        {"mlp down", 9216, 2560, false},       {"mlp gate|up", 2560, 18432, true},
        {"attn q|gate", 2560, 8192, false},    {"attn k (or v)", 2560, 1024, false},
        {"attn q|gate|k|v", 2560, 10240, false}, {"attn k|v", 2560, 2048, false},
    };
    bool enumerate = getenv("ENUMERATE") != nullptr;
    for (int i = 1; i < argc; ++i) {
        int rows = atoi(argv[i]);
        for (const Shape& s : shapes) probe(rows, s, enumerate && rows == atoi(argv[1]));
    }
    return 0;
}
