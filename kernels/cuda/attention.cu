// Causal GQA attention within each packed sequence, with the sigmoid output gate. Naive and exact:
// one block per (row, query head), keys visited one by one with an online softmax. Correct first;
// a tiled flash-style kernel replaces it later.

#define ATTN_THREADS 128
#define ATTN_MAX_PER_THREAD 4  // head_dim <= ATTN_THREADS * ATTN_MAX_PER_THREAD

// One query head's online softmax over the keys it attends to, this thread's share of the head's
// values: the scaled query, the running maximum and denominator, and the weighted sum of values.
struct OnlineSoftmax {
    float qr[ATTN_MAX_PER_THREAD];
    float acc[ATTN_MAX_PER_THREAD];
    float running_max;
    float denom;
    int head_dim;

    __device__ __forceinline__ OnlineSoftmax(const float* __restrict__ q, float scale, int dim)
        : running_max(F32_NEG_INF), denom(0.0f), head_dim(dim) {
#pragma unroll
        for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
            const int d = threadIdx.x + r * ATTN_THREADS;
            qr[r] = d < head_dim ? q[d] * scale : 0.0f;
            acc[r] = 0.0f;
        }
    }

    // Folds key k_j (score q·k_j) and value v_j in. Every thread of the block calls it.
    __device__ __forceinline__ void attend(const float* __restrict__ kj, const float* __restrict__ vj) {
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
            const int d = threadIdx.x + r * ATTN_THREADS;
            if (d < head_dim) part += qr[r] * kj[d];
        }
        const float score = block_sum(part);
        const float new_max = fmaxf(running_max, score);
        const float correction = expf(running_max - new_max);
        const float p = expf(score - new_max);
        denom = denom * correction + p;
#pragma unroll
        for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
            const int d = threadIdx.x + r * ATTN_THREADS;
            if (d < head_dim) acc[r] = acc[r] * correction + p * vj[d];
        }
        running_max = new_max;
    }

    // Output value r of this thread (dimension threadIdx.x + r·ATTN_THREADS), gated.
    __device__ __forceinline__ float gated(int r, const float* __restrict__ gate) const {
        return acc[r] / denom * sigmoid_f(gate[threadIdx.x + r * ATTN_THREADS]);
    }
};

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attention_gated(const float* __restrict__ qg, const float* __restrict__ k, const float* __restrict__ v,
                const u32* __restrict__ cu_seqlens, int num_seqs, float* __restrict__ out, int q_heads,
                int kv_heads, int head_dim, float scale, u32 rows_cap) {
    const u32 row = blockIdx.x;
    const int h = blockIdx.y;
    if (row >= rows_cap) return;
    const int s = sequence_of_row(cu_seqlens, num_seqs, row);
    if (s < 0) return;  // uniform over the block: no barrier is skipped by only some threads
    const u32 start = cu_seqlens[s];
    const int kvh = h / (q_heads / kv_heads);
    const float* q = qg + (i64)row * q_heads * 2 * head_dim + (i64)h * 2 * head_dim;
    const float* gate = q + head_dim;

    OnlineSoftmax softmax(q, scale, head_dim);
    for (u32 j = start; j <= row; ++j) {
        const i64 at = ((i64)j * kv_heads + kvh) * head_dim;
        softmax.attend(k + at, v + at);
    }
    float* o = out + (i64)row * q_heads * head_dim + (i64)h * head_dim;
#pragma unroll
    for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
        const int d = threadIdx.x + r * ATTN_THREADS;
        if (d < head_dim) o[d] = softmax.gated(r, gate);
    }
}

// attention_gated for sequences that continue a prefix (a prefix-state snapshot, or the previous
// chunk of a long prompt). q|gate, k and v are column blocks of the stacked projection `qkv` (rows
// `stride` wide, already normed and roped); sequence s's prefix keys and values are rows
// cu_prefix[s]..cu_prefix[s+1] of the dense `pk` / `pv` (`kv_heads·head_dim` wide; clamped to
// `prefix_rows`). A query attends to all of its prefix, then causally to its own rows. With
// `last_only`, block x is a sequence and only its last row is computed (into out row s). `out` is
// f32, or bf16 with out_bf16. Naive and exact like attention_gated: the path that resumes.
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attention_gated_prefix(const float* __restrict__ qkv, int stride, int qg_off, int k_off, int v_off,
                       const float* __restrict__ pk, const float* __restrict__ pv,
                       const u32* __restrict__ cu_prefix, int has_prefix, u32 prefix_rows,
                       const u32* __restrict__ cu_seqlens, int num_seqs, void* __restrict__ out, int out_bf16,
                       int q_heads, int kv_heads, int head_dim, float scale, u32 rows_cap, int last_only) {
    const int h = blockIdx.y;
    int s;
    u32 row, out_row;
    if (last_only) {
        s = blockIdx.x;
        if (s >= num_seqs) return;
        const u32 end = min(cu_seqlens[s + 1], rows_cap);
        if (end <= cu_seqlens[s]) return;
        row = end - 1;
        out_row = s;
    } else {
        row = blockIdx.x;
        if (row >= rows_cap) return;
        s = sequence_of_row(cu_seqlens, num_seqs, row);
        out_row = row;
    }
    if (s < 0) return;  // uniform over the block: no barrier is skipped by only some threads
    const u32 start = cu_seqlens[s];
    const int kvh = h / (q_heads / kv_heads);
    const i64 kv_w = (i64)kv_heads * head_dim;
    const float* q = qkv + (i64)row * stride + qg_off + (i64)h * 2 * head_dim;
    const float* gate = q + head_dim;

    OnlineSoftmax softmax(q, scale, head_dim);
    if (has_prefix) {
        const u32 p_end = min(cu_prefix[s + 1], prefix_rows);
        for (u32 j = cu_prefix[s]; j < p_end; ++j) {
            const i64 at = (i64)j * kv_w + (i64)kvh * head_dim;
            softmax.attend(pk + at, pv + at);
        }
    }
    for (u32 j = start; j <= row; ++j) {
        const float* base = qkv + (i64)j * stride + (i64)kvh * head_dim;
        softmax.attend(base + k_off, base + v_off);
    }
    const i64 o = (i64)out_row * q_heads * head_dim + (i64)h * head_dim;
#pragma unroll
    for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
        const int d = threadIdx.x + r * ATTN_THREADS;
        if (d >= head_dim) continue;
        const float y = softmax.gated(r, gate);
        if (out_bf16) {
            static_cast<__nv_bfloat16*>(out)[o + d] = __float2bfloat16_rn(y);
        } else {
            static_cast<float*>(out)[o + d] = y;
        }
    }
}

// Copies columns off..off+width of `rows` rows `stride` wide into dense rows of `width` (a stacked
// projection's k or v block, for a prefix-state snapshot).
extern "C" __global__ void copy_columns(const float* __restrict__ x, int stride, int off, float* __restrict__ out,
                                        int width, int rows) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * width) return;
    const i64 t = i / width;
    out[i] = x[t * stride + off + (i % width)];
}
