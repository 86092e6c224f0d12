// Gated delta rule, chunked: the recurrence of gated_delta_rule_recurrent (delta.cu),
//   S ← e^g S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀ q,
// computed 64 tokens at a time with the WY representation, as the CPU reference's `chunked`
// (kernels/src/cpu/delta.rs). Per chunk, with γ the cumulative log-decay inside the chunk and S0
// the state at its start:
//   A   = strictly-lower(β_i (k_i·k_j) e^{γ_i−γ_j}),   T = (I + A)⁻¹
//   W   = T (β e^γ K),   U = T (β V),   V' = U − W S0
//   O_i = e^{γ_i} q_i S0 + Σ_{j≤i} P_ij V'_j,   P_ij = (q_i·k_j) e^{γ_i−γ_j}
//   S   ← e^{γ_last} S0 + Σ_j e^{γ_last−γ_j} k_j V'_jᵀ
// Only differences γ_i − γ_j with i ≥ j are exponentiated, so nothing overflows however strong the
// decay.
//
// Two kernels, because only the last three lines depend on the state:
//  1. gdr_prepare: one block per (chunk, value head), all chunks of the batch at once, f32 SIMT.
//     Computes γ, A, P, T (by forward substitution), W, U, and the pre-scaled e^γ·scale·q and
//     e^{γ_last−γ}·k, and writes them to scratch laid out like the tokens ([rows][v_heads][..]),
//     so the second kernel finds a chunk's data at its rows.
//  2. gdr_state_pass: one block per (sequence, value head, slice of SV value columns) walks its
//     sequence's chunks in order. Per chunk it only does the four state products (V' = U − W S0,
//     e^γ q S0 + P V', and the state update), on bf16 tensor cores (mma.sync m16n8k16) with f32
//     accumulation; the state stays f32 in registers, its bf16 copy in shared memory feeds the
//     products (the precision of flash-linear-attention's kernels). The next chunk's tiles stream in
//     with cp.async while the current one computes.
//
// Key and value heads up to 128 wide; narrower ones are zero-padded to 128 (the padding stays
// exactly zero in every product). A partial last chunk is zero-padded the same way: β = 0 and
// k = q = v = 0 make its padded rows of A, W, U, V' and P vanish, and the second kernel loads its
// rows past the sequence as zeros.

#define DC_CHUNK 64
#define DC_DK 128
#define DC_THREADS 256
// Row stride of the 64×64 A and P tiles: rows stay float4-aligned, and a thread's 4×4 tile store
// (4 rows 4 floats wide) spreads consecutive tiles over different banks.
#define DC_AP 68

extern __shared__ float4 dc_smem[];

// Index into a [64][128] q / k tile. The float4 groups of row r are XOR-swizzled by (r / 4) % 8:
// the A and P products read 8 rows 4 apart at once, which unswizzled would all hit the same 4
// banks; a row's 128 values stay a permutation of its own 32 float4 groups.
__device__ __forceinline__ int dc_qk(int row, int k) {
    return row * DC_DK + ((((k >> 2) ^ ((row >> 2) & 7)) << 2) | (k & 3));
}

__device__ __forceinline__ float4 dc_ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__device__ __forceinline__ void dc_st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

__device__ __forceinline__ float dc_dot4(float4 a, float4 b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: the per-chunk quantities.
//
// Scratch outputs, row r of the batch, value head h (H = v_heads):
//   w_out [r][H][128] bf16   W          u_out [r][H][128] f32    U
//   q_out [r][H][128] bf16   e^γ·scale·q k_out [r][H][128] bf16  e^{γ_last−γ}·k
//   p_out [r][H][64]  bf16   row of P (zero above the diagonal)
//   gam_out [r][H]    f32    γ
// Grid (ceil(rows / 64) + num_seqs chunk slots, v_heads), 256 threads; slots past the batch's
// chunks return at once. Dynamic shared memory: 2·64·128 + 2·64·68 + 5·64 floats (101,632 bytes).

extern "C" __global__ void __launch_bounds__(DC_THREADS, 2)
    gdr_prepare(const float* __restrict__ qkv, const float* __restrict__ beta, const float* __restrict__ g,
                const u32* __restrict__ cu_seqlens, int num_seqs, int k_heads, int v_heads, int k_dim,
                int v_dim, float scale, u32 rows_cap, __nv_bfloat16* __restrict__ w_out,
                float* __restrict__ u_out, __nv_bfloat16* __restrict__ q_out,
                __nv_bfloat16* __restrict__ k_out, __nv_bfloat16* __restrict__ p_out,
                float* __restrict__ gam_out) {
    constexpr int CH = DC_CHUNK;
    constexpr int DK = DC_DK;
    float* const Ks = reinterpret_cast<float*>(dc_smem);  // [CH][DK] swizzled: k
    float* const Qs = Ks + CH * DK;                       // [CH][DK] swizzled: scaled q
    float* const As = Qs + CH * DK;                       // [CH][DC_AP]: A (strictly lower part)
    float* const Ps = As + CH * DC_AP;                    // [CH][DC_AP]: P (lower part, 0 above)
    float* const graw = Ps + CH * DC_AP;                  // [CH]: g
    float* const gam = graw + CH;                         // [CH]: γ, cumulative g in the chunk
    float* const bet = gam + CH;                          // [CH]: β
    float* const egam = bet + CH;                         // [CH]: e^{γ_i}
    float* const edec = egam + CH;                        // [CH]: e^{γ_last − γ_j}

    int tile = 0;
    u32 seq_start = 0;
    int len = 0;
    if (!find_tile_warp<CH>(cu_seqlens, num_seqs, rows_cap, blockIdx.x, tile, seq_start, len)) return;
    const u32 c0 = seq_start + (u32)tile * CH;
    const int n = min(CH, len - tile * CH);

    const int h = blockIdx.y;
    const int tid = threadIdx.x;
    const int kh = h / (v_heads / k_heads);
    const i64 width = 2 * (i64)k_heads * k_dim + (i64)v_heads * v_dim;
    const i64 q_at = (i64)kh * k_dim;
    const i64 k_at = (i64)k_heads * k_dim + (i64)kh * k_dim;
    const i64 v_at = 2 * (i64)k_heads * k_dim + (i64)h * v_dim;

    // ---- 1. Stage q (scaled) and k, g, β; zeros past n and past k_dim. Eight rows' loads are
    // issued before any of them is stored, so their memory latencies overlap.
    {
        constexpr int BATCH = 8;
        constexpr int STEP = DC_THREADS / DK;  // rows per pass of all threads
        const int c = tid % DK;
        for (int i0 = tid / DK; i0 < CH; i0 += BATCH * STEP) {
            float qv[BATCH], kv[BATCH];
#pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                const int i = i0 + b * STEP;
                qv[b] = 0.0f;
                kv[b] = 0.0f;
                if (i < n && c < k_dim) {
                    const float* row = qkv + (i64)(c0 + i) * width;
                    qv[b] = row[q_at + c] * scale;
                    kv[b] = row[k_at + c];
                }
            }
#pragma unroll
            for (int b = 0; b < BATCH; ++b) {
                const int i = i0 + b * STEP;
                Qs[dc_qk(i, c)] = qv[b];
                Ks[dc_qk(i, c)] = kv[b];
            }
        }
        if (tid < CH) {
            graw[tid] = tid < n ? g[(i64)(c0 + tid) * v_heads + h] : 0.0f;
            bet[tid] = tid < n ? beta[(i64)(c0 + tid) * v_heads + h] : 0.0f;
        }
    }
    __syncthreads();

    // ---- 2. γ, summed left to right as the reference does.
    if (tid < CH) {
        float acc = 0.0f;
        for (int t = 0; t <= tid; ++t) acc += graw[t];
        gam[tid] = acc;
    }
    __syncthreads();

    // ---- 3. A and P (one 4×4 tile per thread), the decay factors. Threads 0..119 take the 120
    // tiles strictly below A's diagonal, threads 120..255 the 136 tiles on or below P's; the
    // strictly-lower entries of A's 16 diagonal tiles are done separately (threads 0..95).
    if (tid < CH) {
        const float gi = gam[tid];
        egam[tid] = expf(gi);
        edec[tid] = expf(gam[n - 1] - gi);
    }
    {
        const bool is_p = tid >= 120;
        int tj = is_p ? tid - 120 : tid;
        int ti = 0;
        while (tj > ti) {
            tj -= ti + 1;
            ++ti;
        }
        if (!is_p) ti += 1;
        const float* arows = (is_p ? Qs : Ks) + 4 * ti * DK;
        const float* brows = Ks + 4 * tj * DK;
        const int swa = ti & 7;
        const int swb = tj & 7;
        float acc[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
        }
#pragma unroll 2
        for (int kg = 0; kg < DK / 4; ++kg) {
            float4 a[4], b[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) a[r] = dc_ld4(arows + r * DK + ((kg ^ swa) << 2));
#pragma unroll
            for (int c = 0; c < 4; ++c) b[c] = dc_ld4(brows + c * DK + ((kg ^ swb) << 2));
#pragma unroll
            for (int r = 0; r < 4; ++r) {
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = dc_dot4(a[r], b[c], acc[r][c]);
            }
        }
        float* dst = is_p ? Ps : As;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = 4 * ti + r;
            const float gi = gam[i];
            const float bi = is_p ? 1.0f : bet[i];
            float v[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int j = 4 * tj + c;
                // P's diagonal tiles need their upper entries zero: they are written out.
                v[c] = i >= j ? bi * expf(gi - gam[j]) * acc[r][c] : 0.0f;
            }
            dc_st4(dst + i * DC_AP + 4 * tj, make_float4(v[0], v[1], v[2], v[3]));
        }
    }
    if (tid < 96) {
        // Entry (r, c), r > c, of A's diagonal tile d.
        const int d = tid / 6;
        const int e = tid % 6;
        const int r = e < 1 ? 1 : (e < 3 ? 2 : 3);
        const int c = e < 1 ? 0 : (e < 3 ? e - 1 : e - 3);
        const int i = 4 * d + r;
        const int j = 4 * d + c;
        const int sw = d & 7;
        float acc = 0.0f;
#pragma unroll 4
        for (int kg = 0; kg < DK / 4; ++kg) {
            acc = dc_dot4(dc_ld4(Ks + i * DK + ((kg ^ sw) << 2)), dc_ld4(Ks + j * DK + ((kg ^ sw) << 2)), acc);
        }
        As[i * DC_AP + j] = bet[i] * expf(gam[i] - gam[j]) * acc;
    }
    __syncthreads();

    // ---- 4. W = T (β e^γ K) (threads 0..127, one key column each) and U = T (β V) (threads
    // 128..255, one value column each): independent forward substitutions x_i = b_i − Σ_{j<i}
    // A_ij x_j, held in registers (every index is a constant once the loops unroll), written
    // straight to the scratch (consecutive threads, consecutive columns).
    {
        const bool w_col = tid < DK;
        const int c = w_col ? tid : tid - DK;
        float x[CH];
        if (w_col) {
#pragma unroll
            for (int i = 0; i < CH; ++i) x[i] = bet[i] * egam[i] * Ks[dc_qk(i, c)];
        } else {
#pragma unroll
            for (int i = 0; i < CH; ++i) {
                x[i] = (i < n && c < v_dim) ? bet[i] * qkv[(i64)(c0 + i) * width + v_at + c] : 0.0f;
            }
        }
#pragma unroll
        for (int i = 1; i < CH; ++i) {
            const float* arow = As + i * DC_AP;
            // Four partial sums: shorter dependency chains.
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
            for (int j = 0; j < i; j += 4) {
                // Entries j ≥ i of the row are never initialised; they are never used either.
                const float4 a = dc_ld4(arow + j);
                s0 = fmaf(a.x, x[j], s0);
                if (j + 1 < i) s1 = fmaf(a.y, x[j + 1], s1);
                if (j + 2 < i) s2 = fmaf(a.z, x[j + 2], s2);
                if (j + 3 < i) s3 = fmaf(a.w, x[j + 3], s3);
            }
            x[i] -= (s0 + s1) + (s2 + s3);
        }
#pragma unroll
        for (int i = 0; i < CH; ++i) {
            if (i < n) {
                const i64 at = ((i64)(c0 + i) * v_heads + h) * DK + c;
                if (w_col) {
                    w_out[at] = __float2bfloat16_rn(x[i]);
                } else {
                    u_out[at] = x[i];
                }
            }
        }
    }

    // ---- 5. P, e^γ·scale·q, e^{γ_last−γ}·k and γ for the state pass (rows of the chunk only).
    for (int e = tid; e < n * CH; e += DC_THREADS) {
        const int i = e / CH;
        const int j = e % CH;
        // Tiles above P's diagonal were never computed: their entries are zeros here.
        p_out[((i64)(c0 + i) * v_heads + h) * CH + j] = __float2bfloat16_rn(j <= i ? Ps[i * DC_AP + j] : 0.0f);
    }
    for (int e = tid; e < n * DK; e += DC_THREADS) {
        const int i = e / DK;
        const int c = e % DK;
        const i64 at = ((i64)(c0 + i) * v_heads + h) * DK + c;
        q_out[at] = __float2bfloat16_rn(egam[i] * Qs[dc_qk(i, c)]);
        k_out[at] = __float2bfloat16_rn(edec[i] * Ks[dc_qk(i, c)]);
    }
    if (tid < n) gam_out[(i64)(c0 + tid) * v_heads + h] = gam[tid];
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: the sequential pass over each sequence's chunks.

#define GS_LD 136  // bf16 row stride of the [64][128] tiles: 16 bytes of padding keep ldmatrix's
                   // 8 row addresses in distinct bank groups
#define GS_PLD 72  // bf16 row stride of the [64][64] P tile

__device__ __forceinline__ void gs_cp16(u32 dst, const void* src, bool valid) {
    // src-size 0 fills the 16 bytes with zeros (rows past the sequence).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void gs_cp4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void gs_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void gs_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory of one stage (one chunk's tiles), in bytes, for SV value columns.
template <int SV>
struct GsStage {
    static constexpr int ULD = SV + 4;  // f32 row stride of the U tile
    static constexpr int W = 0;         // [64][GS_LD] bf16
    static constexpr int Q = W + DC_CHUNK * GS_LD * 2;
    static constexpr int K = Q + DC_CHUNK * GS_LD * 2;
    static constexpr int P = K + DC_CHUNK * GS_LD * 2;  // [64][GS_PLD] bf16
    static constexpr int U = P + DC_CHUNK * GS_PLD * 2; // [64][ULD] f32
    static constexpr int GL = U + DC_CHUNK * ULD * 4;   // γ of the chunk's last row, f32
    static constexpr int BYTES = GL + 16;
};

// Issues the cp.async copies of the chunk at rows c0..c0+n into stage `base` (zeros past n).
template <int SV, int THREADS>
__device__ __forceinline__ void gs_issue(u32 base, const __nv_bfloat16* __restrict__ w,
                                         const float* __restrict__ u, const __nv_bfloat16* __restrict__ q,
                                         const __nv_bfloat16* __restrict__ k,
                                         const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,
                                         u32 c0, int n, int v_heads, int h, int col0) {
    using L = GsStage<SV>;
    const int tid = threadIdx.x;
    // W, q, k: 64 rows of 16 × 16 bytes each.
    for (int e = tid; e < DC_CHUNK * 16; e += THREADS) {
        const int i = e / 16;
        const int part = e % 16;
        const bool ok = i < n;
        const i64 at = ((i64)(c0 + (ok ? i : 0)) * v_heads + h) * DC_DK + part * 8;
        const u32 off = (u32)(i * GS_LD + part * 8) * 2;
        gs_cp16(base + L::W + off, w + at, ok);
        gs_cp16(base + L::Q + off, q + at, ok);
        gs_cp16(base + L::K + off, k + at, ok);
    }
    // P: 64 rows of 8 × 16 bytes.
    for (int e = tid; e < DC_CHUNK * 8; e += THREADS) {
        const int i = e / 8;
        const int part = e % 8;
        const bool ok = i < n;
        const i64 at = ((i64)(c0 + (ok ? i : 0)) * v_heads + h) * DC_CHUNK + part * 8;
        gs_cp16(base + L::P + (u32)(i * GS_PLD + part * 8) * 2, p + at, ok);
    }
    // U: this slice's SV columns, SV / 4 × 16 bytes per row.
    for (int e = tid; e < DC_CHUNK * (SV / 4); e += THREADS) {
        const int i = e / (SV / 4);
        const int part = e % (SV / 4);
        const bool ok = i < n;
        const i64 at = ((i64)(c0 + (ok ? i : 0)) * v_heads + h) * DC_DK + col0 + part * 4;
        gs_cp16(base + L::U + (u32)(i * L::ULD + part * 4) * 4, u + at, ok);
    }
    if (tid == 0) gs_cp4(base + L::GL, gam + (i64)(c0 + n - 1) * v_heads + h);
}

// SV value columns per block, in groups of 32; warps (4 per group) each own 16 rows of the
// chunk's V' / O tile and 32 rows of the state, 32 columns wide.
template <int SV>
__device__ __forceinline__ void gdr_state_pass(
    const __nv_bfloat16* __restrict__ w, const float* __restrict__ u, const __nv_bfloat16* __restrict__ q,
    const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,
    const u32* __restrict__ cu_seqlens, const float* __restrict__ initial, int has_initial,
    float* __restrict__ final_state, int has_final, float* __restrict__ out, int v_heads, int k_dim,
    int v_dim, u32 rows_cap) {
    constexpr int THREADS = SV * 4;  // 4 warps per 32 columns
    constexpr int SLD = SV + 8;      // bf16 row stride of the state and V' copies
    using L = GsStage<SV>;
    unsigned char* const smem = reinterpret_cast<unsigned char*>(dc_smem);
    __nv_bfloat16* const Sb = reinterpret_cast<__nv_bfloat16*>(smem + 2 * L::BYTES);  // [128][SLD]
    __nv_bfloat16* const Vb = Sb + DC_DK * SLD;                                      // [64][SLD]
    const u32 stage0 = smem_addr(smem);

    const int s = blockIdx.x;
    const int h = blockIdx.y;
    const int col0 = blockIdx.z * SV;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int rw = warp & 3;         // row group: V'/O rows 16·rw.., state rows 32·rw..
    const int cw = 32 * (warp >> 2); // the warp's first column within the slice
    const int gr = lane >> 2;        // fragment row (and row + 8)
    const int gc = 2 * (lane & 3);   // fragment column pair
    const int vcols = min(SV, v_dim - col0);
    const i64 state_at = ((i64)s * v_heads + h) * k_dim * v_dim + col0;
    const u32 start = min(cu_seqlens[s], rows_cap);
    const u32 end = max(start, min(cu_seqlens[s + 1], rows_cap));

    // The state slice, f32 in mma accumulator layout: st[m][n] covers rows 32·rw + 16·m (+ gr,
    // + gr + 8), columns cw + 8·n (+ gc, + gc + 1).
    float st[2][4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = 32 * rw + 16 * m + gr + (e >> 1) * 8;
                const int col = cw + 8 * nt + gc + (e & 1);
                st[m][nt][e] = (has_initial && row < k_dim && col < vcols)
                                   ? initial[state_at + (i64)row * v_dim + col]
                                   : 0.0f;
            }
        }
    }
    // Its bf16 copy, the right operand of W S0 and q S0.
    auto store_state = [&]() {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                __nv_bfloat16* d = Sb + (32 * rw + 16 * m + gr) * SLD + cw + 8 * nt + gc;
                *reinterpret_cast<u32*>(d) = pack_bf16x2(st[m][nt][0], st[m][nt][1]);
                *reinterpret_cast<u32*>(d + 8 * SLD) = pack_bf16x2(st[m][nt][2], st[m][nt][3]);
            }
        }
    };
    store_state();

    // ldmatrix lane addresses (see flash_attention.cu): A from a row-major tile, lanes 0-15 rows
    // 0-15 at column 0, 16-31 at column 8; B from a row-major [k][n] tile (transposed), the same
    // pattern; A from a [k][m] tile (kᵀ, transposed): lanes 0-7 k 0-7 at m 0, 8-15 k 0-7 at m 8,
    // 16-23 k 8-15 at m 0, 24-31 k 8-15 at m 8.
    const int a_row = lane & 15;
    const int a_col = (lane >> 4) * 8;
    const int at_k = (lane & 7) + (lane >> 4) * 8;
    const int at_m = ((lane >> 3) & 1) * 8;
    const u32 sb_addr = smem_addr(Sb + a_row * SLD + cw + a_col);
    const u32 vb_addr = smem_addr(Vb + a_row * SLD + cw + a_col);

    int n = (int)min((u32)DC_CHUNK, end - start);
    if (start < end) gs_issue<SV, THREADS>(stage0, w, u, q, k, p, gam, start, n, v_heads, h, col0);
    gs_commit();
    int buf = 0;
    for (u32 c0 = start; c0 < end; c0 += DC_CHUNK, buf ^= 1) {
        const u32 base = stage0 + buf * L::BYTES;
        const unsigned char* stage = smem + buf * L::BYTES;
        gs_wait<0>();
        // The chunk's tiles and the state copy are complete; every warp is done with the other stage.
        __syncthreads();
        const u32 c_next = c0 + (u32)n;
        const int n_next = (int)min((u32)DC_CHUNK, end - c_next);
        if (c_next < end) {
            gs_issue<SV, THREADS>(stage0 + (buf ^ 1) * L::BYTES, w, u, q, k, p, gam, c_next, n_next, v_heads, h,
                                  col0);
        }
        gs_commit();

        // ---- V' = U − W S0 and O = (e^γ q) S0: 16 rows × 32 columns per warp, depth 128.
        float vp[4][4], o[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vp[nt][e] = 0.0f;
                o[nt][e] = 0.0f;
            }
        }
        {
            const u32 w_addr = base + L::W + (u32)((16 * rw + a_row) * GS_LD + a_col) * 2;
            const u32 q_addr = base + L::Q + (u32)((16 * rw + a_row) * GS_LD + a_col) * 2;
#pragma unroll
            for (int ks = 0; ks < DC_DK / 16; ++ks) {
                u32 wa[4], qa[4];
                ldmatrix_x4(wa, w_addr + ks * 32);
                ldmatrix_x4(qa, q_addr + ks * 32);
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 sb[4];
                    ldmatrix_x4_trans(sb, sb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                    mma_bf16_16816(vp[2 * np], wa, sb[0], sb[1]);
                    mma_bf16_16816(vp[2 * np + 1], wa, sb[2], sb[3]);
                    mma_bf16_16816(o[2 * np], qa, sb[0], sb[1]);
                    mma_bf16_16816(o[2 * np + 1], qa, sb[2], sb[3]);
                }
            }
        }
        {
            const float* us = reinterpret_cast<const float*>(stage + L::U);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int col = cw + 8 * nt + gc;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int row = 16 * rw + gr + 8 * half;
                    const float2 uu = *reinterpret_cast<const float2*>(us + row * L::ULD + col);
                    const float v0 = uu.x - vp[nt][2 * half];
                    const float v1 = uu.y - vp[nt][2 * half + 1];
                    *reinterpret_cast<u32*>(Vb + row * SLD + col) = pack_bf16x2(v0, v1);
                }
            }
        }
        // V' is complete, and every warp is done reading the state copy.
        __syncthreads();

        // ---- O += P V' (P is zero above the diagonal: only the 16-token blocks up to the warp's
        // own), then O to global memory.
        {
            const u32 p_addr = base + L::P + (u32)((16 * rw + a_row) * GS_PLD + a_col) * 2;
            for (int ks = 0; ks <= rw; ++ks) {
                u32 pa[4];
                ldmatrix_x4(pa, p_addr + ks * 32);
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    u32 vb[4];
                    ldmatrix_x4_trans(vb, vb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                    mma_bf16_16816(o[2 * np], pa, vb[0], vb[1]);
                    mma_bf16_16816(o[2 * np + 1], pa, vb[2], vb[3]);
                }
            }
            const i64 out_width = (i64)v_heads * v_dim;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int row = 16 * rw + gr + 8 * half;
                if (row < n) {
                    float* dst = out + (i64)(c0 + row) * out_width + (i64)h * v_dim + col0;
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        const int col = cw + 8 * nt + gc;
                        if (col < vcols) dst[col] = o[nt][2 * half];
                        if (col + 1 < vcols) dst[col + 1] = o[nt][2 * half + 1];
                    }
                }
            }
        }

        // ---- S ← e^{γ_last} S0 + (e^{γ_last−γ} K)ᵀ V': 32 state rows × 32 columns per warp,
        // depth 64 (the chunk's tokens).
        {
            const float decay = expf(*reinterpret_cast<const float*>(stage + L::GL));
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) st[m][nt][e] *= decay;
                }
            }
            const u32 k_addr = base + L::K + (u32)(at_k * GS_LD + 32 * rw + at_m) * 2;
#pragma unroll
            for (int ks = 0; ks < DC_CHUNK / 16; ++ks) {
                u32 vb[2][4];
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    ldmatrix_x4_trans(vb[np], vb_addr + (u32)(ks * 16 * SLD + np * 16) * 2);
                }
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    u32 ka[4];
                    ldmatrix_x4_trans(ka, k_addr + (u32)(ks * 16 * GS_LD + 16 * m) * 2);
#pragma unroll
                    for (int np = 0; np < 2; ++np) {
                        mma_bf16_16816(st[m][2 * np], ka, vb[np][0], vb[np][1]);
                        mma_bf16_16816(st[m][2 * np + 1], ka, vb[np][2], vb[np][3]);
                    }
                }
            }
        }
        // Every warp read V' and the state copy before this chunk's barrier; the next chunk reads
        // the new copy after its barrier.
        store_state();
        n = n_next;
    }
    gs_wait<0>();

    if (has_final) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = 32 * rw + 16 * m + gr + (e >> 1) * 8;
                    const int col = cw + 8 * nt + gc + (e & 1);
                    if (row < k_dim && col < vcols) final_state[state_at + (i64)row * v_dim + col] = st[m][nt][e];
                }
            }
        }
    }
}

// Grid (num_seqs, v_heads, ceil(v_dim / SV)), 4·SV threads, dynamic shared memory
// 2·GsStage<SV>::BYTES + (128 + 64)·(SV + 8)·2 bytes (delta_chunked.rs `pass_smem_bytes`).
#define GS_KERNEL(NAME, SV)                                                                                 \
    extern "C" __global__ void __launch_bounds__(SV * 4)                                                    \
        NAME(const __nv_bfloat16* __restrict__ w, const float* __restrict__ u,                             \
             const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,                     \
             const __nv_bfloat16* __restrict__ p, const float* __restrict__ gam,                           \
             const u32* __restrict__ cu_seqlens, const float* __restrict__ initial, int has_initial,        \
             float* __restrict__ final_state, int has_final, float* __restrict__ out, int v_heads,         \
             int k_dim, int v_dim, u32 rows_cap) {                                                          \
        gdr_state_pass<SV>(w, u, q, k, p, gam, cu_seqlens, initial, has_initial, final_state, has_final,    \
                           out, v_heads, k_dim, v_dim, rows_cap);                                           \
    }

GS_KERNEL(gdr_state_pass_v32, 32)
GS_KERNEL(gdr_state_pass_v64, 64)
