// The vision tower's ops: the patch rows from u8 images, LayerNorm, bias and residual adds, GELU, 2-D
// axial rotary and bidirectional attention within each segment (image frame) of a packed batch.
// Activations f32, weights bf16.

// An f32 activation, or a bf16 one that only a GEMM reads (rounded to nearest even, as the GEMM
// rounds an f32 input): the same bits reach the GEMM either way.
__device__ __forceinline__ void store_value(float* out, i64 i, float v) { out[i] = v; }
__device__ __forceinline__ void store_value(__nv_bfloat16* out, i64 i, float v) { out[i] = __float2bfloat16_rn(v); }

// ---- Patch rows from u8 images (the patch embedding's input).
//
// The staged buffer starts with a table of PATCH_TABLE u64 per image, then the images' RGB bytes
// (each 16-byte aligned). Per image: byte offset of its pixels in the staged buffer, width in pixels
// (a multiple of 32), grid width in patches, patches, first output row. Grid: (threads over the
// largest image's patches, images). A patch row is 3 channels x 2 frames x 16 y x 16 x values; one
// thread writes one (channel, frame, y) run of 16 (j = (c·2 + t)·16 + y, 96 per patch), so 32
// consecutive threads write one contiguous kilobyte (bf16) and every warp reads one channel.

#define PATCH_TABLE 5
#define PATCH_THREADS 96
#define PATCH_ROW_VALUES 1536

// The reference's fused rescale and normalize, as the host table computes it: the subtraction
// (exact) then a true division, each rounded to nearest, never contracted or approximated.
__device__ __forceinline__ float patch_value(u32 level) {
    return __fdiv_rn(__fsub_rn((float)level, 127.5f), 127.5f);
}

// The 16 values of channel C in 16 pixels of 3 bytes (48 bytes, 12 words), by constant indices so
// the words stay in registers.
template <int C>
__device__ __forceinline__ void patch_run_values(const u32 (&w)[12], float (&v)[16]) {
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const int b = 3 * x + C;
        v[x] = patch_value((w[b >> 2] >> ((b & 3) * 8)) & 0xffu);
    }
}

// 16 values as bf16 (rounded to nearest even, the host's rounding of the same f32) in two 16-byte
// stores, or as f32 in four.
__device__ __forceinline__ u32 bf16_pair(float lo, float hi) {
    return (u32)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((u32)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
__device__ __forceinline__ void store_patch_run(__nv_bfloat16* out, const float (&v)[16]) {
    uint4* o = reinterpret_cast<uint4*>(out);
    o[0] = make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]), bf16_pair(v[6], v[7]));
    o[1] = make_uint4(bf16_pair(v[8], v[9]), bf16_pair(v[10], v[11]), bf16_pair(v[12], v[13]),
                      bf16_pair(v[14], v[15]));
}
__device__ __forceinline__ void store_patch_run(float* out, const float (&v)[16]) {
    float4* o = reinterpret_cast<float4*>(out);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
}

template <typename T>
__device__ void patch_rows(const unsigned char* __restrict__ staged, T* __restrict__ out) {
    const unsigned long long* image = reinterpret_cast<const unsigned long long*>(staged) + (i64)blockIdx.y * PATCH_TABLE;
    const i64 pixels_at = (i64)image[0], width = (i64)image[1], grid_w = (i64)image[2];
    const i64 patches = (i64)image[3], first_row = (i64)image[4];
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= patches * PATCH_THREADS) return;
    const i64 q = i / PATCH_THREADS;
    const int j = (int)(i - q * PATCH_THREADS);
    const int c = j >> 5, y = j & 15;
    // Patch q in block order: merge blocks of 2x2 patches row-major, inside one r0c0, r0c1, r1c0, r1c1.
    const i64 blocks_w = grid_w >> 1, block = q >> 2;
    const int inner = (int)(q & 3);
    const i64 top = ((block / blocks_w) * 2 + (inner >> 1)) * 16;
    const i64 left = ((block % blocks_w) * 2 + (inner & 1)) * 16;
    // 16-byte aligned: the image starts so, a row is width·3 bytes (width a multiple of 32), and
    // left·3 is a multiple of 48.
    const uint4* src = reinterpret_cast<const uint4*>(staged + pixels_at + ((top + y) * width + left) * 3);
    const uint4 a = src[0], b = src[1], d = src[2];
    const u32 w[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, d.x, d.y, d.z, d.w};
    float v[16];
    if (c == 0) {
        patch_run_values<0>(w, v);
    } else if (c == 1) {
        patch_run_values<1>(w, v);
    } else {
        patch_run_values<2>(w, v);
    }
    store_patch_run(out + (first_row + q) * PATCH_ROW_VALUES + (i64)j * 16, v);
}

extern "C" __global__ void patch_rows_bf16(const unsigned char* __restrict__ staged, __nv_bfloat16* __restrict__ out) {
    patch_rows(staged, out);
}

extern "C" __global__ void patch_rows_f32(const unsigned char* __restrict__ staged, float* __restrict__ out) {
    patch_rows(staged, out);
}

// ---- LayerNorm: one block of 256 threads per row.

// out = (x − mean) / sqrt(var + eps) · w + b with the biased variance, two passes over the row (the
// mean first, then the squared deviations from it: no cancellation, unlike E[x²] − mean²). The row is
// held in registers when HELD values per thread hold it; longer rows (in the largest variant) reread
// it.
template <int HELD, typename T>
__device__ void layer_norm_row(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                               const __nv_bfloat16* __restrict__ b, T* __restrict__ out, int dim, float eps) {
    const i64 base = (i64)blockIdx.x * dim;
    if (dim <= HELD * (int)blockDim.x) {
        float v[HELD];
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            v[e] = i < dim ? x[base + i] : 0.0f;
            sum += v[e];
        }
        const float mean = block_sum(sum) / (float)dim;
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dim) ss += (v[e] - mean) * (v[e] - mean);
        }
        const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
#pragma unroll
        for (int e = 0; e < HELD; ++e) {
            const int i = threadIdx.x + e * blockDim.x;
            if (i < dim) store_value(out, base + i, (v[e] - mean) * inv * load_bf16(w, i) + load_bf16(b, i));
        }
        return;
    }
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += x[base + i];
    const float mean = block_sum(sum) / (float)dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = x[base + i] - mean;
        ss += d * d;
    }
    const float inv = rsqrtf(block_sum(ss) / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        store_value(out, base + i, (x[base + i] - mean) * inv * load_bf16(w, i) + load_bf16(b, i));
    }
}

#define LAYER_NORM_KERNEL(NAME, H, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                  \
        const float* __restrict__ x, const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b, \
        T* __restrict__ out, int dim, float eps) {                                                           \
        layer_norm_row<H>(x, w, b, out, dim, eps);                                                           \
    }

LAYER_NORM_KERNEL(layer_norm_h4, 4, float)
LAYER_NORM_KERNEL(layer_norm_h8, 8, float)
LAYER_NORM_KERNEL(layer_norm_h16, 16, float)
LAYER_NORM_KERNEL(layer_norm_bf16_h4, 4, __nv_bfloat16)
LAYER_NORM_KERNEL(layer_norm_bf16_h8, 8, __nv_bfloat16)
LAYER_NORM_KERNEL(layer_norm_bf16_h16, 16, __nv_bfloat16)

// ---- Element-wise: one thread per value.

// The bias kernels below take VEC = 4 consecutive values of a row per thread when the row width
// is a multiple of 4 (the launch sizes the grid so; one column index, one 16-byte load), else one:
// the same operation per value either way.
#define VEC_OF(dim) (((dim) & 3) == 0 ? 4 : 1)

// x[t][c] += bias[c] over n = rows · dim values.
extern "C" __global__ void add_bias(float* __restrict__ x, const __nv_bfloat16* __restrict__ bias, i64 n, int dim) {
    const int vec = VEC_OF(dim);
    const i64 i = vec * ((i64)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const int c = (int)(i % dim);
    if (vec == 4) {
        float4 v = load4(x + i);
        v.x += load_bf16(bias, c);
        v.y += load_bf16(bias, c + 1);
        v.z += load_bf16(bias, c + 2);
        v.w += load_bf16(bias, c + 3);
        *reinterpret_cast<float4*>(x + i) = v;
    } else {
        x[i] += load_bf16(bias, c);
    }
}

// x[i] += delta[i] for i < n.
extern "C" __global__ void add_in_place(float* __restrict__ x, const float* __restrict__ delta, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += delta[i];
}

// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), PyTorch's gelu(approximate="tanh").
__device__ __forceinline__ float gelu_tanh_of(float v) {
    const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
}

// 0.5·x·(1 + erf(x/√2)), the exact GELU.
__device__ __forceinline__ float gelu_erf_of(float v) { return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f)); }

extern "C" __global__ void gelu_tanh(float* __restrict__ x, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = gelu_tanh_of(x[i]);
}

extern "C" __global__ void gelu_erf(float* __restrict__ x, i64 n) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = gelu_erf_of(x[i]);
}

// out[t][c] = gelu(x[t][c] + bias[c]) over n = rows · dim values: add_bias then gelu in one pass,
// the same f32 operations; a bf16 out is the next GEMM's input (store_value), so the tower computes
// the same bits with one pass instead of three.
#define BIAS_GELU_KERNEL(NAME, GELU, T)                                                                     \
    extern "C" __global__ void NAME(const float* __restrict__ x, const __nv_bfloat16* __restrict__ bias,    \
                                    T* __restrict__ out, i64 n, int dim) {                                  \
        const int vec = VEC_OF(dim);                                                                        \
        const i64 i = vec * ((i64)blockIdx.x * blockDim.x + threadIdx.x);                                   \
        if (i >= n) return;                                                                                 \
        const int c = (int)(i % dim);                                                                       \
        if (vec == 4) {                                                                                     \
            const float4 v = load4(x + i);                                                                  \
            store_value(out, i, GELU(v.x + load_bf16(bias, c)));                                             \
            store_value(out, i + 1, GELU(v.y + load_bf16(bias, c + 1)));                                     \
            store_value(out, i + 2, GELU(v.z + load_bf16(bias, c + 2)));                                     \
            store_value(out, i + 3, GELU(v.w + load_bf16(bias, c + 3)));                                     \
        } else {                                                                                            \
            store_value(out, i, GELU(x[i] + load_bf16(bias, c)));                                            \
        }                                                                                                   \
    }
BIAS_GELU_KERNEL(bias_gelu_tanh_f32, gelu_tanh_of, float)
BIAS_GELU_KERNEL(bias_gelu_tanh_bf16, gelu_tanh_of, __nv_bfloat16)
BIAS_GELU_KERNEL(bias_gelu_erf_f32, gelu_erf_of, float)
BIAS_GELU_KERNEL(bias_gelu_erf_bf16, gelu_erf_of, __nv_bfloat16)

// residual[t][c] += x[t][c] + bias[c]: add_bias then add_in_place in one pass, the same f32 adds.
extern "C" __global__ void add_bias_residual(float* __restrict__ residual, const float* __restrict__ x,
                                             const __nv_bfloat16* __restrict__ bias, i64 n, int dim) {
    const int vec = VEC_OF(dim);
    const i64 i = vec * ((i64)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    const int c = (int)(i % dim);
    if (vec == 4) {
        const float4 v = load4(x + i);
        float4 r = load4(residual + i);
        r.x += v.x + load_bf16(bias, c);
        r.y += v.y + load_bf16(bias, c + 1);
        r.z += v.z + load_bf16(bias, c + 2);
        r.w += v.w + load_bf16(bias, c + 3);
        *reinterpret_cast<float4*>(residual + i) = r;
    } else {
        residual[i] += x[i] + load_bf16(bias, c);
    }
}

// ---- 2-D axial rotary embedding in place.

// One thread per (row, head, pair j < D/2): pair (j, j + D/2) rotated by axial_rotate (prelude).
extern "C" __global__ void rope_axial(float* __restrict__ x, const u32* __restrict__ positions,
                                      const AxialFreqs freqs, int rows, int heads, int half, int head_stride,
                                      int row_stride, int offset) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * heads * half) return;
    const int j = (int)(i % half);
    const i64 rh = i / half;
    const int h = (int)(rh % heads);
    const i64 t = rh / heads;
    float* head = x + t * row_stride + offset + (i64)h * head_stride;
    float a = head[j];
    float b = head[j + half];
    axial_rotate(positions, freqs, t, j, half, a, b);
    head[j] = a;
    head[j + half] = b;
}

// ---- Bidirectional attention within each segment.
//
// A block takes BIDIR_ROWS query rows of one segment and one head (grid: query tiles × heads) and
// walks the segment's keys in tiles of 32 staged in shared memory, with an online softmax. Each warp
// owns BIDIR_ROWS_PER_WARP query rows. Scores: lane j takes key j of the tile (its full dot product
// with each of the warp's rows, reading the queries as shared-memory broadcasts). Values: lane l
// accumulates dims l, l + 32, ... (E of them, E·32 >= head_dim) of each row's output. f32 throughout.

#define BIDIR_THREADS 128
#define BIDIR_ROWS_PER_WARP 4
#define BIDIR_ROWS (BIDIR_THREADS / 32 * BIDIR_ROWS_PER_WARP)
#define BIDIR_KEYS 32

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// The key rows in shared memory have an odd stride, so that the 32 lanes reading one column of 32
// different keys hit 32 different banks.
__device__ __forceinline__ int bidir_key_stride(int head_dim) { return head_dim | 1; }

// Dynamic shared memory: queries [BIDIR_ROWS][head_dim], keys [32][head_dim | 1], values [32][head_dim]
// (the launcher sizes it the same way).
template <int E>
__device__ void attention_bidirectional_tile(const float* __restrict__ qkv, const u32* __restrict__ cu_seqlens,
                                             int num_seqs, u32 rows, float* __restrict__ out, int heads,
                                             int head_dim, float scale) {
    extern __shared__ __align__(16) float bidir_smem[];
    int tile, len;
    u32 seq_start;
    // Uniform over the block (every warp finds the same tile), so the return skips no barrier.
    if (!find_tile_warp<BIDIR_ROWS>(cu_seqlens, num_seqs, rows, blockIdx.x, tile, seq_start, len)) return;
    const int h = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const i64 width = (i64)heads * head_dim;
    const i64 stride = 3 * width;
    const int ks = bidir_key_stride(head_dim);
    float* qs = bidir_smem;
    float* kt = qs + BIDIR_ROWS * head_dim;
    float* vt = kt + BIDIR_KEYS * ks;
    const int q0 = tile * BIDIR_ROWS;  // first query row of the tile, within the segment

    // Rows past the segment's end are zeros: computed like the others, never written.
    for (int i = threadIdx.x; i < BIDIR_ROWS * head_dim; i += BIDIR_THREADS) {
        const int r = i / head_dim;
        const int d = i - r * head_dim;
        qs[i] = q0 + r < len ? qkv[(i64)(seq_start + q0 + r) * stride + (i64)h * head_dim + d] : 0.0f;
    }

    float m[BIDIR_ROWS_PER_WARP], l[BIDIR_ROWS_PER_WARP], acc[BIDIR_ROWS_PER_WARP][E];
#pragma unroll
    for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) {
        m[r] = F32_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[r][e] = 0.0f;
    }
    const float* my_q = qs + warp * BIDIR_ROWS_PER_WARP * head_dim;

    for (int k0 = 0; k0 < len; k0 += BIDIR_KEYS) {
        const int n = min(BIDIR_KEYS, len - k0);
        // The previous tile's keys and values are no longer read (and, the first time, the
        // queries become visible).
        __syncthreads();
        for (int i = threadIdx.x; i < BIDIR_KEYS * head_dim; i += BIDIR_THREADS) {
            const int j = i / head_dim;
            const int d = i - j * head_dim;
            float kv = 0.0f, vv = 0.0f;
            if (j < n) {
                const float* src = qkv + (i64)(seq_start + k0 + j) * stride + (i64)h * head_dim + d;
                kv = src[width];
                vv = src[2 * width];
            }
            kt[j * ks + d] = kv;
            vt[j * head_dim + d] = vv;
        }
        __syncthreads();

        // Lane j's scores against key j, in the reference's order: the dot product, then the scale.
        float s[BIDIR_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) s[r] = 0.0f;
        const float* k_row = kt + lane * ks;
        for (int d = 0; d < head_dim; ++d) {
            const float kd = k_row[d];
#pragma unroll
            for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) s[r] += my_q[r * head_dim + d] * kd;
        }
        float p[BIDIR_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) {
            const float score = lane < n ? s[r] * scale : F32_NEG_INF;
            // Finite: every tile holds at least one key.
            const float new_max = fmaxf(m[r], warp_max(score));
            const float correction = expf(m[r] - new_max);
            p[r] = expf(score - new_max);
            l[r] = l[r] * correction + warp_sum(p[r]);
            m[r] = new_max;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[r][e] *= correction;
        }
        for (int j = 0; j < n; ++j) {
            float pj[BIDIR_ROWS_PER_WARP];
#pragma unroll
            for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) pj[r] = __shfl_sync(0xffffffffu, p[r], j);
            const float* v_row = vt + j * head_dim;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int d = lane + 32 * e;
                if (d < head_dim) {
                    const float vd = v_row[d];
#pragma unroll
                    for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) acc[r][e] += pj[r] * vd;
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < BIDIR_ROWS_PER_WARP; ++r) {
        const int q = q0 + warp * BIDIR_ROWS_PER_WARP + r;
        if (q >= len) continue;
        float* o = out + (i64)(seq_start + q) * width + (i64)h * head_dim;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int d = lane + 32 * e;
            if (d < head_dim) o[d] = acc[r][e] * inv;
        }
    }
}

// E = ceil(head_dim / 32) values per lane, rounded up to the variant: head_dim up to 64, 128, 256.
#define BIDIR_KERNEL(E)                                                                                       \
    extern "C" __global__ void __launch_bounds__(BIDIR_THREADS) attention_bidirectional_e##E(                 \
        const float* __restrict__ qkv, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,              \
        float* __restrict__ out, int heads, int head_dim, float scale) {                                        \
        attention_bidirectional_tile<E>(qkv, cu_seqlens, num_seqs, rows, out, heads, head_dim, scale);        \
    }

BIDIR_KERNEL(2)
BIDIR_KERNEL(4)
BIDIR_KERNEL(8)
