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

// Gated attention's inputs for the flash kernels, from one stacked projection (rows `row_stride`
// wide: q|gate per query head, then the k heads, then the v heads), in one pass:
//  - each q head: head_rms_norm then rope (the helpers qk_norm_rope uses, on a copy of the head in
//    shared memory: the same operations, so the same bits), times scale·log2(e), as bf16 into qb
//    [rows][q_heads][d];
//  - each k head: the same without the scale, into kb [rows][kv_heads][d];
//  - each v head: as bf16 into vb [rows][kv_heads][d];
//  - with `gates`, each gate's sigmoid in place of the gate (the flash kernel reads it there);
//  - with `last_only` (for the last-row kernels), q heads of each sequence's last row only;
//  - with prefix_rows > 0, k and v of sequence s's rows shifted by cu_prefix[s + 1] rows, into the
//    joined key rows the prefix flash kernels read (each sequence's prefix keys, then its own);
//  - with `write_back`, each k head normed and roped in f32 back into qkv (what a snapshot keeps).
// Columns from head_dim to d of qb, kb, vb are zeros. One warp per (row, item), a row's items being
// its q heads, k heads, v heads and (with `gates`) gates; head_dim floats of dynamic shared memory
// per warp. head_dim is a multiple of 16 (so every 8-value part is wholly in or out).
extern "C" __global__ void attention_prologue(float* __restrict__ qkv, int row_stride, int q_heads, int kv_heads,
                                              int head_dim, int d, const __nv_bfloat16* __restrict__ q_norm,
                                              const __nv_bfloat16* __restrict__ k_norm,
                                              const u32* __restrict__ positions, const RopeTable table, int half,
                                              int rows, float eps, float scale, __nv_bfloat16* __restrict__ qb,
                                              __nv_bfloat16* __restrict__ kb, __nv_bfloat16* __restrict__ vb,
                                              int gates, const u32* __restrict__ cu_seqlens, int num_seqs,
                                              int last_only, const u32* __restrict__ cu_prefix, u32 prefix_rows,
                                              int write_back) {
    extern __shared__ __align__(16) float ap_heads[];
    const i64 item = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    const int items = q_heads + 2 * kv_heads + (gates ? q_heads : 0);
    if (item >= (i64)rows * items) return;  // uniform over the warp
    const i64 t = item / items;
    const int it = (int)(item % items);
    // With last_only, only each sequence's last row has queries anyone reads.
    if (last_only && it < q_heads) {
        const int s = sequence_of_row(cu_seqlens, num_seqs, (u32)t);
        if (s < 0 || (u32)t + 1 != cu_seqlens[s + 1]) return;
    }
    float* row = qkv + t * row_stride;
    const int k_at = 2 * q_heads * head_dim;
    if (it >= q_heads + 2 * kv_heads) {
        float* g = row + (i64)(it - q_heads - 2 * kv_heads) * 2 * head_dim + head_dim;
        for (int c = lane; c < head_dim; c += 32) g[c] = sigmoid_f(g[c]);
        return;
    }
    const bool is_v = it >= q_heads + kv_heads;
    const bool is_q = it < q_heads;
    const int h = is_q ? it : is_v ? it - q_heads - kv_heads : it - q_heads;
    const float* src = is_q ? row + (i64)h * 2 * head_dim : row + k_at + (i64)((is_v ? kv_heads : 0) + h) * head_dim;
    // With prefix rows (a batch resuming from prefix states), k and v go to the joined key rows:
    // each sequence's prefix keys, then its own (flash_prefix_rows writes the prefix ones). A row
    // in no sequence (a padded pass's) goes past all of them, prefix_rows on: unshifted, it would
    // land on a sequence's joined keys.
    i64 kv_row = t;
    if (prefix_rows > 0 && !is_q) {
        const int s = sequence_of_row(cu_seqlens, num_seqs, (u32)t);
        kv_row += s >= 0 ? min(cu_prefix[s + 1], prefix_rows) : prefix_rows;
    }
    __nv_bfloat16* dst = is_q ? qb + (t * q_heads + h) * d : (is_v ? vb : kb) + (kv_row * kv_heads + h) * d;
    const float* vals = src;
    float mul = 1.0f;
    if (!is_v) {
        float* s = ap_heads + (threadIdx.x >> 5) * head_dim;
        for (int c = lane; c < head_dim; c += 32) s[c] = src[c];
        head_rms_norm_warp(s, is_q ? q_norm : k_norm, head_dim, lane, eps);
        // The rotation and the conversion read values other lanes normalised.
        __syncwarp();
        for (int j = lane; j < half; j += 32) rope_pair(s, positions, table, t, j, half);
        __syncwarp();
        // A snapshot keeps k as attention saw it, normed and roped, in f32.
        if (write_back && !is_q) {
            float* k_row = const_cast<float*>(src);
            for (int c = lane; c < head_dim; c += 32) k_row[c] = s[c];
        }
        vals = s;
        if (is_q) mul = scale * 1.4426950408889634f;
    }
    for (int c = lane * 8; c < d; c += 256) {
        uint4 packed = make_uint4(0u, 0u, 0u, 0u);
        if (c < head_dim) {
            const float4 a = *reinterpret_cast<const float4*>(vals + c);
            const float4 b = *reinterpret_cast<const float4*>(vals + c + 4);
            packed = make_uint4(pack_bf16x2(a.x * mul, a.y * mul), pack_bf16x2(a.z * mul, a.w * mul),
                                pack_bf16x2(b.x * mul, b.y * mul), pack_bf16x2(b.z * mul, b.w * mul));
        }
        *reinterpret_cast<uint4*>(dst + c) = packed;
    }
}
