// Partial multi-axis rotary embedding in place. The host computes each frequency pair's inverse
// frequency (in f32, as PyTorch does) and position axis and passes them by value, so the kernel needs
// no device table and no allocation. One thread per (row, head, pair).

#define ROPE_MAX_PAIRS 64

struct RopeTable {
    float inv_freq[ROPE_MAX_PAIRS];
    u32 axis[ROPE_MAX_PAIRS];
};

// Rotates pair (j, j + half) of the head of row t. One helper for both kernels, so they give the
// same bits.
__device__ __forceinline__ void rope_pair(float* head, const u32* positions, const RopeTable& table, i64 t, int j,
                                          int half) {
    // Same rounding as the reference: an f32 product, then cos/sin of that f32.
    const float angle = (float)positions[t * 3 + table.axis[j]] * table.inv_freq[j];
    float s, c;
    sincosf(angle, &s, &c);
    const float a = head[j];
    const float b = head[j + half];
    head[j] = a * c - b * s;
    head[j + half] = b * c + a * s;
}

extern "C" __global__ void rope(float* __restrict__ x, const u32* __restrict__ positions, const RopeTable table,
                                int rows, int heads, int half, int head_stride, int row_stride, int offset) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * heads * half) return;
    const int j = (int)(i % half);
    const i64 rh = i / half;
    const int h = (int)(rh % heads);
    const i64 t = rh / heads;
    rope_pair(x + t * row_stride + offset + (i64)h * head_stride, positions, table, t, j, half);
}

// Where one tensor's heads sit in its rows (a HeadLayout), and their norm weight.
struct HeadsAt {
    float* x;
    const __nv_bfloat16* w;
    int heads, head_stride, row_stride, offset;
};

// An attention layer's q and k preparation in one launch: head_rms_norm of every q head and k head,
// then rope on each (the same bits as the four separate kernels). One warp per (row, head), the q
// heads of a row first.
extern "C" __global__ void qk_norm_rope(float* qx, const __nv_bfloat16* qw, int q_heads, int q_head_stride,
                                        int q_row_stride, int q_offset, float* kx, const __nv_bfloat16* kw,
                                        int k_heads, int k_head_stride, int k_row_stride, int k_offset, int head_dim,
                                        const u32* __restrict__ positions, const RopeTable table, int half, int rows,
                                        float eps) {
    const HeadsAt q{qx, qw, q_heads, q_head_stride, q_row_stride, q_offset};
    const HeadsAt k{kx, kw, k_heads, k_head_stride, k_row_stride, k_offset};
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int heads = q.heads + k.heads;
    if (item >= (i64)rows * heads) return;
    const i64 t = item / heads;
    const int hh = (int)(item % heads);
    const HeadsAt at = hh < q.heads ? q : k;
    const int h = hh < q.heads ? hh : hh - q.heads;
    float* head = at.x + t * at.row_stride + at.offset + (i64)h * at.head_stride;
    head_rms_norm_warp(head, at.w, head_dim, lane, eps);
    // The rotation reads values other lanes normalised.
    __syncwarp();
    for (int j = lane; j < half; j += 32) rope_pair(head, positions, table, t, j, half);
}
