// Partial multi-axis rotary embedding in place. The host computes each frequency pair's inverse
// frequency (in f32, as PyTorch does) and position axis and passes them by value, so the kernel needs
// no device table and no allocation. One thread per (row, head, pair).

#define ROPE_MAX_PAIRS 64

struct RopeTable {
    float inv_freq[ROPE_MAX_PAIRS];
    u32 axis[ROPE_MAX_PAIRS];
};

extern "C" __global__ void rope(float* __restrict__ x, const u32* __restrict__ positions, const RopeTable table,
                                int rows, int heads, int half, int head_stride, int row_stride, int offset) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * heads * half) return;
    const int j = (int)(i % half);
    const i64 rh = i / half;
    const int h = (int)(rh % heads);
    const i64 t = rh / heads;
    // Same rounding as the reference: an f32 product, then cos/sin of that f32.
    const float angle = (float)positions[t * 3 + table.axis[j]] * table.inv_freq[j];
    float s, c;
    sincosf(angle, &s, &c);
    float* head = x + t * row_stride + offset + (i64)h * head_stride;
    const float a = head[j];
    const float b = head[j + half];
    head[j] = a * c - b * s;
    head[j + half] = b * c + a * s;
}
