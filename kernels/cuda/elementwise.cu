// Element-wise, gather and scatter kernels: embedding, SwiGLU, Gated DeltaNet gates, last-row
// gather, row scatter.

// out[t] = table[ids[t]] (bf16 table widened to f32). An id outside the vocabulary gives a NaN row,
// so a bad id shows up downstream instead of reading out of bounds.
extern "C" __global__ void embedding(const __nv_bfloat16* __restrict__ table, const u32* __restrict__ ids,
                                     float* __restrict__ out, int rows, int dim, u32 vocab) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * dim) return;
    const i64 t = i / dim;
    const int d = (int)(i % dim);
    const u32 id = ids[t];
    out[i] = id < vocab ? load_bf16(table, (i64)id * dim + d) : F32_NAN;
}

// out[t][i] = silu(gate_up[t][i]) · gate_up[t][inter + i]. One block per row (no per-element
// division), four values per thread-step when the rows are 16-byte aligned.
// The SwiGLU kernels: one row per blockIdx.x, its columns spread over blockIdx.y and the threads,
// `per` values per thread-step (so a wide row is many blocks and each thread has one or two steps).
__device__ __forceinline__ int col_start(int per) { return (blockIdx.y * blockDim.x + threadIdx.x) * per; }
__device__ __forceinline__ int col_step(int per) { return gridDim.y * blockDim.x * per; }

extern "C" __global__ void swiglu(const float* __restrict__ gate_up, float* __restrict__ out, int rows, int inter) {
    const i64 t = blockIdx.x;
    if (t >= rows) return;
    const float* row = gate_up + t * 2 * inter;
    float* o = out + t * inter;
    if ((inter & 3) == 0) {
        const float4* g4 = reinterpret_cast<const float4*>(row);
        const float4* u4 = reinterpret_cast<const float4*>(row + inter);
        float4* o4 = reinterpret_cast<float4*>(o);
        for (int c = col_start(1); c < inter / 4; c += col_step(1)) {
            const float4 g = g4[c];
            const float4 u = u4[c];
            o4[c] = make_float4(silu_f(g.x) * u.x, silu_f(g.y) * u.y, silu_f(g.z) * u.z, silu_f(g.w) * u.w);
        }
    } else {
        for (int c = col_start(1); c < inter; c += col_step(1)) o[c] = silu_f(row[c]) * row[inter + c];
    }
}

// The same SwiGLU rounded to bf16: the input of the projection that follows (only that GEMM reads
// it, so the f32 copy and a separate conversion are skipped).
extern "C" __global__ void swiglu_bf16(const float* __restrict__ gate_up, __nv_bfloat16* __restrict__ out, int rows,
                                       int inter) {
    const i64 t = blockIdx.x;
    if (t >= rows) return;
    const float* row = gate_up + t * 2 * inter;
    __nv_bfloat16* o = out + t * inter;
    if ((inter & 1) == 0) {
        const float2* g2 = reinterpret_cast<const float2*>(row);
        const float2* u2 = reinterpret_cast<const float2*>(row + inter);
        __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(o);
        for (int c = col_start(1); c < inter / 2; c += col_step(1)) {
            const float2 g = g2[c];
            const float2 u = u2[c];
            o2[c] = __float22bfloat162_rn(make_float2(silu_f(g.x) * u.x, silu_f(g.y) * u.y));
        }
    } else {
        for (int c = col_start(1); c < inter; c += col_step(1)) o[c] = __float2bfloat16_rn(silu_f(row[c]) * row[inter + c]);
    }
}

// SwiGLU from a bf16 gate|up (a GEMM's bf16 output), to f32 or (for the down projection's input)
// bf16. Pairs of values per thread-step when inter is even.
__device__ __forceinline__ float2 swiglu_pair(const __nv_bfloat16* row, int inter, int c) {
    const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + c));
    const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + inter + c));
    return make_float2(silu_f(g.x) * u.x, silu_f(g.y) * u.y);
}

__device__ __forceinline__ float swiglu_one(const __nv_bfloat16* row, int inter, int c) {
    return silu_f(__bfloat162float(row[c])) * __bfloat162float(row[inter + c]);
}

extern "C" __global__ void swiglu_from_bf16(const __nv_bfloat16* __restrict__ gate_up, float* __restrict__ out,
                                            int rows, int inter) {
    const i64 t = blockIdx.x;
    if (t >= rows) return;
    const __nv_bfloat16* row = gate_up + t * 2 * inter;
    float* o = out + t * inter;
    if ((inter & 1) == 0) {
        for (int c = col_start(2); c < inter; c += col_step(2))
            *reinterpret_cast<float2*>(o + c) = swiglu_pair(row, inter, c);
    } else {
        for (int c = col_start(1); c < inter; c += col_step(1)) o[c] = swiglu_one(row, inter, c);
    }
}

extern "C" __global__ void swiglu_bf16_from_bf16(const __nv_bfloat16* __restrict__ gate_up,
                                                 __nv_bfloat16* __restrict__ out, int rows, int inter) {
    const i64 t = blockIdx.x;
    if (t >= rows) return;
    const __nv_bfloat16* row = gate_up + t * 2 * inter;
    __nv_bfloat16* o = out + t * inter;
    if ((inter & 7) == 0) {  // 16-byte loads and stores: 8 values per thread-step
        for (int c = col_start(8); c < inter; c += col_step(8)) {
            const uint4 g = *reinterpret_cast<const uint4*>(row + c);
            const uint4 u = *reinterpret_cast<const uint4*>(row + inter + c);
            const u32 gs[4] = {g.x, g.y, g.z, g.w};
            const u32 us[4] = {u.x, u.y, u.z, u.w};
            u32 r[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&gs[k]));
                const float2 uf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&us[k]));
                r[k] = pack_bf16x2(silu_f(gf.x) * uf.x, silu_f(gf.y) * uf.y);
            }
            *reinterpret_cast<uint4*>(o + c) = make_uint4(r[0], r[1], r[2], r[3]);
        }
    } else if ((inter & 1) == 0) {
        for (int c = col_start(2); c < inter; c += col_step(2))
            *reinterpret_cast<__nv_bfloat162*>(o + c) = __float22bfloat162_rn(swiglu_pair(row, inter, c));
    } else {
        for (int c = col_start(1); c < inter; c += col_step(1)) o[c] = __float2bfloat16_rn(swiglu_one(row, inter, c));
    }
}

// beta = sigmoid(b); g = −exp(a_log) · softplus(a + dt_bias), both dense [rows, heads] (one thread per
// value; `delta_gate_at` in the prelude, which the conv kernel shares).
template <typename X>
__device__ __forceinline__ void delta_gates_at(const X* __restrict__ b, int b_stride, int b_offset,
                                               const X* __restrict__ a, int a_stride, int a_offset,
                                               const __nv_bfloat16* __restrict__ a_log,
                                               const __nv_bfloat16* __restrict__ dt_bias, float* __restrict__ beta,
                                               float* __restrict__ g, int rows, int heads) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * heads) return;
    delta_gate_at(b, b_stride, b_offset, a, a_stride, a_offset, a_log, dt_bias, beta, g, i / heads,
                  (int)(i % heads), heads);
}

extern "C" __global__ void delta_gates(const float* __restrict__ b, int b_stride, int b_offset,
                                       const float* __restrict__ a, int a_stride, int a_offset,
                                       const __nv_bfloat16* __restrict__ a_log,
                                       const __nv_bfloat16* __restrict__ dt_bias, float* __restrict__ beta,
                                       float* __restrict__ g, int rows, int heads) {
    delta_gates_at(b, b_stride, b_offset, a, a_stride, a_offset, a_log, dt_bias, beta, g, rows, heads);
}

// The same with b and a in a bf16 buffer (the stacked in-projection output of a bf16 model).
extern "C" __global__ void delta_gates_bf16x(const __nv_bfloat16* __restrict__ b, int b_stride, int b_offset,
                                             const __nv_bfloat16* __restrict__ a, int a_stride, int a_offset,
                                             const __nv_bfloat16* __restrict__ a_log,
                                             const __nv_bfloat16* __restrict__ dt_bias, float* __restrict__ beta,
                                             float* __restrict__ g, int rows, int heads) {
    delta_gates_at(b, b_stride, b_offset, a, a_stride, a_offset, a_log, dt_bias, beta, g, rows, heads);
}

// out[s] = x[cu[s + 1] − 1]; grid (ceil(dim / block), num_seqs). An empty sequence (or one that
// ends beyond the buffer) gives a NaN row.
extern "C" __global__ void gather_last(const float* __restrict__ x, const u32* __restrict__ cu_seqlens,
                                       float* __restrict__ out, int dim, u32 rows_cap) {
    const int s = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    const u32 start = cu_seqlens[s];
    const u32 end = cu_seqlens[s + 1];
    const bool valid = end > start && end <= rows_cap;
    out[(i64)s * dim + d] = valid ? x[(i64)(end - 1) * dim + d] : F32_NAN;
}

// Copies of f32 values, one per part i = blockIdx.y: parts[3i] (source address), parts[3i + 1]
// (destination address), parts[3i + 2] (values), each spread over the blocks along x in a
// grid-stride loop; float4 where both addresses are 16-byte aligned. The caller checked every part
// against its buffers and that no part writes what another reads or writes.
extern "C" __global__ void copy_parts(const unsigned long long* __restrict__ parts, int count) {
    const int i = blockIdx.y;
    if (i >= count) return;
    const float* src = reinterpret_cast<const float*>(parts[3 * i]);
    float* dst = reinterpret_cast<float*>(parts[3 * i + 1]);
    const i64 len = (i64)parts[3 * i + 2];
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    i64 done = 0;
    if (((parts[3 * i] | parts[3 * i + 1]) & 15) == 0) {
        const i64 n4 = len / 4;
        for (i64 k = t; k < n4; k += stride)
            reinterpret_cast<float4*>(dst)[k] = reinterpret_cast<const float4*>(src)[k];
        done = 4 * n4;
    }
    for (i64 k = done + t; k < len; k += stride) dst[k] = src[k];
}

// out[slots[i]][d] = rows[i][d] for i < count, d < width: rows put in place of others (a
// screenshot's image features over its image tokens' embeddings). A slot past out_rows is skipped.
extern "C" __global__ void scatter_rows(const float* __restrict__ rows, const u32* __restrict__ slots,
                                        float* __restrict__ out, int count, int width, u32 out_rows) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)count * width) return;
    const i64 r = i / width;
    const u32 slot = slots[r];
    if (slot < out_rows) out[(i64)slot * width + i % width] = rows[i];
}

// out[i] = bf16(x[i]) (round to nearest even) for i < n: the GEMM input, as a bf16 model holds it.
// Two values per thread through the packed bf16x2 conversion.
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, i64 n) {
    const i64 i = 2 * ((i64)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 1 < n) {
        const float2 v = *reinterpret_cast<const float2*>(x + i);
        *reinterpret_cast<__nv_bfloat162*>(out + i) = __float22bfloat162_rn(v);
    } else if (i < n) {
        out[i] = __float2bfloat16_rn(x[i]);
    }
}
