// Timing helpers of the GEMM probe and harness under tools/reference (gemm_skinny_probe.cu,
// skinny_gemm_harness.cu): a plain streaming read of a buffer (the memory-bandwidth yardstick, and
// a way to flush the 50 MB L2 with clean lines), and the fastest of several runs each after a flush.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

// Every 16 bytes of p[0 .. n) loaded once (L2 only), XORed so the loads stay.
__global__ void read_all(const uint4* __restrict__ p, size_t n, unsigned* sink) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

// `bytes` of `p` read by `blocks` blocks of 512 threads, on `stream`.
static void read_bytes(const void* p, size_t bytes, int blocks, unsigned* sink, cudaStream_t stream) {
    read_all<<<blocks, 512, 0, stream>>>((const uint4*)p, bytes / 16, sink);
}

// The fastest of `runs` runs of `run()` on `stream` (µs), each after `flush(i)`, which is not timed.
template <typename Flush, typename Run>
static float fastest_us(cudaStream_t stream, int runs, Flush flush, Run run) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < runs; ++i) {
        flush(i);
        cudaEventRecord(e0, stream);
        run();
        cudaEventRecord(e1, stream);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        best = std::min(best, ms);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1000.0f * best;
}
