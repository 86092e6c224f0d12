// Causal depthwise conv1d (no bias) + SiLU over packed sequences. Sequence boundaries come from
// cu_seqlens in device memory, so one launch shape serves any batch up to `rows_cap` rows.


// x rows sit at x_stride · row + x_offset (a column block of the stacked in-projection output, f32 or
// bf16: each kernel has an entry point per input type); out and the windows are dense f32 [.., channels].

// Pre-conv input of sequence `s` at sequence-local time `t` (t < 0 reads the carried window, whose
// rows are oldest first; 0 without a window or beyond it).
template <typename X>
__device__ __forceinline__ float conv_input(const X* x, int x_stride, int x_offset, const float* window_in,
                                            int has_window, u32 start, int s, int t, int c, int channels,
                                            int hist) {
    if (t >= 0) return load_f32(x, ((i64)start + t) * x_stride + x_offset + c);
    if (!has_window || -t > hist) return 0.0f;
    return window_in[((i64)s * hist + hist + t) * channels + c];
}

#define CONV_TILE_ROWS 32   // rows per block (CONV_TILE_ROWS in the launcher)
#define CONV_TILE_CH 128     // channels per block (CONV_TILE_CH in the launcher)
#define CONV_THREADS 256     // threads per block: CONV_TILE_CH channels x 2 row halves
#define CONV_MAX_KERNEL 8    // largest kernel width (CONV_MAX_KERNEL in the launcher)

// What the per-row loop of conv1d_silu reads: the block's shared tile and row table, and where
// its thread writes.
struct ConvRows {
    const float (*s_x)[CONV_TILE_CH];
    const int* s_seq;
    const u32* s_start;
    const float* window_in;
    int has_window;
    float* out;
    int channels;
    i64 r0;
    int c;     // the thread's channel
    int cl;    // ... within the tile
    int half;  // which half of the tile's rows the thread computes
    bool l2;   // outputs go to the shared tile (L2-normalised after), not to `out`
};

// The thread's rows of the tile for a kernel of width KW. Every tap reads the shared tile (it holds
// CONV_MAX_KERNEL - 1 rows before the tile); only a row whose window reaches before its sequence's
// start (the first KW - 1 rows of a sequence) replaces those inputs with the carried window or zeros.
// The sum runs over the taps in order from zero, as the CPU reference does.
template <int KW>
__device__ __forceinline__ void conv_rows(const ConvRows& a, const float (&taps)[CONV_MAX_KERNEL],
                                          float (*s_out)[CONV_TILE_CH]) {
    constexpr int HALO = CONV_MAX_KERNEL - 1;
    constexpr int HIST = KW - 1;
    constexpr int PER = CONV_TILE_ROWS / (CONV_THREADS / CONV_TILE_CH);
    const int j0 = a.half * PER;
    float* dst = a.out + (a.r0 + j0) * a.channels + a.c;
    // Rows all inside one sequence, past its first HIST rows (most tiles): no per-row checks, and
    // the window slides through registers (one shared load per row).
    const int s0 = a.s_seq[j0];
    if (s0 >= 0 && a.s_seq[j0 + PER - 1] == s0 && a.r0 + j0 >= (i64)a.s_start[j0] + HIST) {
        float in[KW];
#pragma unroll
        for (int i = 0; i < KW - 1; ++i) in[i + 1] = a.s_x[HALO + j0 - HIST + i][a.cl];
#pragma unroll 4
        for (int jj = 0; jj < PER; ++jj, dst += a.channels) {
            const int j = j0 + jj;
#pragma unroll
            for (int i = 0; i < KW - 1; ++i) in[i] = in[i + 1];
            in[KW - 1] = a.s_x[HALO + j][a.cl];
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < KW; ++i) acc += taps[i] * in[i];
            if (a.l2) s_out[j][a.cl] = silu_fast(acc);
            else *dst = silu_fast(acc);
        }
        return;
    }
#pragma unroll 4
    for (int jj = 0; jj < PER; ++jj, dst += a.channels) {
        const int j = j0 + jj;
        const int s = a.s_seq[j];
        if (s < 0) continue;  // past the last sequence (or past rows_cap)
        const i64 r = a.r0 + j;
        const u32 start = a.s_start[j];
        if (r < (i64)start) {
            if (a.l2) s_out[j][a.cl] = F32_NAN;
            else *dst = F32_NAN;
            continue;
        }
        const int local = (int)(r - start);
        float in[KW];
#pragma unroll
        for (int i = 0; i < KW; ++i) in[i] = a.s_x[HALO + j - (HIST - i)][a.cl];
        if (local < HIST) {
#pragma unroll
            for (int i = 0; i < KW; ++i) {
                const int back = HIST - i;  // steps before row r
                if (back > local) {
                    const int t = local - back;  // < 0: before the sequence
                    in[i] = a.has_window ? a.window_in[((i64)s * HIST + HIST + t) * a.channels + a.c] : 0.0f;
                }
            }
        }
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < KW; ++i) acc += taps[i] * in[i];
        if (a.l2) s_out[j][a.cl] = silu_fast(acc);
        else *dst = silu_fast(acc);
    }
}

// out_t[c] = silu(Σ_i w[c][i] · x_{t-kernel+1+i}[c]) (silu_fast); then, for channels below l2_channels (a
// multiple of CONV_TILE_CH: whole heads of that width, DeltaNet's q and k), each head's L2 norm
// x / sqrt(Σx² + l2_eps). One block per tile of CONV_TILE_ROWS rows x
// CONV_TILE_CH channels: the tile and the kernel-1 rows before it are first copied into shared
// memory with every load issued at once (float4s where the layout allows), so the block waits on
// memory once; then each thread computes one channel over half the tile's rows from shared memory.
// Each row's sequence start is looked up once per block. Inputs before a sequence's start come
// from the carried window (or are zero); rows past the last sequence are not written; a row before
// its sequence's start (corrupt boundaries) gets NaN.

template <typename X>
__device__ __forceinline__ void conv1d_silu_tile(const X* __restrict__ x, int x_stride, int x_offset,
                                                 const __nv_bfloat16* __restrict__ w,
                                                 const u32* __restrict__ cu_seqlens, int num_seqs,
                                                 const float* __restrict__ window_in, int has_window,
                                                 float* __restrict__ out, int channels, int kernel, u32 rows_cap,
                                                 int l2_channels, float l2_eps, const X* __restrict__ gb,
                                                 int gb_stride, int gb_offset, const X* __restrict__ ga,
                                                 int ga_stride, int ga_offset,
                                                 const __nv_bfloat16* __restrict__ a_log,
                                                 const __nv_bfloat16* __restrict__ dt_bias,
                                                 float* __restrict__ beta, float* __restrict__ g, int gate_heads) {
    constexpr int HALO = CONV_MAX_KERNEL - 1;
    constexpr int TILE = CONV_TILE_ROWS + HALO;  // shared rows: HALO before the tile, then the tile
    __shared__ float s_x[TILE][CONV_TILE_CH];
    __shared__ float s_out[CONV_TILE_ROWS][CONV_TILE_CH];  // the tile's outputs, when L2-normalised here
    __shared__ int s_seq[CONV_TILE_ROWS];
    __shared__ u32 s_start[CONV_TILE_ROWS];
    const i64 r0 = (i64)blockIdx.x * CONV_TILE_ROWS;
    const int c0 = blockIdx.y * CONV_TILE_CH;
    const int tid = threadIdx.x;
    // The tile is one whole head of the L2-normalised channels: its outputs go through s_out.
    const bool l2 = c0 + CONV_TILE_CH <= l2_channels;
    // With gate_heads, the blocks of the first channel tile also compute the delta rule's gates of
    // their rows (delta_gates' values, through the same helper): one launch less per layer.
    if (gate_heads > 0 && blockIdx.y == 0) {
        for (int i = tid; i < CONV_TILE_ROWS * gate_heads; i += CONV_THREADS) {
            const i64 t = r0 + i / gate_heads;
            if (t < (i64)rows_cap)
                delta_gate_at(gb, gb_stride, gb_offset, ga, ga_stride, ga_offset, a_log, dt_bias, beta, g, t,
                              i % gate_heads, gate_heads);
        }
    }

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
                v[e] = load4(x + r * x_stride + x_offset + c0 + c);
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
                       ? load_f32(x, r * x_stride + x_offset + c0 + c)
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
    // The kernel width as a compile-time constant: the taps unroll without bounds checks.
    const ConvRows rows{s_x, s_seq, s_start, window_in, has_window, out, channels, r0, c, cl,
                        tid / CONV_TILE_CH, l2};
    float (*const tile_out)[CONV_TILE_CH] = s_out;
    switch (kernel) {
        case 1: conv_rows<1>(rows, taps, tile_out); break;
        case 2: conv_rows<2>(rows, taps, tile_out); break;
        case 3: conv_rows<3>(rows, taps, tile_out); break;
        case 4: conv_rows<4>(rows, taps, tile_out); break;
        case 5: conv_rows<5>(rows, taps, tile_out); break;
        case 6: conv_rows<6>(rows, taps, tile_out); break;
        case 7: conv_rows<7>(rows, taps, tile_out); break;
        default: conv_rows<8>(rows, taps, tile_out); break;
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

#define CONV_ENTRY(NAME, X)                                                                                    \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS)                                                \
        NAME(const X* __restrict__ x, int x_stride, int x_offset, const __nv_bfloat16* __restrict__ w,        \
             const u32* __restrict__ cu_seqlens, int num_seqs, const float* __restrict__ window_in,           \
             int has_window, float* __restrict__ out, int channels, int kernel, u32 rows_cap, int l2_channels, \
             float l2_eps, const X* __restrict__ gb, int gb_stride, int gb_offset, const X* __restrict__ ga,   \
             int ga_stride, int ga_offset, const __nv_bfloat16* __restrict__ a_log,                            \
             const __nv_bfloat16* __restrict__ dt_bias, float* __restrict__ beta, float* __restrict__ g,       \
             int gate_heads) {                                                                                \
        conv1d_silu_tile(x, x_stride, x_offset, w, cu_seqlens, num_seqs, window_in, has_window, out,          \
                         channels, kernel, rows_cap, l2_channels, l2_eps, gb, gb_stride, gb_offset, ga,       \
                         ga_stride, ga_offset, a_log, dt_bias, beta, g, gate_heads);                          \
    }

CONV_ENTRY(conv1d_silu, float)
CONV_ENTRY(conv1d_silu_bf16x, __nv_bfloat16)

// window_out[s][i][c] = pre-conv input at local time len - hist + i (the window to resume from),
// where len is the sequence's length or, with has_output_at, output_at[s] (at most the length).
// A sequence that ends beyond the `rows_cap` rows of x gets a NaN window instead of an out-of-bounds read.
template <typename X>
__device__ __forceinline__ void conv1d_window_out_at(const X* __restrict__ x, int x_stride, int x_offset,
                                                     const u32* __restrict__ cu_seqlens, int num_seqs,
                                                     const float* __restrict__ window_in, int has_window,
                                                     const u32* __restrict__ output_at, int has_output_at,
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
    const int len = (int)(has_output_at ? min(output_at[s], end - start) : end - start);
    window_out[i] = conv_input(x, x_stride, x_offset, window_in, has_window, start, s, len - hist + k, c, channels,
                               hist);
}

#define WINDOW_ENTRY(NAME, X)                                                                                  \
    extern "C" __global__ void NAME(const X* __restrict__ x, int x_stride, int x_offset,                      \
                                    const u32* __restrict__ cu_seqlens, int num_seqs,                          \
                                    const float* __restrict__ window_in, int has_window,                       \
                                    const u32* __restrict__ output_at, int has_output_at,                      \
                                    float* __restrict__ window_out, int channels, int kernel, u32 rows_cap) {  \
        conv1d_window_out_at(x, x_stride, x_offset, cu_seqlens, num_seqs, window_in, has_window, output_at,    \
                             has_output_at, window_out, channels, kernel, rows_cap);                           \
    }

WINDOW_ENTRY(conv1d_window_out, float)
WINDOW_ENTRY(conv1d_window_out_bf16x, __nv_bfloat16)
