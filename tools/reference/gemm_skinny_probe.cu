// Probe of cuBLASLt's algorithms for the language model's GEMMs at few rows (one short question, or
// a question resumed after a cached prefix: the weights are read once and the GEMMs should run at
// the memory bandwidth). For each shape it reports, against the time of reading the weight alone:
//   - the batch-invariant reference (kernels/src/cuda/blas.rs: the heuristic's first pick at 4,096
//     rows that splits no K) run at these rows;
//   - the best of the heuristic's 8 picks at these rows with the K split removed that give the
//     reference's bits (what the server's tuning chooses from);
//   - the best of the heuristic's picks as they are (split K allowed: other bits; the ceiling the
//     invariance rule gives up);
//   - the best of every tile, stage count, cluster shape, CTA swizzle and custom option of the
//     reference's and the picks' algorithm ids, split K removed, that cuBLASLt accepts and that
//     give the reference's bits (an exhaustive search the server does not do).
// Every timed run follows a write of 128 MB, so the weight comes from memory, not from the 50 MB L2,
// as in a forward pass where 7 GB of weights stream through. Not part of the build; on the GPU:
//   nvcc -O2 -std=c++17 -arch=sm_90a -o /tmp/gemm_skinny_probe tools/reference/gemm_skinny_probe.cu -lcublasLt \
//     && /tmp/gemm_skinny_probe [rows]
// Layout as blas.rs: y [rows, n] = x [rows, k] · W [n, k]ᵀ; column-major A = W (transposed), B = x.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cublaslt_host.h"
#include "gpu_timing.cuh"
#include "harness_host.h"

static void* flush_buf;
static const size_t FLUSH = 128 << 20;

static uint16_t cfg16(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint16_t v = 0;
    size_t w = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof v, &w);
    return v;
}

static bool set32(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr, uint32_t v) {
    return cublasLtMatmulAlgoConfigSetAttribute(&a, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

static bool set16(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr, uint16_t v) {
    return cublasLtMatmulAlgoConfigSetAttribute(&a, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

static void describe(const cublasLtMatmulAlgo_t& a, char* out, size_t n) {
    snprintf(out, n, "id %u tile %u stages %u cluster %u swizzle %u custom %u splitk %u", lt_cfg(a, CUBLASLT_ALGO_CONFIG_ID),
             lt_cfg(a, CUBLASLT_ALGO_CONFIG_TILE_ID), lt_cfg(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
             (unsigned)cfg16(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), lt_cfg(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
             lt_cfg(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), lt_cfg(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM));
}

// Before each timed run: FLUSH bytes written (the weight then comes from memory; the dirty lines
// also cost the run their write-backs, so compare within a run of this probe).
static void memset_flush(int i) { cudaMemsetAsync(flush_buf, i, FLUSH, st); }

// The fastest of `runs` runs, each after memset_flush; -1 where a run fails.
static float time_us(const LtPlan& p, const cublasLtMatmulAlgo_t& a, const void* w, const void* x, void* y, float beta,
                     int runs = 7) {
    if (!lt_run(p, a, w, x, y, beta)) return -1;
    return fastest_us(
        st, runs, memset_flush, [&] { lt_run(p, a, w, x, y, beta); });
}

// The weight read alone, timed as the GEMMs are.
static float read_us(const void* w, size_t bytes, unsigned* sink) {
    return fastest_us(
        st, 7, memset_flush, [&] { read_bytes(w, bytes, 132 * 8, sink, st); });
}

int main(int argc, char** argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 144;  // a 139-id question's bucket
    lt_init();
    CK(cudaMalloc(&flush_buf, FLUSH));
    unsigned* sink;
    CK(cudaMalloc(&sink, 4));
    struct Shape {
        const char* name;
        int k, n;
        bool bf16_out, add;
        int layers;
    } shapes[] = {
        {"attention q|gate,k,v", 2560, 10240, false, false, 8},
        {"DeltaNet in-projection", 2560, 12352, true, false, 24},
        {"MLP gate|up", 2560, 18432, true, false, 32},
        {"attention/DeltaNet out-projection (+=)", 4096, 2560, false, true, 32},
        {"MLP down (+=)", 9216, 2560, false, true, 32},
    };
    double sum_read = 0, sum_served = 0, sum_best = 0, sum_split = 0;
    printf("rows %d\n", rows);
    for (const auto& s : shapes) {
        const size_t wn = (size_t)s.k * s.n, xn = (size_t)rows * s.k, yn = (size_t)rows * s.n;
        const size_t ybytes = yn * (s.bf16_out ? 2 : 4);
        const cudaDataType_t yt = s.bf16_out ? CUDA_R_16BF : CUDA_R_32F;
        const float beta = s.add ? 1.0f : 0.0f;
        std::vector<uint16_t> hw(wn), hx(xn);
        fill_bf16(hw, 0.03f, 11 + s.n);
        fill_bf16(hx, 1.0f, 12 + s.k);
        void *w, *x, *y;
        CK(cudaMalloc(&w, wn * 2));
        CK(cudaMalloc(&x, xn * 2));
        CK(cudaMalloc(&y, ybytes));
        CK(cudaMemcpy(w, hw.data(), wn * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(x, hx.data(), xn * 2, cudaMemcpyHostToDevice));
        // The output each candidate must give: beta = 1 adds to zeros (the same bits as replacing).
        auto output = [&](const LtPlan& p, const cublasLtMatmulAlgo_t& a, std::vector<uint8_t>& out) {
            CK(cudaMemsetAsync(y, 0, ybytes, st));
            if (!lt_run(p, a, w, x, y, beta)) return false;
            out.resize(ybytes);
            CK(cudaMemcpyAsync(out.data(), y, ybytes, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            return true;
        };
        const LtPlan p = lt_plan(rows, s.k, s.n, yt);
        cublasLtMatmulAlgo_t ref{};
        const bool have_ref = lt_reference(s.k, s.n, yt, ref);
        const float wread = read_us(w, wn * 2, sink);
        const double gb = wn * 2 / 1e3;  // bytes per µs = MB/s · 1e-3: GB/s as bytes / µs / 1e3
        printf("\n== %s: %d x %d -> %d (%s%s), weight %.1f MB, read alone %.1f us (%.0f GB/s)\n", s.name, rows, s.k,
               s.n, s.bf16_out ? "bf16" : "f32", s.add ? ", added" : "", wn * 2 / 1e6, wread, gb / wread);
        if (!have_ref || !lt_accepts(p, ref)) {
            printf("  no reference usable at these rows\n");
            continue;
        }
        char d[160];
        std::vector<uint8_t> want, got;
        CK(output(p, ref, want) ? 0 : 1);
        const float t_ref = time_us(p, ref, w, x, y, beta);
        describe(ref, d, sizeof d);
        printf("  reference (%s): %.1f us, %.0f GB/s\n", d, t_ref, gb / t_ref);
        // The server's search: the heuristic's picks at these rows, split removed, same bits.
        const auto picks = lt_heuristic(p, 8);
        float t_served = t_ref, t_split = 1e30f;
        std::vector<int> ids = {(int)lt_cfg(ref, CUBLASLT_ALGO_CONFIG_ID)};
        for (auto a : picks) {
            const float t_any = time_us(p, a, w, x, y, beta);
            if (t_any > 0) t_split = std::min(t_split, t_any);
            const int id = (int)lt_cfg(a, CUBLASLT_ALGO_CONFIG_ID);
            if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
            if (!lt_remove_split(a) || !lt_accepts(p, a) || !output(p, a, got) || got != want) continue;
            t_served = std::min(t_served, time_us(p, a, w, x, y, beta));
        }
        printf("  the server's choice (heuristic's 8, unsplit, same bits): %.1f us, %.0f GB/s\n", t_served,
               gb / t_served);
        printf("  heuristic's 8 as they are (split K allowed, other bits): %.1f us, %.0f GB/s\n", t_split,
               gb / t_split);
        // Every configuration of those algorithm ids.
        struct Found {
            float us;
            cublasLtMatmulAlgo_t a;
        };
        std::vector<Found> same;
        int tried = 0, accepted = 0, differing = 0;
        const uint16_t clusters[] = {0, 2, 3, 4, 5, 6};
        for (int id : ids) {
            cublasLtMatmulAlgo_t base;
            if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, yt, yt, id, &base) !=
                CUBLAS_STATUS_SUCCESS)
                continue;
            size_t nbytes = 0;
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &nbytes);
            std::vector<uint32_t> tiles(std::max<size_t>(nbytes / 4, 1), 0);
            if (nbytes) cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), nbytes, &nbytes);
            nbytes = 0;
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &nbytes);
            std::vector<uint32_t> stages(std::max<size_t>(nbytes / 4, 1), 0);
            if (nbytes)
                cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), nbytes, &nbytes);
            uint32_t swz = 0;
            int32_t custom_max = 0;
            size_t wr;
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz, sizeof swz, &wr);
            cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof custom_max,
                                              &wr);
            printf("  algo id %d: %zu tiles, %zu stage counts, swizzle %u, custom options 0-%d\n", id, tiles.size(),
                   stages.size(), swz, custom_max);
            for (uint32_t tile : tiles)
                for (uint32_t stage : stages)
                    for (uint16_t cluster : clusters)
                        for (uint32_t sw = 0; sw <= (swz ? 1u : 0u); ++sw)
                            for (int32_t custom = 0; custom <= std::min(custom_max, 3); ++custom) {
                                cublasLtMatmulAlgo_t a = base;
                                if (!set32(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile) ||
                                    !set32(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stage) ||
                                    !set16(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster) ||
                                    !set32(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, sw) ||
                                    !set32(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, (uint32_t)custom) || !lt_remove_split(a))
                                    continue;
                                ++tried;
                                if (!lt_accepts(p, a)) continue;
                                ++accepted;
                                if (!output(p, a, got)) continue;
                                if (got != want) {
                                    ++differing;
                                    continue;
                                }
                                const float t = time_us(p, a, w, x, y, beta, 3);
                                if (t > 0) same.push_back({t, a});
                            }
        }
        std::sort(same.begin(), same.end(), [](const Found& l, const Found& r) { return l.us < r.us; });
        // The leaders again, timed as the others were.
        for (size_t i = 0; i < std::min<size_t>(same.size(), 8); ++i) same[i].us = time_us(p, same[i].a, w, x, y, beta);
        std::sort(same.begin(), same.begin() + std::min<size_t>(same.size(), 8),
                  [](const Found& l, const Found& r) { return l.us < r.us; });
        printf("  exhaustive: %d configurations, %d accepted, %d other bits, %zu same bits; fastest:\n", tried, accepted,
               differing, same.size());
        for (size_t i = 0; i < std::min<size_t>(same.size(), 5); ++i) {
            describe(same[i].a, d, sizeof d);
            printf("    %.1f us, %.0f GB/s: %s\n", same[i].us, gb / same[i].us, d);
        }
        const float t_best = same.empty() ? t_served : std::min(t_served, same[0].us);
        sum_read += s.layers * wread;
        sum_served += s.layers * t_served;
        sum_best += s.layers * t_best;
        sum_split += s.layers * t_split;
        cudaFree(w);
        cudaFree(x);
        cudaFree(y);
    }
    printf("\nper forward (the layers' GEMMs at %d rows): weight read alone %.0f us; the server's choice %.0f us; "
           "exhaustive, same bits %.0f us; split K allowed %.0f us\n",
           rows, sum_read, sum_served, sum_best, sum_split);
    return 0;
}
