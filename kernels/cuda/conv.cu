// Causal depthwise conv1d (no bias) + SiLU over packed sequences. Sequence boundaries come from
// cu_seqlens in device memory, so one launch shape serves any batch up to `rows_cap` rows.


// x rows sit at x_stride · row + x_offset (a column block of the stacked in-projection output); out and
// the windows are dense [.., channels].

// Pre-conv input of sequence `s` at sequence-local time `t` (t < 0 reads the carried window, whose
// rows are oldest first; 0 without a window or beyond it).
__device__ __forceinline__ float conv_input(const float* x, int x_stride, int x_offset, const float* window_in,
                                            int has_window, u32 start, int s, int t, int c, int channels,
                                            int hist) {
    if (t >= 0) return x[((i64)start + t) * x_stride + x_offset + c];
    if (!has_window || -t > hist) return 0.0f;
    return window_in[((i64)s * hist + hist + t) * channels + c];
}

#define CONV_ROWS 16       // rows one thread walks (CONV_ROWS in the launcher)
#define CONV_MAX_KERNEL 8  // largest kernel width (taps held in registers)

// out_t[c] = silu(Σ_i w[c][i] · x_{t-kernel+1+i}[c]). Each thread owns one channel over CONV_ROWS
// consecutive rows (grid.x: row runs, grid.y × block: channels), sliding the window in registers,
// so every input is read once and the sequence lookup happens once per run, not per element.
extern "C" __global__ void conv1d_silu(const float* __restrict__ x, int x_stride, int x_offset,
                                       const __nv_bfloat16* __restrict__ w,
                                       const u32* __restrict__ cu_seqlens, int num_seqs,
                                       const float* __restrict__ window_in, int has_window,
                                       float* __restrict__ out, int channels, int kernel, u32 rows_cap) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const u32 r0 = blockIdx.x * CONV_ROWS;
    if (c >= channels || r0 >= rows_cap) return;
    const u32 r1 = min(r0 + CONV_ROWS, rows_cap);
    const int hist = kernel - 1;
    float taps[CONV_MAX_KERNEL];
#pragma unroll
    for (int k = 0; k < CONV_MAX_KERNEL; ++k) taps[k] = k < kernel ? load_bf16(w, (i64)c * kernel + k) : 0.0f;
    int s = sequence_of_row(cu_seqlens, num_seqs, r0);
    if (s < 0) return;
    u32 start = cu_seqlens[s];
    u32 end = cu_seqlens[s + 1];
    // win[i]: the input `hist - i` steps back (oldest first).
    float win[CONV_MAX_KERNEL];
    bool fresh = true;
    for (u32 r = r0; r < r1; ++r) {
        while (r >= end) {  // the next sequence (skipping empty ones)
            if (++s >= num_seqs) return;
            start = cu_seqlens[s];
            end = cu_seqlens[s + 1];
            fresh = true;
        }
        const i64 at = (i64)r * channels + c;
        if (r < start) {  // corrupt boundaries: never index before the sequence
            out[at] = F32_NAN;
            fresh = true;
            continue;
        }
        const int local = (int)(r - start);
        if (fresh) {
#pragma unroll
            for (int i = 0; i < CONV_MAX_KERNEL - 1; ++i) {
                if (i < hist)
                    win[i] = conv_input(x, x_stride, x_offset, window_in, has_window, start, s, local - hist + i, c,
                                        channels, hist);
            }
            fresh = false;
        }
        const float cur = x[(i64)r * x_stride + x_offset + c];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_MAX_KERNEL - 1; ++i) {
            if (i < hist) acc += taps[i] * win[i];
        }
#pragma unroll
        for (int k = 0; k < CONV_MAX_KERNEL; ++k) {
            if (k == hist) acc += taps[k] * cur;
        }
        out[at] = silu_f(acc);
#pragma unroll
        for (int i = 0; i < CONV_MAX_KERNEL - 1; ++i) {
            if (i + 1 < hist) win[i] = win[i + 1];
            else if (i + 1 == hist) win[i] = cur;
        }
    }
}

// window_out[s][i][c] = pre-conv input at local time len - hist + i (the window to resume from).
// A sequence that ends beyond the `rows_cap` rows of x gets a NaN window instead of an out-of-bounds read.
extern "C" __global__ void conv1d_window_out(const float* __restrict__ x, int x_stride, int x_offset,
                                             const u32* __restrict__ cu_seqlens, int num_seqs,
                                             const float* __restrict__ window_in, int has_window,
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
    window_out[i] = conv_input(x, x_stride, x_offset, window_in, has_window, start, s, len - hist + k, c, channels,
                               hist);
}
