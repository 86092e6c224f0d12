// Gated delta rule, token by token: S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀ q.
// One block per (sequence, value head); thread j owns column j of the state S [k_dim][v_dim], held
// in registers (k_dim <= DELTA_MAX_K, every index into it a compile-time constant after unrolling).
// Correct first: a chunked tensor-core kernel replaces it for prefill later.

#define DELTA_MAX_K 128
#define DELTA_MAX_THREADS 256

extern "C" __global__ void __launch_bounds__(DELTA_MAX_THREADS)
gated_delta_rule_recurrent(const float* __restrict__ qkv, const float* __restrict__ beta,
                           const float* __restrict__ g, const u32* __restrict__ cu_seqlens,
                           const float* __restrict__ initial, int has_initial, float* __restrict__ final_state,
                           int has_final, const u32* __restrict__ final_at, int has_final_at,
                           float* __restrict__ out, int k_heads, int v_heads, int k_dim,
                           int v_dim, float scale, u32 rows_cap) {
    __shared__ float qs[DELTA_MAX_K];
    __shared__ float ks[DELTA_MAX_K];
    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const int j = threadIdx.x;
    const bool active = j < v_dim;
    const int kh = h / (v_heads / k_heads);
    const i64 width = 2 * (i64)k_heads * k_dim + (i64)v_heads * v_dim;
    // Never step outside the buffers, whatever cu_seqlens holds.
    const u32 start = min(cu_seqlens[s], rows_cap);
    const u32 end = max(start, min(cu_seqlens[s + 1], rows_cap));
    const i64 state_at = ((i64)s * v_heads + h) * k_dim * v_dim + j;

    // The state is written once the rows before `snap` are done (each sequence's end unless told).
    const u32 snap = has_final_at ? min(start + final_at[s], end) : end;

    float S[DELTA_MAX_K];
#pragma unroll
    for (int i = 0; i < DELTA_MAX_K; ++i) {
        S[i] = (has_initial && active && i < k_dim) ? initial[state_at + (i64)i * v_dim] : 0.0f;
    }
    auto write_final = [&]() {
        if (has_final && active) {
#pragma unroll
            for (int i = 0; i < DELTA_MAX_K; ++i) {
                if (i < k_dim) final_state[state_at + (i64)i * v_dim] = S[i];
            }
        }
    };
    if (snap == start) write_final();
    for (u32 t = start; t < end; ++t) {
        const float* row = qkv + (i64)t * width;
        for (int i = threadIdx.x; i < k_dim; i += blockDim.x) {
            qs[i] = row[(i64)kh * k_dim + i] * scale;
            ks[i] = row[(i64)k_heads * k_dim + (i64)kh * k_dim + i];
        }
        __syncthreads();
        if (active) {
            const float decay = expf(g[(i64)t * v_heads + h]);
            const float b = beta[(i64)t * v_heads + h];
            const float v = row[2 * (i64)k_heads * k_dim + (i64)h * v_dim + j];
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < DELTA_MAX_K; ++i) {
                if (i < k_dim) {
                    S[i] *= decay;
                    kv += S[i] * ks[i];
                }
            }
            const float delta = (v - kv) * b;
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < DELTA_MAX_K; ++i) {
                if (i < k_dim) {
                    S[i] += ks[i] * delta;
                    o += S[i] * qs[i];
                }
            }
            out[(i64)t * v_heads * v_dim + (i64)h * v_dim + j] = o;
        }
        if (t + 1 == snap) write_final();
        // The next token overwrites qs/ks.
        __syncthreads();
    }
}
