// Causal GQA attention within each packed sequence, with the sigmoid output gate. Naive and exact:
// one block per (row, query head), keys visited one by one with an online softmax. Correct first;
// a tiled flash-style kernel replaces it later.

#define ATTN_THREADS 128
#define ATTN_MAX_PER_THREAD 4  // head_dim <= ATTN_THREADS * ATTN_MAX_PER_THREAD

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

    float qr[ATTN_MAX_PER_THREAD];
    float acc[ATTN_MAX_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
        const int d = threadIdx.x + r * ATTN_THREADS;
        qr[r] = d < head_dim ? q[d] * scale : 0.0f;
        acc[r] = 0.0f;
    }
    float running_max = F32_NEG_INF;
    float denom = 0.0f;
    for (u32 j = start; j <= row; ++j) {
        const float* kj = k + ((i64)j * kv_heads + kvh) * head_dim;
        const float* vj = v + ((i64)j * kv_heads + kvh) * head_dim;
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
    float* o = out + (i64)row * q_heads * head_dim + (i64)h * head_dim;
#pragma unroll
    for (int r = 0; r < ATTN_MAX_PER_THREAD; ++r) {
        const int d = threadIdx.x + r * ATTN_THREADS;
        if (d < head_dim) o[d] = acc[r] / denom * sigmoid_f(gate[d]);
    }
}
