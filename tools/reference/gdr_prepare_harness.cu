// The DeltaNet layer's chunk preparation (gdr_prepare_conv, delta_chunked.cu) outside the server,
// on the real Qwen3.5-4B shapes (16 key heads and 32 value heads of 128, the stacked 12,352-wide
// in-projection in bf16): its time per batch shape (CUDA events, 20 launches after 3), where a
// block's time goes (the kernel's DC_MARK phase marks: the SM clock when the last warp reaches
// each) and how the blocks fall into waves (the global timer at each block's start); and, for each
// variant beside it (another revision's kernel with REF_CU), how many output values differ from the
// served kernel's bit for bit. Built and run by gdr_prepare_harness.sh on the GPU machine.
#include <cstdint>
__device__ unsigned long long* dc_marks;  // [blocks][8]: clock64 at phases 0-5, global ns at 6, SM at 7
__device__ __forceinline__ unsigned long long dc_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned dc_smid() {
    unsigned r;
    asm volatile("mov.u32 %0, %smid;" : "=r"(r));
    return r;
}
#define DC_MARK(i)                                                                              \
    do {                                                                                        \
        if (dc_marks && (threadIdx.x & 31) == 0) {                                              \
            const size_t b_ = (size_t)blockIdx.y * gridDim.x + blockIdx.x;                      \
            atomicMax(&dc_marks[b_ * 8 + (i)], (unsigned long long)clock64());                  \
            if ((i) == 0 && threadIdx.x == 0) {                                                 \
                dc_marks[b_ * 8 + 6] = dc_now();                                                \
                dc_marks[b_ * 8 + 7] = dc_smid();                                               \
            }                                                                                   \
        }                                                                                       \
    } while (0)
#include "../../kernels/cuda/prelude.cuh"
#include "../../kernels/cuda/delta_chunked.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <cuda_runtime.h>

#include "harness_host.h"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));                \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

typedef void (*PrepFn)(const __nv_bfloat16*, int, int, const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                       const __nv_bfloat16*, int, int, const __nv_bfloat16*, const __nv_bfloat16*, float,
                       const float*, int, const u32*, int, int, int, int, int, float, u32, __nv_bfloat16*, float*,
                       __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*);
struct Variant {
    const char* name;
    PrepFn fn;
    int threads;
    int smem;
};

// Real shapes.
static const int KH = 16, VH = 32, KD = 128, VD = 128;
static const int QKV = 2 * KH * KD + VH * VD;  // 8,192
static const int XW = QKV + VH * VD + 2 * VH;  // 12,352: q|k|v, z, b, a
static const int SMEM = 4 * (2 * 64 * 132 + 2 * 64 * 68 + 3 * 256 + 5 * 64);

struct Outs {
    __nv_bfloat16 *w, *q, *k, *p;
    float *u, *gam;
    size_t rows;
    void alloc(size_t r) {
        rows = r;
        CK(cudaMalloc(&w, r * VH * 128 * 2));
        CK(cudaMalloc(&q, r * VH * 128 * 2));
        CK(cudaMalloc(&k, r * VH * 128 * 2));
        CK(cudaMalloc(&p, r * VH * 64 * 2));
        CK(cudaMalloc(&u, r * VH * 128 * 4));
        CK(cudaMalloc(&gam, r * VH * 4));
    }
    void clear() {
        CK(cudaMemset(w, 0, rows * VH * 128 * 2));
        CK(cudaMemset(q, 0, rows * VH * 128 * 2));
        CK(cudaMemset(k, 0, rows * VH * 128 * 2));
        CK(cudaMemset(p, 0, rows * VH * 64 * 2));
        CK(cudaMemset(u, 0, rows * VH * 128 * 4));
        CK(cudaMemset(gam, 0, rows * VH * 4));
    }
    void release() {
        cudaFree(w); cudaFree(q); cudaFree(k); cudaFree(p); cudaFree(u); cudaFree(gam);
    }
};

static size_t diff_bytes(const void* a, const void* b, size_t bytes, size_t unit) {
    std::vector<unsigned char> x(bytes), y(bytes);
    CK(cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(y.data(), b, bytes, cudaMemcpyDeviceToHost));
    size_t n = 0;
    for (size_t i = 0; i < bytes; i += unit) n += memcmp(&x[i], &y[i], unit) != 0;
    return n;
}

#ifdef GDR_REF
// The kernel of another revision (REF_CU in gdr_prepare_harness.sh), its names prefixed with ref_.
extern "C" __global__ void ref_gdr_prepare_conv(const __nv_bfloat16*, int, int, const __nv_bfloat16*,
                                                const __nv_bfloat16*, int, int, const __nv_bfloat16*, int, int,
                                                const __nv_bfloat16*, const __nv_bfloat16*, float, const float*, int,
                                                const u32*, int, int, int, int, int, float, u32, __nv_bfloat16*,
                                                float*, __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*);
#endif

int main() {
    std::vector<Variant> variants = {{"served", gdr_prepare_conv, DC_THREADS, SMEM}};
#ifdef GDR_REF
    variants.push_back({"ref", ref_gdr_prepare_conv, DC_THREADS, SMEM});
#endif
    for (auto& v : variants) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.f, 1.f);
    struct Case {
        const char* name;
        std::vector<u32> lens;
        bool windows = false;  // resumed: conv windows carried in (has_window)
    };
    std::vector<Case> cases = {
        {"ragged 1,63,64,65,127,129,200", {1, 63, 64, 65, 127, 129, 200}},
        {"139", {139}},
        {"2x300", {300, 300}},
        {"712", {712}},
        {"1100", {1100}},
        {"32x300", std::vector<u32>(32, 300)},
        {"128x300", std::vector<u32>(128, 300)},
        {"ragged resumed 1,2,3,63,64,65,300", {1, 2, 3, 63, 64, 65, 300}, true},
    };
    // Inputs sized for the largest case.
    size_t max_rows = 0;
    for (auto& c : cases) {
        size_t r = 0;
        for (u32 l : c.lens) r += l;
        max_rows = std::max(max_rows, r);
    }
    std::vector<uint16_t> hx(max_rows * XW), hw(QKV * 4), hal(VH), hdt(VH);
    // The projection: uniform in [-1, 1) from a xorshift (a normal draw per value is too slow
    // for the largest batch's 474 M values).
    XorShift xs{0x9e3779b97f4a7c15ull};
    for (auto& v : hx) v = to_bf16(xs.uniform());
    for (auto& v : hw) v = to_bf16(nd(rng) * 0.5f);
    for (auto& v : hal) v = to_bf16(nd(rng) * 0.5f);
    for (auto& v : hdt) v = to_bf16(nd(rng) * 0.5f);
    __nv_bfloat16 *dx, *dw, *dal, *ddt;
    CK(cudaMalloc(&dx, hx.size() * 2));
    CK(cudaMalloc(&dw, hw.size() * 2));
    CK(cudaMalloc(&dal, VH * 2));
    CK(cudaMalloc(&ddt, VH * 2));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dal, hal.data(), VH * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ddt, hdt.data(), VH * 2, cudaMemcpyHostToDevice));
    // Carried conv windows (f32 [seqs][3][q|k|v], values of a bf16 projection) for resumed cases.
    const int max_win_seqs = 16;
    std::vector<float> hwin((size_t)max_win_seqs * 3 * QKV);
    for (auto& v : hwin) v = from_bf16(to_bf16(xs.uniform()));
    float* dwin;
    CK(cudaMalloc(&dwin, hwin.size() * 4));
    CK(cudaMemcpy(dwin, hwin.data(), hwin.size() * 4, cudaMemcpyHostToDevice));
    Outs ref, got;
    ref.alloc(max_rows);
    got.alloc(max_rows);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float scale = 1.0f / sqrtf((float)KD);
    bool all_same = true;
    for (auto& c : cases) {
        std::vector<u32> cu = {0};
        for (u32 l : c.lens) cu.push_back(cu.back() + l);
        const u32 rows = cu.back();
        const int ns = (int)c.lens.size();
        u32* dcu;
        CK(cudaMalloc(&dcu, cu.size() * 4));
        CK(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
        const int slots = (int)((rows + 63) / 64) + ns;
        int chunks = 0;
        for (u32 l : c.lens) chunks += (int)((l + 63) / 64);
        const dim3 grid(slots, VH);
        auto launch = [&](const Variant& v, Outs& o) {
            v.fn<<<grid, v.threads, v.smem>>>(dx, XW, 0, dw, dx, XW, QKV + VH * VD, dx, XW, QKV + VH * VD + VH, dal,
                                              ddt, 1e-6f, c.windows ? dwin : nullptr, c.windows ? 1 : 0, dcu, ns, KH, VH,
                                              KD, VD, scale, rows, o.w, o.u,
                                              o.q, o.k, o.p, o.gam);
        };
        // Bits against the served kernel.
        ref.clear();
        launch(variants[0], ref);
        CK(cudaDeviceSynchronize());
        for (size_t vi = 0; vi < variants.size(); ++vi) {
            auto& v = variants[vi];
            float best = 1e30f, sum = 0.f;
            for (int i = 0; i < 3; ++i) launch(v, got);
            const int runs = 20;
            for (int i = 0; i < runs; ++i) {
                CK(cudaEventRecord(e0));
                launch(v, got);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                best = std::min(best, ms);
                sum += ms;
            }
            size_t d = 0;
            if (vi > 0) {
                got.clear();
                launch(v, got);
                CK(cudaDeviceSynchronize());
                const size_t r = rows;
                d += diff_bytes(ref.w, got.w, r * VH * 128 * 2, 2);
                d += diff_bytes(ref.q, got.q, r * VH * 128 * 2, 2);
                d += diff_bytes(ref.k, got.k, r * VH * 128 * 2, 2);
                d += diff_bytes(ref.p, got.p, r * VH * 64 * 2, 2);
                d += diff_bytes(ref.u, got.u, r * VH * 128 * 4, 4);
                d += diff_bytes(ref.gam, got.gam, r * VH * 4, 4);
                all_same &= d == 0;
            }
            // Bytes the kernel must move: the q|k|v block and gates of its rows, the outputs.
            const double bytes = (double)rows * (QKV * 2 + 2 * VH * 2) +
                                 (double)rows * VH * (128 * 2 * 3 + 64 * 2 + 128 * 4 + 4);
            printf("[%s] %-8s rows %5u chunks %5d blocks %6d: mean %.1f us, best %.1f us (%.0f GB/s at best)%s%zu\n",
                   c.name, v.name, rows, chunks, chunks * VH, 1e3f * sum / runs, 1e3f * best,
                   bytes / (best * 1e-3) / 1e9, vi > 0 ? ", values differing from served: " : "",
                   vi > 0 ? d : (size_t)0);
        }
        // Phase marks of the served kernel, one run.
        const size_t blocks = (size_t)slots * VH;
        unsigned long long* dm;
        CK(cudaMalloc(&dm, blocks * 8 * 8));
        CK(cudaMemset(dm, 0, blocks * 8 * 8));
        CK(cudaMemcpyToSymbol(dc_marks, &dm, sizeof(dm)));
        launch(variants[0], got);
        CK(cudaDeviceSynchronize());
        unsigned long long* none = nullptr;
        CK(cudaMemcpyToSymbol(dc_marks, &none, sizeof(none)));
        std::vector<unsigned long long> m(blocks * 8);
        CK(cudaMemcpy(m.data(), dm, m.size() * 8, cudaMemcpyDeviceToHost));
        cudaFree(dm);
        int khz = 0;
        CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        const double us_per_cycle = 1e3 / khz;
        unsigned long long t0 = ~0ull;
        std::vector<std::vector<double>> phase(5);
        std::vector<double> total, starts;
        for (size_t b = 0; b < blocks; ++b) {
            const unsigned long long* x = &m[b * 8];
            if (x[0] == 0) continue;  // a slot past the batch's chunks
            t0 = std::min(t0, x[6]);
            for (int i = 0; i < 5; ++i) phase[i].push_back((double)(x[i + 1] - x[i]) * us_per_cycle);
            total.push_back((double)(x[5] - x[0]) * us_per_cycle);
        }
        double t1 = 0;
        for (size_t b = 0; b < blocks; ++b)
            if (m[b * 8]) {
                starts.push_back((m[b * 8 + 6] - t0) * 1e-3);
                t1 = std::max(t1, starts.back() + (double)(m[b * 8 + 5] - m[b * 8]) * us_per_cycle);
            }
        auto med = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v.empty() ? 0.0 : v[v.size() / 2];
        };
        auto mx = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
        printf("  marks (us at %d MHz): span %.1f; block median %.1f (max %.1f); phase medians: stage,conv,norm %.1f | "
               "gamma,A,P,diag %.1f | q,k out %.1f | levels %.1f | W,U %.1f\n",
               khz / 1000, t1, med(total), mx(total), med(phase[0]), med(phase[1]), med(phase[2]),
               med(phase[3]), med(phase[4]));
        // Start times: how many blocks start in each 5 us window (waves).
        std::sort(starts.begin(), starts.end());
        printf("  block starts (us after the first: count):");
        const double step = 5.0;
        for (double lo = 0; lo <= starts.back(); lo += step) {
            const size_t n = std::count_if(starts.begin(), starts.end(), [&](double s) { return s >= lo && s < lo + step; });
            if (n) printf(" %.0f:%zu", lo, n);
        }
        printf("  (%d SMs)\n", sms);
        cudaFree(dcu);
    }
    printf(all_same ? "ALL SAME BITS\n" : "SOME DIFFER\n");
    return 0;
}
