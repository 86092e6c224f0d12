// Row and per-head normalisations. Row kernels: one block per row; head kernels: one warp per head.

// The norms' outputs are f32, or bf16 when they only feed GEMMs (which read bf16 operands).
__device__ __forceinline__ void store_out(float* out, i64 i, float v) { out[i] = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* out, i64 i, float v) { out[i] = __float2bfloat16_rn(v); }

// The kernels below hold their row in registers when it fits: HELD values per thread, a template
// parameter so that each variant keeps only the registers it needs (the launcher picks the smallest
// variant that holds the row: suffix _h4 ... _h16, 256 threads per row for the row kernels, 32 per
// head for the one-warp kernels). Every load is issued before the first use, so a thread waits on
// memory once. Each thread keeps the elements the plain loop gives it (stride blockDim, or 32) and
// sums them in the same order, so the results are bit for bit those of the plain loops, which remain
// (in the _h16 variants) for longer rows. (A float4 layout would be a little faster but changes the
// summation order, and bf16 roundings downstream turn that into answer noise.)

// out = x / sqrt(mean(x²) + eps) · (1 + w), the zero-centred RMSNorm.
template <int HELD, typename Out>
__device__ void rms_norm_row(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, Out* __restrict__ out,
                             int dim, float eps) {
    const i64 base = (i64)blockIdx.x * dim;
    if (dim <= HELD * (int)blockDim.x) {
        float v[HELD];
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            v[e] = i < dim ? x[base + i] : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            if (threadIdx.x + e * blockDim.x < dim) ss += v[e] * v[e];
        }
        const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dim) store_out(out, base + i, (v[e] * inv) * (1.0f + load_bf16(w, i)));
        }
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = x[base + i];
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        store_out(out, base + i, (x[base + i] * inv) * (1.0f + load_bf16(w, i)));
    }
}

// residual += delta, then out = rms_norm(residual).
template <int HELD, typename Out>
__device__ void add_rms_norm_row(float* __restrict__ residual, const float* __restrict__ delta,
                                 const __nv_bfloat16* __restrict__ w, Out* __restrict__ out, int dim, float eps) {
    const i64 base = (i64)blockIdx.x * dim;
    if (dim <= HELD * (int)blockDim.x) {
        float v[HELD], d[HELD];
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            v[e] = i < dim ? residual[base + i] : 0.0f;
            d[e] = i < dim ? delta[base + i] : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dim) {
                v[e] = v[e] + d[e];
                residual[base + i] = v[e];
                ss += v[e] * v[e];
            }
        }
        const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dim) store_out(out, base + i, (v[e] * inv) * (1.0f + load_bf16(w, i)));
        }
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = residual[base + i] + delta[base + i];
        residual[base + i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
    // Each thread rereads only the elements it wrote itself, so no barrier is needed.
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        store_out(out, base + i, (residual[base + i] * inv) * (1.0f + load_bf16(w, i)));
    }
}

// The four row kernels with HELD values per thread, named NAME_hHELD.
#define ROW_NORM_KERNELS(H)                                                                                    \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_h##H(                                           \
        const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, float* __restrict__ out, int dim,     \
        float eps) {                                                                                           \
        rms_norm_row<H>(x, w, out, dim, eps);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) rms_norm_bf16_h##H(                                      \
        const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out,      \
        int dim, float eps) {                                                                                  \
        rms_norm_row<H>(x, w, out, dim, eps);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) add_rms_norm_h##H(                                       \
        float* __restrict__ residual, const float* __restrict__ delta, const __nv_bfloat16* __restrict__ w,     \
        float* __restrict__ out, int dim, float eps) {                                                         \
        add_rms_norm_row<H>(residual, delta, w, out, dim, eps);                                                \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) add_rms_norm_bf16_h##H(                                  \
        float* __restrict__ residual, const float* __restrict__ delta, const __nv_bfloat16* __restrict__ w,     \
        __nv_bfloat16* __restrict__ out, int dim, float eps) {                                                 \
        add_rms_norm_row<H>(residual, delta, w, out, dim, eps);                                                \
    }

ROW_NORM_KERNELS(4)
ROW_NORM_KERNELS(8)
ROW_NORM_KERNELS(12)
ROW_NORM_KERNELS(16)

// The gate of normalised row `row` (head `row % heads` of token `row / heads`): z rows of heads·dim sit at
// z_stride · token + z_offset (a column block of the stacked in-projection output, f32 or bf16).
template <typename Z>
__device__ __forceinline__ const Z* gate_row(const Z* z, i64 row, int heads, int dim, int z_stride, int z_offset) {
    return z + (row / heads) * z_stride + z_offset + (row % heads) * dim;
}

// x ← w · x / sqrt(mean(x²) + eps) · silu(z), in place (plain w) over `rows` = tokens · heads rows of dim.
// One warp per row: the rows are short (a value head, 128 wide) and there are many of them.
template <typename Z>
__device__ void gated_rms_norm_rows(float* __restrict__ x, const Z* __restrict__ z, int heads, int z_stride,
                                    int z_offset, const __nv_bfloat16* __restrict__ w, int rows, int dim, float eps) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* xr = x + row * dim;
    const Z* zr = gate_row(z, row, heads, dim, z_stride, z_offset);
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
    for (int i = lane; i < dim; i += 32) xr[i] = load_bf16(w, i) * (xr[i] * inv) * silu_f(load_f32(zr, i));
}

extern "C" __global__ void gated_rms_norm(float* __restrict__ x, const float* __restrict__ z, int heads,
                                          int z_stride, int z_offset, const __nv_bfloat16* __restrict__ w, int rows,
                                          int dim, float eps) {
    gated_rms_norm_rows(x, z, heads, z_stride, z_offset, w, rows, dim, eps);
}

extern "C" __global__ void gated_rms_norm_zbf16(float* __restrict__ x, const __nv_bfloat16* __restrict__ z,
                                                int heads, int z_stride, int z_offset,
                                                const __nv_bfloat16* __restrict__ w, int rows, int dim, float eps) {
    gated_rms_norm_rows(x, z, heads, z_stride, z_offset, w, rows, dim, eps);
}

// The same gated norm written to bf16 elsewhere (the input of the projection that follows).
template <int HELD, typename Z>
__device__ void gated_rms_norm_bf16_row(const float* __restrict__ x, const Z* __restrict__ z, int heads,
                                        int z_stride, int z_offset, const __nv_bfloat16* __restrict__ w,
                                        __nv_bfloat16* __restrict__ out, int rows, int dim, float eps) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + row * dim;
    const Z* zr = gate_row(z, row, heads, dim, z_stride, z_offset);
    __nv_bfloat16* o = out + row * dim;
    // A 128-wide head (the model's) with x, z and out aligned for it: four consecutive values per
    // lane, one vector load or store each (the scalar form below leaves bandwidth unused).
    const size_t misaligned = ((size_t)xr & 15) | ((size_t)zr & (4 * sizeof(Z) - 1)) | ((size_t)w & 7) | ((size_t)o & 7);
    if (dim == 4 * 32 && misaligned == 0) {
        const float4 xv = load4(xr + 4 * lane);
        const float4 zv = load4(zr + 4 * lane);
        const float4 wv = load4(w + 4 * lane);
        const float ss = xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
        const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
        *reinterpret_cast<uint2*>(o + 4 * lane) =
            make_uint2(pack_bf16x2(wv.x * (xv.x * inv) * silu_f(zv.x), wv.y * (xv.y * inv) * silu_f(zv.y)),
                       pack_bf16x2(wv.z * (xv.z * inv) * silu_f(zv.z), wv.w * (xv.w * inv) * silu_f(zv.w)));
        return;
    }
    if (dim <= HELD * 32) {
        float xv[HELD], zv[HELD];
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = lane + e * 32;
            xv[e] = i < dim ? xr[i] : 0.0f;
            zv[e] = i < dim ? load_f32(zr, i) : 0.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            if (lane + e * 32 < dim) ss += xv[e] * xv[e];
        }
        const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = lane + e * 32;
            if (i < dim) o[i] = __float2bfloat16_rn(load_bf16(w, i) * (xv[e] * inv) * silu_f(zv[e]));
        }
        return;
    }
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
    for (int i = lane; i < dim; i += 32)
        o[i] = __float2bfloat16_rn(load_bf16(w, i) * (xr[i] * inv) * silu_f(load_f32(zr, i)));
}

// Start of head `head` of row `row` in a HeadLayout.
__device__ __forceinline__ i64 head_start(int row, int head, int row_stride, int offset, int head_stride) {
    return (i64)row * row_stride + offset + (i64)head * head_stride;
}

// Zero-centred RMSNorm of every head in place (q/k norm), w: [head_dim]. One warp per (row, head).
extern "C" __global__ void head_rms_norm(float* __restrict__ x, const __nv_bfloat16* __restrict__ w, int rows,
                                         int heads, int head_dim, int head_stride, int row_stride, int offset,
                                         float eps) {
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (item >= (i64)rows * heads) return;
    head_rms_norm_warp(x + head_start((int)(item / heads), (int)(item % heads), row_stride, offset, head_stride), w,
                       head_dim, lane, eps);
}

// x · 1/sqrt(Σx² + eps) on every head in place. One warp per (row, head).
template <int HELD>
__device__ void l2_norm_head(float* __restrict__ x, int rows, int heads, int head_dim, int head_stride,
                             int row_stride, int offset, float eps) {
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (item >= (i64)rows * heads) return;
    float* h = x + head_start((int)(item / heads), (int)(item % heads), row_stride, offset, head_stride);
    if (head_dim <= HELD * 32) {
        float v[HELD];
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = lane + e * 32;
            v[e] = i < head_dim ? h[i] : 0.0f;
        }
        const float inv = l2_inv_held<HELD>(v, lane, head_dim, eps);
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = lane + e * 32;
            if (i < head_dim) h[i] = v[e] * inv;
        }
        return;
    }
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += h[i] * h[i];
    const float inv = rsqrtf(warp_sum(ss) + eps);
    for (int i = lane; i < head_dim; i += 32) h[i] *= inv;
}

// The one-warp kernels with HELD values per lane, named NAME_hHELD.
#define WARP_NORM_KERNELS(H)                                                                                   \
    extern "C" __global__ void gated_rms_norm_bf16_h##H(                                                       \
        const float* __restrict__ x, const float* __restrict__ z, int heads, int z_stride, int z_offset,        \
        const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out, int rows, int dim, float eps) {   \
        gated_rms_norm_bf16_row<H>(x, z, heads, z_stride, z_offset, w, out, rows, dim, eps);                   \
    }                                                                                                          \
    extern "C" __global__ void gated_rms_norm_bf16_zbf16_h##H(                                                 \
        const float* __restrict__ x, const __nv_bfloat16* __restrict__ z, int heads, int z_stride,              \
        int z_offset, const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out, int rows, int dim,  \
        float eps) {                                                                                           \
        gated_rms_norm_bf16_row<H>(x, z, heads, z_stride, z_offset, w, out, rows, dim, eps);                   \
    }                                                                                                          \
    extern "C" __global__ void l2_norm_h##H(float* __restrict__ x, int rows, int heads, int head_dim,          \
                                            int head_stride, int row_stride, int offset, float eps) {          \
        l2_norm_head<H>(x, rows, heads, head_dim, head_stride, row_stride, offset, eps);                       \
    }

WARP_NORM_KERNELS(4)
WARP_NORM_KERNELS(8)
WARP_NORM_KERNELS(16)
