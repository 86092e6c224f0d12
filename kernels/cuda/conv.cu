// Causal depthwise conv1d (no bias) + SiLU over packed sequences. Sequence boundaries come from
// cu_seqlens in device memory, so one launch shape serves any batch up to `rows_cap` rows.

// Pre-conv input of sequence `s` at sequence-local time `t` (t < 0 reads the carried window, whose
// rows are oldest first; 0 without a window or beyond it).
__device__ __forceinline__ float conv_input(const float* x, const float* window_in, int has_window, u32 start,
                                            int s, int t, int c, int channels, int hist) {
    if (t >= 0) return x[((i64)start + t) * channels + c];
    if (!has_window || -t > hist) return 0.0f;
    return window_in[((i64)s * hist + hist + t) * channels + c];
}

// out_t[c] = silu(Σ_i w[c][i] · x_{t-kernel+1+i}[c]); one thread per (row, channel) of rows_cap rows.
extern "C" __global__ void conv1d_silu(const float* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                       const u32* __restrict__ cu_seqlens, int num_seqs,
                                       const float* __restrict__ window_in, int has_window,
                                       float* __restrict__ out, int channels, int kernel, u32 rows_cap) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows_cap * channels) return;
    const u32 row = (u32)(i / channels);
    const int c = (int)(i % channels);
    const int s = sequence_of_row(cu_seqlens, num_seqs, row);
    if (s < 0) return;
    const u32 start = cu_seqlens[s];
    const int local = (int)(row - start);
    const int hist = kernel - 1;
    float acc = 0.0f;
    for (int k = 0; k < kernel; ++k) {
        const float v = conv_input(x, window_in, has_window, start, s, local - hist + k, c, channels, hist);
        acc += load_bf16(w, (i64)c * kernel + k) * v;
    }
    out[i] = silu_f(acc);
}

// window_out[s][i][c] = pre-conv input at local time len - hist + i (the window to resume from).
// A sequence that ends beyond the `rows_cap` rows of x gets a NaN window instead of an out-of-bounds read.
extern "C" __global__ void conv1d_window_out(const float* __restrict__ x, const u32* __restrict__ cu_seqlens,
                                             int num_seqs, const float* __restrict__ window_in, int has_window,
                                             float* __restrict__ window_out, int channels, int kernel,
                                             u32 rows_cap) {
    const int hist = kernel - 1;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)num_seqs * hist * channels) return;
    const int c = (int)(i % channels);
    const i64 si = i / channels;
    const int k = (int)(si % hist);
    const int s = (int)(si / hist);
    const u32 start = cu_seqlens[s];
    const u32 end = cu_seqlens[s + 1];
    if (end < start || end > rows_cap) {
        window_out[i] = F32_NAN;
        return;
    }
    const int len = (int)(end - start);
    window_out[i] = conv_input(x, window_in, has_window, start, s, len - hist + k, c, channels, hist);
}
