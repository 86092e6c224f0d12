// Causal GQA flash attention with the sigmoid output gate, on bf16 tensor cores (mma.sync
// m16n8k16, sm_80+). Same contract as attention_gated in attention.cu; used for head dims that are
// multiples of 16 up to 256 (attention_gated stays the fallback for the others).
//
// One block = BM query rows of one sequence and one query head; BM / 16 warps, each owning 16
// rows. Key/value tiles of FA_BN rows stream through shared memory. Per tile a warp computes
// S = Q Kᵀ (16 x FA_BN, f32 in registers), updates its online softmax in f32, rounds P to bf16 and adds
// P V into its 16 x D f32 accumulator, which never leaves registers. The C-fragment layout of S
// equals the A-fragment layout P needs, so P goes from S to the PV product without shared memory.
//
// The inputs are f32, so tiles cannot be copied with cp.async: each thread loads float4s into
// registers, converts to bf16 and stores them. To hide that latency with one block per SM, the
// V tile of step j is loaded in chunks interleaved with the QKᵀ MMAs of step j, and the K tile of
// step j+1 with the PV MMAs of step j; one K and one V buffer suffice (two barriers per step).
//
// Shared memory rows are padded by 16 bytes: the 8 row addresses of every ldmatrix then fall in
// distinct 16-byte bank groups (no conflicts), without an XOR swizzle.

// Two shapes of the same kernel (template parameters WARPS and STAGE):
//  - wide (flash_attention_d*): 8 warps, 128 query rows per block, one block per SM at D = 256.
//    Grid (query tiles, q_heads). For long sequences.
//  - narrow (flash_attention_narrow_d*): 4 warps, 64 query rows per block, 99 KiB of shared memory
//    at D = 256, so two blocks share an SM and one block's memory waits overlap the other's MMAs;
//    8 staged float4s per thread (so half the threads still load a tile in 4 round trips, as the
//    wide kernel does). Grid (q_heads, query tiles):
//    the heads of one kv group run side by side, so their K/V reads hit L2. It finds its tile with
//    a warp-parallel scan of cu_seqlens (32 sequences per load) instead of a serial walk. For
//    batches of short sequences, where the wide kernel waits on memory with one block per SM.
#define FA_BN 64                  // keys per tile
#define FA_PAD 8                  // bf16 padding per shared-memory row (16 bytes)

extern __shared__ __align__(16) unsigned char fa_smem[];

// 2^x in one MUFU op (exp2f adds range scaling around it). ex2.approx(-inf) = 0.
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void fa_store_bf16x4(__nv_bfloat16* dst, float4 x) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
}

// Chunk `c` of a K or V tile: STAGE float4s per thread, consecutive threads on consecutive
// float4s of a row (coalesced). Pass e of chunk c covers tile rows (c·STAGE + e)·rows_per_pass
// + ld_row, column ld_col. `src` points at column ld_col of sequence row key0 + ld_row; stepping it
// by `step` (rows_per_pass rows) keeps the per-thread addressing to one pointer. Keys at or beyond
// `kv_len`, and columns at or beyond head_dim (when head_dim < D), load as zeros: causal masking
// hides those keys, and zero columns add nothing.
template <int D, int THREADS, int STAGE>
__device__ __forceinline__ void fa_issue(float4 (&stage)[STAGE], const float* src, i64 step,
                                         int key, int kv_len, bool col_ok, int c) {
    constexpr int RPP = THREADS * 4 / D;  // tile rows per pass of all threads
    src += (i64)(c * STAGE) * step;
    key += c * STAGE * RPP;
#pragma unroll
    for (int e = 0; e < STAGE; ++e) {
        stage[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (col_ok && key + e * RPP < kv_len) stage[e] = *reinterpret_cast<const float4*>(src);
        src += step;
    }
}

// Stores chunk `c` into a tile; `dst` is the thread's (ld_row, ld_col) element of the tile.
template <int D, int THREADS, int STAGE>
__device__ __forceinline__ void fa_commit(const float4 (&stage)[STAGE], __nv_bfloat16* dst, int c) {
    constexpr int RPP = THREADS * 4 / D;
#pragma unroll
    for (int e = 0; e < STAGE; ++e) {
        fa_store_bf16x4(dst + (c * STAGE + e) * RPP * (D + FA_PAD), stage[e]);
    }
}

// Block `t` of the batch as (sequence start, length, query tile), tiles of BM rows: sequence by
// sequence, last tile to first within a sequence (the long causal tiles start first, the short
// ones fill the tail). Every boundary is clamped to `rows`, so no row at or beyond it is touched
// whatever cu_seqlens holds. Returns false for blocks beyond the batch's tiles.
//
// Serial walk, one boundary per step.
template <int BM>
__device__ __forceinline__ bool fa_find_tile_serial(const u32* __restrict__ cu_seqlens,
                                                    int num_seqs, u32 rows, int t, int& tile,
                                                    u32& seq_start, int& len) {
    u32 a = min(cu_seqlens[0], rows);
    for (int s = 0; s < num_seqs; ++s) {
        const u32 b = min(cu_seqlens[s + 1], rows);
        const int n = b > a ? (int)((b - a + BM - 1) / BM) : 0;
        if (t < n) {
            tile = n - 1 - t;
            seq_start = a;
            len = (int)(b - a);
            return true;
        }
        t -= n;
        a = b;
    }
    return false;
}

// D: the head size the block is laid out for (64, 128 or 256); head_dim <= D, a multiple of 16.
// WARPS: warps per block (16 query rows each). STAGE: float4s per thread per staged K/V chunk.
// NARROW: grid (q_heads, tiles) with the warp-parallel tile search, else (tiles, q_heads) with the
// serial one.
template <int D, int WARPS, int STAGE, bool NARROW>
__device__ __forceinline__ void flash_attention_impl(
    const float* __restrict__ qg, const float* __restrict__ k, const float* __restrict__ v,
    const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, float* __restrict__ out,
    int q_heads, int kv_heads, int head_dim, float scale) {
    constexpr int FA_BM = WARPS * 16;      // query rows per block
    constexpr int FA_THREADS = WARPS * 32;
    constexpr int STRIDE = D + FA_PAD;  // shared-memory row stride, bf16 elements
    constexpr int KSTEPS = D / 16;      // 16-wide steps over the head dim (QKᵀ depth, PV width)
    constexpr int CHUNKS = FA_BN * D / 4 / FA_THREADS / STAGE;  // staged chunks per tile
    constexpr int PERIOD = KSTEPS / CHUNKS;  // steps between chunks
    static_assert(CHUNKS >= 1, "a tile holds at least one chunk");
    static_assert(CHUNKS * STAGE * FA_THREADS * 4 == FA_BN * D, "tile splits into chunks");
    static_assert(PERIOD * CHUNKS == KSTEPS, "chunks spread evenly over the steps");
    static_assert(FA_THREADS * 4 % D == 0, "a pass of all threads covers whole tile rows");

    int tile = -1;
    u32 seq_start = 0;
    int len = 0;
    const bool found =
        NARROW
            ? find_tile_warp<FA_BM>(cu_seqlens, num_seqs, rows, blockIdx.y, tile, seq_start, len)
            : fa_find_tile_serial<FA_BM>(cu_seqlens, num_seqs, rows, blockIdx.x, tile, seq_start,
                                         len);
    if (!found) return;  // uniform over the block, before any barrier

    const int h = NARROW ? blockIdx.x : blockIdx.y;
    const int kvh = h / (q_heads / kv_heads);
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;  // fragment row (and row + 8)
    const int tq = lane & 3;  // fragment column pair
    const int q0 = tile * FA_BM;             // first query row of the block, within the sequence
    const int kv_len = min(q0 + FA_BM, len); // keys any row of the block can see
    const int n_tiles = (kv_len + FA_BN - 1) / FA_BN;
    const int wrow = q0 + warp * 16;         // first query row of this warp
    const bool warp_rows = wrow < len;

    __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(fa_smem);
    __nv_bfloat16* s_k = s_q + FA_BM * STRIDE;
    __nv_bfloat16* s_v = s_k + FA_BN * STRIDE;

    // This thread's part of every K/V tile load (see fa_issue): tile row ld_row, column ld_col.
    const int ld_row = tid / (D / 4);
    const int ld_col = (tid % (D / 4)) * 4;
    const bool ld_col_ok = ld_col < head_dim;
    const i64 kv_stride = (i64)kv_heads * head_dim;
    const i64 ld_step = (i64)(FA_THREADS * 4 / D) * kv_stride;
    const i64 ld_offset = ((i64)seq_start + ld_row) * kv_stride + (i64)kvh * head_dim + ld_col;
    const float* k_ld = k + ld_offset;
    const float* v_ld = v + ld_offset;
    __nv_bfloat16* k_st = s_k + ld_row * STRIDE + ld_col;
    __nv_bfloat16* v_st = s_v + ld_row * STRIDE + ld_col;

    // Q, pre-scaled in f32 by scale·log2(e) so the softmax can use exp2.
    {
        const float qs = scale * 1.4426950408889634f;
#pragma unroll(NARROW ? 16 : 8)
        for (int i = tid; i < FA_BM * D / 4; i += FA_THREADS) {
            const int r = i / (D / 4);
            const int col = (i % (D / 4)) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q0 + r < len && col < head_dim) {
                const i64 row = (i64)seq_start + q0 + r;
                x = *reinterpret_cast<const float4*>(qg + (row * q_heads + h) * 2 * head_dim + col);
                x.x *= qs;
                x.y *= qs;
                x.z *= qs;
                x.w *= qs;
            }
            fa_store_bf16x4(s_q + r * STRIDE + col, x);
        }
    }
    float4 stage[STAGE];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        fa_issue<D, FA_THREADS, STAGE>(stage, k_ld, ld_step, ld_row, kv_len, ld_col_ok, c);
        fa_commit<D, FA_THREADS, STAGE>(stage, k_st, c);
    }
    __syncthreads();

    // ldmatrix lane addresses. A (Q, 16x16): lanes 0-15 rows 0-15 at column 0, lanes 16-31 rows
    // 0-15 at column 8. B from K (keys x dims, non-transposed): lanes 0-7 keys 0-7 dims 0, 8-15
    // keys 0-7 dims 8, 16-23 keys 8-15 dims 0, 24-31 keys 8-15 dims 8 -> (b0, b1) of two 8-key
    // groups. B from V (keys x dims, transposed): lanes 0-15 keys 0-15 at dim 0, 16-31 at dim 8 ->
    // (b0, b1) of two 8-dim groups.
    const u32 q_addr = smem_addr(s_q + (warp * 16 + (lane & 15)) * STRIDE + (lane >> 4) * 8);
    const u32 k_addr = smem_addr(s_k + ((lane & 7) + (lane >> 4) * 8) * STRIDE + ((lane >> 3) & 1) * 8);
    const u32 v_addr = smem_addr(s_v + (lane & 15) * STRIDE + (lane >> 4) * 8);

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = F32_NEG_INF, m1 = F32_NEG_INF;  // running max (log2 units) of rows g and g + 8
    float l0 = 0.0f, l1 = 0.0f;                // this thread's share of the running denominators

    for (int j = 0; j < n_tiles; ++j) {
        const int key0 = j * FA_BN;
        const bool has_next = j + 1 < n_tiles;
        // Warps whose rows all precede the tile (or lie past the sequence) skip the math but still
        // load and reach every barrier.
        const bool active = warp_rows && key0 <= wrow + 15;

        // S = Q Kᵀ, with V_j staged in between (its buffer was released by the last barrier).
        float s[FA_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            if (kk % PERIOD == 0) {
                if (kk > 0) fa_commit<D, FA_THREADS, STAGE>(stage, v_st, kk / PERIOD - 1);
                fa_issue<D, FA_THREADS, STAGE>(stage, v_ld + key0 * kv_stride, ld_step,
                                               key0 + ld_row, kv_len, ld_col_ok, kk / PERIOD);
            }
            if (active) {
                u32 qa[4];
                ldmatrix_x4(qa, q_addr + kk * 32);
#pragma unroll
                for (int np = 0; np < FA_BN / 16; ++np) {
                    u32 kb[4];
                    ldmatrix_x4(kb, k_addr + (np * 16 * STRIDE + kk * 16) * 2);
                    mma_bf16_16816(s[2 * np], qa, kb[0], kb[1]);
                    mma_bf16_16816(s[2 * np + 1], qa, kb[2], kb[3]);
                }
            }
        }
        fa_commit<D, FA_THREADS, STAGE>(stage, v_st, CHUNKS - 1);
        __syncthreads();  // V_j visible to all; every warp is done reading K_j

        // Online softmax over this tile, then P as bf16 A fragments.
        u32 p[FA_BN / 16][4];
        if (active) {
            const int r0 = wrow + g;
            if (key0 + FA_BN - 1 > wrow) {  // the tile crosses this warp's diagonal
#pragma unroll
                for (int n = 0; n < FA_BN / 8; ++n) {
                    const int key = key0 + n * 8 + tq * 2;
                    if (key > r0) s[n][0] = F32_NEG_INF;
                    if (key + 1 > r0) s[n][1] = F32_NEG_INF;
                    if (key > r0 + 8) s[n][2] = F32_NEG_INF;
                    if (key + 1 > r0 + 8) s[n][3] = F32_NEG_INF;
                }
            }
            float x0 = m0, x1 = m1;
#pragma unroll
            for (int n = 0; n < FA_BN / 8; ++n) {
                x0 = fmaxf(x0, fmaxf(s[n][0], s[n][1]));
                x1 = fmaxf(x1, fmaxf(s[n][2], s[n][3]));
            }
            // The four threads of a quad hold one row between them.
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
            // A row that has seen no key yet keeps max -inf: subtract 0 instead so exp2 gives 0,
            // not NaN.
            const float b0 = x0 == F32_NEG_INF ? 0.0f : x0;
            const float b1 = x1 == F32_NEG_INF ? 0.0f : x1;
            const float c0 = fa_exp2(m0 - b0);
            const float c1 = fa_exp2(m1 - b1);
            m0 = x0;
            m1 = x1;
            l0 *= c0;
            l1 *= c1;
            // Once the running max settles (most tiles of a long row), skip the D/2 multiplies.
            if (__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) {
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[n][0] *= c0;
                    o[n][1] *= c0;
                    o[n][2] *= c1;
                    o[n][3] *= c1;
                }
            }
#pragma unroll
            for (int n = 0; n < FA_BN / 8; ++n) {
                s[n][0] = fa_exp2(s[n][0] - b0);
                s[n][1] = fa_exp2(s[n][1] - b0);
                s[n][2] = fa_exp2(s[n][2] - b1);
                s[n][3] = fa_exp2(s[n][3] - b1);
                l0 += s[n][0] + s[n][1];
                l1 += s[n][2] + s[n][3];
            }
#pragma unroll
            for (int ks = 0; ks < FA_BN / 16; ++ks) {
                p[ks][0] = pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
                p[ks][1] = pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
                p[ks][2] = pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
                p[ks][3] = pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
            }
        }

        // O += P V, with K_{j+1} staged in between.
#pragma unroll
        for (int dp = 0; dp < KSTEPS; ++dp) {
            if (dp % PERIOD == 0 && has_next) {
                if (dp > 0) fa_commit<D, FA_THREADS, STAGE>(stage, k_st, dp / PERIOD - 1);
                fa_issue<D, FA_THREADS, STAGE>(stage, k_ld + (key0 + FA_BN) * kv_stride, ld_step,
                                               key0 + FA_BN + ld_row, kv_len, ld_col_ok,
                                               dp / PERIOD);
            }
            if (active) {
#pragma unroll
                for (int ks = 0; ks < FA_BN / 16; ++ks) {
                    u32 vb[4];
                    ldmatrix_x4_trans(vb, v_addr + (ks * 16 * STRIDE + dp * 16) * 2);
                    mma_bf16_16816(o[2 * dp], p[ks], vb[0], vb[1]);
                    mma_bf16_16816(o[2 * dp + 1], p[ks], vb[2], vb[3]);
                }
            }
        }
        if (has_next) fa_commit<D, FA_THREADS, STAGE>(stage, k_st, CHUNKS - 1);
        __syncthreads();  // K_{j+1} visible to all; every warp is done reading V_j
    }

    if (!warp_rows) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = wrow + g + half * 8;
        if (r >= len) continue;
        const float inv = 1.0f / (half == 0 ? l0 : l1);
        const i64 row = (i64)seq_start + r;
        const float* gate = qg + (row * q_heads + h) * 2 * head_dim + head_dim;
        float* dst = out + (row * q_heads + h) * head_dim;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            const int col = n * 8 + tq * 2;
            if (col < head_dim) {
                const float2 gt = *reinterpret_cast<const float2*>(gate + col);
                const float2 y = make_float2(o[n][half * 2] * inv * sigmoid_f(gt.x),
                                             o[n][half * 2 + 1] * inv * sigmoid_f(gt.y));
                *reinterpret_cast<float2*>(dst + col) = y;
            }
        }
    }
}

// One entry point per head-size bucket and shape: the shared-memory layout and register tiles are
// fixed at compile time. Launch with 32·WARPS threads and (16·WARPS + 2·FA_BN)·(D + FA_PAD)·2
// bytes of dynamic shared memory; grid (ceil(rows / BM) + num_seqs, q_heads) for the wide kernel,
// (q_heads, ceil(rows / BM) + num_seqs) for the narrow one.
#define FA_ENTRY(NAME, D, WARPS, STAGE, NARROW, MIN_BLOCKS)                                       \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) NAME(                     \
        const float* __restrict__ qg, const float* __restrict__ k, const float* __restrict__ v,   \
        const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, float* __restrict__ out,      \
        int q_heads, int kv_heads, int head_dim, float scale) {                                   \
        flash_attention_impl<D, WARPS, STAGE, NARROW>(qg, k, v, cu_seqlens, num_seqs, rows, out,  \
                                                      q_heads, kv_heads, head_dim, scale);        \
    }

FA_ENTRY(flash_attention_d64, 64, 8, 4, false, 1)
FA_ENTRY(flash_attention_d128, 128, 8, 4, false, 1)
FA_ENTRY(flash_attention_d256, 256, 8, 4, false, 1)
FA_ENTRY(flash_attention_narrow_d64, 64, 4, 8, true, 2)
FA_ENTRY(flash_attention_narrow_d128, 128, 4, 8, true, 2)
FA_ENTRY(flash_attention_narrow_d256, 256, 4, 8, true, 2)
