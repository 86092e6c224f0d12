// Row and per-head normalisations. Row kernels: one block per row; head kernels: one warp per head.

// The norms' outputs are f32, or bf16 when they only feed GEMMs (which read bf16 operands).
__device__ __forceinline__ void store_out(float* out, i64 i, float v) { out[i] = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* out, i64 i, float v) { out[i] = __float2bfloat16_rn(v); }
// Four values at a multiple of 4 (16-byte aligned f32, 8-byte aligned bf16).
__device__ __forceinline__ void store_out4(float* out, i64 i, float4 v) { *reinterpret_cast<float4*>(out + i) = v; }
__device__ __forceinline__ void store_out4(__nv_bfloat16* out, i64 i, float4 v) {
    *reinterpret_cast<uint2*>(out + i) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float sumsq4(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
// v · inv · (1 + w[i..i+4]) (zero-centred norm weight).
__device__ __forceinline__ float4 scale4(float4 v, float inv, const __nv_bfloat16* w, i64 i) {
    return make_float4(v.x * inv * (1.0f + load_bf16(w, i)), v.y * inv * (1.0f + load_bf16(w, i + 1)),
                       v.z * inv * (1.0f + load_bf16(w, i + 2)), v.w * inv * (1.0f + load_bf16(w, i + 3)));
}

// Row kernels hold a row in registers when it has at most NORM_V4 float4s per thread (4,096 values
// at 256 threads) and a length that is a multiple of 4: one read of the row, all loads issued
// before any use. Longer or odd rows take the plain loops.
#define NORM_V4 4

// out = x / sqrt(mean(x²) + eps) · (1 + w), the zero-centred RMSNorm.
template <typename Out>
__device__ void rms_norm_row(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, Out* __restrict__ out,
                             int dim, float eps) {
    const i64 base = (i64)blockIdx.x * dim;
    if ((dim & 3) == 0 && dim <= NORM_V4 * 4 * (int)blockDim.x) {
        float4 v[NORM_V4];
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < NORM_V4; ++e) {
            const int i = (threadIdx.x + e * blockDim.x) * 4;
            v[e] = i < dim ? ld4(x + base + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += sumsq4(v[e]);
        }
        const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < NORM_V4; ++e) {
            const int i = (threadIdx.x + e * blockDim.x) * 4;
            if (i < dim) store_out4(out, base + i, scale4(v[e], inv, w, i));
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

extern "C" __global__ void rms_norm(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                    float* __restrict__ out, int dim, float eps) {
    rms_norm_row(x, w, out, dim, eps);
}

extern "C" __global__ void rms_norm_bf16(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                         __nv_bfloat16* __restrict__ out, int dim, float eps) {
    rms_norm_row(x, w, out, dim, eps);
}

// residual += delta, then out = rms_norm(residual).
template <typename Out>
__device__ void add_rms_norm_row(float* __restrict__ residual, const float* __restrict__ delta,
                                 const __nv_bfloat16* __restrict__ w, Out* __restrict__ out, int dim, float eps) {
    const i64 base = (i64)blockIdx.x * dim;
    if ((dim & 3) == 0 && dim <= NORM_V4 * 4 * (int)blockDim.x) {
        float4 v[NORM_V4], d[NORM_V4];
#pragma unroll
        for (int e = 0; e < NORM_V4; ++e) {
            const int i = (threadIdx.x + e * blockDim.x) * 4;
            const bool in = i < dim;
            v[e] = in ? ld4(residual + base + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            d[e] = in ? ld4(delta + base + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < NORM_V4; ++e) {
            const int i = (threadIdx.x + e * blockDim.x) * 4;
            v[e] = make_float4(v[e].x + d[e].x, v[e].y + d[e].y, v[e].z + d[e].z, v[e].w + d[e].w);
            if (i < dim) *reinterpret_cast<float4*>(residual + base + i) = v[e];
            ss += sumsq4(v[e]);
        }
        const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < NORM_V4; ++e) {
            const int i = (threadIdx.x + e * blockDim.x) * 4;
            if (i < dim) store_out4(out, base + i, scale4(v[e], inv, w, i));
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

extern "C" __global__ void add_rms_norm(float* __restrict__ residual, const float* __restrict__ delta,
                                        const __nv_bfloat16* __restrict__ w, float* __restrict__ out,
                                        int dim, float eps) {
    add_rms_norm_row(residual, delta, w, out, dim, eps);
}

extern "C" __global__ void add_rms_norm_bf16(float* __restrict__ residual, const float* __restrict__ delta,
                                             const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out,
                                             int dim, float eps) {
    add_rms_norm_row(residual, delta, w, out, dim, eps);
}

// The gate of normalised row `row` (head `row % heads` of token `row / heads`): z rows of heads·dim sit at
// z_stride · token + z_offset (a column block of the stacked in-projection output).
__device__ __forceinline__ const float* gate_row(const float* z, i64 row, int heads, int dim, int z_stride,
                                                 int z_offset) {
    return z + (row / heads) * z_stride + z_offset + (row % heads) * dim;
}

// x ← w · x / sqrt(mean(x²) + eps) · silu(z), in place (plain w) over `rows` = tokens · heads rows of dim.
// One warp per row: the rows are short (a value head, 128 wide) and there are many of them.
extern "C" __global__ void gated_rms_norm(float* __restrict__ x, const float* __restrict__ z, int heads,
                                          int z_stride, int z_offset, const __nv_bfloat16* __restrict__ w, int rows,
                                          int dim, float eps) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* xr = x + row * dim;
    const float* zr = gate_row(z, row, heads, dim, z_stride, z_offset);
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
    for (int i = lane; i < dim; i += 32) xr[i] = load_bf16(w, i) * (xr[i] * inv) * silu_f(zr[i]);
}

// The same gated norm written to bf16 elsewhere (the input of the projection that follows).
extern "C" __global__ void gated_rms_norm_bf16(const float* __restrict__ x, const float* __restrict__ z, int heads,
                                               int z_stride, int z_offset, const __nv_bfloat16* __restrict__ w,
                                               __nv_bfloat16* __restrict__ out, int rows, int dim, float eps) {
    const i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + row * dim;
    const float* zr = gate_row(z, row, heads, dim, z_stride, z_offset);
    __nv_bfloat16* o = out + row * dim;
    // Rows of up to 4·128 values at 16-byte aligned strides: float4s held in registers.
    if (((dim | z_stride | z_offset) & 3) == 0 && dim <= 4 * 128) {
        float4 xv[4], zv[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = (lane + e * 32) * 4;
            xv[e] = i < dim ? ld4(xr + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            zv[e] = i < dim ? ld4(zr + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) ss += sumsq4(xv[e]);
        const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = (lane + e * 32) * 4;
            if (i < dim) {
                const float4 y = make_float4(load_bf16(w, i) * (xv[e].x * inv) * silu_f(zv[e].x),
                                             load_bf16(w, i + 1) * (xv[e].y * inv) * silu_f(zv[e].y),
                                             load_bf16(w, i + 2) * (xv[e].z * inv) * silu_f(zv[e].z),
                                             load_bf16(w, i + 3) * (xv[e].w * inv) * silu_f(zv[e].w));
                store_out4(o, i, y);
            }
        }
        return;
    }
    float ss = 0.0f;
    for (int i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)dim + eps);
    for (int i = lane; i < dim; i += 32) o[i] = __float2bfloat16_rn(load_bf16(w, i) * (xr[i] * inv) * silu_f(zr[i]));
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
    float* h = x + head_start((int)(item / heads), (int)(item % heads), row_stride, offset, head_stride);
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += h[i] * h[i];
    const float inv = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) h[i] = (h[i] * inv) * (1.0f + load_bf16(w, i));
}

// x · 1/sqrt(Σx² + eps) on every head in place. One warp per (row, head).
extern "C" __global__ void l2_norm(float* __restrict__ x, int rows, int heads, int head_dim, int head_stride,
                                   int row_stride, int offset, float eps) {
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (item >= (i64)rows * heads) return;
    float* h = x + head_start((int)(item / heads), (int)(item % heads), row_stride, offset, head_stride);
    // Heads of up to 4·128 values at 16-byte aligned offsets: float4s held in registers.
    if (((head_dim | head_stride | row_stride | offset) & 3) == 0 && head_dim <= 4 * 128) {
        float4 v[4];
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = (lane + e * 32) * 4;
            v[e] = i < head_dim ? ld4(h + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            ss += sumsq4(v[e]);
        }
        const float inv = rsqrtf(warp_sum(ss) + eps);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = (lane + e * 32) * 4;
            if (i < head_dim)
                *reinterpret_cast<float4*>(h + i) = make_float4(v[e].x * inv, v[e].y * inv, v[e].z * inv, v[e].w * inv);
        }
        return;
    }
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += h[i] * h[i];
    const float inv = rsqrtf(warp_sum(ss) + eps);
    for (int i = lane; i < head_dim; i += 32) h[i] *= inv;
}
