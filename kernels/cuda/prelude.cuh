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

// An activation value as f32, from an f32 buffer or a bf16 one (a projection output a bf16 model
// holds in bf16): for kernels with one entry point per input type.
__device__ __forceinline__ float load_f32(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p, i64 i) { return __bfloat162float(p[i]); }

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
// SiLU through the fast exponential and division (the MUFU ex2 and rcp units): within a few ulp of
// silu_f at a quarter of its instructions. For the DeltaNet conv, where SiLU is most of the work of
// a kernel bound by issuing instructions (its outputs feed TF32 and bf16 products).
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// 1/sqrt(Σv² + eps) over a head held HELD values per lane (element lane + 32e, zero past head_dim),
// summed in the plain loop's order. One helper for l2_norm and the conv's fused L2 norm, so both give
// the same bits.
template <int HELD>
__device__ __forceinline__ float l2_inv_held(const float (&v)[HELD], int lane, int head_dim, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < HELD; ++e) {
        if (lane + e * 32 < head_dim) ss += v[e] * v[e];
    }
    return rsqrtf(warp_sum(ss) + eps);
}

// Zero-centred RMSNorm of one head in place, by one warp: h ← h / sqrt(mean(h²) + eps) · (1 + w).
// One helper for head_rms_norm and the fused qk_norm_rope, so both give the same bits.
__device__ __forceinline__ void head_rms_norm_warp(float* h, const __nv_bfloat16* w, int head_dim, int lane,
                                                   float eps) {
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += h[i] * h[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) h[i] = (h[i] * inv) * (1.0f + load_bf16(w, i));
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

// ---- Tensor-core helpers (sm_80+), shared by flash_attention.cu and delta_chunked.cu.

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// "memory" keeps the compiler from moving these reads across the shared-memory stores and
// barriers around them.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a · b for one 16x8x16 bf16 tile with f32 accumulation.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Asynchronous global -> shared copies (sm_80+). `valid` false copies nothing and fills the 16
// bytes with zeros (rows past a sequence); `src` must still be a mapped address.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// Closes the copies issued since the last commit into one group (an empty group is fine).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats as bf16x2, `lo` in the low half (the lower column / address).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const u32*>(&v);
}

// pack_bf16x2 undone: the low half first.
__device__ __forceinline__ float2 unpack_bf16x2(u32 bits) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// Four consecutive values as f32 (one 16-byte f32 or 8-byte bf16 load; p aligned to it).
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 lo = unpack_bf16x2(u.x);
    const float2 hi = unpack_bf16x2(u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Block `t` of a packed batch as (sequence start, length, tile), tiles of BM rows: sequence by
// sequence, last tile to first within a sequence (long causal tiles start first, short ones fill
// the tail). Boundaries are clamped to `rows`, so no row at or beyond it is ever touched whatever
// cu_seqlens holds; false for blocks beyond the batch's tiles. 32 sequences per step: lane i takes
// sequence base + i, an inclusive warp scan of the tile counts finds the sequence holding tile t. Every warp runs it (same loads, same
// answer), so no shared memory or barrier is needed. Counts are unsigned: a sequence has at most
// ceil(2^32 / BM) tiles, 32 of them fit in 32 bits for BM >= 2. `seq`, where given, receives the
// sequence's index.
template <int BM>
__device__ __forceinline__ bool find_tile_warp(const u32* __restrict__ cu_seqlens,
                                               int num_seqs, u32 rows, int t_in, int& tile,
                                               u32& seq_start, int& len, int* seq = nullptr) {
    const int lane = threadIdx.x & 31;
    u32 t = (u32)t_in;
    for (int base = 0; base < num_seqs; base += 32) {
        const int s = base + lane;
        u32 a = 0, b = 0, n = 0;
        if (s < num_seqs) {
            a = min(cu_seqlens[s], rows);
            b = min(cu_seqlens[s + 1], rows);
            n = b > a ? (b - a - 1) / BM + 1 : 0;
        }
        u32 incl = n;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        const u32 total = __shfl_sync(0xffffffffu, incl, 31);
        if (t < total) {
            // The first lane whose inclusive count passes t holds the tile.
            const int src = __ffs(__ballot_sync(0xffffffffu, t < incl)) - 1;
            const u32 before = __shfl_sync(0xffffffffu, incl - n, src);
            const u32 count = __shfl_sync(0xffffffffu, n, src);
            seq_start = __shfl_sync(0xffffffffu, a, src);
            len = (int)(__shfl_sync(0xffffffffu, b, src) - seq_start);
            tile = (int)(count - 1 - (t - before));
            if (seq) *seq = base + src;
            return true;
        }
        t -= total;
    }
    return false;
}

// PyTorch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The Gated DeltaNet gates of row t, head h, as (beta, g): beta = sigmoid(b),
// g = −exp(a_log) · softplus(a + dt_bias). b and a rows sit at stride · row + offset (column blocks of the stacked
// in-projection output; possibly one buffer). One helper for delta_gates, the conv kernel and
// gdr_prepare_conv, which compute them alongside, so all give the same bits.
template <typename X>
__device__ __forceinline__ float2 delta_gate_pair(const X* __restrict__ b, int b_stride, int b_offset,
                                                  const X* __restrict__ a, int a_stride, int a_offset,
                                                  const __nv_bfloat16* __restrict__ a_log,
                                                  const __nv_bfloat16* __restrict__ dt_bias, i64 t, int h) {
    return make_float2(sigmoid_f(load_f32(b, t * b_stride + b_offset + h)),
                       -expf(load_bf16(a_log, h)) *
                           softplus_f(load_f32(a, t * a_stride + a_offset + h) + load_bf16(dt_bias, h)));
}

// The same (beta, g), written to dense [rows, heads].
template <typename X>
__device__ __forceinline__ void delta_gate_at(const X* __restrict__ b, int b_stride, int b_offset,
                                              const X* __restrict__ a, int a_stride, int a_offset,
                                              const __nv_bfloat16* __restrict__ a_log,
                                              const __nv_bfloat16* __restrict__ dt_bias, float* __restrict__ beta,
                                              float* __restrict__ g, i64 t, int h, int heads) {
    const i64 i = t * heads + h;
    const float2 bg = delta_gate_pair(b, b_stride, b_offset, a, a_stride, a_offset, a_log, dt_bias, t, h);
    beta[i] = bg.x;
    g[i] = bg.y;
}

// ---- The flash attentions' online softmax (flash_attention.cu's mma.sync kernels and
// flash_bidir_wgmma.cu's warpgroup form): one helper, so both give the same bits.

// 2^x in one MUFU op (exp2f adds range scaling around it). ex2.approx(-inf) = 0.
__device__ __forceinline__ float exp2_mufu(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// One key tile's step for the two query rows a thread holds a quarter of, in the mma accumulator
// layout: s[n][0], s[n][1] in row g and s[n][2], s[n][3] in row g + 8, keys n·8 + 2·(lane % 4) and
// the next (masked keys already -inf). Updates the rows' running maxima m0, m1 and this thread's
// shares of their denominators l0, l1; leaves 2^(s − max) in s and in c0, c1 the factors by which
// the rows' earlier output sums must be scaled.
template <int N>
__device__ __forceinline__ void online_softmax_tile(float (&s)[N][4], float& m0, float& m1, float& l0, float& l1,
                                                    float& c0, float& c1) {
    float x0 = m0, x1 = m1;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        x0 = fmaxf(x0, fmaxf(s[n][0], s[n][1]));
        x1 = fmaxf(x1, fmaxf(s[n][2], s[n][3]));
    }
    // The four threads of a quad hold one row between them.
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    // A row that has seen no key yet keeps max -inf: subtract 0 instead so exp2 gives 0, not NaN.
    const float b0 = x0 == F32_NEG_INF ? 0.0f : x0;
    const float b1 = x1 == F32_NEG_INF ? 0.0f : x1;
    c0 = exp2_mufu(m0 - b0);
    c1 = exp2_mufu(m1 - b1);
    m0 = x0;
    m1 = x1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        s[n][0] = exp2_mufu(s[n][0] - b0);
        s[n][1] = exp2_mufu(s[n][1] - b0);
        s[n][2] = exp2_mufu(s[n][2] - b1);
        s[n][3] = exp2_mufu(s[n][3] - b1);
        l0 += s[n][0] + s[n][1];
        l1 += s[n][2] + s[n][3];
    }
}

// ---- 2-D axial rotary (the vision tower's), shared by rope_axial (vision.cu) and the fused
// attention inputs (flash_attention.cu), so both round exactly alike.

#define AXIAL_MAX_FREQS 64  // head_dim <= 4 · AXIAL_MAX_FREQS

// The D/4 inverse frequencies, computed on the host exactly as the CPU reference does (f32 powf) and
// passed by value: no device table to allocate.
struct AxialFreqs {
    float inv_freq[AXIAL_MAX_FREQS];
};

// Pair (j, j + D/2) of a head (half = D/2) at row `t` rotated: by the row position times inv_freq[j]
// for j < D/4, by the column position times inv_freq[j − D/4] above. An f32 product, then sin/cos of
// that f32: the reference's rounding.
__device__ __forceinline__ void axial_rotate(const u32* __restrict__ positions, const AxialFreqs& freqs, i64 t,
                                             int j, int half, float& a, float& b) {
    const int quarter = half >> 1;
    const int axis = j < quarter ? 0 : 1;
    const float angle = (float)positions[t * 2 + axis] * freqs.inv_freq[j - axis * quarter];
    float s, c;
    sincosf(angle, &s, &c);
    // Each product and sum rounded on its own, as the CPU reference computes them: left to the
    // compiler, the products would fuse into FMAs one way here and another way in a kernel that
    // inlines this elsewhere, and the fused attention inputs would not be rope_axial's bits.
    const float x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = x;
    b = y;
}
