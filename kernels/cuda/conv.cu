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

#define CONV_TILE_ROWS 32   // rows per block (CONV_TILE_ROWS in the launcher)
#define CONV_TILE_CH 128     // channels per block (CONV_TILE_CH in the launcher)
#define CONV_THREADS 256     // threads per block: CONV_TILE_CH channels x 2 row halves
#define CONV_MAX_KERNEL 8    // largest kernel width (CONV_MAX_KERNEL in the launcher)

// out_t[c] = silu(Σ_i w[c][i] · x_{t-kernel+1+i}[c]); then, for channels below l2_channels (a
// multiple of CONV_TILE_CH: whole heads of that width, DeltaNet's q and k), each head's L2 norm
// x / sqrt(Σx² + l2_eps). One block per tile of CONV_TILE_ROWS rows x
// CONV_TILE_CH channels: the tile and the kernel-1 rows before it are first copied into shared
// memory with every load issued at once (float4s where the layout allows), so the block waits on
// memory once; then each thread computes one channel over half the tile's rows from shared memory.
// Each row's sequence start is looked up once per block. Inputs before a sequence's start come
// from the carried window (or are zero); rows past the last sequence are not written; a row before
// its sequence's start (corrupt boundaries) gets NaN.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
conv1d_silu(const float* __restrict__ x, int x_stride, int x_offset, const __nv_bfloat16* __restrict__ w,
            const u32* __restrict__ cu_seqlens, int num_seqs, const float* __restrict__ window_in,
            int has_window, float* __restrict__ out, int channels, int kernel, u32 rows_cap, int l2_channels,
            float l2_eps) {
    constexpr int HALO = CONV_MAX_KERNEL - 1;
    constexpr int TILE = CONV_TILE_ROWS + HALO;  // shared rows: HALO before the tile, then the tile
    __shared__ float s_x[TILE][CONV_TILE_CH];
    __shared__ float s_out[CONV_TILE_ROWS][CONV_TILE_CH];  // the tile's outputs, when L2-normalised here
    __shared__ int s_seq[CONV_TILE_ROWS];
    __shared__ u32 s_start[CONV_TILE_ROWS];
    const int hist = kernel - 1;
    const i64 r0 = (i64)blockIdx.x * CONV_TILE_ROWS;
    const int c0 = blockIdx.y * CONV_TILE_CH;
    const int tid = threadIdx.x;
    // The tile is one whole head of the L2-normalised channels: its outputs go through s_out.
    const bool l2 = c0 + CONV_TILE_CH <= l2_channels;

    // Shared row j holds x row r0 - HALO + j (zeros outside [0, rows_cap) or past the channels).
    // Every load of the thread goes out before the first store, so the block waits on memory once.
    const bool vec = ((x_stride | x_offset | channels) & 3) == 0;
    if (vec) {
        constexpr int PARTS = CONV_TILE_CH / 4;
        constexpr int PER = (TILE * PARTS + CONV_THREADS - 1) / CONV_THREADS;
        float4 v[PER];
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = tid + e * CONV_THREADS;
            const int j = i / PARTS;
            const int c = (i % PARTS) * 4;
            const i64 r = r0 - HALO + j;
            v[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < TILE * PARTS && r >= 0 && r < (i64)rows_cap && c0 + c < channels)
                v[e] = *reinterpret_cast<const float4*>(x + r * x_stride + x_offset + c0 + c);
        }
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = tid + e * CONV_THREADS;
            if (i < TILE * PARTS) *reinterpret_cast<float4*>(&s_x[i / PARTS][(i % PARTS) * 4]) = v[e];
        }
    } else {
        constexpr int PER = (TILE * CONV_TILE_CH + CONV_THREADS - 1) / CONV_THREADS;
        float v[PER];
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = tid + e * CONV_THREADS;
            const int j = i / CONV_TILE_CH;
            const int c = i % CONV_TILE_CH;
            const i64 r = r0 - HALO + j;
            v[e] = i < TILE * CONV_TILE_CH && r >= 0 && r < (i64)rows_cap && c0 + c < channels
                       ? x[r * x_stride + x_offset + c0 + c]
                       : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            const int i = tid + e * CONV_THREADS;
            if (i < TILE * CONV_TILE_CH) s_x[i / CONV_TILE_CH][i % CONV_TILE_CH] = v[e];
        }
    }
    if (tid < CONV_TILE_ROWS) {
        const i64 r = r0 + tid;
        const int s = r < (i64)rows_cap ? sequence_of_row(cu_seqlens, num_seqs, (u32)r) : -1;
        s_seq[tid] = s;
        s_start[tid] = s >= 0 ? cu_seqlens[s] : 0;
    }
    __syncthreads();

    const int cl = tid % CONV_TILE_CH;
    const int c = c0 + cl;
    if (c >= channels) return;
    float taps[CONV_MAX_KERNEL];
#pragma unroll
    for (int k = 0; k < CONV_MAX_KERNEL; ++k) taps[k] = k < kernel ? load_bf16(w, (i64)c * kernel + k) : 0.0f;
    const int half = tid / CONV_TILE_CH;
    constexpr int PER = CONV_TILE_ROWS / (CONV_THREADS / CONV_TILE_CH);
#pragma unroll 4
    for (int jj = 0; jj < PER; ++jj) {
        const int j = half * PER + jj;
        const int s = s_seq[j];
        if (s < 0) continue;  // past the last sequence (or past rows_cap)
        const i64 r = r0 + j;
        const u32 start = s_start[j];
        if (r < (i64)start) {
            if (l2) s_out[j][cl] = F32_NAN;
            else out[r * channels + c] = F32_NAN;
            continue;
        }
        const int local = (int)(r - start);
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < CONV_MAX_KERNEL; ++i) {
            if (i > hist) break;
            const int back = hist - i;  // steps before row r
            float in;
            if (back <= local) {
                in = s_x[HALO + j - back][cl];
            } else {
                const int t = local - back;  // < 0: before the sequence
                in = has_window && -t <= hist ? window_in[((i64)s * hist + hist + t) * channels + c] : 0.0f;
            }
            acc += taps[i] * in;
        }
        if (l2) s_out[j][cl] = silu_f(acc);
        else out[r * channels + c] = silu_f(acc);
    }
    if (!l2) return;
    // L2 norm of each row of the head: a warp per row, lane holding channels lane + 32e as l2_norm
    // does, so the bits are those of conv1d_silu followed by l2_norm.
    __syncthreads();
    constexpr int WARPS = CONV_THREADS / 32;
    constexpr int HELD = CONV_TILE_CH / 32;
    const int lane = tid & 31;
    for (int j = tid >> 5; j < CONV_TILE_ROWS; j += WARPS) {
        if (s_seq[j] < 0) continue;
        float v[HELD];
#pragma unroll
        for (int e = 0; e < HELD; ++e) v[e] = s_out[j][lane + 32 * e];
        const float inv = l2_inv_held<HELD>(v, lane, CONV_TILE_CH, l2_eps);
        float* o = out + (r0 + j) * channels + c0;
#pragma unroll
        for (int e = 0; e < HELD; ++e) o[lane + 32 * e] = v[e] * inv;
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
