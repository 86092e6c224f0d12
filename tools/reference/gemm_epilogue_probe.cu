// Probe of cuBLASLt's bias and GELU epilogues for the vision tower's GEMMs, before building on them:
// which output / bias types cuBLASLt accepts with bf16 operands and f32 compute, which GELU it
// applies (the tanh form the tower's config names, or erf), how far the fused result is from the
// separate ops', and what the epilogue costs against the plain GEMM. Not part of the build; run on
// the GPU machine:
//   nvcc -O2 -std=c++17 -o /tmp/gemm_epilogue_probe tools/reference/gemm_epilogue_probe.cu -lcublasLt \
//     && /tmp/gemm_epilogue_probe [rows]
// Layout as kernels/src/cuda/blas.rs: y [rows, n] = x [rows, k] · W [n, k]ᵀ; column-major A = W
// (transposed), B = x, C = D = y. The reference for each case is the plain GEMM's f32 output with the
// epilogue's arithmetic done on the host, as the tower's separate kernels do it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cublaslt_host.h"
#include "harness_host.h"



static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / 1.4142135623730951)); }


struct Gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool ok = false;
};

// A plan for y = x Wᵀ (+ epilogue) with output type yt; false where cuBLASLt has no algorithm.
static Gemm plan(int rows, int k, int n, cudaDataType_t yt, cublasLtEpilogue_t epi, cudaDataType_t bias_t,
                 const void* bias) {
    Gemm g{};
    CK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int t = CUBLAS_OP_T;
    CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        if (cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) return g;
        if (cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t, sizeof bias_t))
            return g;
        if (cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) return g;
    }
    CK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, n, k));
    CK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, rows, k));
    CK(cublasLtMatrixLayoutCreate(&g.c, yt, n, rows, n));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = WS;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.a, g.b, g.c, g.c, pref, 1, &r, &found) == CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        g.algo = r.algo;
        g.ok = true;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return g;
}

static bool run(const Gemm& g, const void* w, const void* x, void* y, float beta) {
    const float alpha = 1.0f;
    return cublasLtMatmul(lt, g.desc, &alpha, w, g.a, x, g.b, &beta, y, g.c, y, g.c, &g.algo, ws, WS, st) ==
           CUBLAS_STATUS_SUCCESS;
}

// Mean µs of 20 runs after 3 (y rewritten each time; with beta = 1 it grows, which does not matter
// for the time).
static float time_us(const Gemm& g, const void* w, const void* x, void* y, float beta) {
    for (int i = 0; i < 3; ++i) run(g, w, x, y, beta);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, st);
    for (int i = 0; i < 20; ++i) run(g, w, x, y, beta);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return 1000.0f * ms / 20;
}

int main(int argc, char** argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 4096;  // one 1024x1024 screenshot's patches
    lt_init();
    struct Shape {
        const char* name;
        int k, n;
    } shapes[] = {{"fc1 1024 -> 4096", 1024, 4096}, {"proj 1024 -> 1024", 1024, 1024}, {"fc2 4096 -> 1024", 4096, 1024}};
    for (const auto& s : shapes) {
        const size_t wn = (size_t)s.k * s.n, xn = (size_t)rows * s.k, yn = (size_t)rows * s.n;
        std::vector<uint16_t> hw(wn), hx(xn), hb(s.n);
        // Products of order 1 (k · (1/√k)² · a² / 3 ...): GELU inputs spread over a few units.
        fill_bf16(hw, 2.0f / sqrtf((float)s.k) * 1.7f, 1 + s.k);
        fill_bf16(hx, 1.7f, 2 + s.n);
        fill_bf16(hb, 0.5f, 3);
        std::vector<float> hb32(s.n), hres(yn);
        for (int i = 0; i < s.n; ++i) hb32[i] = from_bf16(hb[i]);
        std::vector<uint16_t> hres16(yn);
        fill_bf16(hres16, 2.0f, 4);
        for (size_t i = 0; i < yn; ++i) hres[i] = from_bf16(hres16[i]);
        void *w, *x, *y, *ref, *b16, *b32;
        CK(cudaMalloc(&w, wn * 2));
        CK(cudaMalloc(&x, xn * 2));
        CK(cudaMalloc(&y, yn * 4));
        CK(cudaMalloc(&ref, yn * 4));
        CK(cudaMalloc(&b16, s.n * 2));
        CK(cudaMalloc(&b32, s.n * 4));
        CK(cudaMemcpy(w, hw.data(), wn * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x, hx.data(), xn * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b16, hb.data(), s.n * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b32, hb32.data(), s.n * 4, cudaMemcpyHostToDevice));

        // The plain GEMM, f32 out: the reference's products and the time to beat.
        Gemm plain = plan(rows, s.k, s.n, CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_32F, nullptr);
        if (!plain.ok || !run(plain, w, x, ref, 0.0f)) {
            printf("%s: the plain GEMM has no algorithm\n", s.name);
            continue;
        }
        CK(cudaStreamSynchronize(st));
        std::vector<float> acc(yn);
        CK(cudaMemcpy(acc.data(), ref, yn * 4, cudaMemcpyDeviceToHost));
        const float plain_us = time_us(plain, w, x, ref, 0.0f);
        Gemm plain16 = plan(rows, s.k, s.n, CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_32F, nullptr);
        const float plain16_us = plain16.ok ? time_us(plain16, w, x, y, 0.0f) : -1.0f;
        printf("\n== %s, %d rows: plain GEMM %.1f us (f32 out), %.1f us (bf16 out)\n", s.name, rows, plain_us,
               plain16_us);

        struct Case {
            const char* name;
            cublasLtEpilogue_t epi;
            cudaDataType_t yt, bt;
            bool add;  // beta = 1 onto the residual
        } cases[] = {
            {"GELU_BIAS, f32 out, bf16 bias", CUBLASLT_EPILOGUE_GELU_BIAS, CUDA_R_32F, CUDA_R_16BF, false},
            {"GELU_BIAS, f32 out, f32 bias", CUBLASLT_EPILOGUE_GELU_BIAS, CUDA_R_32F, CUDA_R_32F, false},
            {"GELU_BIAS, bf16 out, bf16 bias", CUBLASLT_EPILOGUE_GELU_BIAS, CUDA_R_16BF, CUDA_R_16BF, false},
            {"GELU_BIAS, bf16 out, f32 bias", CUBLASLT_EPILOGUE_GELU_BIAS, CUDA_R_16BF, CUDA_R_32F, false},
            {"BIAS + residual, f32, bf16 bias", CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, CUDA_R_16BF, true},
            {"BIAS + residual, f32, f32 bias", CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, CUDA_R_32F, true},
        };
        for (const auto& c : cases) {
            const bool gelu = c.epi == CUBLASLT_EPILOGUE_GELU_BIAS;
            if (gelu != (s.n == 4096)) continue;  // GELU after fc1; bias + residual after proj and fc2
            const void* bias = c.bt == CUDA_R_16BF ? b16 : b32;
            Gemm g = plan(rows, s.k, s.n, c.yt, c.epi, c.bt, bias);
            if (!g.ok) {
                printf("  %-34s not accepted (no algorithm)\n", c.name);
                continue;
            }
            if (c.add) CK(cudaMemcpy(y, hres.data(), yn * 4, cudaMemcpyHostToDevice));
            if (!run(g, w, x, y, c.add ? 1.0f : 0.0f)) {
                printf("  %-34s accepted by the heuristic, the matmul failed\n", c.name);
                continue;
            }
            CK(cudaStreamSynchronize(st));
            std::vector<float> got(yn);
            if (c.yt == CUDA_R_32F) {
                CK(cudaMemcpy(got.data(), y, yn * 4, cudaMemcpyDeviceToHost));
            } else {
                std::vector<uint16_t> g16(yn);
                CK(cudaMemcpy(g16.data(), y, yn * 2, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < yn; ++i) got[i] = from_bf16(g16[i]);
            }
            // Against the separate ops on the plain GEMM's products (f32 adds in the kernels' order:
            // GELU(acc + bias); residual + (acc + bias)).
            double d_tanh = 0, d_erf = 0, d_add = 0;
            size_t closer_tanh = 0, closer_erf = 0;
            for (size_t i = 0; i < yn; ++i) {
                const float pre = acc[i] + hb32[i % s.n];
                if (gelu) {
                    const double t = gelu_tanh(pre), e = gelu_erf(pre);
                    d_tanh = fmax(d_tanh, fabs(got[i] - t));
                    d_erf = fmax(d_erf, fabs(got[i] - e));
                    if (fabs(t - e) > 1e-5) (fabs(got[i] - t) < fabs(got[i] - e) ? closer_tanh : closer_erf)++;
                } else {
                    d_add = fmax(d_add, fabs(got[i] - (hres[i] + pre)));
                }
            }
            const float us = time_us(g, w, x, y, c.add ? 1.0f : 0.0f);
            if (gelu)
                printf("  %-34s %7.1f us; max |y - GELU_tanh| %.3g, max |y - GELU_erf| %.3g; where they differ by "
                       "> 1e-5, nearer tanh %zu, nearer erf %zu\n",
                       c.name, us, d_tanh, d_erf, closer_tanh, closer_erf);
            else
                printf("  %-34s %7.1f us; max |y - (residual + (x W^T + bias))| %.3g\n", c.name, us, d_add);
        }
        cudaFree(w);
        cudaFree(x);
        cudaFree(y);
        cudaFree(ref);
        cudaFree(b16);
        cudaFree(b32);
    }
    return 0;
}
