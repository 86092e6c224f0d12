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
// The kernel reads Q (pre-scaled), K and V as bf16 from a scratch that `flash_bf16_inputs` fills
// from the f32 activations just before, so tiles stream into shared memory with cp.async and no
// register staging. One K and one V buffer: the V tile of step j loads while the block computes
// S = Q K_jᵀ and its softmax, the K tile of step j+1 while it computes P V_j (four barriers per
// step). Rows past a sequence load as zeros (so a masked key's V row is 0, never stale memory).
//
// Shared memory rows are padded by 16 bytes: the 8 row addresses of every ldmatrix then fall in
// distinct 16-byte bank groups (no conflicts), without an XOR swizzle.

// Two shapes of the same kernel (template parameters WARPS and NARROW):
//  - wide (flash_attention_d*): 8 warps, 128 query rows per block, one block per SM at D = 256.
//    Grid (query tiles, q_heads). For long sequences.
//  - narrow (flash_attention_narrow_d*): 4 warps, 64 query rows per block, 99 KiB of shared memory
//    at D = 256, so two blocks share an SM and one block's memory waits overlap the other's MMAs.
//    Grid (q_heads, query tiles): the heads of one kv group run side by side, so their K/V reads
//    hit L2. It finds its tile with a warp-parallel scan of cu_seqlens (32 sequences per load)
//    instead of a serial walk. For batches of short sequences.
#define FA_BN 64                  // keys per tile
#define FA_PAD 8                  // bf16 padding per shared-memory row (16 bytes)

extern __shared__ __align__(16) unsigned char fa_smem[];

// Part `col` (8 values) of one head's row: src[col..col + 8] times `mul`, as bf16, into dst, or
// zeros at and beyond head_dim (a multiple of 16: a part is wholly in or out). One 16-byte store.
__device__ __forceinline__ void fa_store_part(const float* src, __nv_bfloat16* dst, int col, int head_dim,
                                              float mul) {
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (col < head_dim) {
        const float4 a = *reinterpret_cast<const float4*>(src + col);
        const float4 b = *reinterpret_cast<const float4*>(src + col + 4);
        packed = make_uint4(pack_bf16x2(a.x * mul, a.y * mul), pack_bf16x2(a.z * mul, a.w * mul),
                            pack_bf16x2(b.x * mul, b.y * mul), pack_bf16x2(b.z * mul, b.w * mul));
    }
    *reinterpret_cast<uint4*>(dst + col) = packed;
}

// Q, K, V in bf16 for the kernels below: qb [rows][q_heads][D] = q · scale · log2(e) (so the
// softmax can use exp2), kb and vb [rows][kv_heads][D]; columns at or beyond head_dim are zeros.
// With `gates`, also the output gate's sigmoid, [rows][q_heads][head_dim] f32 into gate_out (the
// attention's output buffer, which the kernel then overwrites in place): computed here by every
// thread of the GPU at once instead of in each block's epilogue, where it would wait at the end of
// the longest blocks. One thread per 8 values (two float4 loads, one 16-byte store).
extern "C" __global__ void flash_bf16_inputs(const float* __restrict__ qg, const float* __restrict__ k,
                                             const float* __restrict__ v, u32 rows, int q_heads,
                                             int kv_heads, int head_dim, int d, float scale,
                                             __nv_bfloat16* __restrict__ qb, __nv_bfloat16* __restrict__ kb,
                                             __nv_bfloat16* __restrict__ vb, float* __restrict__ gate_out,
                                             int gates) {
    const int parts = d / 8;
    const int heads = q_heads + 2 * kv_heads + (gates ? q_heads : 0);
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * heads * parts) return;
    const int col = (int)(i % parts) * 8;
    const i64 rh = i / parts;
    const int hh = (int)(rh % heads);
    const i64 row = rh / heads;
    if (hh >= q_heads + 2 * kv_heads) {
        const int gh = hh - q_heads - 2 * kv_heads;
        if (col >= head_dim) return;
        const float* src = qg + (row * q_heads + gh) * 2 * head_dim + head_dim + col;
        float* dst = gate_out + (row * q_heads + gh) * head_dim + col;
        const float4 a = *reinterpret_cast<const float4*>(src);
        const float4 b = *reinterpret_cast<const float4*>(src + 4);
        *reinterpret_cast<float4*>(dst) = make_float4(sigmoid_f(a.x), sigmoid_f(a.y), sigmoid_f(a.z), sigmoid_f(a.w));
        *reinterpret_cast<float4*>(dst + 4) = make_float4(sigmoid_f(b.x), sigmoid_f(b.y), sigmoid_f(b.z), sigmoid_f(b.w));
        return;
    }
    const float* src;
    __nv_bfloat16* dst;
    float mul = 1.0f;
    if (hh < q_heads) {
        src = qg + (row * q_heads + hh) * 2 * head_dim;
        dst = qb + (row * q_heads + hh) * d;
        mul = scale * 1.4426950408889634f;
    } else if (hh < q_heads + kv_heads) {
        src = k + (row * kv_heads + hh - q_heads) * head_dim;
        dst = kb + (row * kv_heads + hh - q_heads) * d;
    } else {
        src = v + (row * kv_heads + hh - q_heads - kv_heads) * head_dim;
        dst = vb + (row * kv_heads + hh - q_heads - kv_heads) * d;
    }
    fa_store_part(src, dst, col, head_dim, mul);
}

// cp.async of one tile (ROWS rows of D bf16 from a [rows][heads][D] array) into shared memory.
// Thread tid copies 16-byte part (tid % (D/8)) of tile rows tid / (D/8) + e · THREADS / (D/8).
// Rows at or beyond `limit` are filled with zeros; `base` points at the tile's first row and head.
template <int D, int THREADS, int ROWS>
__device__ __forceinline__ void fa_load_tile(u32 dst, const __nv_bfloat16* base, i64 row_stride,
                                             int first, int limit) {
    constexpr int PARTS = D / 8;
    constexpr int RSTEP = THREADS / PARTS;
    static_assert(THREADS % PARTS == 0 && ROWS % RSTEP == 0, "whole rows per pass");
    const int tid = threadIdx.x;
    const int r0 = tid / PARTS;
    const int col = (tid % PARTS) * 8;
#pragma unroll
    for (int e = 0; e < ROWS / RSTEP; ++e) {
        const int r = r0 + e * RSTEP;
        const bool ok = first + r < limit;
        const __nv_bfloat16* src = ok ? base + (i64)r * row_stride + col : base;
        cp_async16(dst + (u32)(r * (D + FA_PAD) + col) * 2, src, ok);
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

// The sequence whose (clamped) rows are [seq_start, seq_start + len), len > 0: a found tile's.
__device__ __forceinline__ int fa_seq_of(const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,
                                         u32 seq_start, int len) {
    const u32 end = seq_start + (u32)len;
    for (int s = 0; s < num_seqs; ++s) {
        if (min(cu_seqlens[s], rows) == seq_start && min(cu_seqlens[s + 1], rows) == end) return s;
    }
    return 0;  // not reached for a found tile
}

// Where the output gate comes from: with `gate_in_out`, its sigmoid already in `out` (f32, written
// there by flash_bf16_inputs); else in the gate columns of `qg`: its sigmoid (attention_prologue's),
// or for LAST (one row per sequence) the raw gate, whose sigmoid the epilogue takes.

// D: the head size the block is laid out for (64, 128 or 256); head_dim <= D, a multiple of 16.
// WARPS: warps per block (16 query rows each). NARROW: grid (q_heads, tiles) with the warp-parallel
// tile search, else (tiles, q_heads) with the serial one. qb, kb, vb as `flash_bf16_inputs` (or
// `attention_prologue`) writes them; qg (f32 rows of qg_stride values, per head the query then the
// gate) for the output gate, as gate_in_out says. out is f32, or bf16 with out_bf16 (the o_proj's
// input, rounded as the GEMM would round it). LAST: only each sequence's last row (grid (q_heads,
// num_seqs), block y = sequence; the block takes the sequence's last tile, only the warp holding the
// last row computes, and out is [num_seqs][q_heads][head_dim]). SPLIT (with LAST): block z takes
// key tiles [z·tiles_per_split, (z+1)·tiles_per_split) of its sequence only (blocks past the
// sequence's tiles exit) and writes, instead of the output, its unnormalised partial row and its
// running max and denominator to `partial` ([num_seqs][q_heads][gridDim.z][D + 2]: the D values,
// then m, then l), which `flash_last_combine` merges: one long sequence's keys spread over many
// SMs instead of one block walking them all.
//
// PREFIX: sequence s's queries follow cu_prefix[s + 1] − cu_prefix[s] prefix keys (a resumed
// prefix state), and kb/vb hold joined rows: from row cu_seqlens[s] + cu_prefix[s], the prefix's
// keys then the sequence's own (prefix_rows in all; attention_prologue and flash_prefix_rows
// write them). Query row r sees joined keys 0..=r + prefix: the key tiles, their order and the
// rounding are those of the whole prompt's run, so a resumed answer computes as the whole one.
//
// BIDIR (the vision tower): every query row of a segment sees every key of it (no causal mask,
// keys past the segment masked), and there is no output gate (qg, qg_stride and gate_in_out are
// not read). Not with LAST, SPLIT or PREFIX.
template <int D, int WARPS, bool NARROW, bool LAST, bool SPLIT, bool PREFIX = false, bool BIDIR = false>
__device__ __forceinline__ void flash_attention_impl(
    const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,
    const __nv_bfloat16* __restrict__ vb, const float* __restrict__ qg, i64 qg_stride, int gate_in_out,
    const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows, void* __restrict__ out, int out_bf16,
    int q_heads, int kv_heads, int head_dim, int tiles_per_split, float* __restrict__ partial,
    const u32* __restrict__ cu_prefix = nullptr, u32 prefix_rows = 0) {
    constexpr int FA_BM = WARPS * 16;      // query rows per block
    constexpr int FA_THREADS = WARPS * 32;
    constexpr int STRIDE = D + FA_PAD;  // shared-memory row stride, bf16 elements
    constexpr int KSTEPS = D / 16;      // 16-wide steps over the head dim (QKᵀ depth, PV width)

    int tile = -1;
    u32 seq_start = 0;
    int len = 0;
    bool found;
    if (LAST) {
        const int seq = blockIdx.y;
        const u32 a = min(cu_seqlens[seq], rows);
        const u32 b = min(cu_seqlens[seq + 1], rows);
        found = seq < num_seqs && b > a;
        seq_start = a;
        len = found ? (int)(b - a) : 0;
        tile = found ? (len - 1) / FA_BM : 0;
    } else {
        found = NARROW ? find_tile_warp<FA_BM>(cu_seqlens, num_seqs, rows, blockIdx.y, tile,
                                               seq_start, len)
                       : fa_find_tile_serial<FA_BM>(cu_seqlens, num_seqs, rows, blockIdx.x, tile,
                                                    seq_start, len);
    }
    if (!found) return;  // uniform over the block, before any barrier

    // The sequence's prefix keys (PREFIX) and where its keys start in kb/vb.
    int pre = 0;
    i64 key_base = seq_start;
    if (PREFIX) {
        const int s = LAST ? (int)blockIdx.y : fa_seq_of(cu_seqlens, num_seqs, rows, seq_start, len);
        const u32 pa = min(cu_prefix[s], prefix_rows);
        const u32 pb = min(cu_prefix[s + 1], prefix_rows);
        pre = pb > pa ? (int)(pb - pa) : 0;
        key_base += pa;
    }

    const int h = NARROW ? blockIdx.x : blockIdx.y;
    const int kvh = h / (q_heads / kv_heads);
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;  // fragment row (and row + 8)
    const int tq = lane & 3;  // fragment column pair
    const int q0 = tile * FA_BM;             // first query row of the block, within the sequence
    // Keys any row of the block can see.
    const int kv_len = BIDIR ? len : pre + min(q0 + FA_BM, len);
    int j_begin = 0;
    int n_tiles = (kv_len + FA_BN - 1) / FA_BN;  // one past the last key tile of this block
    if (SPLIT) {
        j_begin = blockIdx.z * tiles_per_split;
        if (j_begin >= n_tiles) return;  // uniform over the block, before any barrier
        n_tiles = min(n_tiles, j_begin + tiles_per_split);
    }
    const int wrow = q0 + warp * 16;         // first query row of this warp
    // LAST: only the warp holding the sequence's last row has rows to compute.
    const bool warp_rows = LAST ? wrow <= len - 1 && len - 1 < wrow + 16 : wrow < len;

    __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(fa_smem);
    __nv_bfloat16* s_k = s_q + FA_BM * STRIDE;
    __nv_bfloat16* s_v = s_k + FA_BN * STRIDE;
    const u32 sq = smem_addr(s_q), sk = smem_addr(s_k), sv = smem_addr(s_v);
    const i64 kv_row = (i64)kv_heads * D;
    const __nv_bfloat16* k_seq = kb + key_base * kv_row + (i64)kvh * D;
    const __nv_bfloat16* v_seq = vb + key_base * kv_row + (i64)kvh * D;

    // Groups in flight at the top of step j: {K_j} (with Q at j = 0), then {V_j}.
    fa_load_tile<D, FA_THREADS, FA_BM>(sq, qb + ((i64)(seq_start + q0) * q_heads + h) * D,
                                       (i64)q_heads * D, q0, len);
    const int first_key = j_begin * FA_BN;
    fa_load_tile<D, FA_THREADS, FA_BN>(sk, k_seq + (i64)first_key * kv_row, kv_row, first_key, kv_len);
    cp_async_commit();
    fa_load_tile<D, FA_THREADS, FA_BN>(sv, v_seq + (i64)first_key * kv_row, kv_row, first_key, kv_len);
    cp_async_commit();

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

    for (int j = j_begin; j < n_tiles; ++j) {
        const int key0 = j * FA_BN;
        const bool has_next = j + 1 < n_tiles;
        // Warps whose rows all precede the tile (or lie past the sequence) skip the math but still
        // copy and reach every barrier.
        const bool active = warp_rows && (BIDIR || key0 <= wrow + 15 + pre);

        cp_async_wait<1>();  // K_j (V_j may still be in flight)
        __syncthreads();

        // S = Q Kᵀ.
        float s[FA_BN / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (active) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                u32 qa[4];
                ldmatrix_x4(qa, q_addr + kk * 32);
#pragma unroll
                for (int np = 0; np < FA_BN / 16; ++np) {
                    u32 kb4[4];
                    ldmatrix_x4(kb4, k_addr + (np * 16 * STRIDE + kk * 16) * 2);
                    mma_bf16_16816(s[2 * np], qa, kb4[0], kb4[1]);
                    mma_bf16_16816(s[2 * np + 1], qa, kb4[2], kb4[3]);
                }
            }
        }

        // Online softmax over this tile, then P as bf16 A fragments.
        u32 p[FA_BN / 16][4];
        if (active) {
            const int r0 = wrow + g + pre;  // the row's last visible key
            if (BIDIR) {
                if (key0 + FA_BN > len) {  // the tile runs past the segment (its rows load as zeros)
#pragma unroll
                    for (int n = 0; n < FA_BN / 8; ++n) {
                        const int key = key0 + n * 8 + tq * 2;
                        if (key >= len) s[n][0] = s[n][2] = F32_NEG_INF;
                        if (key + 1 >= len) s[n][1] = s[n][3] = F32_NEG_INF;
                    }
                }
            } else if (key0 + FA_BN - 1 > wrow + pre) {  // the tile crosses this warp's diagonal
#pragma unroll
                for (int n = 0; n < FA_BN / 8; ++n) {
                    const int key = key0 + n * 8 + tq * 2;
                    if (key > r0) s[n][0] = F32_NEG_INF;
                    if (key + 1 > r0) s[n][1] = F32_NEG_INF;
                    if (key > r0 + 8) s[n][2] = F32_NEG_INF;
                    if (key + 1 > r0 + 8) s[n][3] = F32_NEG_INF;
                }
            }
            float c0, c1;
            online_softmax_tile<FA_BN / 8>(s, m0, m1, l0, l1, c0, c1);
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
            for (int ks = 0; ks < FA_BN / 16; ++ks) {
                p[ks][0] = pack_bf16x2(s[2 * ks][0], s[2 * ks][1]);
                p[ks][1] = pack_bf16x2(s[2 * ks][2], s[2 * ks][3]);
                p[ks][2] = pack_bf16x2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
                p[ks][3] = pack_bf16x2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
            }
        }

        __syncthreads();  // every warp is done reading K_j
        if (has_next) fa_load_tile<D, FA_THREADS, FA_BN>(sk, k_seq + (i64)(key0 + FA_BN) * kv_row, kv_row,
                                                         key0 + FA_BN, kv_len);
        cp_async_commit();
        cp_async_wait<1>();  // V_j
        __syncthreads();

        // O += P V.
        if (active) {
#pragma unroll
            for (int dp = 0; dp < KSTEPS; ++dp) {
#pragma unroll
                for (int ks = 0; ks < FA_BN / 16; ++ks) {
                    u32 vb4[4];
                    ldmatrix_x4_trans(vb4, v_addr + (ks * 16 * STRIDE + dp * 16) * 2);
                    mma_bf16_16816(o[2 * dp], p[ks], vb4[0], vb4[1]);
                    mma_bf16_16816(o[2 * dp + 1], p[ks], vb4[2], vb4[3]);
                }
            }
        }
        __syncthreads();  // every warp is done reading V_j
        if (has_next) fa_load_tile<D, FA_THREADS, FA_BN>(sv, v_seq + (i64)(key0 + FA_BN) * kv_row, kv_row,
                                                         key0 + FA_BN, kv_len);
        cp_async_commit();
    }

    if (!warp_rows) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (SPLIT) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (wrow + g + half * 8 != len - 1) continue;
            float* p = partial + (((i64)blockIdx.y * q_heads + h) * gridDim.z + blockIdx.z) * (D + 2);
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                *reinterpret_cast<float2*>(p + n * 8 + tq * 2) = make_float2(o[n][half * 2], o[n][half * 2 + 1]);
            }
            if (tq == 0) {
                p[D] = half == 0 ? m0 : m1;
                p[D + 1] = half == 0 ? l0 : l1;
            }
        }
        return;
    }
    // The gate (see gate_in_out). Its values come in batches of GB column groups for both rows,
    // every load of a batch issued before the first use: one memory wait per batch, not one per
    // value.
    constexpr int GB = 8;
    bool keep[2];
    float inv[2];
    const float* gate[2];
    i64 dst[2];  // index of the row's first output value
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = wrow + g + half * 8;
        keep[half] = r < len && (!LAST || r == len - 1);
        inv[half] = 1.0f / (half == 0 ? l0 : l1);
        const i64 row = (i64)seq_start + min(r, len - 1);
        const i64 out_row = LAST ? (i64)blockIdx.y : row;
        dst[half] = (out_row * q_heads + h) * head_dim;
        gate[half] = BIDIR         ? nullptr
                     : gate_in_out ? static_cast<const float*>(out) + dst[half]
                                   : qg + row * qg_stride + (i64)h * 2 * head_dim + head_dim;
    }
#pragma unroll
    for (int n0 = 0; n0 < D / 8; n0 += GB) {
        float2 gt[2][GB];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int u = 0; u < GB; ++u) {
                const int col = (n0 + u) * 8 + tq * 2;
                gt[half][u] = BIDIR ? make_float2(1.0f, 1.0f)
                              : keep[half] && col < head_dim ? *reinterpret_cast<const float2*>(gate[half] + col)
                                                             : make_float2(0.0f, 0.0f);
                if (LAST) gt[half][u] = make_float2(sigmoid_f(gt[half][u].x), sigmoid_f(gt[half][u].y));
            }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int u = 0; u < GB; ++u) {
                const int n = n0 + u;
                const int col = n * 8 + tq * 2;
                if (keep[half] && col < head_dim) {
                    const float2 y = make_float2(o[n][half * 2] * inv[half] * gt[half][u].x,
                                                 o[n][half * 2 + 1] * inv[half] * gt[half][u].y);
                    if (out_bf16) {
                        *reinterpret_cast<u32*>(static_cast<__nv_bfloat16*>(out) + dst[half] + col) =
                            pack_bf16x2(y.x, y.y);
                    } else {
                        *reinterpret_cast<float2*>(static_cast<float*>(out) + dst[half] + col) = y;
                    }
                }
            }
        }
    }
}

// One entry point per head-size bucket and shape: the shared-memory layout and register tiles are
// fixed at compile time. Launch with 32·WARPS threads and (16·WARPS + 2·FA_BN)·(D + FA_PAD)·2
// bytes of dynamic shared memory; grid (ceil(rows / BM) + num_seqs, q_heads) for the wide kernel,
// (q_heads, ceil(rows / BM) + num_seqs) for the narrow one, (q_heads, num_seqs) for the last-row one.
#define FA_ENTRY(NAME, D, WARPS, NARROW, LAST, SPLIT, MIN_BLOCKS)                                 \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) NAME(                     \
        const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,               \
        const __nv_bfloat16* __restrict__ vb, const float* __restrict__ qg, i64 qg_stride,        \
        int gate_in_out, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,              \
        void* __restrict__ out, int out_bf16, int q_heads, int kv_heads, int head_dim,            \
        int tiles_per_split, float* __restrict__ partial) {                                       \
        flash_attention_impl<D, WARPS, NARROW, LAST, SPLIT>(                                      \
            qb, kb, vb, qg, qg_stride, gate_in_out, cu_seqlens, num_seqs, rows, out, out_bf16,    \
            q_heads, kv_heads, head_dim, tiles_per_split, partial);                               \
    }

FA_ENTRY(flash_attention_d64, 64, 8, false, false, false, 1)
FA_ENTRY(flash_attention_d128, 128, 8, false, false, false, 1)
FA_ENTRY(flash_attention_d256, 256, 8, false, false, false, 1)
FA_ENTRY(flash_attention_narrow_d64, 64, 4, true, false, false, 2)
FA_ENTRY(flash_attention_narrow_d128, 128, 4, true, false, false, 2)
FA_ENTRY(flash_attention_narrow_d256, 256, 4, true, false, false, 2)
FA_ENTRY(flash_attention_last_d64, 64, 4, true, true, false, 2)
FA_ENTRY(flash_attention_last_d128, 128, 4, true, true, false, 2)
FA_ENTRY(flash_attention_last_d256, 256, 4, true, true, false, 2)
FA_ENTRY(flash_attention_last_split_d64, 64, 4, true, true, true, 2)
FA_ENTRY(flash_attention_last_split_d128, 128, 4, true, true, true, 2)
FA_ENTRY(flash_attention_last_split_d256, 256, 4, true, true, true, 2)

// The prefix forms (PREFIX above): the narrow layout for every row, the last-row one for each
// sequence's last row, unsplit or over key splits (the splits count joined key tiles, so a
// resumed last row is summed as its whole prompt's split last row is). The arguments of
// FA_ENTRY, then cu_prefix and prefix_rows.
#define FA_PREFIX_ENTRY(NAME, D, LAST, SPLIT)                                                     \
    extern "C" __global__ void __launch_bounds__(128, 2) NAME(                                    \
        const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,               \
        const __nv_bfloat16* __restrict__ vb, const float* __restrict__ qg, i64 qg_stride,        \
        int gate_in_out, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,              \
        void* __restrict__ out, int out_bf16, int q_heads, int kv_heads, int head_dim,            \
        int tiles_per_split, float* __restrict__ partial, const u32* __restrict__ cu_prefix,      \
        u32 prefix_rows) {                                                                        \
        flash_attention_impl<D, 4, true, LAST, SPLIT, true>(                                      \
            qb, kb, vb, qg, qg_stride, gate_in_out, cu_seqlens, num_seqs, rows, out, out_bf16,    \
            q_heads, kv_heads, head_dim, tiles_per_split, partial, cu_prefix, prefix_rows);       \
    }

FA_PREFIX_ENTRY(flash_attention_prefix_d64, 64, false, false)
FA_PREFIX_ENTRY(flash_attention_prefix_d128, 128, false, false)
FA_PREFIX_ENTRY(flash_attention_prefix_d256, 256, false, false)
FA_PREFIX_ENTRY(flash_attention_prefix_last_d64, 64, true, false)
FA_PREFIX_ENTRY(flash_attention_prefix_last_d128, 128, true, false)
FA_PREFIX_ENTRY(flash_attention_prefix_last_d256, 256, true, false)
FA_PREFIX_ENTRY(flash_attention_prefix_last_split_d64, 64, true, true)
FA_PREFIX_ENTRY(flash_attention_prefix_last_split_d128, 128, true, true)
FA_PREFIX_ENTRY(flash_attention_prefix_last_split_d256, 256, true, true)

// The bidirectional form (BIDIR above) in the narrow layout, for the vision tower's attention
// within each image: the arguments of FA_ENTRY (qg, qg_stride and gate_in_out unread; kv_heads =
// q_heads).
#define FA_BIDIR_ENTRY(NAME, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 2) NAME(                                    \
        const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,               \
        const __nv_bfloat16* __restrict__ vb, const float* __restrict__ qg, i64 qg_stride,        \
        int gate_in_out, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,              \
        void* __restrict__ out, int out_bf16, int q_heads, int kv_heads, int head_dim,            \
        int tiles_per_split, float* __restrict__ partial) {                                       \
        flash_attention_impl<D, 4, true, false, false, false, true>(                              \
            qb, kb, vb, qg, qg_stride, gate_in_out, cu_seqlens, num_seqs, rows, out, out_bf16,    \
            q_heads, kv_heads, head_dim, tiles_per_split, partial);                               \
    }

FA_BIDIR_ENTRY(flash_attention_bidir_d64, 64)
FA_BIDIR_ENTRY(flash_attention_bidir_d128, 128)
FA_BIDIR_ENTRY(flash_attention_bidir_d256, 256)

// The bidirectional form in the wide layout (8 warps, 128 query rows per block, grid (query tiles,
// heads)), for long segments such as a whole screenshot: each K/V tile a block loads serves twice
// the query rows. A row's keys are summed in the same tile order as in the narrow layout, so both
// give the same bits.
#define FA_BIDIR_WIDE_ENTRY(NAME, D, MIN_BLOCKS)                                                  \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) NAME(                           \
        const __nv_bfloat16* __restrict__ qb, const __nv_bfloat16* __restrict__ kb,               \
        const __nv_bfloat16* __restrict__ vb, const float* __restrict__ qg, i64 qg_stride,        \
        int gate_in_out, const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,              \
        void* __restrict__ out, int out_bf16, int q_heads, int kv_heads, int head_dim,            \
        int tiles_per_split, float* __restrict__ partial) {                                       \
        flash_attention_impl<D, 8, false, false, false, false, true>(                             \
            qb, kb, vb, qg, qg_stride, gate_in_out, cu_seqlens, num_seqs, rows, out, out_bf16,    \
            q_heads, kv_heads, head_dim, tiles_per_split, partial);                               \
    }

FA_BIDIR_WIDE_ENTRY(flash_attention_bidir_wide_d64, 64, 2)
FA_BIDIR_WIDE_ENTRY(flash_attention_bidir_wide_d128, 128, 2)
FA_BIDIR_WIDE_ENTRY(flash_attention_bidir_wide_d256, 256, 1)

// The vision tower's stacked qkv (f32 [rows][q | k | v][heads][head_dim]) as the bidirectional
// kernel's bf16 inputs [rows][heads][d]: q times scale·log2(e), columns at or beyond head_dim zero
// (head_dim a multiple of 16: a part of 8 is wholly in or out). One thread per 8 values.
extern "C" __global__ void flash_bidir_inputs(const float* __restrict__ qkv, u32 rows, int heads, int head_dim,
                                              int d, float scale, __nv_bfloat16* __restrict__ qb,
                                              __nv_bfloat16* __restrict__ kb, __nv_bfloat16* __restrict__ vb) {
    const int parts = d / 8;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * 3 * heads * parts) return;
    const int col = (int)(i % parts) * 8;
    const i64 rh = i / parts;
    const int hh = (int)(rh % (3 * heads));  // which of q, k, v (hh / heads) and head (hh % heads)
    const i64 row = rh / (3 * heads);
    const int which = hh / heads, h = hh % heads;
    const float* src = qkv + (row * 3 * heads + hh) * head_dim;
    __nv_bfloat16* dst = (which == 0 ? qb : which == 1 ? kb : vb) + (row * heads + h) * d;
    const float mul = which == 0 ? scale * 1.4426950408889634f : 1.0f;
    fa_store_part(src, dst, col, head_dim, mul);
}

// flash_bidir_inputs from the qkv product before its bias and rotary: per value the same f32 ops as
// add_bias, then rope_axial on q and k (axial_rotate), then flash_bidir_inputs, in one pass over
// qkv instead of four. head_dim = d, a multiple of 16. One thread per (row, q|k|v head, 8 pairs
// (j, j + half)): 16 values read, 16 stored.
extern "C" __global__ void flash_bidir_inputs_rope(const float* __restrict__ qkv, const __nv_bfloat16* __restrict__ bias,
                                                   const u32* __restrict__ positions, const AxialFreqs freqs,
                                                   u32 rows, int heads, int head_dim, float scale,
                                                   __nv_bfloat16* __restrict__ qb, __nv_bfloat16* __restrict__ kb,
                                                   __nv_bfloat16* __restrict__ vb) {
    const int half = head_dim / 2;
    const int parts = half / 8;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * 3 * heads * parts) return;
    const int col = (int)(i % parts) * 8;
    const i64 rh = i / parts;
    const int hh = (int)(rh % (3 * heads));  // which of q, k, v (hh / heads) and head (hh % heads)
    const i64 row = rh / (3 * heads);
    const int which = hh / heads, h = hh % heads;
    const float* src = qkv + (row * 3 * heads + hh) * head_dim;
    const i64 b0 = (i64)hh * head_dim;
    float a[8], b[8];
    {
        const float4 a0 = load4(src + col), a1 = load4(src + col + 4);
        const float4 c0 = load4(src + col + half), c1 = load4(src + col + half + 4);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            a[e] = av[e] + load_bf16(bias, b0 + col + e);
            b[e] = bv[e] + load_bf16(bias, b0 + col + half + e);
        }
    }
    if (which < 2) {
#pragma unroll
        for (int e = 0; e < 8; ++e) axial_rotate(positions, freqs, row, col + e, half, a[e], b[e]);
    }
    const float mul = which == 0 ? scale * 1.4426950408889634f : 1.0f;
    __nv_bfloat16* dst = (which == 0 ? qb : which == 1 ? kb : vb) + (row * heads + h) * head_dim;
    *reinterpret_cast<uint4*>(dst + col) =
        make_uint4(pack_bf16x2(a[0] * mul, a[1] * mul), pack_bf16x2(a[2] * mul, a[3] * mul),
                   pack_bf16x2(a[4] * mul, a[5] * mul), pack_bf16x2(a[6] * mul, a[7] * mul));
    *reinterpret_cast<uint4*>(dst + col + half) =
        make_uint4(pack_bf16x2(b[0] * mul, b[1] * mul), pack_bf16x2(b[2] * mul, b[3] * mul),
                   pack_bf16x2(b[4] * mul, b[5] * mul), pack_bf16x2(b[6] * mul, b[7] * mul));
}

// Prefix keys and values (f32 [prefix_rows][kv_heads·head_dim], normed and roped k, as a snapshot
// holds them) as bf16 into the joined rows of kb and vb [..][kv_heads][d]: prefix row p of
// sequence s goes to joined row cu_seqlens[s] + p (the sequence's own rows before it are those of
// the earlier sequences). Columns from head_dim to d are zeros. One thread per 8 values.
extern "C" __global__ void flash_prefix_rows(const float* __restrict__ pk, const float* __restrict__ pv,
                                             u32 prefix_rows, int kv_heads, int head_dim, int d,
                                             const u32* __restrict__ cu_prefix,
                                             const u32* __restrict__ cu_seqlens, int num_seqs,
                                             __nv_bfloat16* __restrict__ kb, __nv_bfloat16* __restrict__ vb) {
    const int parts = d / 8;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)prefix_rows * 2 * kv_heads * parts) return;
    const int col = (int)(i % parts) * 8;
    const i64 rh = i / parts;
    const int hh = (int)(rh % (2 * kv_heads));
    const u32 p = (u32)(rh / (2 * kv_heads));
    const int s = sequence_of_row(cu_prefix, num_seqs, p);
    if (s < 0) return;
    const bool is_v = hh >= kv_heads;
    const int h = is_v ? hh - kv_heads : hh;
    const float* src = (is_v ? pv : pk) + ((i64)p * kv_heads + h) * head_dim;
    const i64 joined = (i64)cu_seqlens[s] + p;
    __nv_bfloat16* dst = (is_v ? vb : kb) + (joined * kv_heads + h) * d;
    // Times 1: the value itself (exact), as the prologue rounds the whole prompt's keys.
    fa_store_part(src, dst, col, head_dim, 1.0f);
}

// Merges the split last-row partials (see SPLIT above) of sequence blockIdx.x and query head
// blockIdx.y: with M the largest running max, out = Σ 2^(m_z − M)·o_z / Σ 2^(m_z − M)·l_z, times the
// sigmoid of the row's raw gate (from qg, as the last-row kernel takes it), f32 or bf16 (out_bf16).
// Only the splits that hold key tiles of the sequence are read: of its own keys and, after a
// prefix (cu_prefix, as the prefix form takes it; prefix_rows 0 where there is none), of its
// joined keys. One thread per column.
extern "C" __global__ void flash_last_combine(const float* __restrict__ partial, int splits, int tiles_per_split,
                                              const u32* __restrict__ cu_seqlens, int num_seqs, u32 rows,
                                              const float* __restrict__ qg, i64 qg_stride,
                                              void* __restrict__ out, int out_bf16, int q_heads, int head_dim,
                                              int d, const u32* __restrict__ cu_prefix, u32 prefix_rows) {
    const int seq = blockIdx.x;
    const int h = blockIdx.y;
    if (seq >= num_seqs) return;
    const u32 a = min(cu_seqlens[seq], rows);
    const u32 b = min(cu_seqlens[seq + 1], rows);
    if (b <= a) return;
    const u32 pa = min(cu_prefix[seq], prefix_rows);
    const u32 pb = min(cu_prefix[seq + 1], prefix_rows);
    const int keys = (int)(b - a) + (pb > pa ? (int)(pb - pa) : 0);
    const int used = min(splits, ((keys + FA_BN - 1) / FA_BN + tiles_per_split - 1) / tiles_per_split);
    const float* p = partial + ((i64)seq * q_heads + h) * splits * (d + 2);
    float m = F32_NEG_INF;
    for (int z = 0; z < used; ++z) m = fmaxf(m, p[z * (d + 2) + d]);
    float l = 0.0f;
    for (int z = 0; z < used; ++z) l += exp2f(p[z * (d + 2) + d] - m) * p[z * (d + 2) + d + 1];
    const float inv = 1.0f / l;
    const float* gate = qg + (i64)(b - 1) * qg_stride + (i64)h * 2 * head_dim + head_dim;
    const i64 dst = ((i64)seq * q_heads + h) * head_dim;
    for (int col = threadIdx.x; col < head_dim; col += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < used; ++z) acc += exp2f(p[z * (d + 2) + d] - m) * p[z * (d + 2) + col];
        const float y = acc * inv * sigmoid_f(gate[col]);
        if (out_bf16) {
            static_cast<__nv_bfloat16*>(out)[dst + col] = __float2bfloat16_rn(y);
        } else {
            static_cast<float*>(out)[dst + col] = y;
        }
    }
}
