// The vision tower's bidirectional attention kernels outside the server: flash_bidir_wgmma.cu (the
// served entry point and other tile/stage choices) against an f64 reference and against
// flash_attention.cu's mma.sync wide layout (values, and how many differ from it bit for bit), on
// ragged segments (lengths 1, 63-65, 127-129, ...), large logits and one 1024x1024 screenshot's
// 4,096 rows of 16 heads; each timed (CUDA events, 20 launches after 3). Built and run by
// flash_bidir_harness.sh on an sm_90 GPU.
#include "../../kernels/cuda/prelude.cuh"
#include "../../kernels/cuda/flash_attention.cu"
#include "../../kernels/cuda/flash_bidir_wgmma.cu"
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <random>
#include <cuda_runtime.h>
#include "harness_host.h"

// Other tile and stage choices, for comparison with the served one.
FW_ENTRY(fw_bn64_s2, 64, 2, 2)
FW_ENTRY(fw_bn64_s3, 64, 3, 2)
FW_ENTRY(fw_bn128_s2, 128, 2, 2)
FW_ENTRY(fw_bn128_s2_1, 128, 2, 1)
// The products overlapped with the softmax (three stages).
FW_OVERLAP_ENTRY(fw_overlap_bn128, 128, 1)

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

typedef void (*FwFn)(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const u32*, int, u32, void*, int, int);
struct Variant { const char* name; FwFn fn; int bn, stages; };

int main(int argc, char** argv) {
    Variant variants[] = {{"overlap bn64 s3 (served)", flash_bidir_wgmma_d64, 64, 3}, {"wgmma bn64 s3", fw_bn64_s3, 64, 3},
                          {"wgmma bn128 s2", fw_bn128_s2, 128, 2}, {"wgmma bn128 s2 1blk", fw_bn128_s2_1, 128, 2},
                          {"wgmma bn64 s2", fw_bn64_s2, 64, 2}, {"overlap bn128 s3 1blk", fw_overlap_bn128, 128, 3}};
    const int NV = sizeof(variants) / sizeof(variants[0]);
    for (auto& v : variants) CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, FW_SMEM_BYTES(v.bn, v.stages)));
    const int wide_smem = (128 + 2 * FA_BN) * (64 + FA_PAD) * 2;
    CK(cudaFuncSetAttribute(flash_attention_bidir_wide_d64, cudaFuncAttributeMaxDynamicSharedMemorySize, wide_smem));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    struct Case { const char* name; std::vector<u32> lens; int heads; int check_rows; float qmul; };
    std::vector<Case> cases = {
        {"ragged", {1, 63, 64, 65, 127, 128, 129, 255, 300, 1000, 17}, 4, 0, 1.f},
        {"ragged hot", {5, 200, 513, 64}, 3, 0, 4.f},
        {"image 4096 x16", {4096}, 16, 96, 1.f},
    };
    bool all_ok = true;
    for (auto& c : cases) {
        std::vector<u32> cu = {0};
        for (u32 l : c.lens) cu.push_back(cu.back() + l);
        const u32 rows = cu.back();
        const int H = c.heads, D = 64;
        const size_t n = (size_t)rows * H * D;
        std::vector<uint16_t> q(n), k(n), v(n);
        const float qs = 0.125f * 1.4426950408889634f * c.qmul;
        for (size_t i = 0; i < n; ++i) { q[i] = to_bf16(nd(rng) * qs); k[i] = to_bf16(nd(rng)); v[i] = to_bf16(nd(rng)); }
        __nv_bfloat16 *dq, *dk, *dv; u32* dcu; float* dout; float* dref;
        CK(cudaMalloc(&dq, n * 2)); CK(cudaMalloc(&dk, n * 2)); CK(cudaMalloc(&dv, n * 2));
        CK(cudaMalloc(&dcu, cu.size() * 4)); CK(cudaMalloc(&dout, n * 4)); CK(cudaMalloc(&dref, n * 4));
        CK(cudaMemcpy(dq, q.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dk, k.data(), n * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, v.data(), n * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
        const int ns = (int)c.lens.size();
        dim3 grid((rows + 127) / 128 + ns, H);
        // reference rows: all, or check_rows per head spread over the rows
        std::vector<u32> ref_rows;
        if (c.check_rows == 0) for (u32 r = 0; r < rows; ++r) ref_rows.push_back(r);
        else for (int i = 0; i < c.check_rows; ++i) ref_rows.push_back((u32)(((uint64_t)i * 2654435761u) % rows));
        std::vector<double> ref(ref_rows.size() * H * D);
        for (size_t ri = 0; ri < ref_rows.size(); ++ri) {
            const u32 r = ref_rows[ri];
            int s = 0; while (cu[s + 1] <= r) ++s;
            for (int h = 0; h < H; ++h) {
                std::vector<double> sc(cu[s + 1] - cu[s]);
                double mx = -1e300;
                for (u32 j = cu[s]; j < cu[s + 1]; ++j) {
                    double a = 0; for (int d = 0; d < D; ++d) a += (double)from_bf16(q[((size_t)r * H + h) * D + d]) * from_bf16(k[((size_t)j * H + h) * D + d]);
                    sc[j - cu[s]] = a; mx = fmax(mx, a);
                }
                double den = 0; std::vector<double> acc(D, 0.0);
                for (u32 j = cu[s]; j < cu[s + 1]; ++j) { double p = exp2(sc[j - cu[s]] - mx); den += p; for (int d = 0; d < D; ++d) acc[d] += p * from_bf16(v[((size_t)j * H + h) * D + d]); }
                for (int d = 0; d < D; ++d) ref[(ri * H + h) * D + d] = acc[d] / den;
            }
        }
        std::vector<float> out(n), wide(n);
        auto err_of = [&](const std::vector<float>& o) { double e = 0; for (size_t ri = 0; ri < ref_rows.size(); ++ri) for (int h = 0; h < H; ++h) for (int d = 0; d < D; ++d) e = fmax(e, fabs(o[((size_t)ref_rows[ri] * H + h) * D + d] - ref[(ri * H + h) * D + d])); return e; };
        // mma.sync wide kernel
        CK(cudaMemset(dref, 0xff, n * 4));
        flash_attention_bidir_wide_d64<<<grid, 256, wide_smem>>>(dq, dk, dv, nullptr, 0, 0, dcu, ns, rows, dref, 0, H, H, 64, 0, nullptr);
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(wide.data(), dref, n * 4, cudaMemcpyDeviceToHost));
        const double e_wide = err_of(wide);
        printf("[%s] rows %u heads %d: mma.sync wide max|err| %.3e\n", c.name, rows, H, e_wide);
        cudaEvent_t t0, t1; cudaEventCreate(&t0); cudaEventCreate(&t1);
        const double flop = [&] { double f = 0; for (u32 l : c.lens) f += 4.0 * l * l * D * H; return f; }();
        auto time_it = [&](auto launch) { for (int i = 0; i < 3; ++i) launch(); cudaEventRecord(t0); for (int i = 0; i < 20; ++i) launch(); cudaEventRecord(t1); CK(cudaEventSynchronize(t1)); float ms; cudaEventElapsedTime(&ms, t0, t1); return ms / 20 * 1e3; };
        const double us_wide = time_it([&] { flash_attention_bidir_wide_d64<<<grid, 256, wide_smem>>>(dq, dk, dv, nullptr, 0, 0, dcu, ns, rows, dref, 1, H, H, 64, 0, nullptr); });
        printf("  mma.sync wide: %.1f us (%.0f TFLOP/s)\n", us_wide, flop / us_wide * 1e-6);
        for (int vi = 0; vi < NV; ++vi) {
            auto& var = variants[vi];
            CK(cudaMemset(dout, 0xff, n * 4));
            var.fn<<<grid, FW_THREADS, FW_SMEM_BYTES(var.bn, var.stages)>>>(dq, dk, dv, dcu, ns, rows, dout, 0, H);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(out.data(), dout, n * 4, cudaMemcpyDeviceToHost));
            double dmax = 0; size_t nan = 0, differ = 0;
            for (size_t i = 0; i < n; ++i) {
                if (!std::isfinite(out[i])) ++nan; else dmax = fmax(dmax, fabs(out[i] - wide[i]));
                differ += memcmp(&out[i], &wide[i], 4) != 0;
            }
            const double e = err_of(out);
            const bool ok = nan == 0 && e <= 2.0 * e_wide + 1e-3;
            all_ok &= ok;
            const double us = time_it([&] { var.fn<<<grid, FW_THREADS, FW_SMEM_BYTES(var.bn, var.stages)>>>(dq, dk, dv, dcu, ns, rows, dout, 1, H); });
            printf("  %-24s max|err| %.3e  vs wide: max|diff| %.3e, %zu of %zu values differ  non-finite %zu  %s  %.1f us (%.0f TFLOP/s)\n",
                   var.name, e, dmax, differ, n, nan, ok ? "ok" : "FAIL", us, flop / us * 1e-6);
        }
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dcu); cudaFree(dout); cudaFree(dref);
    }
    printf(all_ok ? "ALL OK\n" : "SOME FAILED\n");
    return all_ok ? 0 : 1;
}
