// Shared by every kernel file: prepended to each source before NVRTC compiles it.
// Conventions: activations are f32, weights bf16 (widened to f32 on load), accumulation in f32.
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef long long i64;

// NVRTC has no <cmath>/<math.h> macros (INFINITY, NAN) without extra headers.
#define F32_NAN __int_as_float(0x7fc00000)
#define F32_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float load_bf16(const __nv_bfloat16* p, i64 i) {
    return __bfloat162float(p[i]);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        float s = lane < warps ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    const float result = total;
    // Keep a following block_sum call from overwriting `total` before everyone read it.
    __syncthreads();
    return result;
}

// Index of the sequence holding packed row `row`: the last s with cu[s] <= row. `cu` has
// num_seqs + 1 entries; rows at or beyond cu[num_seqs] belong to no sequence (returns -1).
__device__ int sequence_of_row(const u32* cu, int num_seqs, u32 row) {
    if (row >= cu[num_seqs]) return -1;
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= row) lo = mid; else hi = mid - 1;
    }
    return lo;
}
